package fencing

import (
	"errors"
	"testing"

	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"
)

// The caller's certificate names the operator; the request's operator field may not contradict it.
// (The witness and record rules are replayed in coordinator/engine/testdata/fence_flow.txt.)
func TestAckCaller(t *testing.T) {
	alice := identity.Identity{Role: identity.Operator, Name: "alice"}
	anyone := identity.Identity{Role: identity.Any}
	for _, tc := range []struct {
		caller   identity.Identity
		operator string
		want     string
		invalid  bool
	}{
		{alice, "", "alice", false},
		{alice, "alice", "alice", false},
		{alice, "bob", "", true},
		{anyone, "", anyone.String(), false},
		{anyone, "bob", anyone.String() + ` (says "bob")`, false},
		{identity.Identity{Role: identity.Coordinator, Name: "c1"}, "bob", identity.Identity{Role: identity.Coordinator, Name: "c1"}.String(), false},
	} {
		got, err := AckCaller(tc.caller, tc.operator)
		var inv fault.Invalid
		if tc.invalid {
			if !errors.As(err, &inv) || len(inv) != 1 || inv[0].Field != "operator" {
				t.Errorf("AckCaller(%v, %q) = %q, %v; want an invalid operator field", tc.caller, tc.operator, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("AckCaller(%v, %q) = %q, %v; want %q", tc.caller, tc.operator, got, err, tc.want)
		}
	}
}
