package fenceconfig

import (
	"errors"
	"testing"

	"github.com/nodefence/nodefence/services/fault"
)

// The coordinator refuses, on load and on every reload (both go through Validate), an agent
// method whose parameters the agent driver would refuse: here a user name that fence_wti's ssh
// command line reads as -oProxyCommand. The problem names the parameter, directly or through a
// template.
func TestAgentParametersValidatedOnLoad(t *testing.T) {
	for _, tc := range []struct{ name, yaml, field string }{
		{"method", `drivers: {agent: {endpoint: "127.0.0.1:1"}}
nodes:
  n1:
    methods: {pdu: {driver: agent, parameters: {agent: fence_wti, ip: 10.0.0.1, ssh: "1", username: "-oProxyCommand=/tmp/x x"}}}
    steps: {power_management: [pdu]}
`, "nodes.n1.methods.pdu.parameters.username"},
		{"template", `drivers: {agent: {endpoint: "127.0.0.1:1"}}
templates:
  wti: {driver: agent, parameters: {agent: fence_wti, ip: "10.0.0.1 -oProxyCommand=/tmp/x"}}
nodes:
  n1:
    methods: {pdu: {template: wti, parameters: {plug: "1"}}}
    steps: {power_management: [pdu]}
`, "templates.wti.parameters.ip"},
		{"forbidden name", `drivers: {agent: {endpoint: "127.0.0.1:1"}}
nodes:
  n1:
    methods: {pdu: {driver: agent, parameters: {agent: fence_wti, ip: 10.0.0.1, ssh_options: "-oProxyCommand=/tmp/x"}}}
    steps: {power_management: [pdu]}
`, "nodes.n1.methods.pdu.parameters.ssh_options"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), "fence.yaml")
			var inv fault.Invalid
			if !errors.As(err, &inv) {
				t.Fatalf("Parse = %v, want fault.Invalid", err)
			}
			for _, fe := range inv {
				if fe.Field == tc.field {
					return
				}
			}
			t.Fatalf("Parse = %v, want a problem naming %s", err, tc.field)
		})
	}
	ok := `drivers: {agent: {endpoint: "127.0.0.1:1"}}
nodes:
  n1:
    methods: {pdu: {driver: agent, parameters: {agent: fence_wti, ip: pdu1.example.org, ssh: "1", username: admin, password: "p w$", plug: "3", extra_knob: on}}}
    steps: {power_management: [pdu]}
`
	if _, err := Parse([]byte(ok), "fence.yaml"); err != nil {
		t.Errorf("a valid agent method: %v", err)
	}
}
