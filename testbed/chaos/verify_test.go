package chaos

import (
	"os"
	"path/filepath"
	"testing"
)

// The driver-log checker finds a stale epoch: a device that ran epoch 5 then ran epoch 4.
func TestDriverOpsOrderAndStaleEpoch(t *testing.T) {
	log := `fence-driver ipmi serving on 10.213.0.15:7101
{"time":"2026-11-24T14:00:02Z","level":"INFO","msg":"fence operation","action":"off","operation_id":"b","epoch":5,"device":"ipmi/x","result":"ok","elapsed":1000000000}
{"time":"2026-11-24T14:00:03Z","level":"WARN","msg":"fence operation","action":"off","operation_id":"c","epoch":3,"device":"ipmi/x","result":"rejected","elapsed":1000}
{"time":"2026-11-24T14:00:04Z","level":"INFO","msg":"fence operation repeated","action":"off","operation_id":"b","epoch":5,"device":"ipmi/x"}
{"time":"2026-11-24T14:00:05Z","level":"INFO","msg":"fence operation","action":"off","operation_id":"d","epoch":4,"device":"ipmi/x","result":"ok","elapsed":1000}
`
	p := filepath.Join(t.TempDir(), "driver.log")
	if err := os.WriteFile(p, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	ops, err := driverOps(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 3 || ops[0].OperationID != "b" || ops[2].OperationID != "d" {
		t.Fatalf("ops = %+v; want b, c, d by start time", ops)
	}
	if n := staleEpochs(ops, func(string, ...any) {}); n != 1 {
		t.Fatalf("stale-epoch calls = %d, want 1 (d ran epoch 4 after b ran 5; c was rejected)", n)
	}
}
