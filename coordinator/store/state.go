package store

import (
	"context"
	"encoding/json"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/leader"
)

// The engine's persisted state (Ready.Writes) and the operator's pause flag, under the prefix:
//
//	state/nodes/<node>       engine.NodeRecord (JSON)
//	state/zones/<zone>       engine.ZoneRecord (JSON)
//	state/halted             whether the engine halted (every zone fully disrupted), JSON bool
//	state/evictions-paused   present while evictions are paused; its value says who paused and why
func (s *Store) stateNodesPrefix() string        { return s.prefix + "/state/nodes/" }
func (s *Store) stateNodeKey(node string) string { return s.stateNodesPrefix() + node }
func (s *Store) stateZoneKey(zone string) string { return s.prefix + "/state/zones/" + zone }
func (s *Store) haltedKey() string               { return s.prefix + "/state/halted" }
func (s *Store) pausedKey() string               { return s.prefix + "/state/evictions-paused" }

// StateOps returns the etcd operations that persist the engine's writes, in order. A key written
// twice keeps its last value in the place of its first (etcd refuses a transaction that names a key
// twice).
func (s *Store) StateOps(writes []engine.Write) []clientv3.Op {
	index := map[string]int{}
	var ops []clientv3.Op
	set := func(key string, op clientv3.Op) {
		if i, ok := index[key]; ok {
			ops[i] = op
			return
		}
		index[key] = len(ops)
		ops = append(ops, op)
	}
	put := func(key string, v any) {
		b, _ := json.Marshal(v) // plain structs, numbers and bools: never an error
		set(key, clientv3.OpPut(key, string(b)))
	}
	for _, w := range writes {
		switch {
		case w.Node != nil:
			put(s.stateNodeKey(w.Node.Name), w.Node)
		case w.Zone != nil:
			put(s.stateZoneKey(w.Zone.Key), w.Zone)
		case w.Halted != nil:
			put(s.haltedKey(), *w.Halted)
		case w.Forget != "":
			key := s.stateNodeKey(w.Forget)
			set(key, clientv3.OpDelete(key))
		}
	}
	return ops
}

// EngineState is what a new term's engine restores.
type EngineState struct {
	// Nodes are the persisted node records; unreadable ones are skipped and logged.
	Nodes []engine.NodeRecord
	// Paused says the operator paused evictions.
	Paused bool
}

// LoadEngineState reads the persisted node records and the pause flag.
func (s *Store) LoadEngineState(ctx context.Context) (EngineState, error) {
	resp, err := s.cli.Get(ctx, s.stateNodesPrefix(), clientv3.WithPrefix())
	if err != nil {
		return EngineState{}, fmt.Errorf("load engine state: %w", err)
	}
	var st EngineState
	for _, kv := range resp.Kvs {
		var r engine.NodeRecord
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			if s.Log != nil {
				s.Log.Warn("skipping unreadable node record", "key", string(kv.Key), "err", err)
			}
			continue
		}
		st.Nodes = append(st.Nodes, r)
	}
	p, err := s.cli.Get(ctx, s.pausedKey(), clientv3.WithCountOnly())
	if err != nil {
		return EngineState{}, fmt.Errorf("load pause flag: %w", err)
	}
	st.Paused = p.Count > 0
	return st, nil
}

// SetPaused sets (with a note saying who paused and why) or clears the pause flag under the term.
func (s *Store) SetPaused(ctx context.Context, t *leader.Term, paused bool, note string) error {
	op := clientv3.OpDelete(s.pausedKey())
	if paused {
		op = clientv3.OpPut(s.pausedKey(), note)
	}
	_, err := t.Txn(ctx, nil, op)
	return err
}

// CurrentLeader reads the election: the leader's identity and epoch, ok false while there is none.
func (s *Store) CurrentLeader(ctx context.Context) (info leader.Info, epoch int64, ok bool, err error) {
	return leader.Current(ctx, s.cli, s.LeaderPrefix())
}
