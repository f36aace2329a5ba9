package kit

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/durationpb"

	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"
)

var testDesc = []*driverv1.Parameter{
	{Name: "ip", Aliases: []string{"ipaddr"}, Required: true, Type: TypeString},
	{Name: "ipport", Type: TypeInteger, Default: "623"},
	{Name: "password", Aliases: []string{"passwd"}, Secret: true, Type: TypeString},
	{Name: "lanplus", Type: TypeBoolean, Default: "1"},
	{Name: "snmp_priv_passwd", Type: TypeString},
}

func TestCanonicalize(t *testing.T) {
	tests := []struct {
		name    string
		in      map[string]string
		want    map[string]string
		wantErr []string // field names in the fault.Invalid
	}{
		{
			name: "aliases, defaults, normalised names",
			in:   map[string]string{"IPADDR": "10.0.0.1", "passwd": "s", "snmp-priv-passwd": "p", "plug": "3"},
			want: map[string]string{"ip": "10.0.0.1", "ipport": "623", "password": "s", "lanplus": "1", "snmp_priv_passwd": "p", "plug": "3"},
		},
		{
			name: "booleans",
			in:   map[string]string{"ip": "h", "lanplus": "off"},
			want: map[string]string{"ip": "h", "ipport": "623", "lanplus": "0"},
		},
		{
			name: "same value under two names is fine",
			in:   map[string]string{"ip": "h", "ipaddr": "h"},
			want: map[string]string{"ip": "h", "ipport": "623", "lanplus": "1"},
		},
		{name: "missing required", in: map[string]string{"ipport": "1"}, wantErr: []string{"ip"}},
		{name: "empty required", in: map[string]string{"ip": " "}, wantErr: []string{"ip"}},
		{name: "conflicting aliases", in: map[string]string{"ip": "a", "ipaddr": "b"}, wantErr: []string{"ip"}},
		{
			name:    "bad types, all reported",
			in:      map[string]string{"ip": "h", "ipport": "x", "lanplus": "maybe"},
			wantErr: []string{"ipport", "lanplus"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonicalize(tt.in, testDesc)
			var inv fault.Invalid
			if tt.wantErr != nil {
				if !errors.As(err, &inv) {
					t.Fatalf("err = %v, want fault.Invalid", err)
				}
				var fields []string
				for _, e := range inv {
					fields = append(fields, e.Field)
				}
				if diff := cmp.Diff(tt.wantErr, fields); diff != "" {
					t.Errorf("invalid fields (-want +got):\n%s", diff)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Canonicalize (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMaskedHidesSecrets(t *testing.T) {
	got := Masked(map[string]string{"ip": "h", "password": "a", "passwd": "b", "community": "c", "snmp_priv_passwd": "d"}, testDesc)
	want := map[string]string{"ip": "h", "password": "***", "passwd": "***", "community": "***", "snmp_priv_passwd": "***"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Masked (-want +got):\n%s", diff)
	}
}

func TestEpochStorePersists(t *testing.T) {
	dir := t.TempDir()
	s, err := loadEpochs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.observe("dev", 5); err != nil {
		t.Fatal(err)
	}
	if _, err := s.observe("dev", 4); !errors.Is(err, fault.ErrStaleEpoch) {
		t.Fatalf("observe lower epoch = %v, want ErrStaleEpoch", err)
	}
	s2, err := loadEpochs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.check("dev", 4); !errors.Is(err, fault.ErrStaleEpoch) {
		t.Fatalf("after reload, epoch 4 = %v, want ErrStaleEpoch", err)
	}
	if err := s2.check("other", 1); err != nil {
		t.Fatalf("other device: %v", err)
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, "*.tmp-*"))
	if len(leftovers) != 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
	if err := os.WriteFile(filepath.Join(dir, epochFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadEpochs(dir); err == nil {
		t.Error("a corrupt epochs file was accepted")
	}
}

// fakeDriver is an in-memory device; hang makes every call ignore its context for that long.
type fakeDriver struct {
	mu       sync.Mutex
	on       bool
	hang     time.Duration
	failed   int // remaining PowerOff calls that fail
	offs     int
	parses   int // Parse calls
	unparsed int // PowerOff and Status calls whose target did not carry the parsed parameters
}

// fakeParams is the fake driver's typed form of a target.
type fakeParams struct{ ip string }

func (f *fakeDriver) Parse(p map[string]string) (any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.parses++
	return fakeParams{ip: p["ip"]}, nil
}

func (f *fakeDriver) sawParsed(t Target) {
	if fp, ok := t.Parsed.(fakeParams); !ok || fp.ip != t.Params["ip"] {
		f.unparsed++
	}
}

func (*fakeDriver) Name() string                            { return "fake" }
func (*fakeDriver) Describe() []*driverv1.Parameter         { return testDesc }
func (*fakeDriver) DeviceKey(t Target) string               { return "fake/" + t.Params["ip"] }
func (f *fakeDriver) PowerOn(context.Context, Target) error { f.set(true); return nil }
func (f *fakeDriver) PowerOff(ctx context.Context, t Target) error {
	time.Sleep(f.hang) // deliberately deaf to ctx
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sawParsed(t)
	f.offs++
	if f.failed > 0 {
		f.failed--
		return errors.New("device said no")
	}
	f.on = false
	return nil
}
func (f *fakeDriver) set(on bool) { f.mu.Lock(); f.on = on; f.mu.Unlock() }
func (f *fakeDriver) Status(_ context.Context, t Target) (driverv1.PowerState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sawParsed(t)
	if f.on {
		return driverv1.PowerState_POWER_STATE_ON, nil
	}
	return driverv1.PowerState_POWER_STATE_OFF, nil
}

func newTestService(t *testing.T, d Driver) *Service {
	t.Helper()
	s, err := NewService(d, Options{StateDir: t.TempDir(), PollInterval: 10 * time.Millisecond, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func offReq(id string, timeout time.Duration) *driverv1.PowerOffRequest {
	return &driverv1.PowerOffRequest{OperationId: id, Epoch: 1, Timeout: durationpb.New(timeout),
		Target: &driverv1.Target{Name: "n", Parameters: map[string]string{"ip": "h", "password": "secret"}}}
}

func TestDeadlineEnforcedOnDeafDriver(t *testing.T) {
	d := &fakeDriver{on: true, hang: 2 * time.Second}
	s := newTestService(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := s.PowerOff(ctx, offReq("a", 300*time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PowerOff on a deaf driver = %v, want DeadlineExceeded", err)
	}
	if el := time.Since(start); el > 400*time.Millisecond {
		t.Errorf("returned after %s with a 300ms timeout", el)
	}
}

func TestFailedOperationIsRetried(t *testing.T) {
	d := &fakeDriver{on: true, failed: 1}
	s := newTestService(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.PowerOff(ctx, offReq("a", time.Second)); err == nil || !strings.Contains(err.Error(), "device said no") {
		t.Fatalf("first PowerOff = %v, want the device's error", err)
	}
	resp, err := s.PowerOff(ctx, offReq("a", time.Second))
	if err != nil || resp.GetState() != driverv1.PowerState_POWER_STATE_OFF {
		t.Fatalf("retried PowerOff = %v, %v", resp, err)
	}
	if _, err := s.PowerOff(ctx, offReq("a", time.Second)); err != nil {
		t.Fatal(err)
	}
	if d.offs != 2 {
		t.Errorf("device asked %d times, want 2 (failure retried, success remembered)", d.offs)
	}
}

func TestKeyPart(t *testing.T) {
	for in, want := range map[string]string{
		"7": "7", "07": "7", " 007 ": "7", "0": "0", "00": "0", "161": "161",
		"outlet 7": "outlet 7", " db-01 ": "db-01", "-7": "-7", "7a": "7a", "": "",
		"99999999999999999999": "99999999999999999999", // beyond uint63: kept as written
	} {
		if got := KeyPart(in); got != want {
			t.Errorf("KeyPart(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseSeconds(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{"2", 2 * time.Second, ""}, {" 0.5 ", 500 * time.Millisecond, ""}, {"250ms", 250 * time.Millisecond, ""},
		{"60", time.Minute, ""}, {"61", 0, "between 10ms and 1m0s"}, {"0.001", 0, "between"}, {"-1", 0, "between"},
		{"", 0, "must be seconds"}, {"soon", 0, `got "soon"`}, {"NaN", 0, "between"}, {"+Inf", 0, "between"}, {"1e300", 0, "between"},
	} {
		got, err := ParseSeconds(tc.in, 10*time.Millisecond, time.Minute)
		if tc.err == "" && (err != nil || got != tc.want) {
			t.Errorf("ParseSeconds(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("ParseSeconds(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
		}
	}
}

// The epoch table stays bounded: past its size the lowest epoch is forgotten into the floor, and a
// forgotten device still refuses what it refused before.
func TestEpochStoreBounded(t *testing.T) {
	dir := t.TempDir()
	s, err := loadEpochs(dir)
	if err != nil {
		t.Fatal(err)
	}
	s.max = 3
	for i, dev := range []string{"a", "b", "c", "d", "e"} {
		if _, err := s.observe(dev, int64(10+i)); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.epochs) != 3 || s.floor != 11 {
		t.Fatalf("table %v floor %d, want 3 devices and floor 11", s.epochs, s.floor)
	}
	s2, err := loadEpochs(dir)
	if err != nil {
		t.Fatal(err)
	}
	for dev, stale := range map[string]int64{"a": 9, "b": 10, "new": 10, "e": 13} {
		if err := s2.check(dev, stale); !errors.Is(err, fault.ErrStaleEpoch) {
			t.Errorf("after reload, %s at epoch %d = %v, want ErrStaleEpoch", dev, stale, err)
		}
	}
	if err := s2.check("new", 11); err != nil {
		t.Errorf("a new device at the floor: %v", err)
	}
}

// Only the coordinator's calls reach a device or record an epoch: a call authorized as anyone else
// (the server's policy refuses it first; this is the kit's own guarantee) with a huge epoch is
// refused, the device is untouched, and the coordinator's low epoch still works afterwards.
func TestOnlyTheCoordinatorRecordsEpochs(t *testing.T) {
	d := &fakeDriver{on: true}
	s := newTestService(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	evil := offReq("evil", time.Second)
	evil.Epoch = math.MaxInt64
	for _, role := range []identity.Role{identity.Operator, identity.Agent, identity.Viewer, identity.Driver} {
		_, err := s.PowerOff(identity.With(ctx, identity.Identity{Role: role, Name: "x"}), evil)
		if !errors.Is(err, fault.ErrPermissionDenied) {
			t.Fatalf("%s: %v, want ErrPermissionDenied", role, err)
		}
	}
	if d.offs != 0 {
		t.Fatalf("device asked %d times by refused callers", d.offs)
	}
	resp, err := s.PowerOff(identity.With(ctx, identity.Identity{Role: identity.Coordinator, Name: "c1"}), offReq("good", time.Second))
	if err != nil || resp.GetState() != driverv1.PowerState_POWER_STATE_OFF {
		t.Fatalf("the coordinator's PowerOff with epoch 1: %v, %v (an attacker's epoch was recorded?)", resp, err)
	}
}

func TestTargetIsParsedOncePerRequest(t *testing.T) {
	d := &fakeDriver{on: true}
	s := newTestService(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.PowerOff(ctx, offReq("once", 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.parses != 1 {
		t.Errorf("Parse ran %d times for one PowerOff (with its status read-backs), want 1", d.parses)
	}
	if d.unparsed != 0 {
		t.Errorf("%d driver calls got a target without its parsed parameters", d.unparsed)
	}
}
