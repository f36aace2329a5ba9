// Package aws is the Amazon EC2 fence driver (aws-sdk-go-v2 service/ec2), with the parameters of
// ClusterLabs fence_aws.
//
// Off is StopInstances with Force (the instance's OS gets no chance to flush anything), on is
// StartInstances, status is DescribeInstances: "running" is on, "stopped" is off, and every other
// state (pending, stopping, shutting-down, terminated) is unknown, so the kit keeps reading until
// the instance settles. An instance the API does not know is an invalid target.
//
// Credentials are access_key and secret_key when given, else the SDK's default chain
// (environment, shared files and profile, container or instance roles). endpoint_url points the
// client at another endpoint (a VPC endpoint, a test server). Unlike fence_aws, the driver does not
// first check through the instance metadata service that it runs on a healthy EC2 instance: it
// runs as a service, usually outside EC2, and the coordinator's epoch guards against a deposed
// fencer.
package aws

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/nodefence/nodefence/fence-drivers/kit"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/fault"
)

// Canonical parameter names (ClusterLabs' where fence_aws has one).
const (
	ParamRegion    = "region"
	ParamAccessKey = "access_key"
	ParamSecretKey = "secret_key"
	// ParamSessionToken is the session token of temporary access keys.
	ParamSessionToken = "session_token"
	// ParamProfile names a shared-config profile for the default credential chain.
	ParamProfile = "profile"
	// ParamEndpointURL overrides the EC2 endpoint.
	ParamEndpointURL = "endpoint_url"
	// ParamFilter is fence_aws's list filter, key=value (instance-state-name=running, tag:Name=x).
	ParamFilter = "filter"
)

var (
	instanceID = regexp.MustCompile(`^i-[0-9a-f]{8}([0-9a-f]{9})?$`)
	regionName = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]+$`)
)

// Idle clients: at most maxIdle per region, credentials and endpoint, each dropped after idleTimeout.
const (
	maxIdle     = 4
	idleTimeout = time.Minute
)

// Driver is the EC2 driver. Use New.
type Driver struct {
	pool *kit.Pool[*ec2.Client] // idle clients by client key
}

var (
	_ kit.Driver     = (*Driver)(nil)
	_ kit.Lister     = (*Driver)(nil)
	_ kit.Monitorer  = (*Driver)(nil)
	_ kit.Documented = (*Driver)(nil)
)

// New returns the EC2 driver.
func New() kit.Driver {
	return &Driver{pool: kit.NewPool(maxIdle, idleTimeout, func(*ec2.Client) {})} // an EC2 client holds nothing to close
}

// Close drops every idle client.
func (d *Driver) Close() { d.pool.Close() }

// Name is "aws".
func (*Driver) Name() string { return "aws" }

// Description says what the driver controls.
func (*Driver) Description() string {
	return "Stops (forced) and starts Amazon EC2 instances (bare-metal or virtual) through the EC2 API, like fence_aws."
}

// Describe lists the parameters, with ClusterLabs names and aliases.
func (*Driver) Describe() []*driverv1.Parameter {
	return []*driverv1.Parameter{
		{Name: kit.ParamPlug, Aliases: []string{"port"}, Required: true, Type: kit.TypeString, Description: "EC2 instance id (i-...)"},
		{Name: ParamRegion, Type: kit.TypeString, Description: "AWS region (default: from the environment or shared config)"},
		{Name: ParamAccessKey, Type: kit.TypeString, Description: "AWS access key id (default: the SDK's credential chain)"},
		{Name: ParamSecretKey, Secret: true, Type: kit.TypeString, Description: "AWS secret access key"},
		{Name: ParamSessionToken, Secret: true, Type: kit.TypeString, Description: "session token of temporary access keys"},
		{Name: ParamProfile, Type: kit.TypeString, Description: "shared config profile for the credential chain"},
		{Name: ParamEndpointURL, Type: kit.TypeString, Description: "EC2 endpoint URL override (e.g. a VPC endpoint)"},
		{Name: ParamFilter, Type: kit.TypeString, Description: "list filter key=value, e.g. tag:Cluster=prod (list only)"},
	}
}

// params is a parsed target.
type params struct {
	id, region, access, secret, token, profile, endpoint string
	filterKey, filterValue                               string
}

func parse(p map[string]string) (*params, error) {
	var inv fault.Invalid
	c := &params{id: strings.TrimSpace(p[kit.ParamPlug]), region: strings.TrimSpace(p[ParamRegion]), access: strings.TrimSpace(p[ParamAccessKey]),
		secret: p[ParamSecretKey], token: p[ParamSessionToken], profile: strings.TrimSpace(p[ParamProfile]),
		endpoint: strings.TrimSpace(p[ParamEndpointURL])}
	if !instanceID.MatchString(c.id) {
		inv.Add(kit.ParamPlug, "must be an EC2 instance id (i- and 8 or 17 hex digits), got %q", c.id)
	}
	if c.region != "" && !regionName.MatchString(c.region) {
		inv.Add(ParamRegion, "must be a region name like eu-west-1, got %q", c.region)
	}
	if (c.access == "") != (c.secret == "") {
		inv.Add(ParamSecretKey, "access_key and secret_key go together")
	}
	if c.token != "" && c.access == "" {
		inv.Add(ParamSessionToken, "needs access_key and secret_key")
	}
	if c.endpoint != "" && !strings.HasPrefix(c.endpoint, "https://") && !strings.HasPrefix(c.endpoint, "http://") {
		inv.Add(ParamEndpointURL, "must be an http:// or https:// URL, got %q", c.endpoint)
	}
	if f := strings.TrimSpace(p[ParamFilter]); f != "" {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" || v == "" {
			inv.Add(ParamFilter, "must be key=value, got %q", f)
		}
		c.filterKey, c.filterValue = k, v
	}
	return c, inv.Err()
}

// Parse checks canonical parameters and returns them typed.
func (*Driver) Parse(p map[string]string) (any, error) { return parse(p) }

// DeviceKey is the region, endpoint and instance.
func (*Driver) DeviceKey(t kit.Target) string {
	return "aws/" + strings.TrimSpace(t.Params[ParamRegion]) + "/" + strings.TrimSpace(t.Params[ParamEndpointURL]) + "/" + strings.TrimSpace(t.Params[kit.ParamPlug])
}

func (c *params) key() string {
	return kit.SessionKey(c.region, c.access, c.secret, c.token, c.profile, c.endpoint)
}

// withClient parses t once and runs fn with an idle client for it or a new one. The client is
// kept for reuse unless fn failed for another reason than a bad target.
func (d *Driver) withClient(ctx context.Context, t kit.Target, fn func(*params, *ec2.Client) error) error {
	c, err := kit.ParsedAs(t, parse)
	if err != nil {
		return err
	}
	dial := func() (*ec2.Client, error) { return newClient(ctx, c) }
	return d.pool.Use(c.key(), dial, func(cl *ec2.Client) error { return fn(c, cl) })
}

// retryBackoff caps the SDK's wait between attempts.
const retryBackoff = 500 * time.Millisecond

// newClient makes an EC2 client for c's region, credentials and endpoint.
func newClient(ctx context.Context, c *params) (*ec2.Client, error) {
	// Three attempts with at most retryBackoff between them: a refused
	// connection is reported as Unavailable well inside a fence timeout
	// instead of being hidden behind the SDK's 20 s default backoff.
	opts := []func(*config.LoadOptions) error{config.WithRetryer(func() aws.Retryer {
		return retry.AddWithMaxBackoffDelay(retry.NewStandard(func(o *retry.StandardOptions) { o.MaxAttempts = 3 }), retryBackoff)
	})}
	if c.region != "" {
		opts = append(opts, config.WithRegion(c.region))
	}
	if c.access != "" {
		opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(c.access, c.secret, c.token)))
	}
	if c.profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(c.profile))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: loading the AWS configuration: %v", fault.ErrUnauthenticated, err)
	}
	if cfg.Region == "" {
		return nil, fault.FieldError{Field: ParamRegion, Problem: "required: no region given and none in the environment or shared config"}
	}
	return ec2.NewFromConfig(cfg, func(o *ec2.Options) {
		if c.endpoint != "" {
			o.BaseEndpoint = aws.String(c.endpoint)
		}
	}), nil
}

// classify maps SDK errors to the fault sentinels.
func classify(ctx context.Context, c *params, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s %s: the EC2 API did not answer in time: %w", what, c.id, ctx.Err())
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code, msg := ae.ErrorCode(), ae.ErrorMessage()
		switch {
		case code == "AuthFailure", code == "UnauthorizedOperation", code == "InvalidClientTokenId", code == "SignatureDoesNotMatch",
			code == "ExpiredToken", code == "RequestExpired", code == "OptInRequired":
			return fmt.Errorf("%w: %s %s: %s: %s", fault.ErrUnauthenticated, what, c.id, code, msg)
		case strings.HasPrefix(code, "InvalidInstanceID"):
			return fault.FieldError{Field: kit.ParamPlug, Problem: fmt.Sprintf("%s: %s", code, msg)}
		}
		return fmt.Errorf("%w: %s %s: %s: %s", fault.ErrDevice, what, c.id, code, msg)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%s %s: the EC2 API did not answer in time: %w", what, c.id, context.DeadlineExceeded)
	}
	return fmt.Errorf("%w: %s %s: %v", fault.ErrUnreachable, what, c.id, err)
}

func stateOf(s *types.InstanceState) driverv1.PowerState {
	if s == nil {
		return driverv1.PowerState_POWER_STATE_UNKNOWN
	}
	switch s.Name {
	case types.InstanceStateNameRunning:
		return driverv1.PowerState_POWER_STATE_ON
	case types.InstanceStateNameStopped:
		return driverv1.PowerState_POWER_STATE_OFF
	}
	return driverv1.PowerState_POWER_STATE_UNKNOWN
}

// Status describes the instance: running is ON, stopped OFF, anything else UNKNOWN.
func (d *Driver) Status(ctx context.Context, t kit.Target) (driverv1.PowerState, error) {
	state := driverv1.PowerState_POWER_STATE_UNKNOWN
	err := d.withClient(ctx, t, func(c *params, cl *ec2.Client) error {
		out, err := cl.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{c.id}})
		if err != nil {
			return classify(ctx, c, "DescribeInstances", err)
		}
		for _, r := range out.Reservations {
			for _, in := range r.Instances {
				if aws.ToString(in.InstanceId) == c.id {
					state = stateOf(in.State)
					return nil
				}
			}
		}
		return fault.FieldError{Field: kit.ParamPlug, Problem: "DescribeInstances does not list instance " + c.id}
	})
	if err != nil {
		return driverv1.PowerState_POWER_STATE_UNKNOWN, err
	}
	return state, nil
}

// PowerOff force-stops the instance.
func (d *Driver) PowerOff(ctx context.Context, t kit.Target) error {
	return d.withClient(ctx, t, func(c *params, cl *ec2.Client) error {
		if _, err := cl.StopInstances(ctx, &ec2.StopInstancesInput{InstanceIds: []string{c.id}, Force: aws.Bool(true)}); err != nil {
			return classify(ctx, c, "StopInstances", err)
		}
		return nil
	})
}

// PowerOn starts the instance.
func (d *Driver) PowerOn(ctx context.Context, t kit.Target) error {
	return d.withClient(ctx, t, func(c *params, cl *ec2.Client) error {
		if _, err := cl.StartInstances(ctx, &ec2.StartInstancesInput{InstanceIds: []string{c.id}}); err != nil {
			return classify(ctx, c, "StartInstances", err)
		}
		return nil
	})
}

// List describes the instances (all, or those matching filter) with their Name tags and states.
func (d *Driver) List(ctx context.Context, t kit.Target) ([]*driverv1.Plug, error) {
	var plugs []*driverv1.Plug
	err := d.withClient(ctx, t, func(c *params, cl *ec2.Client) error {
		in := &ec2.DescribeInstancesInput{}
		if c.filterKey != "" {
			in.Filters = []types.Filter{{Name: aws.String(c.filterKey), Values: []string{c.filterValue}}}
		}
		p := ec2.NewDescribeInstancesPaginator(cl, in)
		for p.HasMorePages() {
			out, err := p.NextPage(ctx)
			if err != nil {
				return classify(ctx, c, "DescribeInstances", err)
			}
			for _, r := range out.Reservations {
				for _, i := range r.Instances {
					plugs = append(plugs, &driverv1.Plug{Id: aws.ToString(i.InstanceId), Name: nameTag(i.Tags), State: stateOf(i.State)})
				}
			}
		}
		return nil
	})
	return plugs, err
}

// nameTag is the value of the Name tag, or "".
func nameTag(tags []types.Tag) string {
	for _, tag := range tags {
		if aws.ToString(tag.Key) == "Name" {
			return aws.ToString(tag.Value)
		}
	}
	return ""
}

// Monitor describes the target instance.
func (d *Driver) Monitor(ctx context.Context, t kit.Target) error {
	_, err := d.Status(ctx, t)
	return err
}
