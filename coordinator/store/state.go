package store

import (
	"context"
	"encoding/json"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nodefence/nodefence/coordinator/leader"
)

// The engine's persisted state (Ready.Writes) and the operator's pause flag, under the prefix:
//
//	state/nodes/<node>       the engine's record of the node (JSON)
//	state/zones/<zone>       the engine's record of the zone (JSON)
//	state/halted             whether the engine halted (every zone fully disrupted), JSON bool
//	state/evictions-paused   present while evictions are paused; its value says who paused and why
func (s *Store) stateNodesPrefix() string        { return s.prefix + "/state/nodes/" }
func (s *Store) stateNodeKey(node string) string { return s.stateNodesPrefix() + node }
func (s *Store) stateZoneKey(zone string) string { return s.prefix + "/state/zones/" + zone }
func (s *Store) haltedKey() string               { return s.prefix + "/state/halted" }
func (s *Store) pausedKey() string               { return s.prefix + "/state/evictions-paused" }

// StateWrite is one change of the engine's persisted state; exactly one of Node, Zone, Halted and
// Forget is set. The store knows where each lives, not what the engine keeps in it (the engine's
// records are JSON to the store, which keeps store free of the engine's types).
type StateWrite struct {
	Node   string // the node whose record is Record
	Zone   string // the zone whose record is Record
	Record any    // the record of Node or Zone, stored as JSON
	Halted *bool  // whether the engine halted
	Forget string // a node whose record is deleted
}

// StateOps returns the etcd operations that persist the engine's writes, in order. A key written
// twice keeps its last value in the place of its first (etcd refuses a transaction that names a key
// twice).
func (s *Store) StateOps(writes []StateWrite) []clientv3.Op {
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
		case w.Node != "":
			put(s.stateNodeKey(w.Node), w.Record)
		case w.Zone != "":
			put(s.stateZoneKey(w.Zone), w.Record)
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
	// Nodes are the persisted node records (JSON); records that are not JSON are skipped and
	// logged.
	Nodes []json.RawMessage
	// Paused says the operator paused evictions; PauseNote says who and why.
	Paused    bool
	PauseNote string
}

// LoadEngineState reads the persisted node records and the pause flag.
func (s *Store) LoadEngineState(ctx context.Context) (EngineState, error) {
	resp, err := s.cli.Get(ctx, s.stateNodesPrefix(), clientv3.WithPrefix())
	if err != nil {
		return EngineState{}, fmt.Errorf("load engine state: %w", err)
	}
	var st EngineState
	for _, kv := range resp.Kvs {
		if !json.Valid(kv.Value) {
			if s.Log != nil {
				s.Log.Warn("skipping unreadable node record", "key", string(kv.Key))
			}
			continue
		}
		st.Nodes = append(st.Nodes, json.RawMessage(kv.Value))
	}
	p, err := s.cli.Get(ctx, s.pausedKey())
	if err != nil {
		return EngineState{}, fmt.Errorf("load pause flag: %w", err)
	}
	if st.Paused = len(p.Kvs) > 0; st.Paused {
		st.PauseNote = string(p.Kvs[0].Value)
	}
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
