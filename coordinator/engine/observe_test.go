package engine

import (
	"strings"
	"testing"
)

func TestParseFenceMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want FenceMode
		err  string
	}{
		{"enforce", FenceModeEnforce, ""},
		{"observe", FenceModeObserve, ""},
		{"", FenceModeEnforce, `fence mode "": want observe or enforce`},
		{"Observe", FenceModeEnforce, `fence mode "Observe"`},
		{"observe ", FenceModeEnforce, `fence mode "observe "`},
		{strings.Repeat("x", 100), FenceModeEnforce, "...\": want observe or enforce"},
	} {
		got, err := ParseFenceMode(tc.in)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("ParseFenceMode(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseFenceMode(%q) error %v; want one containing %q", tc.in, err, tc.err)
		}
	}
}

// FuzzParseFenceMode: any input either parses to one of the two modes, round-tripping through
// String, or fails with an error naming the field; nothing panics and the error stays bounded (the
// value is clipped to 64 bytes before it is quoted).
func FuzzParseFenceMode(f *testing.F) {
	for _, s := range []string{"enforce", "observe", "", "OBSERVE", "observe\x00", strings.Repeat("é", 70)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseFenceMode(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fence mode ") || len(err.Error()) > 400 {
				t.Fatalf("error %q", err)
			}
			return
		}
		if m.String() != s {
			t.Fatalf("%q parsed to %v", s, m)
		}
	})
}
