package app

import (
	"bytes"
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// termFunctions are the functions only a term's goroutines run: none may be on a stack once the
// term's jobs were waited for.
var termFunctions = []string{
	"coordinator/app.(*termParts).",
	"coordinator/app.(*recordWriter).",
	"coordinator/app.(*App).prune",
	"coordinator/app.(*deviceChecks).",
	"coordinator/app.(*kubeMode).startTerm",
	"coordinator/app.(*kubeMode).startMaintenance",
	"coordinator/fencing.(*Runner).Run",
	"coordinator/loop.(*Loop).Run",
	"coordinator/store.(*AuditWriter).Run",
	"coordinator/kube.(*Reconciler).Run",
	"coordinator/kube.(*RemediationController).Run",
	"coordinator/kube.(*MaintenanceController).Run",
}

// goroutine is one record of the goroutine profile: its count, labels and stack.
type goroutine struct {
	text   string
	labels string
	funcs  []string
}

// goroutines reads the goroutine profile (pprof's debug=1 text: records of identical stacks and
// labels, separated by blank lines), leaving out the goroutine that reads it.
func goroutines() []goroutine {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	var out []goroutine
	for _, rec := range strings.Split(b.String(), "\n\n") {
		g := goroutine{text: rec}
		for _, line := range strings.Split(rec, "\n") {
			if l, ok := strings.CutPrefix(line, "# labels: "); ok {
				g.labels = l
			}
			if f, ok := strings.CutPrefix(line, "#\t0x"); ok {
				if fields := strings.Fields(f); len(fields) >= 2 {
					g.funcs = append(g.funcs, fields[1])
				}
			}
		}
		if len(g.funcs) == 0 || strings.Contains(rec, "runtime/pprof.writeGoroutine") {
			continue
		}
		out = append(out, g)
	}
	return out
}

// outliving lists the goroutines of the group that run the coordinator's code (a goroutine a job
// starts inherits the job's labels: a connection of the replica's driver pool, or its certificate
// watcher, that a job happened to open first carries them too, and is not the term's), and with
// termFuncs every goroutine running a term's function.
func outliving(group string, termFuncs bool) []string {
	var found []string
	for _, g := range goroutines() {
		match := false
		for _, f := range g.funcs {
			match = match || (strings.Contains(g.labels, `"group":"`+group) && strings.HasPrefix(f, "github.com/nodefence/nodefence/coordinator/"))
			for _, tf := range termFunctions {
				match = match || (termFuncs && strings.Contains(f, tf))
			}
		}
		if match {
			found = append(found, g.text)
		}
	}
	return found
}

// No goroutine outlives its term: when a term ends — the leader resigns, or the process stops —
// every goroutine it started (the engine loop, the audit writer, a fence record's run, the device
// checks, the pruning, and whatever those started) has returned before the next campaign, and
// once Run returned nothing the app started runs. A term with a fence record in progress (its
// driver never answers) proves the check sees the term's goroutines at all.
func TestNoGoroutineOutlivesItsTerm(t *testing.T) {
	insecure := tlsfiles.Files{Insecure: true}
	fences := filepath.Join(t.TempDir(), "fence.yaml")
	if err := os.WriteFile(fences, []byte(`drivers:
  ipmi: {endpoint: "127.0.0.1:1"}
templates:
  bmc: {driver: ipmi, parameters: {username: admin, ip: 127.0.0.1}}
nodes:
  node-1: {zone: a, methods: {bmc: {template: bmc, parameters: {password: secret}}}, steps: {power_management: [bmc]}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{
		Server:    server.Config{Listen: "127.0.0.1:0", TLS: insecure, UnauthenticatedCaller: "any", DrainTimeout: time.Second},
		DriverTLS: insecure, FenceConfig: fences, DataDir: t.TempDir(), DeviceCheckInterval: 50 * time.Millisecond,
		EtcdClientListen: "127.0.0.1:0", EtcdPeerListen: "127.0.0.1:0", EtcdUnsafeNoFsync: true, ElectionTTL: 3 * time.Second,
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	leaks := map[int64][]string{} // by the epoch of every term stopped
	a.termStopped = func(epoch int64) {
		l := outliving(termGroup(epoch), true) // the next term has not started: no term function may run
		mu.Lock()
		leaks[epoch] = l
		mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	runCtx, stopRun := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(runCtx) }()
	defer func() { stopRun(); <-done }()
	cc, err := dial.New(a.Addr(), insecure)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cluster, fencer := coordv1.NewClusterServiceClient(cc), coordv1.NewFenceServiceClient(cc)
	leading := func(after int64) int64 {
		t.Helper()
		for {
			gl, err := cluster.GetLeader(ctx, &coordv1.GetLeaderRequest{})
			if term := a.Term(); err == nil && gl.IsSelf && term != nil && term.Epoch > after {
				return term.Epoch
			}
			select {
			case <-ctx.Done():
				t.Fatalf("no leader above epoch %d: %v", after, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	// check waits until the term stopped and fails if any term so far left a goroutine running.
	check := func(epoch int64) {
		t.Helper()
		for {
			mu.Lock()
			_, ok := leaks[epoch]
			for e, l := range leaks {
				if len(l) > 0 {
					mu.Unlock()
					t.Fatalf("%d goroutine(s) of term %d outlived it:\n%s", len(l), e, strings.Join(l, "\n\n"))
				}
			}
			mu.Unlock()
			if ok {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("term %d never stopped", epoch)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	// running waits until a goroutine of the group runs job.
	running := func(group, job string) {
		t.Helper()
		for {
			for _, g := range goroutines() {
				if strings.Contains(g.labels, `"group":"`+group+`"`) && strings.Contains(g.labels, `"job":"`+job) {
					return
				}
			}
			select {
			case <-ctx.Done():
				t.Fatalf("no goroutine of %s runs %s", group, job)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}

	first := leading(0)
	if _, err := fencer.Fence(ctx, &coordv1.FenceRequest{Node: "node-1", Reason: "goroutine test"}); err != nil {
		t.Fatal(err)
	}
	running(termGroup(first), "fence ")
	running(termGroup(first), "engine-loop")
	resign(ctx, t, a)
	check(first)

	second := leading(first)
	running(termGroup(second), "fence ") // the next term resumes the record
	stopRun()
	<-done
	check(second)
	if l := outliving(processGroup, false); len(l) > 0 {
		t.Fatalf("%d goroutine(s) of the process outlived Run:\n%s", len(l), strings.Join(l, "\n\n"))
	}
	if l := outliving("term-", true); len(l) > 0 {
		t.Fatalf("%d goroutine(s) of a term outlived Run:\n%s", len(l), strings.Join(l, "\n\n"))
	}
}

// The app starts no goroutine of its own: every one is a job of the process's or a term's group
// (jobs.go), so that a term's end can wait for all of them. A go statement in the app's non-test
// code fails here.
func TestAppStartsNoGoroutineOutsideItsJobs(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if g, ok := n.(*ast.GoStmt); ok {
				t.Errorf("%s: a go statement; add a job to the term's or the process's group instead (jobs.go)", fset.Position(g.Pos()))
			}
			return true
		})
	}
	if len(files) < 10 {
		t.Fatalf("only %d files: is the test running in coordinator/app?", len(files))
	}
}
