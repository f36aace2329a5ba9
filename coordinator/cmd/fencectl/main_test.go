package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestConfigCheckPrintsThePlanWithSecretsMasked(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"config", "check", "../../config/testdata/seed-complete"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	for _, want := range []string{"node host0", "node host1", "1. fc-off: off via brocade", "1. eaton-off: off via pdu, must succeed",
		"2. eaton-on: on via pdu, must succeed", "password=***", "snmp-priv-passwd=***", "2 node(s), configuration valid"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	for _, secret := range []string{"eaton_password", "brocade_password", "eaton_snmp_passwd"} {
		if strings.Contains(out.String(), secret) {
			t.Errorf("output shows the secret %q", secret)
		}
	}
}

func TestConfigCheckListsEveryProblem(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"config", "check", "../../config/testdata/seed/two-node.yaml"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "6 problem(s)") {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{}, {"frobnicate"}, {"fence"}, {"config", "check"}, {"--coordinator", "", "nodes"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), append([]string{"--insecure"}, args...), &out, &errb); code != 2 {
			t.Errorf("fencectl %q: exit %d, want 2 (stderr %q)", args, code, errb.String())
		}
	}
}
