package flagdoc

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseHelp(t *testing.T) {
	help := "Usage of x:\n" +
		"  -a\tone letter, same line\n" +
		"  -grace duration\n" +
		"    \tnode-monitor grace period (default 50s)\n" +
		"  -hard value\n" +
		"    \tthresholds (repeatable)\n" +
		"    \tsecond line (default memory.available<100Mi)\n" +
		"  -name string\n" +
		"    \ta name (default \"x|y\")\n" +
		"  -on\n" +
		"    \ta switch (default true)\n"
	got := ParseHelp(help)
	want := []Flag{
		{Name: "a", Usage: "one letter, same line"},
		{Name: "grace", Type: "duration", Usage: "node-monitor grace period", Default: "50s"},
		{Name: "hard", Type: "value", Usage: "thresholds (repeatable) second line", Default: "memory.available<100Mi"},
		{Name: "name", Type: "string", Usage: "a name", Default: "x|y"},
		{Name: "on", Usage: "a switch", Default: "true"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseHelp:\n got %+v\nwant %+v", got, want)
	}
	table := Render(got)
	for _, s := range []string{"| `--a` | bool |  | one letter, same line |", "| `--name` | string | `x\\|y` | a name |", "| `--on` | bool | `true` | a switch |"} {
		if !strings.Contains(table, s) {
			t.Errorf("Render: no %q in\n%s", s, table)
		}
	}
}

func TestSplice(t *testing.T) {
	page := "# T\n\nprose\n" + BeginMarker + "\nold\n" + EndMarker + "\nafter\n"
	got, err := Splice(page, "new")
	if err != nil || got != "# T\n\nprose\n"+BeginMarker+"\nnew\n"+EndMarker+"\nafter\n" {
		t.Fatalf("Splice: %q, %v", got, err)
	}
	if _, err := Splice("no markers", "new"); err == nil {
		t.Fatal("Splice without markers: no error")
	}
}
