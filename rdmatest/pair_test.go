package rdmatest_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
	"github.com/go-rdma/rdma/stream"
)

var soft = rdma.WithProvider(rdma.ProviderSoft)

// TestUpper runs the example's test under go test's own *testing.T.
func TestUpper(t *testing.T) { testUpper(t) }

// Rule: Pair's ends are connected both ways, each on an engine of its
// own: memory allocated on one is not in the other's pool.
func TestPair(t *testing.T) {
	c, s := rdmatest.Pair(t, soft, rdma.WithMaxMessage(4096))
	assert.Equal(t, 4096, c.MaxMessage(), "the options reach the connections")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, dir := range []struct {
		name     string
		from, to *rdma.Conn
	}{{"client to server", c, s}, {"server to client", s, c}} {
		from0, to0 := dir.from.PoolStats().BuffersInUse, dir.to.PoolStats().BuffersInUse
		b, err := dir.from.Alloc(3)
		require.NoError(t, err)
		copy(b.Bytes(), "abc")
		assert.Equal(t, from0+1, dir.from.PoolStats().BuffersInUse, dir.name)
		assert.Equal(t, to0, dir.to.PoolStats().BuffersInUse, "%s: the other end's pool is apart", dir.name)
		r := dir.to.Recv()
		require.NoError(t, dir.from.SendWithImm(b, 7).Wait(ctx), dir.name)
		require.NoError(t, b.Release())
		require.NoError(t, r.Wait(ctx), dir.name)
		imm, ok := r.Imm()
		assert.True(t, ok && imm == 7, "%s: immediate %d, %v", dir.name, imm, ok)
		assert.Equal(t, "abc", string(r.Buffer().Bytes()), dir.name)
		require.NoError(t, r.Buffer().Release())
	}
}

// Rule: StreamPair's ends carry bytes both ways, and a CloseWrite
// reaches the other end as io.EOF.
func TestStreamPair(t *testing.T) {
	c, s := rdmatest.StreamPair(t, soft)
	for _, dir := range []struct {
		name     string
		from, to *stream.Conn
	}{{"client to server", c, s}, {"server to client", s, c}} {
		_, err := dir.from.Write([]byte("hello"))
		require.NoError(t, err, dir.name)
		require.NoError(t, dir.from.CloseWrite(), dir.name)
		got, err := io.ReadAll(dir.to)
		require.NoError(t, err, dir.name)
		assert.Equal(t, "hello", string(got), dir.name)
	}
}

// Rule: what Pair and StreamPair made is closed when the test ends: the
// connections have ended (closed, or closed by the peer), and no
// goroutine or descriptor is left.
func TestCleanupLeavesNothing(t *testing.T) {
	// The first connections of the process start what it keeps (the
	// runtime's network poller); count from after them.
	t.Run("warm up", func(t *testing.T) {
		rdmatest.Pair(t, soft)
		rdmatest.StreamPair(t, soft)
	})
	ignore := goleak.IgnoreCurrent()
	fds := openFDs(t)
	var c, s *rdma.Conn
	var sc, ss *stream.Conn
	t.Run("pairs", func(t *testing.T) {
		c, s = rdmatest.Pair(t, soft)
		sc, ss = rdmatest.StreamPair(t, soft)
	})
	for _, conn := range []*rdma.Conn{c, s, sc.RDMAConn(), ss.RDMAConn()} {
		select {
		case <-conn.Done():
		default:
			t.Fatalf("connection %v is open after its test", conn.LocalAddr())
		}
		assert.ErrorIs(t, conn.Err(), net.ErrClosed)
	}
	_, err := sc.Write([]byte("x"))
	assert.ErrorIs(t, err, net.ErrClosed, "the stream is closed, not only its connection")
	goleak.VerifyNone(t, ignore)
	// Descriptors close with their goroutines, already gone.
	assert.Equal(t, fds, openFDs(t), "descriptors")
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd to count descriptors in")
	}
	return len(ents)
}

// Rule: a Connect whose dial fails fails the test at once, and leaves no
// accept running.
func TestConnectDialFails(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", soft)
	require.NoError(t, err)
	defer ln.Close()
	refused := errors.New("refused")
	dialed := false
	start := time.Now()
	ft := run(func(t testing.TB) {
		rdmatest.Connect(t, ln, func(context.Context, string) (*rdma.Conn, error) {
			dialed = true
			return nil, refused
		})
		t.Errorf("Connect returned")
	})
	assert.True(t, dialed)
	assert.Less(t, time.Since(start), 10*time.Second, "the failure waited for the accept's own timeout")
	assert.True(t, ft.Failed())
	require.NotEmpty(t, ft.logs)
	assert.Contains(t, ft.logs[0], "refused", "the failure names the dial's error")
	require.NoError(t, ln.Close())
	goleak.VerifyNone(t, ignore)
}
