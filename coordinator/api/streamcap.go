package api

import (
	"fmt"
	"sync"

	"github.com/nodefence/nodefence/services/fault"
)

// MaxStreamsPerNode is how many Connect streams one node may hold open at once at one replica. An
// agent needs one; the second lets it resume on a new stream while its previous one is still
// closing (the server may not yet have noticed that the old connection died). More would only let
// one node's certificate hold goroutines, memory and engine work that belong to every node.
const MaxStreamsPerNode = 2

// streamCount counts the open Connect streams of each node.
type streamCount struct {
	mu   sync.Mutex
	open map[string]int
}

// acquire counts one more stream of node, or refuses it with fault.ErrResourceExhausted when the
// node already holds MaxStreamsPerNode. release must be called once the stream ended.
func (c *streamCount) acquire(node string) (release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.open[node]; n >= MaxStreamsPerNode {
		return nil, fmt.Errorf("node %s already holds %d open agent streams (at most %d): %w", node, n, MaxStreamsPerNode, fault.ErrResourceExhausted)
	}
	if c.open == nil {
		c.open = map[string]int{}
	}
	c.open[node]++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.open[node]--; c.open[node] <= 0 {
				delete(c.open, node)
			}
		})
	}, nil
}
