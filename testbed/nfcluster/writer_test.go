package nfcluster

import (
	"strings"
	"testing"
)

func TestCheckOneWriter(t *testing.T) {
	for _, tc := range []struct {
		name, log string
		episodes  int
		err       string
	}{
		{name: "one pod", log: "start a node-2 found=0\na 0 node-2\na 1 node-2", episodes: 1},
		{name: "handover", log: "start a node-2 found=0\na 0 node-2\na 1 node-2\nstart b node-1 found=3\nb 0 node-1", episodes: 2},
		{name: "old writer after new start", log: "start a node-2 found=0\na 0 node-2\nstart b node-1 found=2\na 1 node-2\nb 0 node-1",
			err: "line 4: two writers: pod a (on node-2) wrote after pod b (on node-1) started at line 3"},
		{name: "interleaved", log: "start a n2 found=0\nstart b n1 found=1\nb 0 n1\na 1 n2", err: "line 4: two writers"},
		{name: "no start", log: "a 0 node-2", err: "line 1: pod a writes without a start line"},
		{name: "gap", log: "start a n found=0\na 0 n\na 2 n", err: "line 3: pod a sequence \"2\", want 1"},
		{name: "restart", log: "start a n found=0\nstart a n found=1", err: "line 2: pod a starts twice"},
		{name: "garbage", log: "start a n found=0\nhello", err: `line 2: unreadable "hello"`},
		{name: "torn line", log: "start a n found=0\na 0", err: "line 2: unreadable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eps, err := CheckOneWriter(strings.Split(tc.log, "\n"))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(eps) != tc.episodes {
				t.Fatalf("%d episodes, want %d: %+v", len(eps), tc.episodes, eps)
			}
		})
	}
}

func TestCheckOneWriterEpisodes(t *testing.T) {
	eps, err := CheckOneWriter(strings.Split("start a node-2 found=0\na 0 node-2\na 1 node-2\nstart b node-1 found=3\nb 0 node-1", "\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Episode{{UID: "a", Node: "node-2", Found: 0, First: 0, Last: 2, Lines: 2}, {UID: "b", Node: "node-1", Found: 3, First: 3, Last: 4, Lines: 1}}
	for i := range want {
		if eps[i] != want[i] {
			t.Errorf("episode %d = %+v, want %+v", i, eps[i], want[i])
		}
	}
}
