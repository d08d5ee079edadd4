package stream

import (
	"context"
	"encoding/binary"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
)

// TestStreamHostilePeer: a peer that claims the stream's protocol, says
// a valid hello and then breaks the ring's rules (writes past the ring,
// credits bytes it was never sent) is cut off: the stream's Read returns
// what was legitimately there, then a protocol error that is also a
// reset, and the peer's connection ends at once, telling it why.
func TestStreamHostilePeer(t *testing.T) {
	for name, attack := range map[string]func(t *testing.T, raw *rdma.Conn, ring rdma.RemoteRegion){
		"past-the-ring": func(t *testing.T, raw *rdma.Conn, ring rdma.RemoteRegion) {
			b, err := raw.Alloc(ring.Len)
			require.NoError(t, err)
			defer b.Release()
			one, err := b.Slice(0, 1)
			require.NoError(t, err)
			head, err := ring.Slice(0, 1)
			require.NoError(t, err)
			// The whole ring, which is allowed, then one byte more.
			require.NoError(t, raw.WriteWithImm(b, ring, streamImm(opData, 0)).Wait(t.Context()))
			require.NoError(t, raw.WriteWithImm(one, head, streamImm(opData, 0)).Wait(t.Context()))
		},
		"credits-never-sent": func(t *testing.T, raw *rdma.Conn, ring rdma.RemoteRegion) {
			b, err := raw.Alloc(1)
			require.NoError(t, err)
			defer b.Release()
			empty, err := b.Slice(0, 0)
			require.NoError(t, err)
			require.NoError(t, raw.SendWithImm(empty, streamImm(opCredit, 5)).Wait(t.Context()))
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			raw, s, ring := rawPeer(t, ctx)

			attack(t, raw, ring)

			require.NoError(t, s.SetReadDeadline(time.Now().Add(20*time.Second)))
			n, err := io.Copy(io.Discard, onlyReader{s})
			require.ErrorIs(t, err, ErrProtocol, "after %d bytes", n)
			require.ErrorIs(t, err, syscall.ECONNRESET)
			// The peer hears of it without doing anything more.
			select {
			case <-raw.Done():
			case <-ctx.Done():
				t.Fatal("the hostile peer's connection did not end")
			}
			require.ErrorIs(t, raw.Err(), rdma.ErrPeerClosed)
			require.Contains(t, raw.Err().Error(), "stream protocol error")
		})
	}
}

// TestStreamPeerWritesAnywhereInItsRing: what the receiver cannot check
// (docs/stream.md, "A hostile peer"). A WRITE_WITH_IMM's completion
// carries no address, so data written somewhere else than where the last
// data ended is not detected: the reader reads what is at the expected
// place as the announced bytes. And the peer holds write rights to the
// whole ring, so it can change bytes that arrived and were not read yet.
// Both garble only the peer's own stream: the connection goes on, and
// the peer's fin still ends it with io.EOF.
func TestStreamPeerWritesAnywhereInItsRing(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	raw, s, ring := rawPeer(t, ctx)
	require.NoError(t, s.SetReadDeadline(time.Now().Add(20*time.Second)))
	src, err := raw.Alloc(64)
	require.NoError(t, err)
	defer src.Release()
	write := func(off int, text string, imm bool) {
		t.Helper()
		n := copy(src.Bytes(), text)
		b, err := src.Slice(0, n)
		require.NoError(t, err)
		at, err := ring.Slice(off, n)
		require.NoError(t, err)
		if imm {
			require.NoError(t, raw.WriteWithImm(b, at, streamImm(opData, 0)).Wait(ctx))
		} else {
			require.NoError(t, raw.Write(b, at).Wait(ctx))
		}
	}
	read := func(n int) string {
		t.Helper()
		p := make([]byte, n)
		_, err := io.ReadFull(s, p)
		require.NoError(t, err)
		return string(p)
	}

	// 4 bytes announced as the stream's first, written at offset 1000
	// instead of 0: the reader takes the 4 zero bytes at 0.
	write(1000, "ABCD", true)
	require.Equal(t, "\x00\x00\x00\x00", read(4))

	// 5 bytes where they belong, then a plain WRITE over the first of
	// them before the reader got to them.
	write(4, "hello", true)
	write(4, "J", false)
	require.Equal(t, "Jello", read(5))

	// The connection is intact: the peer's fin ends the stream.
	b, err := src.Slice(0, 0)
	require.NoError(t, err)
	require.NoError(t, raw.SendWithImm(b, streamImm(opFin, 0)).Wait(ctx))
	n, err := s.Read(make([]byte, 1))
	require.Equal(t, 0, n)
	require.ErrorIs(t, err, io.EOF)
}

// rawPeer returns a stream accepted on soft from a peer that speaks the
// stream's protocol by hand on raw: the stream's hello read, a hello of
// its own sent. ring is the stream's receive ring, as its hello named it.
func rawPeer(t *testing.T, ctx context.Context) (raw *rdma.Conn, s *Conn, ring rdma.RemoteRegion) {
	t.Helper()
	l, err := Listen("rdma", "127.0.0.1:0", rdma.WithProvider("soft"))
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	acc := make(chan *Conn, 1)
	go func() {
		c, _ := l.(*Listener).AcceptContext(ctx)
		s, _ := c.(*Conn)
		acc <- s
	}()
	raw, err = rdma.Dial(ctx, "rdma", l.Addr().String(), rdma.WithProvider("soft"), rdma.WithQueueDepth(64, 32), rdma.WithProtocol(Protocol))
	require.NoError(t, err)
	t.Cleanup(func() { raw.Close() })
	s = <-acc
	require.NotNil(t, s)
	t.Cleanup(func() { s.Close() })

	// The stream's hello names its ring.
	f := raw.Recv()
	require.NoError(t, f.Wait(ctx))
	hello := f.Buffer().Bytes()
	require.Len(t, hello, helloSize)
	ring = rdma.RemoteRegion{
		Addr: binary.BigEndian.Uint64(hello[16:]),
		Len:  int(binary.BigEndian.Uint32(hello[24:])),
		RKey: binary.BigEndian.Uint32(hello[28:]),
	}
	f.Buffer().Release()
	// Ours, with a ring of our own exposed.
	mine, err := raw.Alloc(MinRingSize)
	require.NoError(t, err)
	t.Cleanup(func() { mine.Release() })
	region, err := raw.Expose(mine, rdma.RemoteWrite)
	require.NoError(t, err)
	hb, err := raw.Alloc(helloSize)
	require.NoError(t, err)
	marshalHello(hb.Bytes(), region)
	require.NoError(t, raw.SendWithImm(hb, streamImm(opHello, 0)).Wait(ctx))
	hb.Release()
	return raw, s, ring
}

type onlyReader struct{ io.Reader }
