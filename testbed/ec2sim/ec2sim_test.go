package ec2sim_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/nodefence/nodefence/testbed/ec2sim"
)

func client(sim *ec2sim.Sim, key, secret string) *ec2.Client {
	return ec2.New(ec2.Options{
		Region: sim.Region(), BaseEndpoint: aws.String(sim.Endpoint()),
		Credentials: credentials.NewStaticCredentialsProvider(key, secret, ""),
	})
}

// TestSDKWireFormat drives the endpoint with the real SDK: signed requests, XML answers, states
// taking time.
func TestSDKWireFormat(t *testing.T) {
	sim, err := ec2sim.Start(ec2sim.Config{AccessKey: "AKIDEXAMPLE", SecretKey: "s3cr3t", Transition: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	id := sim.AddInstance("n1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := client(sim, "AKIDEXAMPLE", "s3cr3t")
	out, err := c.StopInstances(ctx, &ec2.StopInstancesInput{InstanceIds: []string{id}, Force: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	if got := out.StoppingInstances[0]; got.CurrentState.Name != types.InstanceStateNameStopping || got.PreviousState.Name != types.InstanceStateNameRunning {
		t.Fatalf("StopInstances: %+v", got)
	}
	state := func() types.InstanceStateName {
		d, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []types.Filter{{Name: aws.String("instance-id"), Values: []string{id}}}})
		if err != nil {
			t.Fatal(err)
		}
		return d.Reservations[0].Instances[0].State.Name
	}
	if s := state(); s != types.InstanceStateNameStopping {
		t.Fatalf("right after stop: %s", s)
	}
	for deadline := time.Now().Add(5 * time.Second); state() != types.InstanceStateNameStopped; {
		if time.Now().After(deadline) {
			t.Fatal("never stopped")
		}
	}
	if _, err := c.StartInstances(ctx, &ec2.StartInstancesInput{InstanceIds: []string{"i-00000000deadbeef0"}}); !apiCode(err, "InvalidInstanceID.NotFound") {
		t.Fatalf("start of an unknown instance: %v", err)
	}
	bad := client(sim, "AKIDEXAMPLE", "wrong")
	if _, err := bad.DescribeInstances(ctx, &ec2.DescribeInstancesInput{}); !apiCode(err, "AuthFailure") {
		t.Fatalf("wrong secret: %v", err)
	}
	// An unsigned request and a tampered body are refused.
	resp, err := http.Post(sim.Endpoint(), "application/x-www-form-urlencoded", strings.NewReader("Action=DescribeInstances&Version=2016-11-15"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || !strings.Contains(string(body), "<Code>AuthFailure</Code>") {
		t.Fatalf("unsigned: %d %s", resp.StatusCode, body)
	}
	tampered := ec2.New(ec2.Options{
		Region: sim.Region(), BaseEndpoint: aws.String(sim.Endpoint()),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "s3cr3t", ""),
		HTTPClient:  tamper{},
	})
	if _, err := tampered.StopInstances(ctx, &ec2.StopInstancesInput{InstanceIds: []string{id}}); err == nil {
		t.Fatal("a body changed after signing was accepted")
	}
}

// tamper changes the instance id in a signed request's body.
type tamper struct{}

func (tamper) Do(r *http.Request) (*http.Response, error) {
	b, _ := io.ReadAll(r.Body)
	nb := strings.Replace(string(b), "InstanceId.1=i-", "InstanceId.1=i-0", 1)
	r.Body = io.NopCloser(strings.NewReader(nb))
	r.ContentLength = int64(len(nb))
	return http.DefaultClient.Do(r)
}

func apiCode(err error, code string) bool {
	var ae smithy.APIError
	return err != nil && errors.As(err, &ae) && ae.ErrorCode() == code
}
