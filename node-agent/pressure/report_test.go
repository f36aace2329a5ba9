package pressure

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nodefence/nodefence/coordinator/agentwire"
	"github.com/nodefence/nodefence/node-agent/eviction"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// A report the coordinator refuses would end the stream at every resend: whatever message the
// Eviction API returned, the report the agent builds passes the coordinator's validation.
func TestEvictionReportPassesTheCoordinatorsValidation(t *testing.T) {
	c := eviction.Candidate{Namespace: "default", Name: "web-0", UID: "8d3c0c1e-1f0b-4c53-9d1a-1c2b3d4e5f60", GracePeriod: time.Second}
	for _, msg := range []string{"", "The node was low on resource: memory.", strings.Repeat("é", 3000), "bad \xff utf-8", strings.Repeat("x", 1023) + "€"} {
		m := EvictionReport(c, "memory.available", agentv1.EvictionKind_EVICTION_KIND_FAILED, msg, time.Unix(1e9, 0))
		got := m.GetEviction().GetMessage()
		if len(got) > agentwire.MaxText || !utf8.ValidString(got) {
			t.Errorf("message of %d bytes (valid UTF-8: %v)", len(got), utf8.ValidString(got))
		}
		if err := agentwire.ValidateEvent(m); err != nil {
			t.Errorf("message %.20q...: the coordinator refuses the report: %v", msg, err)
		}
	}
	if maxReportMessage != agentwire.MaxText {
		t.Errorf("maxReportMessage = %d, the coordinator's cap is %d", maxReportMessage, agentwire.MaxText)
	}
}
