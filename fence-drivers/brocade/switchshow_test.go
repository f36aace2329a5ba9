package brocade

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

const fixedPorts = `switchName:	sw0
switchType:	71.2
zoning:		OFF

Index Port Address Media Speed State     Proto
==============================================
  0   0   010000   id    N8   Online      FC  F-Port  10:00:00:00:c9:00:00:00
  1   1   010100   id    N8   No_Light    FC  Disabled (Persistent)
  2   2   010200   --    N8   No_Module   FC
 10  10   010a00   id    N16  In_Sync     FC  Disabled
`

const director = `Index Slot Port Address Media Speed State     Proto
=====================================================
  16    2    0   011000   id    N8   Online      FC  F-Port  10:00:00:00:c9:00:00:00
  17    2    1   011100   id    N8   No_Light    FC  Disabled (Persistent)
`

func TestParseSwitchshow(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want []PortRow
		err  bool
	}{
		{"fixed ports", fixedPorts, []PortRow{{0, "Online", false}, {1, "No_Light", true}, {2, "No_Module", false}, {10, "In_Sync", true}}, false},
		{"director with slots", director, []PortRow{{16, "Online", false}, {17, "No_Light", true}}, false},
		{"a short rule is not the table rule", "Index Port Address Media Speed State Proto\r\n=====\r\n\r\n  3 3 010300 id N8 Online FC\r\n   \r\n", nil, true},
		{"CRLF", "Index Port Address Media Speed State Proto\r\n==========\r\n  3 3 010300 id N8 Online FC\r\n  \r\n", []PortRow{{3, "Online", false}}, false},
		{"no table", "rbash: switchshow: command not found\n", nil, true},
		{"empty", "", nil, true},
		{"Disabled in another column is not the flag", "Index Port Address Media Speed State Proto\n==========\n 4 4 010400 id N8 Disabled FC F-Port\n", []PortRow{{4, "Disabled", false}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSwitchshow(tc.in)
			if (err != nil) != tc.err {
				t.Fatalf("err = %v, want error %v", err, tc.err)
			}
			if err == nil {
				if d := cmp.Diff(tc.want, got); d != "" {
					t.Fatalf("rows (-want +got):\n%s", d)
				}
			}
		})
	}
}

func FuzzParseSwitchshow(f *testing.F) {
	f.Add(fixedPorts)
	f.Add(director)
	f.Add("=========\n1 2 3 4 5 6 7 Disabled")
	f.Fuzz(func(t *testing.T, s string) {
		rows, err := ParseSwitchshow(s)
		if err != nil && rows != nil {
			t.Fatal("rows with an error")
		}
		for _, r := range rows {
			if r.Index < 0 {
				t.Fatalf("negative index %d", r.Index)
			}
		}
	})
}
