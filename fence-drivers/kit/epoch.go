package kit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/nodefence/nodefence/services/fault"
)

// epochFile is the name of the persisted epoch table inside Options.StateDir.
const epochFile = "epochs.json"

// epochState is the on-disk form of the epoch table.
type epochState struct {
	// Version is the file format version, 1.
	Version int `json:"version"`
	// Epochs maps a device key to the highest epoch seen for it.
	Epochs map[string]int64 `json:"epochs"`
	// Floor is the highest epoch of the devices forgotten to keep the table bounded: every device
	// not in Epochs has at least this epoch.
	Floor int64 `json:"floor,omitempty"`
}

// maxEpochs bounds the table: a driver serves a few hundred devices, and the file is rewritten on
// every new epoch.
const maxEpochs = 4096

// epochStore remembers the highest fencing token seen per device, on disk. It keeps at most max
// devices: to add one more it forgets the device with the lowest epoch and raises the floor, the
// epoch every device it does not list is taken to have. Forgetting is therefore safe: a deposed
// leader's epoch is below the floor too.
type epochStore struct {
	mu     sync.Mutex
	path   string
	epochs map[string]int64
	floor  int64
	max    int
}

// loadEpochs opens (or creates) the epoch table in dir. A file that cannot be read is an error:
// forgetting epochs would let a deposed leader act.
func loadEpochs(dir string) (*epochStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	s := &epochStore{path: filepath.Join(dir, epochFile), epochs: map[string]int64{}, max: maxEpochs}
	data, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return s, s.persist(s.epochs, 0) // prove now that the directory is writable
	}
	if err != nil {
		return nil, fmt.Errorf("read epochs: %w", err)
	}
	var st epochState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("epochs file %s is corrupt (refusing to start without it): %w", s.path, err)
	}
	if st.Version != 1 {
		return nil, fmt.Errorf("epochs file %s: unsupported version %d", s.path, st.Version)
	}
	for k, v := range st.Epochs {
		s.epochs[k] = v
	}
	s.floor = st.Floor
	return s, nil
}

// check rejects an epoch lower than the highest seen for key, without recording anything.
func (s *epochStore) check(key string, epoch int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return staleErr(key, epoch, s.high(key))
}

// high is the highest epoch seen for key, or the floor.
func (s *epochStore) high(key string) int64 {
	if e, ok := s.epochs[key]; ok {
		return e
	}
	return s.floor
}

// observe rejects an epoch lower than the highest seen for key and records (and persists, before
// returning) a higher one. The in-memory table changes only once the file is durable. undo takes
// the record back (see forget); it is nil when nothing was recorded.
func (s *epochStore) observe(key string, epoch int64) (undo func() error, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	high := s.high(key)
	if err := staleErr(key, epoch, high); err != nil {
		return nil, err
	}
	if epoch == high {
		return nil, nil
	}
	prev, had := s.epochs[key]
	if err := s.record(key, epoch); err != nil {
		return nil, err
	}
	return func() error { return s.forget(key, epoch, prev, had) }, nil
}

// forget takes back a record of epoch for key that a failed call made: a call that changed nothing
// must not raise the bar (one failed PowerOn at the largest epoch would make the device
// unfenceable). The key returns to what it was, unless a later call has recorded since.
func (s *epochStore) forget(key string, epoch, prev int64, had bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.epochs[key]; !ok || e != epoch {
		return nil
	}
	next := make(map[string]int64, len(s.epochs))
	for k, v := range s.epochs {
		next[k] = v
	}
	if had && prev > s.floor {
		next[key] = prev
	} else {
		delete(next, key)
	}
	if err := s.persist(next, s.floor); err != nil {
		return fmt.Errorf("take back epoch %d for %s: %w", epoch, key, err)
	}
	s.epochs = next
	return nil
}

// record writes epoch for key (higher than its current one), evicting the lowest entry when the
// table is full. s.mu is held.
func (s *epochStore) record(key string, epoch int64) error {
	next := make(map[string]int64, len(s.epochs)+1)
	for k, v := range s.epochs {
		next[k] = v
	}
	floor := s.floor
	if _, known := next[key]; !known && len(next) >= s.max {
		lowest, low := "", int64(0)
		for k, v := range next {
			if lowest == "" || v < low || v == low && k < lowest {
				lowest, low = k, v
			}
		}
		delete(next, lowest)
		floor = max(floor, low)
	}
	next[key] = epoch
	if err := s.persist(next, floor); err != nil {
		return fmt.Errorf("persist epoch %d for %s: %w", epoch, key, err)
	}
	s.epochs, s.floor = next, floor
	return nil
}

func staleErr(key string, epoch, high int64) error {
	if epoch < high {
		return fmt.Errorf("%w: epoch %d is lower than %d already seen for device %s", fault.ErrStaleEpoch, epoch, high, key)
	}
	return nil
}

// persist writes the table atomically: temporary file, fsync, rename, fsync of the directory.
func (s *epochStore) persist(epochs map[string]int64, floor int64) error {
	data, err := json.MarshalIndent(epochState{Version: 1, Epochs: epochs, Floor: floor}, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(s.path, append(data, '\n'))
}

func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
