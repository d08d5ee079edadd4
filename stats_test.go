package rdma_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// TestStatsClosed: an engine's counters keep what its closed connections
// counted, so that Total plus Closed never falls.
func TestStatsClosed(t *testing.T) {
	se, err := rdma.OpenEngine(rdma.WithProvider(rdma.ProviderSoft))
	require.NoError(t, err)
	defer se.Close()
	ce, err := rdma.OpenEngine(rdma.WithProvider(rdma.ProviderSoft))
	require.NoError(t, err)
	defer ce.Close()
	ln, err := se.Listen("rdma", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	for round := 1; round <= 2; round++ {
		c, s := rdmatest.Connect(t, ln, func(ctx context.Context, address string) (*rdma.Conn, error) {
			return ce.Dial(ctx, "rdma", address)
		})
		b, err := c.Alloc(10)
		require.NoError(t, err)
		for range 3 {
			r := s.Recv()
			require.NoError(t, c.Send(b).Wait(ctx))
			require.NoError(t, r.Wait(ctx))
			require.NoError(t, r.Buffer().Release())
		}
		require.NoError(t, b.Release())
		open := ce.Stats()
		require.NoError(t, c.Close())
		require.NoError(t, s.Close())

		cs, ss := ce.Stats(), se.Stats()
		assert.Zero(t, cs.Conns)
		assert.Zero(t, cs.Total.Sends, "Total is the open connections'")
		assert.Equal(t, uint64(3*round), cs.Closed.Sends, "round %d", round)
		assert.Equal(t, uint64(30*round), cs.Closed.SendBytes)
		assert.GreaterOrEqual(t, cs.Closed.Completions, open.Total.Completions+open.Closed.Completions, "never falls")
		assert.Zero(t, cs.Closed.CreditsOut, "a gauge, not kept")
		assert.Equal(t, uint64(3*round), ss.Closed.Recvs)
	}
}
