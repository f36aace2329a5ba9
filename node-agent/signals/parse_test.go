package signals

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseMemoryStat(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    map[string]uint64
		wantErr string
	}{
		{name: "v1", in: "cache 5\ntotal_inactive_file 1024\n", want: map[string]uint64{"cache": 5, "total_inactive_file": 1024}},
		{name: "no trailing newline", in: "inactive_file 0", want: map[string]uint64{"inactive_file": 0}},
		{name: "max uint64", in: "file 18446744073709551615\n", want: map[string]uint64{"file": 1<<64 - 1}},
		{name: "empty", in: "", wantErr: "empty"},
		{name: "only newline", in: "\n", wantErr: "empty"},
		{name: "blank line inside", in: "a 1\n\nb 2\n", wantErr: "line 2"},
		{name: "two trailing newlines", in: "a 1\n\n", wantErr: "line 2"},
		{name: "missing value", in: "cache\n", wantErr: "line 1"},
		{name: "extra field", in: "cache 1 2\n", wantErr: "line 1"},
		{name: "negative", in: "cache -1\n", wantErr: "cache"},
		{name: "overflow", in: "cache 18446744073709551616\n", wantErr: "out of range"},
		{name: "hex", in: "cache 0x10\n", wantErr: "invalid syntax"},
		{name: "duplicate", in: "cache 1\ncache 2\n", wantErr: "duplicate"},
		{name: "binary garbage", in: "\x00\x01", wantErr: "line 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMemoryStat([]byte(tt.in))
			checkErr(t, err, tt.wantErr)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseMemoryStat(%q) (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

func TestParseMeminfo(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    map[string]uint64
		wantErr string
	}{
		{name: "kB and unitless", in: "MemTotal:       2 kB\nHugePages_Total:       3\nInactive(file):  1 kB\n",
			want: map[string]uint64{"MemTotal": 2048, "HugePages_Total": 3, "Inactive(file)": 1024}},
		{name: "empty", in: "", wantErr: "empty"},
		{name: "no colon", in: "MemTotal 2 kB\n", wantErr: "line 1"},
		{name: "empty key", in: ": 2 kB\n", wantErr: "line 1"},
		{name: "space in key", in: "Mem Total: 2 kB\n", wantErr: "line 1"},
		{name: "no value", in: "MemTotal:\n", wantErr: "line 1"},
		{name: "bad unit", in: "MemTotal: 2 MB\n", wantErr: "unknown unit"},
		{name: "three fields", in: "MemTotal: 2 kB x\n", wantErr: "line 1"},
		{name: "negative", in: "MemTotal: -2 kB\n", wantErr: "MemTotal"},
		{name: "kB overflow", in: "MemTotal: 18446744073709551615 kB\n", wantErr: "overflows"},
		{name: "duplicate", in: "MemTotal: 1 kB\nMemTotal: 1 kB\n", wantErr: "duplicate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMeminfo([]byte(tt.in))
			checkErr(t, err, tt.wantErr)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseMeminfo(%q) (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

func TestParseUint(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr bool
	}{
		{in: "32768\n", want: 32768},
		{in: "0", want: 0},
		{in: "max\n", wantErr: true},
		{in: "", wantErr: true},
		{in: "1\n\n", wantErr: true},
		{in: " 1\n", wantErr: true},
		{in: "-1\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(strings.TrimSpace(tt.in), func(t *testing.T) {
			got, err := ParseUint([]byte(tt.in))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("ParseUint(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestParseLoadavgTasks(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{in: "0.41 0.74 0.57 1/84 15201\n", want: 84},
		{in: "0.41 0.74 0.57 1/84\n", wantErr: true},
		{in: "0.41 0.74 0.57 84 15201\n", wantErr: true},
		{in: "0.41 0.74 0.57 x/84 15201\n", wantErr: true},
		{in: "0.41 0.74 0.57 1/-84 15201\n", wantErr: true},
		{in: "0.41 0.74 0.57 1/ 15201\n", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(strings.TrimSpace(tt.in), func(t *testing.T) {
			got, err := ParseLoadavgTasks([]byte(tt.in))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("ParseLoadavgTasks(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want != "" && err == nil:
		t.Fatalf("no error; want one containing %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("error %q does not contain %q", err, want)
	}
}

func FuzzParseMemoryStat(f *testing.F) {
	f.Add([]byte("cache 5\ntotal_inactive_file 1024\n"))
	f.Add([]byte("a 1\n\n"))
	f.Add([]byte("file 18446744073709551616"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseMemoryStat(data)
		if err == nil && len(m) == 0 {
			t.Fatalf("no error and no keys for %q", data)
		}
	})
}

func FuzzParseMeminfo(f *testing.F) {
	f.Add([]byte("MemTotal:       16777216 kB\nHugePages_Total:       0\n"))
	f.Add([]byte("MemTotal: 18446744073709551615 kB\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseMeminfo(data)
		if err == nil && len(m) == 0 {
			t.Fatalf("no error and no keys for %q", data)
		}
	})
}

func FuzzParseLoadavgTasks(f *testing.F) {
	f.Add([]byte("0.41 0.74 0.57 1/84 15201\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if n, err := ParseLoadavgTasks(data); err == nil && n < 0 {
			t.Fatalf("negative task count %d for %q", n, data)
		}
	})
}

func FuzzParseUint(f *testing.F) {
	f.Add([]byte("32768\n"))
	f.Add([]byte("max\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = ParseUint(data)
	})
}
