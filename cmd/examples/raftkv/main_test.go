package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/hashicorp/raft"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestReplicates: a three-node cluster over the go-rdma stream commits
// every put, and each node ends with the leader's store (Run checks it);
// the same over TCP, the baseline the example reports against.
func TestReplicates(t *testing.T) {
	for _, transport := range []string{"rdma", "tcp"} {
		t.Run(transport, func(t *testing.T) {
			r, err := Run(Params{Transport: transport, Nodes: 3, Ops: 300, Size: 64, Concurrency: 8, Timeout: time.Minute})
			require.NoError(t, err)
			assert.Equal(t, 300, r.Ops)
			assert.Positive(t, r.OpsPerSec)
			assert.LessOrEqual(t, r.P50, r.P99)
			t.Log(r)
		})
	}
}

// TestMalformedPut: a log entry that is not a put is an error result of
// Apply, not a panic.
func TestMalformedPut(t *testing.T) {
	s := newStore()
	for _, d := range [][]byte{nil, {0}, {0, 5, 'a'}} {
		_, isErr := s.Apply(&raft.Log{Data: d}).(error)
		assert.True(t, isErr, "entry %q", d)
	}
	assert.Nil(t, s.Apply(&raft.Log{Data: encodePut("k", []byte("v"))}))
	assert.Equal(t, 1, s.len())
}
