package stream_test

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
	"github.com/go-rdma/rdma/stream"
)

// Rule (autocork): a Write with nothing in flight goes out at once,
// posted by the Write itself (no flusher, no timer); small Writes behind
// a WRITE in flight gather in staging and go out as one WRITE when it
// completes, or at once with the Write that makes them a WRITE's worth
// (the cork size).
func TestStreamAutocork(t *testing.T) { eachProvider(t, testStreamAutocork) }

func testStreamAutocork(t *testing.T, opts []rdma.Option) {
	c, s := streamPair(t, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A Write that waits for the held WRITE (below) fails rather than hangs.
	require.NoError(t, c.SetWriteDeadline(time.Now().Add(20*time.Second)))
	writes := func() uint64 { return c.RDMAConn().Stats().Writes }
	one := make([]byte, 1)

	// Lone Writes: each finds nothing in flight and is posted before it
	// returns.
	const lone = 20
	for i := range lone {
		require.Eventually(t, func() bool { return stream.InFlight(c) == 0 }, 10*time.Second, time.Millisecond,
			"write %d: the last WRITE never completed", i)
		before := writes()
		_, err := c.Write([]byte{byte(i)})
		require.NoError(t, err)
		corked, flushing := stream.Corked(c)
		require.Zero(t, corked, "write %d: a lone Write's bytes wait in staging", i)
		require.False(t, flushing, "write %d: a lone Write was left to the flusher", i)
		require.Equal(t, before+1, writes(), "write %d: one WRITE for a lone Write", i)
		_, err = io.ReadFull(s, one)
		require.NoError(t, err)
		require.Equal(t, byte(i), one[0])
	}

	// A byte the server does not read yet: the peer's credits cannot
	// cover what follows it, so only the WRITEs in flight decide. It goes
	// out alone, once the last lone WRITE has completed (the server read
	// that byte, but the client may not have reaped the completion yet:
	// then 'x' would gather with what follows, 1,001 bytes corked).
	require.Eventually(t, func() bool { return stream.InFlight(c) == 0 }, 10*time.Second, time.Millisecond,
		"the last lone WRITE never completed")
	_, err := c.Write([]byte{'x'})
	require.NoError(t, err)
	// Hold the WRITEs in flight: a message ahead of them that completes
	// when the test says (a Recv of another connection's).
	a, b := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	held := b.Recv()
	stream.HoldInFlight(c, held)

	const small, size = 10, 100
	want := []byte{'x'}
	before := writes()
	for i := range small {
		p := bytes.Repeat([]byte{byte('a' + i)}, size)
		want = append(want, p...)
		_, err := c.Write(p)
		require.NoError(t, err)
	}
	corked, _ := stream.Corked(c)
	require.Equal(t, small*size, corked, "bytes gathered behind the WRITE in flight")
	require.Equal(t, before, writes(), "a small Write behind a WRITE in flight was posted")

	// A Write that fills the cork does not wait for the WRITE ahead:
	// what gathered goes out with it, as one WRITE.
	big := bytes.Repeat([]byte{'z'}, stream.Cork(c))
	want = append(want, big...)
	_, err = c.Write(big)
	require.NoError(t, err)
	corked, _ = stream.Corked(c)
	require.Zero(t, corked, "bytes left in staging after a Write that filled the cork")
	require.Equal(t, before+1, writes(), "WRITEs for %d small Writes and one that filled the cork", small)

	// Again behind the same WRITE in flight: small Writes gather, and
	// go out as one WRITE when it completes.
	before = writes()
	for i := range small {
		p := bytes.Repeat([]byte{byte('A' + i)}, size)
		want = append(want, p...)
		_, err := c.Write(p)
		require.NoError(t, err)
	}
	corked, _ = stream.Corked(c)
	require.Equal(t, small*size, corked, "bytes gathered behind the WRITE in flight")
	require.Equal(t, before, writes(), "a small Write behind a WRITE in flight was posted")
	src, err := a.Alloc(1)
	require.NoError(t, err)
	require.NoError(t, a.Send(src).Wait(ctx)) // the WRITE ahead completes
	require.NoError(t, src.Release())
	require.Eventually(t, func() bool { n, flushing := stream.Corked(c); return n == 0 && !flushing }, 10*time.Second, time.Millisecond,
		"the gathered bytes never went out")
	assert.Equal(t, before+1, writes(), "WRITEs for %d small Writes gathered", small)
	got := make([]byte, len(want))
	_, err = io.ReadFull(s, got)
	require.NoError(t, err)
	require.Equal(t, want, got)

	require.NoError(t, held.Wait(ctx))
	require.NoError(t, held.Buffer().Release())
}

// TestStreamCorkedWriteWakes: in header mode a Write may stage as far
// as the two pieces (to staging's end or the peer ring's, whichever is
// nearer) that follow the bytes corked behind the WRITE in flight. A
// Write that found them full used to wait for the peer's next message,
// though what made room was the flusher posting the corked bytes once the
// WRITE ahead completed: with a peer that had nothing to say (what it
// took short of a count or credits due), it waited for ever (a stream
// test hung so under load; 8 header-mode pairs exchanging at once stalled
// within a few runs). Here the ring is 2 MiB + 12 KiB and staging 1 MiB,
// so the pieces from 100 bytes short of 2 MiB are 100 bytes and 12 KiB.
func TestStreamCorkedWriteWakes(t *testing.T) {
	stream.ForceHeaderMode(t)
	opts := []rdma.Option{rdma.WithProvider(rdma.ProviderSoft)}
	ring := 2<<20 + 12<<10
	c, s, _ := ringPair(t, opts, ring, ring)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc := c.(*stream.Conn)

	// 100 bytes short of staging's second end, read by the peer but for
	// the last 1,000 (so that it has not credited all), and nothing more.
	big := 2<<20 - 100
	go func() { _, err := c.Write(make([]byte, big)); assert.NoError(t, err) }()
	_, err := io.ReadFull(s, make([]byte, big-1000))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return stream.InFlight(sc) == 0 }, 10*time.Second, time.Millisecond, "a WRITE never completed")
	require.Equal(t, 1<<20, stream.StagingSize(sc))
	require.Eventually(t, func() bool {
		msgs, took, window := stream.HeaderWindow(sc)
		return msgs-took <= window/2-3
	}, 10*time.Second, time.Millisecond, "no room in the peer's window for two pieces and two more")

	// Hold a WRITE in flight (a message that completes when the test
	// says), cork 60 bytes behind it, then Write 13 KiB: 12 KiB and 40
	// bytes fit the two pieces, and the rest waits.
	a, b := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	held := b.Recv()
	stream.HoldInFlight(sc, held)
	_, err = c.Write(make([]byte, 60))
	require.NoError(t, err)
	corked, _ := stream.Corked(sc)
	require.Equal(t, 60, corked, "60 bytes behind the WRITE in flight")
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, 13<<10))
		done <- err
	}()
	require.Eventually(t, func() bool { n, _ := stream.Corked(sc); return n == 12<<10+100 }, 10*time.Second, time.Millisecond, "the Write never filled the pieces")

	// The WRITE ahead completes: the corked bytes go out, and the
	// Write goes on, though the peer says nothing.
	src, err := a.Alloc(1)
	require.NoError(t, err)
	require.NoError(t, a.Send(src).Wait(ctx))
	require.NoError(t, src.Release())
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("a Write still waits for the room its own corked bytes made: %s", stream.DebugState(sc))
	}
	require.NoError(t, held.Wait(ctx))
	require.NoError(t, held.Buffer().Release())
}
