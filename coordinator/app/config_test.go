package app

import (
	"flag"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/services/server"
)

// The flags' defaults are DefaultConfig: no default is written twice.
func TestFlagDefaultsAreDefaultConfig(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	c.Server = server.Config{}
	if want := DefaultConfig(); !reflect.DeepEqual(c, want) {
		t.Errorf("flag defaults:\n%+v\nDefaultConfig:\n%+v", c, want)
	}
}

// SetDefaults fills a zero Config from DefaultConfig, except the fields whose zero is a choice or
// that must be given.
func TestSetDefaultsFillsFromDefaultConfig(t *testing.T) {
	var c Config
	c.SetDefaults()
	if c.ID == "" {
		t.Error("ID not filled")
	}
	want := DefaultConfig()
	want.ID, want.Server = c.ID, c.Server
	want.DataDir, want.EtcdClientListen, want.EtcdPeerListen, want.DeviceCheckInterval = "", "", "", 0
	if !reflect.DeepEqual(c, want) {
		t.Errorf("SetDefaults:\n%+v\nwant:\n%+v", c, want)
	}
	d := DefaultConfig()
	d.Server.SetDefaults()
	d.Server.TLS.Insecure, d.DriverTLS.Insecure = true, true
	d.FenceConfig = "fences.yaml" // the one setting without a default (or --kubeconfig)
	if errs := d.Validate(); len(errs) != 0 {
		t.Errorf("DefaultConfig is invalid: %v", errs)
	}
}

// Validate reports every bad setting at once, each error naming its flag.
func TestValidateNamesEveryFlag(t *testing.T) {
	c := DefaultConfig()
	c.Server.SetDefaults()
	c.Server.TLS.Insecure, c.DriverTLS.Insecure = true, true
	c.FenceConfig = "fences.yaml"
	c.FencePolicy = "some"
	c.DriverEndpoints = map[string]string{"ipmi": "nohostport"}
	c.ControlPlaneSelector = "role in ("
	c.Advertise = "nohostport"
	c.GCPercent = 20
	c.DataDir = ""
	c.EtcdPrefix = "nodefence/"
	c.ElectionTTL = 1500 * time.Millisecond
	c.Retention.FenceMaxAge, c.Retention.FenceMaxRecords, c.Retention.AuditMaxAge, c.Retention.AuditMaxEntries = -1, -1, -1, -1
	e := &c.Engine
	e.NodeMonitorGracePeriod, e.NodeStartupGracePeriod, e.UnhealthyZoneThreshold = 0, -1, 1.5
	e.NodeEvictionRate, e.SecondaryNodeEvictionRate, e.LargeClusterSizeThreshold = -1, -1, -1
	e.PodEviction.Rate, e.PodEviction.Burst, e.PodEviction.MaxInFlight, e.PodEviction.GrantTTL = -1, 0, 0, 0
	c.AgentHeartbeatInterval, c.AgentSampleInterval, c.WatchdogLease = 0, -1, -1
	e.Fence.Timeout, e.Fence.Budget, e.Fence.BudgetWindow, e.Fence.Settle, e.Fence.MaxUnresponsivePercent = -1, -1, 0, -1, 101
	c.ReleaseHealthyDelay, c.DeviceCheckInterval, c.FenceOpTimeout = -1, -1, 0
	c.Fencing.Retries, c.Fencing.Backoff, c.Fencing.IsolationWait, c.Fencing.Polls, c.Fencing.PollInterval = 101, 0, -1, -1, 0
	flags := []string{"fence-policy", "driver-endpoint ipmi", "control-plane-selector", "advertise", "gc-percent",
		"data-dir", "etcd-prefix", "election-ttl",
		"fence-history-max-age", "fence-history-max-records", "audit-max-age", "audit-max-entries",
		"node-monitor-grace-period", "node-startup-grace-period", "unhealthy-zone-threshold",
		"node-eviction-rate", "secondary-node-eviction-rate", "large-cluster-size-threshold",
		"pod-eviction-rate", "pod-eviction-burst", "pod-eviction-max-in-flight", "pod-eviction-grant-ttl",
		"agent-heartbeat-interval", "agent-sample-interval", "watchdog-lease",
		"fence-timeout", "fence-budget", "fence-budget-window", "fence-guard-settle", "max-unresponsive-percent",
		"release-healthy-delay", "device-check-interval", "fence-op-timeout",
		"fence-retries", "fence-retry-backoff", "isolation-wait", "power-management-polls", "power-management-poll-interval"}
	errs := c.Validate()
	for _, f := range flags {
		n := 0
		for _, err := range errs {
			if strings.HasPrefix(err.Error(), "--"+f+":") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("--%s: %d errors start with it, want 1", f, n)
		}
	}
	if len(errs) != len(flags) {
		t.Errorf("%d errors for %d bad flags: %v", len(errs), len(flags), errs)
	}
}

// --driver-endpoint takes several comma-separated addresses per driver: the first is the driver's
// endpoint, the rest its further endpoints, tried in order; each must be host:port.
func TestDriverEndpointList(t *testing.T) {
	c := DefaultConfig()
	c.DriverEndpoints = map[string]string{"ipmi": "10.0.0.1:7101,10.0.0.2:7101,10.0.0.3:7101"}
	d := c.driverMap()["ipmi"]
	if want := []string{"10.0.0.1:7101", "10.0.0.2:7101", "10.0.0.3:7101"}; !slices.Equal(d.Addresses(), want) {
		t.Errorf("addresses %q, want %q", d.Addresses(), want)
	}
	c.DriverEndpoints = map[string]string{"ipmi": "10.0.0.1:7101,nohostport"}
	found := false
	for _, err := range c.validateSources() {
		found = found || strings.Contains(err.Error(), `--driver-endpoint ipmi: "nohostport" is not host:port`)
	}
	if !found {
		t.Errorf("a bad second address is not refused: %v", c.validateSources())
	}
}
