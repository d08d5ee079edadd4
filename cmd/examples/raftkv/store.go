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
	mu sync.Mutex
	kv map[string][]byte
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
	d := l.Data
	if len(d) < 2 || len(d) < 2+(int(d[0])<<8|int(d[1])) {
		return fmt.Errorf("raftkv: malformed put of %d bytes at index %d", len(d), l.Index)
	}
	n := int(d[0])<<8 | int(d[1])
	key, value := string(d[2:2+n]), bytes.Clone(d[2+n:])
	s.mu.Lock()
	s.kv[key] = value
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

func (s *store) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.kv)
}

func (s *store) Snapshot() (raft.FSMSnapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return snapshot(maps.Clone(s.kv)), nil
}

func (s *store) Restore(r io.ReadCloser) error {
	defer r.Close()
	kv := make(map[string][]byte)
	if err := gob.NewDecoder(r).Decode(&kv); err != nil {
		return fmt.Errorf("raftkv: restore: %w", err)
	}
	s.mu.Lock()
	s.kv = kv
	s.mu.Unlock()
	return nil
}

// snapshot is a copy of the store taken under its lock.
type snapshot map[string][]byte

func (sn snapshot) Persist(sink raft.SnapshotSink) error {
	if err := gob.NewEncoder(sink).Encode(map[string][]byte(sn)); err != nil {
		sink.Cancel()
		return fmt.Errorf("raftkv: snapshot: %w", err)
	}
	return sink.Close()
}

func (snapshot) Release() {}
