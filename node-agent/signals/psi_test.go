package signals

import (
	"strings"
	"testing"
)

func TestParsePSI(t *testing.T) {
	got, err := ParsePSI(strings.NewReader("some avg10=1.50 avg60=0.20 avg300=0.00 total=12345\nfull avg10=0.25 avg60=0.00 avg300=0.00 total=99\n"))
	if err != nil || got["some"].Avg10 != 1.5 || got["full"].Total != 99 {
		t.Fatalf("ParsePSI = %+v, %v", got, err)
	}
	for _, bad := range []string{
		"",
		"full avg10=0.00 avg60=0.00 avg300=0.00 total=0",
		"some avg10=0.00 avg60=0.00 avg300=0.00",
		"some avg10=x avg60=0.00 avg300=0.00 total=0",
		"some avg10=101 avg60=0.00 avg300=0.00 total=0",
		"some avg10=0.00 avg60=0.00 avg300=0.00 total=-1",
		"what avg10=0.00 avg60=0.00 avg300=0.00 total=0",
		"some avg10 avg60=0.00 avg300=0.00 total=0",
		"some avg10=0 avg60=0 avg300=0 total=0\nsome avg10=0 avg60=0 avg300=0 total=0",
	} {
		if _, err := ParsePSI(strings.NewReader(bad)); err == nil {
			t.Errorf("ParsePSI(%q) accepted", bad)
		}
	}
}

func FuzzParsePSI(f *testing.F) {
	f.Add("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParsePSI(strings.NewReader(s))
		if err == nil {
			for _, p := range m {
				if p.Avg10 < 0 || p.Avg10 > 100 {
					t.Fatalf("accepted avg10 %v", p.Avg10)
				}
			}
		}
	})
}

// On this host's kernel, /proc/pressure exists: the PSI signals are there and in range.
func TestPSISignalsOnThisHost(t *testing.T) {
	sigs, err := Reader{}.PSISignals()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, s := range sigs {
		names[s.Name] = true
		if s.Available < 0 || s.Available > s.Capacity || s.Capacity != psiScale {
			t.Errorf("%s = %d of %d", s.Name, s.Available, s.Capacity)
		}
	}
	if !names["psi.memory.some"] || !names["psi.memory.full"] || !names["psi.cpu.some"] {
		t.Fatalf("PSI signals %v", names)
	}
}
