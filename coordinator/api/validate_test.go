//lint:file-ignore SA1019 the tests check that the deprecated GetNodeRequest.name is still accepted

package api

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

func TestValidate(t *testing.T) {
	long := strings.Repeat("x", MaxText+1)
	for _, c := range []struct {
		req   proto.Message
		field string // "" = valid
	}{
		{&coordv1.FenceRequest{Node: "n-1", Reason: "maintenance"}, ""},
		{&coordv1.FenceRequest{}, "node"},
		{&coordv1.FenceRequest{Node: strings.Repeat("a", 300*1024)}, "node"},
		{&coordv1.FenceRequest{Node: "N_1"}, "node"},
		{&coordv1.FenceRequest{Node: "n", Reason: long}, "reason"},
		{&coordv1.FenceRequest{Node: "n", Method: "watchdog"}, ""},
		{&coordv1.FenceRequest{Node: "n", Method: "ipmi"}, "method"},
		{&coordv1.UnfenceRequest{Node: "n", Reason: "\xff"}, "reason"},
		{&coordv1.AcknowledgeRequest{Node: "n", Force: true}, "reason"},
		{&coordv1.AcknowledgeRequest{Node: "n", Operator: long}, "operator"},
		{&coordv1.GetFenceRequest{Id: "n-20261124T120000.000000000"}, ""},
		{&coordv1.GetFenceRequest{Id: "../x"}, "id"},
		{&coordv1.ListFencesRequest{Status: 9}, "status"},
		{&coordv1.ListFencesRequest{Limit: -1}, "limit"},
		{&coordv1.ListFencesRequest{Node: "a/b"}, "node"},
		{&coordv1.WatchFenceRequest{}, "id"},
		{&coordv1.WatchFenceRequest{Node: "n"}, ""},
		{&coordv1.GetNodeRequest{}, "node"},
		{&coordv1.GetNodeRequest{Node: "n"}, ""},
		{&coordv1.GetNodeRequest{Name: "n"}, ""},
		{&coordv1.GetNodeRequest{Name: "n", Node: "n"}, ""},
		{&coordv1.GetNodeRequest{Name: "m", Node: "n"}, "name"},
		{&coordv1.GetNodeRequest{Name: "N_1"}, "node"},
		{&coordv1.CheckNodeRequest{Node: "n-1"}, ""},
		{&coordv1.RebootRequest{Node: "n-1", Reason: "r"}, ""},
		{&coordv1.RebootRequest{}, "node"},
		{&coordv1.RebootRequest{Node: "n", Reason: long}, "reason"},
		{&coordv1.CheckNodeRequest{}, "node"},
		{&coordv1.CheckNodeRequest{Node: strings.Repeat("a", 300)}, "node"},
		{&coordv1.GetConfigRequest{}, ""},
		{&coordv1.PauseEvictionsRequest{Reason: long}, "reason"},
		{&coordv1.ListAuditRequest{AfterRevision: -1}, "after_revision"},
		{&coordv1.ListAuditRequest{Limit: 5001}, "limit"},
		{&coordv1.ListNodesRequest{}, ""},
	} {
		err := Validate(c.req)
		if c.field == "" {
			if err != nil {
				t.Errorf("%T %v: %v, want valid", c.req, c.req, err)
			}
			continue
		}
		if fault.Code(err).String() != "InvalidArgument" || !strings.Contains(err.Error(), c.field+":") {
			t.Errorf("%T: %v, want InvalidArgument naming %s", c.req, err, c.field)
		}
	}
}

// FuzzValidate decodes arbitrary bytes as every request type: Validate never panics, and whatever
// it accepts is within bounds.
func FuzzValidate(f *testing.F) {
	for _, m := range []proto.Message{
		&coordv1.FenceRequest{Node: "n-1", Reason: "r"}, &coordv1.AcknowledgeRequest{Node: "n", Force: true, Reason: "r"},
		&coordv1.ListFencesRequest{Node: "n", Status: 2, Limit: 5}, &coordv1.ListAuditRequest{Node: "n", Limit: 3},
		&coordv1.WatchFenceRequest{Id: "n-1"},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	types := []func() proto.Message{
		func() proto.Message { return &coordv1.FenceRequest{} }, func() proto.Message { return &coordv1.UnfenceRequest{} },
		func() proto.Message { return &coordv1.AcknowledgeRequest{} }, func() proto.Message { return &coordv1.GetFenceRequest{} },
		func() proto.Message { return &coordv1.ListFencesRequest{} }, func() proto.Message { return &coordv1.WatchFenceRequest{} },
		func() proto.Message { return &coordv1.GetNodeRequest{} }, func() proto.Message { return &coordv1.PauseEvictionsRequest{} },
		func() proto.Message { return &coordv1.ListAuditRequest{} }, func() proto.Message { return &coordv1.CheckNodeRequest{} },
		func() proto.Message { return &coordv1.RebootRequest{} },
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, mk := range types {
			m := mk()
			if proto.Unmarshal(b, m) != nil {
				continue
			}
			if Validate(m) != nil {
				continue
			}
			var texts, names []string
			switch r := m.(type) {
			case *coordv1.FenceRequest:
				names, texts = []string{r.Node}, []string{r.Reason}
			case *coordv1.UnfenceRequest:
				names, texts = []string{r.Node}, []string{r.Reason}
			case *coordv1.RebootRequest:
				names, texts = []string{r.Node}, []string{r.Reason}
			case *coordv1.AcknowledgeRequest:
				names, texts = []string{r.Node}, []string{r.Reason, r.Operator}
			case *coordv1.GetNodeRequest:
				names = []string{NodeName(r)}
				if r.Name != "" && r.Node != "" && r.Name != r.Node {
					t.Fatalf("accepted node %q and name %q", r.Node, r.Name)
				}
			case *coordv1.CheckNodeRequest:
				names = []string{r.Node}
			case *coordv1.PauseEvictionsRequest:
				texts = []string{r.Reason}
			case *coordv1.ListFencesRequest:
				if _, ok := coordv1.FenceStatus_name[int32(r.Status)]; !ok || r.Limit < 0 || r.Limit > maxListFences {
					t.Fatalf("accepted %v", r)
				}
			case *coordv1.GetFenceRequest:
				if len(r.Id) > identity.MaxName+40 {
					t.Fatalf("accepted an id of %d bytes", len(r.Id))
				}
			}
			for _, n := range names {
				if identity.ValidName(n) != nil {
					t.Fatalf("%T accepted node name %q", m, n)
				}
			}
			for _, s := range texts {
				if len(s) > MaxText {
					t.Fatalf("%T accepted %d bytes of text", m, len(s))
				}
			}
		}
	})
}
