// Command promcheck validates Prometheus rule files with Prometheus' own parser (the checks of
// `promtool check rules`: YAML shape, PromQL expressions, label and annotation templates) and
// prints, as one JSON object, the metric names each file's expressions select. It is a module of
// its own so that Prometheus' dependencies stay out of nodefence's go.mod; the test of
// deploy/monitoring runs it with `go run`.
//
//	go run . FILE...   # {"FILE": ["metric", ...], ...}; exit 1 listing every problem
package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sort"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	p := parser.NewParser(parser.Options{})
	out := map[string][]string{}
	failed := false
	for _, file := range os.Args[1:] {
		groups, errs := rulefmt.ParseFile(file, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
		for _, err := range errs {
			fmt.Fprintf(os.Stderr, "%s: %v\n", file, err)
			failed = true
		}
		if len(errs) > 0 {
			continue
		}
		names := map[string]bool{}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				expr, err := p.ParseExpr(r.Expr)
				if err != nil {
					fmt.Fprintf(os.Stderr, "%s: %s: %v\n", file, r.Alert+r.Record, err)
					failed = true
					continue
				}
				parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
					if vs, ok := n.(*parser.VectorSelector); ok && vs.Name != "" {
						names[vs.Name] = true
					}
					return nil
				})
				if r.Record != "" {
					names["record:"+r.Record] = true
				}
			}
		}
		list := []string{}
		for n := range names {
			list = append(list, n)
		}
		sort.Strings(list)
		out[file] = list
	}
	if failed {
		os.Exit(1)
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}
