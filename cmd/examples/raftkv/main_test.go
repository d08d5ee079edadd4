package main

import (
	"strconv"
	"sync"
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

// TestConvergeWaitsForStores: a follower whose store has not applied yet
// what raft handed it is waited for, not reported as holding other keys.
// Run failed so once in a full test run ("node0 holds 298 keys, the
// leader 300"): raft's AppliedIndex counts entries handed to the store.
func TestConvergeWaitsForStores(t *testing.T) {
	nodes, err := start(Params{Transport: "tcp", Nodes: 3})
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	defer func() {
		release() // the store's Apply holds raft's shutdown until then
		require.NoError(t, stop(nodes))
	}()
	require.NoError(t, err)
	leader, err := waitLeader(nodes, time.Minute)
	require.NoError(t, err)
	slow := nodes[0]
	if slow == leader {
		slow = nodes[1]
	}
	slow.fsm.mu.Lock()
	slow.fsm.gate = gate
	slow.fsm.mu.Unlock()
	for i := range 5 {
		require.NoError(t, leader.r.Apply(encodePut("k"+strconv.Itoa(i), nil), time.Minute).Error())
	}
	require.NoError(t, leader.r.Barrier(time.Minute).Error())
	want := leader.r.AppliedIndex()
	require.Eventually(t, func() bool { return slow.r.AppliedIndex() >= want }, time.Minute, time.Millisecond,
		"raft hands the follower every entry while its store waits")
	err = converge(nodes, leader, 100*time.Millisecond)
	require.ErrorContains(t, err, "applied up to entry", "a store that lags is waited for")
	release()
	require.NoError(t, converge(nodes, leader, time.Minute))
	assert.Equal(t, 5, slow.fsm.len())
}

// TestAppliedIndexCoversPut: a reader that sees a store's applied index
// sees the put at that index. The index was set before the put was
// stored, so converge could find a follower at the leader's index with
// one key fewer ("node0 holds 299 keys, the leader 300" in CI).
func TestAppliedIndexCoversPut(t *testing.T) {
	s := newStore()
	const puts = 20000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := uint64(1); i <= puts; i++ {
			s.Apply(&raft.Log{Index: i, Data: encodePut("k"+strconv.FormatUint(i, 10), nil)})
		}
	}()
	for {
		s.mu.Lock()
		applied, n := s.applied, len(s.kv)
		s.mu.Unlock()
		require.GreaterOrEqual(t, uint64(n), applied, "the store says it applied entry %d with %d keys", applied, n)
		select {
		case <-done:
			return
		default:
		}
	}
}
