package main

import (
	"fmt"
	"slices"
	"strings"
)

// didYouMean returns `; did you mean "x"?` naming the candidates nearest to word, or "" when none
// is near: at most one edit away for words of up to four letters, two for longer ones (insertions,
// deletions, substitutions and swaps of neighbours, as a typist makes them), or a word that word
// begins. Several equally near are all named, in the candidates' order.
func didYouMean(word string, candidates []string) string {
	best, names := -1, []string(nil)
	limit := 1
	if len(word) > 4 {
		limit = 2
	}
	for _, c := range candidates {
		if c == word || c == "" {
			continue
		}
		d := editDistance(word, c)
		if d > limit && !(len(word) >= 3 && strings.HasPrefix(c, word)) {
			continue
		}
		switch {
		case best < 0 || d < best:
			best, names = d, []string{c}
		case d == best && !slices.Contains(names, c):
			names = append(names, c)
		}
	}
	if len(names) == 0 {
		return ""
	}
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = fmt.Sprintf("%q", n)
	}
	return "; did you mean " + strings.Join(quoted, " or ") + "?"
}

// editDistance is the optimal-string-alignment distance between a and b: the fewest insertions,
// deletions, substitutions and swaps of adjacent letters that turn a into b.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}

// commandNames lists the table's command names: the single words and groups (for a typo of the
// first word), or a group's subcommands.
func commandNames(group string) []string {
	var out []string
	for _, cmd := range commands {
		name := cmd.name
		if group != "" {
			sub, ok := strings.CutPrefix(name, group+" ")
			if !ok {
				continue
			}
			name = sub
		} else {
			name, _, _ = strings.Cut(name, " ")
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}
