package importcheck_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// TestMain is what a user's package would write: no option, so a
// goroutine started at import, or left by a closed engine, fails the run.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Rule: importing go-rdma starts no goroutine, and a soft pair that moved
// messages through Recv and a RecvHandler leaves none once closed.
func TestImportStartsNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	soft := rdma.WithProvider(rdma.ProviderSoft)

	// Recv.
	c, s := rdmatest.Pair(t, soft)
	b, err := c.Alloc(5)
	require.NoError(t, err)
	defer b.Release()
	copy(b.Bytes(), "hello")
	require.NoError(t, c.Send(b).Wait(ctx))
	f := s.Recv()
	require.NoError(t, f.Wait(ctx))
	require.Equal(t, "hello", string(f.Buffer().Bytes()[:f.Len()]))
	require.NoError(t, f.Buffer().Release())

	// A RecvHandler, on the shared engine of the package-level Listen.
	got := make(chan string, 1)
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", soft, rdma.WithRecvHandler(func(_ *rdma.Conn, f *rdma.Future) {
		got <- string(f.Buffer().Bytes()[:f.Len()])
		f.Buffer().Release()
	}))
	require.NoError(t, err)
	defer ln.Close()
	hc, _ := rdmatest.Connect(t, ln, func(ctx context.Context, address string) (*rdma.Conn, error) {
		return rdma.Dial(ctx, "rdma", address, soft)
	})
	hb, err := hc.Alloc(5)
	require.NoError(t, err)
	defer hb.Release()
	copy(hb.Bytes(), "world")
	require.NoError(t, hc.Send(hb).Wait(ctx))
	select {
	case m := <-got:
		require.Equal(t, "world", m)
	case <-ctx.Done():
		t.Fatal("the handler got no message")
	}
}
