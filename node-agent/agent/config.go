package agent

import (
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"sort"
	"strings"
	"time"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/tlsfiles"
)

// Defaults applied by SetDefaults.
const (
	DefaultHeartbeatInterval = time.Second
	DefaultSampleInterval    = time.Second
	DefaultMinBackoff        = 100 * time.Millisecond
	DefaultMaxBackoff        = 10 * time.Second
	DefaultBufferSize        = 1024
)

// Config configures an Agent.
type Config struct {
	// Coordinators are one or more coordinator addresses (host:port, or a gRPC target such as
	// dns:///coordinator:7400). The agent tries them in turn and follows leader redirects.
	Coordinators []string
	// TLS is the client side of the coordinator connection.
	TLS tlsfiles.Files
	// NodeName is the node's name (a DNS-1123 subdomain, as Kubernetes requires).
	NodeName string
	// BootID identifies this boot of the node (/proc/sys/kernel/random/boot_id).
	BootID string
	// Zone and Region are the node's topology.kubernetes.io/zone and region label values.
	Zone, Region string
	// Labels are extra node labels sent in the Hello.
	Labels map[string]string
	// Capacity is the node's capacity sent in the Hello; nil sends none.
	Capacity *agentv1.Capacity
	// Watchdog is the node's watchdog at the start, reported in every Hello until ReportWatchdog
	// changes it; nil: none (yet).
	Watchdog *agentv1.WatchdogState
	// Lease, when set, asks for the watchdog lease with every heartbeat and takes the leader's
	// grants (a watchdog-mode agent); nil asks for none.
	Lease *Lease
	// HeartbeatInterval and SampleInterval are how often heartbeats and signal samples are sent
	// until the coordinator's AgentConfig says otherwise. Defaults 1s and 1s.
	HeartbeatInterval, SampleInterval time.Duration
	// MinBackoff and MaxBackoff bound the jittered exponential wait between connection attempts.
	// Defaults 100ms and 10s.
	MinBackoff, MaxBackoff time.Duration
	// BufferSize is how many unacked messages are kept (default 1024). Heartbeats and samples are
	// dropped first to stay within it; conditions, shutdown events and candidates never are.
	BufferSize int
	// Grants carries out the coordinator's eviction grants (Kubernetes mode); nil, in standalone
	// mode, only logs them.
	Grants GrantHandler
	// Connected, when set, is called each time a stream to a coordinator is established (its first
	// answer arrived), on the stream's receive loop: it must return at once. The pressure monitor
	// uses it to propose its pending eviction candidate again to a new leader, which has never
	// heard of it.
	Connected func()
	// Log receives the agent's logs; nil means slog.Default().
	Log *slog.Logger
}

// GrantHandler carries out eviction grants. It is an interface here, where the grants arrive;
// kubepods.Evictor is the real one. Grant runs on the stream's receive loop, so it must queue the
// work and return at once.
type GrantHandler interface {
	Grant(g *agentv1.EvictionGrant)
}

// SetDefaults fills every zero field that has a default.
func (c *Config) SetDefaults() {
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.SampleInterval == 0 {
		c.SampleInterval = DefaultSampleInterval
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.BufferSize == 0 {
		c.BufferSize = DefaultBufferSize
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
}

var (
	dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	labelName    = regexp.MustCompile(`^[A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?$`)
)

// Validate returns a fault.Invalid listing every bad field, or nil. Zero fields that have defaults
// are judged by their defaults.
func (c Config) Validate() error {
	c.SetDefaults()
	var v fault.Invalid
	if len(c.Coordinators) == 0 {
		v.Add("Coordinators", "at least one coordinator address is required")
	}
	for i, addr := range c.Coordinators {
		if err := checkAddress(addr); err != "" {
			v.Add(fmt.Sprintf("Coordinators[%d]", i), "%q: %s", addr, err)
		}
	}
	for _, err := range c.TLS.Validate("", false) {
		v.Add("TLS", "%v", err)
	}
	if c.NodeName == "" {
		v.Add("NodeName", "required")
	} else if err := checkSubdomain(c.NodeName); err != "" {
		v.Add("NodeName", "%q: %s", c.NodeName, err)
	}
	if c.BootID == "" {
		v.Add("BootID", "required")
	} else if strings.ContainsFunc(c.BootID, isSpaceOrControl) {
		v.Add("BootID", "%q: must not contain spaces or control characters", c.BootID)
	}
	if err := checkLabelValue(c.Zone); err != "" {
		v.Add("Zone", "%q: %s", c.Zone, err)
	}
	if err := checkLabelValue(c.Region); err != "" {
		v.Add("Region", "%q: %s", c.Region, err)
	}
	keys := make([]string, 0, len(c.Labels))
	for k := range c.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := checkLabelKey(k); err != "" {
			v.Add("Labels", "key %q: %s", k, err)
		}
		if err := checkLabelValue(c.Labels[k]); err != "" {
			v.Add("Labels", "value of %q: %s", k, err)
		}
	}
	if c.Capacity != nil && (c.Capacity.MemoryBytes < 0 || c.Capacity.CpuMillis < 0 || c.Capacity.Pids < 0) {
		v.Add("Capacity", "must not be negative")
	}
	for _, d := range []struct {
		field string
		value time.Duration
	}{
		{"HeartbeatInterval", c.HeartbeatInterval},
		{"SampleInterval", c.SampleInterval},
		{"MinBackoff", c.MinBackoff},
		{"MaxBackoff", c.MaxBackoff},
	} {
		if d.value < 0 {
			v.Add(d.field, "%v: must be positive", d.value)
		}
	}
	if c.MinBackoff > 0 && c.MaxBackoff > 0 && c.MaxBackoff < c.MinBackoff {
		v.Add("MaxBackoff", "%v is below MinBackoff %v", c.MaxBackoff, c.MinBackoff)
	}
	if c.BufferSize < 0 {
		v.Add("BufferSize", "%d: must be positive", c.BufferSize)
	}
	return v.Err()
}

func isSpaceOrControl(r rune) bool { return r <= ' ' || r == 0x7f }

func checkAddress(addr string) string {
	switch {
	case addr == "":
		return "empty address"
	case strings.ContainsFunc(addr, isSpaceOrControl):
		return "must not contain spaces"
	case strings.Contains(addr, "://"):
		return "" // a gRPC target URI (dns:///, unix://); grpc.NewClient judges the rest
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "want host:port"
	}
	if host == "" || port == "" {
		return "want host:port"
	}
	return ""
}

func checkSubdomain(s string) string {
	if len(s) > 253 {
		return "longer than 253 characters"
	}
	for _, part := range strings.Split(s, ".") {
		if !dns1123Label.MatchString(part) || len(part) > 63 {
			return "must be a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')"
		}
	}
	return ""
}

func checkLabelKey(k string) string {
	prefix, name, ok := strings.Cut(k, "/")
	if !ok {
		prefix, name = "", k
	} else if prefix == "" {
		return "empty prefix"
	} else if err := checkSubdomain(prefix); err != "" {
		return "prefix " + err
	}
	if name == "" || len(name) > 63 || !labelName.MatchString(name) {
		return "name must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
	}
	return ""
}

func checkLabelValue(s string) string {
	if s == "" {
		return ""
	}
	if len(s) > 63 || !labelName.MatchString(s) {
		return "must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
	}
	return ""
}
