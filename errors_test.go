package rdma_test

import (
	"context"
	"encoding/json"
	"expvar"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: each kind of failure a user meets has a sentinel, and the error
// says what failed: a released buffer, the pool limit, a closed
// connection (which names itself and still matches net.ErrClosed).
func TestErrorSentinels(t *testing.T) {
	e, err := rdma.OpenEngine(rdma.WithProvider(rdma.ProviderSoft), rdma.WithPoolLimit(4<<20))
	require.NoError(t, err)
	defer e.Close()
	b, err := e.Alloc(64)
	require.NoError(t, err)
	require.NoError(t, b.Release())
	require.ErrorIs(t, b.Release(), rdma.ErrBufferReleased)

	_, err = e.Alloc(8 << 20)
	require.ErrorIs(t, err, rdma.ErrPoolLimit)
	assert.NotContains(t, err.Error(), "Options.MaxBytes", "the error names an option the user never set")

	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	buf, err := c.Alloc(8)
	require.NoError(t, err)
	defer buf.Release()
	require.NoError(t, c.Close())
	defer s.Close()
	err = c.Send(buf).Err()
	require.ErrorIs(t, err, net.ErrClosed)
	require.ErrorIs(t, err, rdma.ErrClosed)
	assert.Equal(t, "rdma: conn "+c.RemoteAddr().String()+": closed", err.Error(), "which object, and what")
	_, err = c.Alloc(8)
	assert.Equal(t, "rdma: conn "+c.RemoteAddr().String()+": closed", err.Error())

	require.NoError(t, e.Close())
	_, err = e.Alloc(8)
	require.ErrorIs(t, err, net.ErrClosed)
	assert.Equal(t, "rdma: engine "+e.Device()+": closed", err.Error())
}

// Rule: a Dial that fails in its handshake says why, and the reasons
// read apart: its context ended (context.DeadlineExceeded or
// context.Canceled), the handshake's own bound ran out
// (os.ErrDeadlineExceeded, naming WithHandshakeTimeout's bound), or the
// server went away during the dial (ErrPeerClosed).
func TestDialErrors(t *testing.T) {
	soft := rdma.WithProvider(rdma.ProviderSoft)
	silent := func(t *testing.T, hangUp bool) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				if hangUp {
					c.Close() // a server that dies as the dial begins
					continue
				}
				t.Cleanup(func() { c.Close() })
			}
		}()
		return ln.Addr().String()
	}
	addr := silent(t, false)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := rdma.Dial(ctx, "rdma", addr, soft)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NotErrorIs(t, err, rdma.ErrPeerClosed)

	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = rdma.Dial(ctx, "rdma", addr, soft)
	require.ErrorIs(t, err, context.Canceled)

	_, err = rdma.Dial(context.Background(), "rdma", addr, soft, rdma.WithHandshakeTimeout(200*time.Millisecond))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "no context ended")
	assert.Contains(t, err.Error(), "handshake's bound")

	_, err = rdma.Dial(context.Background(), "rdma", silent(t, true), soft)
	require.ErrorIs(t, err, rdma.ErrPeerClosed)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	assert.NotErrorIs(t, err, os.ErrDeadlineExceeded)
}

// Rule: a connection's and an engine's counters count what was issued,
// received and completed, and expvar serves them once the application
// publishes them.
func TestStats(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := c.Alloc(100)
	require.NoError(t, err)
	defer b.Release()
	dst, err := s.Alloc(100)
	require.NoError(t, err)
	defer dst.Release()
	region, err := s.Expose(dst, rdma.RemoteWrite|rdma.RemoteRead)
	require.NoError(t, err)
	for range 10 {
		r := s.Recv()
		require.NoError(t, c.Send(b).Wait(ctx))
		require.NoError(t, r.Wait(ctx))
		require.NoError(t, r.Buffer().Release())
	}
	require.NoError(t, c.Write(b, region).Wait(ctx))
	require.NoError(t, c.Read(b, region).Wait(ctx))
	cs, ss := c.Stats(), s.Stats()
	assert.Equal(t, uint64(10), cs.Sends)
	assert.Equal(t, uint64(1000), cs.SendBytes)
	assert.Equal(t, uint64(1), cs.Writes)
	assert.Equal(t, uint64(1), cs.Reads)
	assert.Equal(t, uint64(12), cs.Completions)
	assert.Zero(t, cs.Failed)
	assert.Equal(t, uint64(10), ss.Recvs)
	assert.Equal(t, uint64(1000), ss.RecvBytes)
	assert.Positive(t, cs.CreditWaits, "the first send waited for credits")

	var found bool
	for _, es := range rdma.AllStats() {
		if es.Conns > 0 && es.Total.Recvs >= 10 {
			found = true
			require.NotEmpty(t, es.SharedReceives)
			assert.Positive(t, es.Pool.BytesRegistered)
		}
	}
	assert.True(t, found, "the server's engine among AllStats")

	rdma.PublishExpvar()
	rdma.PublishExpvar() // twice is fine
	v := expvar.Get("rdma")
	require.NotNil(t, v)
	var got []map[string]any
	require.NoError(t, json.Unmarshal([]byte(v.String()), &got))
	assert.NotEmpty(t, got)
}
