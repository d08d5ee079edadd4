package rdma_test

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// records is a slog.Handler that keeps what it is given.
type records struct {
	mu  sync.Mutex
	got []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.got = append(r.got, rec)
	r.mu.Unlock()
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// find returns the records with msg, as "level attr=value ..." lines.
func (r *records) find(msg string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.got {
		if rec.Message != msg {
			continue
		}
		var b strings.Builder
		b.WriteString(rec.Level.String())
		rec.Attrs(func(a slog.Attr) bool {
			b.WriteString(" " + a.Key + "=" + a.Value.String())
			return true
		})
		out = append(out, b.String())
	}
	return out
}

// Rule: WithLogger gets each connection's start and end: an orderly close
// as "closed" at Info on both sides, saying which side closed (a failure
// is "ended", with its cause: TestPortDown), and the handshakes the
// listener refused, with the reason.
func TestLifecycleEvents(t *testing.T) {
	var rec records
	log := slog.New(&rec)
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft), rdma.WithLogger(log))
	require.Len(t, rec.find("rdma: connected"), 2)
	require.NoError(t, c.Close())
	<-s.Done()
	closed := rec.find("rdma: connection closed")
	require.Len(t, closed, 2)
	joined := strings.Join(closed, "\n")
	assert.Regexp(t, "INFO .*by=local", joined, "the side that closed")
	assert.Regexp(t, "INFO .*by=peer", joined, "the side whose peer closed")
	assert.Empty(t, rec.find("rdma: connection ended"), "an orderly close is no failure")

	ln, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithProvider(rdma.ProviderSoft), rdma.WithLogger(log))
	require.NoError(t, err)
	defer ln.Close()
	tc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	_, err = tc.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + strings.Repeat("x", 200)))
	require.NoError(t, err)
	tc.SetReadDeadline(time.Now().Add(10 * time.Second))
	bufio.NewReader(tc).ReadString(0) // the listener answers, then closes
	tc.Close()
	require.Eventually(t, func() bool { return len(rec.find("rdma: handshake refused")) > 0 }, 10*time.Second, 5*time.Millisecond)
	assert.Contains(t, rec.find("rdma: handshake refused")[0], "reason=")
}

// Rule: a port that goes down fails the connections on it with an error
// that says so (ErrPortDown), and the engine's logger gets the device's
// event.
func TestPortDown(t *testing.T) {
	var rec records
	e, err := rdma.OpenEngine(rdma.WithProvider(rdma.ProviderSoft), rdma.WithLogger(slog.New(&rec)))
	require.NoError(t, err)
	defer e.Close()
	se, err := rdma.OpenEngine(rdma.WithProvider(rdma.ProviderSoft))
	require.NoError(t, err)
	defer se.Close()
	clients, _ := enginePairs(t, e, se, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.True(t, rdma.InjectDeviceEvent(clients[0], "PORT_ERR", e.Port()))
	for _, c := range clients {
		select {
		case <-c.Done():
		case <-ctx.Done():
			t.Fatal("a connection of the port that went down is still up")
		}
		require.ErrorIs(t, c.Err(), rdma.ErrPortDown)
		assert.Contains(t, c.Err().Error(), "port")
	}
	ended := rec.find("rdma: connection ended")
	require.Len(t, ended, len(clients), "a failure is logged with its cause")
	assert.Contains(t, ended[0], "WARN")
	assert.Contains(t, ended[0], "port went down")
	require.Eventually(t, func() bool { return len(rec.find("rdma: device event")) > 0 }, 5*time.Second, 5*time.Millisecond)
	assert.Contains(t, rec.find("rdma: device event")[0], "PORT_ERR")
}
