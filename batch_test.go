package rdma_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: a batch posts many operations as one chain with only the last
// signaled; its future resolves when the last completes, which covers
// all of them, and reports their total length. A failing operation in
// the middle fails the batch.
func TestBatch(t *testing.T) { eachProvider(t, testBatch) }

func testBatch(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, opts...)
	target, _ := s.Alloc(64 << 10)
	defer target.Release()
	region, err := s.Expose(target, rdma.RemoteWrite|rdma.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	src, _ := c.Alloc(32 * 512)
	defer src.Release()
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i / 512)
	}
	inUse := c.PoolStats().BuffersInUse // src and the posted receives
	polledBefore := rdma.ConnPollerStats(c).Completions
	b := c.NewBatch()
	const rounds = 3
	for round := 0; round < rounds; round++ {
		for i := 0; i < 32; i++ {
			part, err := src.Slice(i*512, 512)
			if err != nil {
				t.Fatal(err)
			}
			dst, _ := region.Slice((31-i)*512, 512) // reversed order
			b.Write(part, dst)
		}
		if b.Len() != 32 {
			t.Fatalf("batch holds %d operations", b.Len())
		}
		f := b.Post()
		if b.Len() != 0 {
			t.Fatal("Post did not empty the batch")
		}
		wait(t, f)
		if f.Len() != 32*512 {
			t.Errorf("batch moved %d bytes, want %d", f.Len(), 32*512)
		}
		for i := 0; i < 32; i++ {
			if got := target.Bytes()[(31-i)*512]; got != byte(i) {
				t.Fatalf("round %d: chunk %d landed wrong (%d)", round, i, got)
			}
		}
	}
	// One completion per batch: only its last WR is signaled. The poller
	// counts a batch of completions after handling it.
	polled := func() uint64 { return rdma.ConnPollerStats(c).Completions - polledBefore }
	require.Eventually(t, func() bool { return polled() >= rounds }, 10*time.Second, time.Millisecond)
	assert.Equal(t, uint64(rounds), polled(), "completions polled for %d batches of 32 writes", rounds)
	if st := c.PoolStats(); st.BuffersInUse != inUse {
		t.Errorf("%d buffers in use after the batches, want %d as before", st.BuffersInUse, inUse)
	}
	// A bad operation is reported by Post and poisons nothing else.
	b.Write(nil, region)
	b.Write(src, region)
	if err := b.Post().Err(); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("batch with a nil buffer: %v", err)
	}
	if f := b.Post(); !f.Resolved() || f.Err() != nil {
		t.Error("empty batch did not resolve at once")
	}
	// A remote failure in the middle fails the batch's future.
	bad := region
	bad.RKey ^= 0x5a5a5a5a
	part, _ := src.Slice(0, 512)
	b.Write(part, region)
	b.Write(part, bad)
	b.Write(part, region)
	err = b.Post().Wait(t.Context())
	if !errors.Is(err, rdma.ErrRemoteAccess) {
		t.Errorf("batch with a bad rkey: %v, want ErrRemoteAccess", err)
	}
}
