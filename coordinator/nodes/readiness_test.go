package nodes

import (
	"testing"
	"testing/quick"
	"time"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

func TestJudge(t *testing.T) {
	start := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	grace := 40 * time.Second
	for _, tc := range []struct {
		name string
		obs  Observation
		now  time.Time
		want coordv1.Readiness
	}{
		{"fresh contact", Observation{LastContact: start.Add(time.Minute), GraceFloor: start}, start.Add(70 * time.Second), coordv1.Readiness_READINESS_READY},
		{"silent exactly grace", Observation{LastContact: start.Add(time.Minute), GraceFloor: start}, start.Add(100 * time.Second), coordv1.Readiness_READINESS_READY},
		{"silent past grace", Observation{LastContact: start.Add(time.Minute), GraceFloor: start}, start.Add(101 * time.Second), coordv1.Readiness_READINESS_UNKNOWN},
		{"never seen, startup grace", Observation{GraceFloor: start}, start.Add(39 * time.Second), coordv1.Readiness_READINESS_READY},
		{"never seen, after grace", Observation{GraceFloor: start}, start.Add(41 * time.Second), coordv1.Readiness_READINESS_UNKNOWN},
		{"silent before failover gets fresh grace", Observation{LastContact: start.Add(-time.Hour), GraceFloor: start}, start.Add(30 * time.Second), coordv1.Readiness_READINESS_READY},
		{"shutting down", Observation{LastContact: start, GraceFloor: start, ShuttingDown: true}, start, coordv1.Readiness_READINESS_NOT_READY},
		{"shutting down within grace", Observation{LastContact: start, GraceFloor: start, ShuttingDown: true}, start.Add(40 * time.Second), coordv1.Readiness_READINESS_NOT_READY},
		{"shutting down then silent becomes unknown", Observation{LastContact: start, GraceFloor: start, ShuttingDown: true}, start.Add(41 * time.Second), coordv1.Readiness_READINESS_UNKNOWN},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, reason := Judge(tc.obs, tc.now, grace)
			if got != tc.want {
				t.Fatalf("Judge = %s (%s), want %s", got, reason, tc.want)
			}
		})
	}
}

// zoneStateReference is the seed's rule written as plainly as possible, in exact integer arithmetic
// for a threshold of percent/100.
func zoneStateReference(ready, notReady, percent int) coordv1.ZoneState {
	if ready == 0 && notReady > 0 {
		return coordv1.ZoneState_ZONE_STATE_FULL_DISRUPTION
	}
	if notReady > 2 {
		total := ready + notReady
		if notReady*100 >= percent*total {
			return coordv1.ZoneState_ZONE_STATE_PARTIAL_DISRUPTION
		}
	}
	return coordv1.ZoneState_ZONE_STATE_NORMAL
}

func TestZoneStateOfMatchesReference(t *testing.T) {
	f := func(r, n uint8) bool {
		ready, notReady := int(r%60), int(n%60)
		return ZoneStateOf(ready, notReady, 0.55) == zoneStateReference(ready, notReady, 55)
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 5000}); err != nil {
		t.Fatal(err)
	}
	// The seed's boundaries, spelled out.
	for _, tc := range []struct {
		ready, notReady int
		want            coordv1.ZoneState
	}{
		{0, 0, coordv1.ZoneState_ZONE_STATE_NORMAL},
		{0, 1, coordv1.ZoneState_ZONE_STATE_FULL_DISRUPTION},
		{1, 2, coordv1.ZoneState_ZONE_STATE_NORMAL},              // notReady == 2 is never partial
		{2, 3, coordv1.ZoneState_ZONE_STATE_PARTIAL_DISRUPTION},  // 60%
		{9, 11, coordv1.ZoneState_ZONE_STATE_PARTIAL_DISRUPTION}, // exactly 55%
		{10, 11, coordv1.ZoneState_ZONE_STATE_NORMAL},            // 52%
	} {
		if got := ZoneStateOf(tc.ready, tc.notReady, 0.55); got != tc.want {
			t.Errorf("ZoneStateOf(%d, %d) = %s, want %s", tc.ready, tc.notReady, got, tc.want)
		}
	}
}
