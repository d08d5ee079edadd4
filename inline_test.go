package rdma_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: a WRITE of up to 64 bytes is posted inline: the device copies
// the bytes at the post, so the source may change as soon as Write
// returns and the peer still gets what was there. On soft the test
// carries the traffic over its TCP transport, where a WRITE that is not
// inline is read from the source later, by the QP's worker.
func TestWriteInline(t *testing.T) { eachProvider(t, testWriteInline) }

func testWriteInline(t *testing.T, opts []rdma.Option) {
	t.Setenv("RDMA_SOFT_TRANSPORT", "tcp")
	c, s := rdmatest.Pair(t, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n, rounds = 64, 100
	target, err := s.Alloc(n * rounds)
	require.NoError(t, err)
	defer target.Release()
	region, err := s.Expose(target, rdma.RemoteWrite)
	require.NoError(t, err)
	src, err := c.Alloc(n)
	require.NoError(t, err)
	defer src.Release()
	var fs []*rdma.Future
	for i := range rounds {
		b := src.Bytes()
		for j := range b {
			b[j] = byte(i)
		}
		dst := region
		dst.Addr += uint64(i * n)
		dst.Len = n
		fs = append(fs, c.Write(src, dst))
		clear(b) // at once: an inline WRITE took the bytes already
	}
	for _, f := range fs {
		require.NoError(t, f.Wait(ctx))
	}
	for i := range rounds {
		require.True(t, bytes.Equal(target.Bytes()[i*n:(i+1)*n], bytes.Repeat([]byte{byte(i)}, n)),
			"WRITE %d: the peer got %v", i, target.Bytes()[i*n:i*n+8])
	}
}
