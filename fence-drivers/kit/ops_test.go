package kit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/fault"
)

func lines(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, opsFile))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// The operations file stays bounded (at most twice the remembered operations), survives a torn
// last line, and a reload remembers the newest operations with their answers.
func TestOperationsFileIsBounded(t *testing.T) {
	dir := t.TempDir()
	const limit = 10
	tab, err := loadOpTable(dir, nil, limit)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 55 {
		id := fmt.Sprintf("op-%d", i)
		op, owner, err := tab.begin(id, "off on dev")
		if err != nil || !owner {
			t.Fatalf("begin %s: owner %v, %v", id, owner, err)
		}
		tab.finish(id, op, &driverv1.PowerOffResponse{State: driverv1.PowerState_POWER_STATE_OFF, Polls: int32(i), ConfirmedAt: timestamppb.Now()}, nil)
		if n := lines(t, dir); n > 2*limit {
			t.Fatalf("after %d operations the file has %d lines; bound %d", i+1, n, 2*limit)
		}
	}
	// A failed operation is not remembered.
	op, _, _ := tab.begin("failed", "off on dev")
	tab.finish("failed", op, nil, fmt.Errorf("device unreachable"))

	f, err := os.OpenFile(filepath.Join(dir, opsFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"id":"torn","what":"off on d`)
	f.Close()

	tab, err = loadOpTable(dir, nil, limit)
	if err != nil {
		t.Fatal(err)
	}
	if len(tab.order) != limit || tab.order[0] != "op-45" || lines(t, dir) != limit {
		t.Fatalf("reloaded %v, %d lines", tab.order, lines(t, dir))
	}
	op, owner, err := tab.begin("op-54", "off on dev")
	if err != nil || owner {
		t.Fatalf("op-54 after reload: owner %v, %v; want remembered", owner, err)
	}
	if r, ok := op.resp.(*driverv1.PowerOffResponse); !ok || r.Polls != 54 {
		t.Fatalf("op-54 answer after reload: %v", op.resp)
	}
	if _, _, err := tab.begin("op-54", "on on dev"); err == nil {
		t.Fatal("reused id for another action accepted after reload")
	}
	for _, id := range []string{"op-44", "failed", "torn"} {
		if _, owner, _ := tab.begin(id, "off on dev"); !owner {
			t.Fatalf("%s remembered; want forgotten", id)
		}
	}
	if st, err := os.Stat(filepath.Join(dir, opsFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("operations file mode: %v %v", st.Mode(), err)
	}
}

// The repeat of an operation that a later successful operation on the same device superseded is
// refused, not answered from the table: a coordinator restored from a backup resends an off its
// lost successor resolved and then undid (on); "confirmed off" would be a lie about a node that is
// on. Repeats on other devices, and of the device's latest operation, are still answered.
func TestSupersededOperationIsNotAnswered(t *testing.T) {
	tab, err := loadOpTable(t.TempDir(), nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	run := func(id, what string) {
		op, owner, err := tab.begin(id, what)
		if err != nil || !owner {
			t.Fatalf("begin %s: owner %v, %v", id, owner, err)
		}
		tab.finish(id, op, &driverv1.PowerOffResponse{State: driverv1.PowerState_POWER_STATE_OFF}, nil)
	}
	run("f/1/off", "power off on ipmi/bmc-1")
	run("g/0/off", "power off on ipmi/bmc-2")
	run("u/0/on", "power on on ipmi/bmc-1")
	_, _, err = tab.begin("f/1/off", "power off on ipmi/bmc-1")
	if !errors.Is(err, fault.ErrFailedPrecondition) || !strings.Contains(err.Error(), `superseded by the later operation "u/0/on"`) {
		t.Fatalf("repeat of the superseded off: %v; want FailedPrecondition naming u/0/on", err)
	}
	for _, r := range []struct{ id, what string }{{"g/0/off", "power off on ipmi/bmc-2"}, {"u/0/on", "power on on ipmi/bmc-1"}} {
		if _, owner, err := tab.begin(r.id, r.what); err != nil || owner {
			t.Fatalf("repeat of %s: owner %v, %v; want the remembered answer", r.id, owner, err)
		}
	}
}
