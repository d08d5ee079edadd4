package rdma_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// atLeast returns the records at level lvl or above, as "LEVEL msg attrs".
func (r *records) atLeast(lvl slog.Level) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.got {
		if rec.Level < lvl {
			continue
		}
		var b strings.Builder
		b.WriteString(rec.Level.String() + " " + rec.Message)
		rec.Attrs(func(a slog.Attr) bool {
			b.WriteString(" " + a.Key + "=" + a.Value.String())
			return true
		})
		out = append(out, b.String())
	}
	return out
}

// count returns how many records have msg and an attribute with value
// val.
func (r *records) count(msg, val string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.got {
		if rec.Message != msg {
			continue
		}
		rec.Attrs(func(a slog.Attr) bool {
			if a.Value.String() == val {
				n++
				return false
			}
			return true
		})
	}
	return n
}

// Rule: an orderly close, by either side, is no error: it logs "closed"
// at Info on both sides, no Warn or Error and no WR_FLUSH_ERR, and the
// flushes it causes are not counted as failed completions.
func TestOrderlyCloseLogsNoError(t *testing.T) {
	for _, closer := range []string{"client", "server"} {
		t.Run(closer, func(t *testing.T) {
			var rec records
			c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft), rdma.WithLogger(slog.New(&rec)))
			if closer == "server" {
				c, s = s, c
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			b, err := c.Alloc(100)
			require.NoError(t, err)
			defer b.Release()
			for range 5 {
				r := s.Recv()
				require.NoError(t, c.Send(b).Wait(ctx))
				require.NoError(t, r.Wait(ctx))
				require.NoError(t, r.Buffer().Release())
			}
			pending := []*rdma.Future{s.Recv(), c.Recv()} // they flush at the close
			require.NoError(t, c.Close())
			<-s.Done()
			require.NoError(t, s.Close())
			for _, f := range pending {
				require.Error(t, f.Wait(ctx))
			}
			assert.Empty(t, rec.atLeast(slog.LevelWarn), "an orderly close is no warning")
			closed := rec.find("rdma: connection closed")
			assert.Len(t, closed, 2, "both sides log the close")
			assert.NotContains(t, strings.Join(closed, "\n"), "WR_FLUSH_ERR")
			assert.Zero(t, c.Stats().Failed, "flushes of an orderly close are no failures")
			assert.Zero(t, s.Stats().Failed, "flushes of an orderly close are no failures")
		})
	}
}

// Rule: a receive's failed completion names its operation RECV, whatever
// the device reported as its opcode (a flushed completion's opcode is
// undefined).
// The peer aborts: the pending Recv fails when its receive flushes (an
// orderly close would give the close's error, without a status).
func TestRecvFlushNamesRecv(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := s.Recv()
	require.NoError(t, c.Abort(errors.New("the test gave up")))
	err := r.Wait(ctx)
	require.ErrorIs(t, err, rdma.ErrPeerClosed)
	var ce *rdma.CompletionError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "RECV", ce.Op, "%v", err)
	assert.Contains(t, err.Error(), "opcode RECV")
	assert.NotContains(t, err.Error(), "opcode SEND")
}

// Rule: a repeated device event is logged once per interval, with the
// count of those not logged since.
func TestRepeatedEventsRateLimited(t *testing.T) {
	var rec records
	e, err := rdma.OpenEngine(rdma.WithProvider(rdma.ProviderSoft), rdma.WithLogger(slog.New(&rec)))
	require.NoError(t, err)
	defer e.Close()
	se, err := rdma.OpenEngine(rdma.WithProvider(rdma.ProviderSoft))
	require.NoError(t, err)
	defer se.Close()
	clients, _ := enginePairs(t, e, se, 1)
	start := time.Now()
	for range 200 {
		require.True(t, rdma.InjectDeviceEvent(clients[0], "PORT_ACTIVE", e.Port()))
	}
	// Events are handled in order: once the last one, of another kind
	// (a port of no connection's), is logged, so are the others.
	require.True(t, rdma.InjectDeviceEvent(clients[0], "PORT_ERR", e.Port()+1))
	require.Eventually(t, func() bool { return rec.count("rdma: device event", "PORT_ERR") > 0 }, 10*time.Second, 5*time.Millisecond)
	secs := int(time.Since(start)/time.Second) + 1
	n := rec.count("rdma: device event", "PORT_ACTIVE")
	assert.GreaterOrEqual(t, n, 1)
	assert.LessOrEqual(t, n, secs+1, "once per second at most")
}

// Rule: a streaming connection under load logs SRQ_LIMIT_REACHED (at
// Debug) a bounded number of times: once per interval, with a count.
// The check after a poll refills the shared receive queue before the
// event's lower watermark in most runs (one event in 64 MiB), so it is
// turned off here: every refill waits for the event, which then fires
// many times a second.
func TestStreamSRQLimitLogBounded(t *testing.T) {
	defer rdma.SetSRQRefill(true, false)()
	var rec records
	c, s := rdmatest.StreamPair(t, rdma.WithProvider(rdma.ProviderSoft), rdma.WithLogger(slog.New(&rec)))
	const total = 32 << 20
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, total))
		done <- err
	}()
	n, err := io.CopyN(io.Discard, s, total)
	require.NoError(t, err)
	require.Equal(t, int64(total), n)
	require.NoError(t, <-done)
	secs := int(time.Since(start)/time.Second) + 1
	// Both ends are on one engine (the shared one of these options),
	// which logs an event kind at most once per second. Each limit
	// event refilled its queue once, or fired again before the refill
	// re-armed the limit: the refills count the events at least.
	events := rdma.SharedRecvStats(s.RDMAConn()).Refills[rdma.RefillEvent]
	bound := secs + 1
	got := rec.count("rdma: device event", "SRQ_LIMIT_REACHED")
	t.Logf("%d limit events in %d s, %d logged", events, secs, got)
	require.Greater(t, events, uint64(2*bound), "too few limit events to test the bound")
	assert.GreaterOrEqual(t, got, 1)
	assert.LessOrEqual(t, got, bound, "SRQ_LIMIT_REACHED logged %d times in %d s", got, secs)
}

// Rule: a flood of refused handshakes is logged once per interval, with
// a count.
func TestRefusalsRateLimited(t *testing.T) {
	var rec records
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithProvider(rdma.ProviderSoft), rdma.WithLogger(slog.New(&rec)))
	require.NoError(t, err)
	defer ln.Close()
	start := time.Now()
	for range 30 {
		tc, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		_, err = tc.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + strings.Repeat("x", 200)))
		require.NoError(t, err)
		tc.SetReadDeadline(time.Now().Add(10 * time.Second))
		io.Copy(io.Discard, tc) // the listener logs, answers, then closes
		tc.Close()
	}
	secs := int(time.Since(start)/time.Second) + 1
	n := len(rec.find("rdma: handshake refused"))
	assert.GreaterOrEqual(t, n, 1)
	assert.LessOrEqual(t, n, secs+1, "once per second at most")
}

// Rule: refused handshakes are rate-limited per peer address and
// reason: refusals for different reasons in quick succession are each
// logged, with the peer's address and the reason.
func TestRefusalsKeepTheirReason(t *testing.T) {
	p := newTestPKI(t)
	soft := rdma.WithProvider(rdma.ProviderSoft)
	var rec records
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", soft, rdma.WithLogger(slog.New(&rec)), rdma.WithTLS(p.serverTLS()),
		rdma.WithAcceptCheck(func(rdma.PeerInfo) error { return errors.New("not on the list") }))
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, opts := range [][]rdma.Option{
		{rdma.WithTLS(p.clientTLS(p.client))}, // the accept check refuses
		{rdma.WithTLS(p.strangerTLS())},       // a certificate of another CA
		{rdma.WithTLS(p.clientTLS())},         // no certificate
		nil,                                   // no TLS
	} {
		_, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), append(opts, soft)...)
		require.Error(t, err)
	}
	want := []string{"not on the list", "certificate signed by unknown authority", "didn't provide a certificate", "the dialer does not use TLS"}
	require.Eventually(t, func() bool { return len(rec.find("rdma: handshake refused")) >= len(want) }, 5*time.Second, time.Millisecond,
		"logged: %q", rec.find("rdma: handshake refused"))
	got := rec.find("rdma: handshake refused")
	require.Len(t, got, len(want))
	for _, w := range want {
		n := 0
		for _, g := range got {
			if strings.Contains(g, w) {
				n++
				assert.Contains(t, g, "remote=127.0.0.1:")
			}
		}
		assert.Equal(t, 1, n, "records saying %q: %q", w, got)
	}
}
