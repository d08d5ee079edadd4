package main

import (
	"bytes"
	"encoding/gob"
	"fmt"
	"io"
	"maps"
	"sync"

	"github.com/hashicorp/raft"
)

// store is the replicated state: raft applies each committed put to
// every node's store in log order.
type store struct {
	mu      sync.Mutex
	kv      map[string][]byte
	applied uint64 // the log index of the last put applied

	gate chan struct{} // tests: Apply waits until it is closed; nil: no wait
}

func newStore() *store { return &store{kv: make(map[string][]byte)} }

// encodePut is a put's log entry: the key's length, the key, the value.
func encodePut(key string, value []byte) []byte {
	b := make([]byte, 0, 2+len(key)+len(value))
	b = append(b, byte(len(key)>>8), byte(len(key)))
	b = append(b, key...)
	return append(b, value...)
}

// Apply applies a committed put. A malformed entry is an error result
// (raft's ApplyFuture.Response), not a panic.
func (s *store) Apply(l *raft.Log) any {
	s.mu.Lock()
	gate := s.gate
	s.mu.Unlock()
	if gate != nil {
		<-gate
	}
	d := l.Data
	if len(d) < 2 || len(d) < 2+(int(d[0])<<8|int(d[1])) {
		s.mu.Lock()
		s.applied = l.Index
		s.mu.Unlock()
		return fmt.Errorf("raftkv: malformed put of %d bytes at index %d", len(d), l.Index)
	}
	n := int(d[0])<<8 | int(d[1])
	key, value := string(d[2:2+n]), bytes.Clone(d[2+n:])
	// The put and its index together: a reader that sees the index
	// sees the put (converge compares the stores once it does).
	s.mu.Lock()
	s.kv[key] = value
	s.applied = l.Index
	s.mu.Unlock()
	return nil
}

// equal reports whether s and o hold the same keys and values.
func (s *store) equal(o *store) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	o.mu.Lock()
	defer o.mu.Unlock()
	return maps.EqualFunc(s.kv, o.kv, bytes.Equal)
}

// appliedIndex is the log index of the last put the store applied. Raft's
// own AppliedIndex counts what it handed to the store, which may not have
// applied it yet.
func (s *store) appliedIndex() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied
}

func (s *store) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.kv)
}

func (s *store) Snapshot() (raft.FSMSnapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return snapshot{KV: maps.Clone(s.kv), Applied: s.applied}, nil
}

func (s *store) Restore(r io.ReadCloser) error {
	defer r.Close()
	var sn snapshot
	if err := gob.NewDecoder(r).Decode(&sn); err != nil {
		return fmt.Errorf("raftkv: restore: %w", err)
	}
	if sn.KV == nil {
		sn.KV = make(map[string][]byte)
	}
	s.mu.Lock()
	s.kv, s.applied = sn.KV, sn.Applied
	s.mu.Unlock()
	return nil
}

// snapshot is a copy of the store taken under its lock.
type snapshot struct {
	KV      map[string][]byte
	Applied uint64
}

func (sn snapshot) Persist(sink raft.SnapshotSink) error {
	if err := gob.NewEncoder(sink).Encode(sn); err != nil {
		sink.Cancel()
		return fmt.Errorf("raftkv: snapshot: %w", err)
	}
	return sink.Close()
}

func (snapshot) Release() {}
