package rdma_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: a UC connection (WithTransport(UC)) carries SEND and WRITE, with
// and without immediate data, without credits; READ and the atomics fail
// at the call with ErrNotSupported naming the transport, and so does a
// Batch holding a READ.
func TestUC(t *testing.T) { eachProvider(t, testUC) }

func testUC(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, append(opts, rdma.WithTransport(rdma.UC))...)
	for _, x := range []*rdma.Conn{c, s} {
		assert.Equal(t, rdma.UC, x.Transport())
		assert.False(t, x.Credited(), "a UC connection has no credits")
		assert.Positive(t, x.SendWindow(), "the peer says its receive window")
	}

	// Messages, fewer at a time than the peer's window: none finds its
	// receive queue empty.
	for _, n := range []int{1, 64, 4096, 60000} {
		b, err := c.Alloc(n)
		require.NoError(t, err)
		for i := range b.Bytes() {
			b.Bytes()[i] = byte(i*7 + n)
		}
		want := bytes.Clone(b.Bytes())
		rf := s.Recv()
		wait(t, c.SendWithImm(b, uint32(n)))
		b.Release()
		wait(t, rf)
		got := rf.Buffer()
		require.NotNil(t, got)
		assert.Equal(t, want, got.Bytes(), "%d-byte message", n)
		imm, ok := rf.Imm()
		assert.True(t, ok)
		assert.Equal(t, uint32(n), imm)
		got.Release()
	}

	// WRITEs into an exposed region. A UC WRITE completes once sent, not
	// once placed: the WRITE_WITH_IMM's receive, and for the plain WRITE
	// a message after it on the same queue pair, show the bytes arrived.
	target, err := s.Alloc(8192)
	require.NoError(t, err)
	defer target.Release()
	region, err := s.Expose(target, rdma.RemoteWrite)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, s.SendRegion(ctx, region))
	r, err := c.RecvRegion(ctx)
	require.NoError(t, err)
	src, err := c.Alloc(100)
	require.NoError(t, err)
	defer src.Release()
	copy(src.Bytes(), bytes.Repeat([]byte("uc-write"), 13))
	sub, err := r.Slice(1000, 100)
	require.NoError(t, err)
	rf := s.Recv()
	wait(t, c.WriteWithImm(src, sub, 7))
	wait(t, rf)
	assert.Equal(t, src.Bytes(), target.Bytes()[1000:1100], "WRITE_WITH_IMM data")
	rf.Buffer().Release()

	sub2, err := r.Slice(5000, 100)
	require.NoError(t, err)
	wait(t, c.Write(src, sub2))
	marker, err := c.Alloc(1)
	require.NoError(t, err)
	rf = s.Recv()
	wait(t, c.Send(marker))
	marker.Release()
	wait(t, rf)
	rf.Buffer().Release()
	assert.Equal(t, src.Bytes(), target.Bytes()[5000:5100], "WRITE data, seen after the message behind it")

	// What UC cannot carry fails at the call.
	dst, err := c.Alloc(100)
	require.NoError(t, err)
	defer dst.Release()
	word, err := r.Slice(4096, 8)
	require.NoError(t, err)
	for name, f := range map[string]*rdma.Future{
		"Read":           c.Read(dst, sub),
		"FetchAdd":       c.FetchAdd(word, 1),
		"CompareAndSwap": c.CompareAndSwap(word, 0, 1),
	} {
		err := f.Wait(ctx)
		require.ErrorIs(t, err, rdma.ErrNotSupported, name)
		assert.Contains(t, err.Error(), "UC", name)
	}
	bt := c.NewBatch()
	bt.Write(src, sub)
	bt.Read(dst, sub)
	err = bt.Post().Wait(ctx)
	require.ErrorIs(t, err, rdma.ErrNotSupported, "a batch with a READ")
	assert.Contains(t, err.Error(), "UC")
	assert.Zero(t, c.Stats().Failed, "refusals at the call fail no operation the device saw")
}

// Rule: on UC a message that finds no receive at the peer is dropped
// there, and its sender's Future succeeds all the same: a sender that
// outruns the peer's window loses messages, never fails.
func TestUCOverrun(t *testing.T) { eachProvider(t, testUCOverrun) }

func testUCOverrun(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, append(opts, rdma.WithTransport(rdma.UC), rdma.WithQueueDepth(64, 8))...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, recvDepth := s.QueueDepth()
	sent := 4 * recvDepth
	for i := range sent {
		b, err := c.Alloc(8)
		require.NoError(t, err)
		b.Bytes()[0] = byte(i)
		require.NoError(t, c.Send(b).Wait(ctx), "message %d: a UC send succeeds at the sender", i)
		b.Release()
	}
	// The receives posted took the first messages; the rest found none.
	// A marker sent after they are taken again arrives, and nothing
	// after it.
	var got []byte
	for len(got) < recvDepth {
		f := s.Recv()
		require.NoError(t, f.Wait(ctx))
		got = append(got, f.Buffer().Bytes()[0])
		f.Buffer().Release()
	}
	marker, err := c.Alloc(8)
	require.NoError(t, err)
	marker.Bytes()[0] = 0xff
	rf := s.Recv()
	require.NoError(t, c.Send(marker).Wait(ctx))
	marker.Release()
	require.NoError(t, rf.Wait(ctx))
	assert.Equal(t, byte(0xff), rf.Buffer().Bytes()[0], "the message after the dropped ones is the marker")
	rf.Buffer().Release()
	for i, b := range got {
		assert.Equal(t, byte(i), b, "the messages that found a receive are the first, in order")
	}
	t.Logf("%d messages sent, %d found a receive, the rest were dropped at the peer", sent, len(got))
}

// Rule: a dialer and a listener of different transports are refused at
// the handshake, with an error matching ErrRefused that names both; the
// listener goes on accepting.
func TestUCMismatch(t *testing.T) {
	for _, tc := range []struct{ dial, listen rdma.Transport }{{rdma.UC, rdma.RC}, {rdma.RC, rdma.UC}} {
		t.Run(tc.dial.String()+"-to-"+tc.listen.String(), func(t *testing.T) {
			ln, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithProvider("soft"), rdma.WithTransport(tc.listen))
			require.NoError(t, err)
			defer ln.Close()
			assert.Equal(t, tc.listen, ln.Transport())
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err = rdma.Dial(ctx, "rdma", ln.Addr().String(), rdma.WithProvider("soft"), rdma.WithTransport(tc.dial))
			require.ErrorIs(t, err, rdma.ErrRefused)
			assert.Contains(t, err.Error(), "transport is "+tc.dial.String())
			assert.Contains(t, err.Error(), "listener's "+tc.listen.String())

			// The listener still serves a dialer of its own transport.
			acc := make(chan *rdma.Conn, 1)
			go func() { a, _ := ln.Accept(ctx); acc <- a }()
			c, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), rdma.WithProvider("soft"), rdma.WithTransport(tc.listen))
			require.NoError(t, err)
			defer c.Close()
			a := <-acc
			require.NotNil(t, a)
			defer a.Close()
			assert.Equal(t, tc.listen, a.Transport())
		})
	}
}

// Rule: WithTransport takes RC or UC, and nothing else.
func TestUCOptions(t *testing.T) {
	_, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithProvider("soft"), rdma.WithTransport(rdma.Transport(9)))
	require.ErrorIs(t, err, rdma.ErrInvalid)
	assert.Equal(t, "UC", rdma.UC.String())
	assert.Equal(t, "Transport(9)", rdma.Transport(9).String())
}
