package fenceconfig

import (
	"strings"
	"testing"
)

// A watchdog method needs no driver service; the node's fallback is read; misuse is refused with
// the field named.
func TestWatchdogMethod(t *testing.T) {
	c, err := Parse([]byte(`
drivers:
  ipmi: {endpoint: "127.0.0.1:7101"}
nodes:
  node-1:
    watchdog_fallback: true
    methods:
      bmc: {driver: ipmi, parameters: {ip: 127.0.0.1}}
      wd: {driver: watchdog}
    steps:
      power_management: [bmc, wd]
`), "wd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Nodes["node-1"].WatchdogFallback {
		t.Fatal("watchdog_fallback not read")
	}
	pm, err := c.Plan("node-1", StepPowerManagement)
	if err != nil || len(pm) != 2 || pm[1].Driver != WatchdogDriver || pm[1].Action != "off" || len(pm[1].Endpoints) != 0 {
		t.Fatalf("plan: %+v, %v", pm, err)
	}

	_, err = Parse([]byte(`
drivers:
  ipmi: {endpoint: "127.0.0.1:7101"}
templates:
  t: {driver: watchdog}
nodes:
  node-1:
    methods:
      wd: {driver: watchdog, action: "on", parameters: {ip: x}}
      wd2: {driver: watchdog, template: t}
    steps:
      isolation: [wd]
      power_management: [wd]
      recovery: [wd2]
`), "bad.yaml")
	if err == nil {
		t.Fatal("misused watchdog methods accepted")
	}
	for _, want := range []string{
		"templates.t.driver", "nodes.node-1.methods.wd.action", "nodes.node-1.methods.wd.parameters",
		"nodes.node-1.methods.wd2.template", "nodes.node-1.steps.isolation[0]", "nodes.node-1.steps.recovery[0]",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s:\n%v", want, err)
		}
	}
}
