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
			l, err := Listen("rdma", "127.0.0.1:0", rdma.WithProvider("soft"))
			require.NoError(t, err)
			defer l.Close()
			acc := make(chan *Conn, 1)
			go func() {
				c, _ := l.(*Listener).AcceptContext(ctx)
				s, _ := c.(*Conn)
				acc <- s
			}()
			raw, err := rdma.Dial(ctx, "rdma", l.Addr().String(), rdma.WithProvider("soft"), rdma.WithQueueDepth(64, 32), rdma.WithProtocol(Protocol))
			require.NoError(t, err)
			defer raw.Close()
			s := <-acc
			require.NotNil(t, s)
			defer s.Close()

			// The stream's hello names its ring.
			f := raw.Recv()
			require.NoError(t, f.Wait(ctx))
			hello := f.Buffer().Bytes()
			require.Len(t, hello, helloSize)
			ring := rdma.RemoteRegion{
				Addr: binary.BigEndian.Uint64(hello[16:]),
				Len:  int(binary.BigEndian.Uint32(hello[24:])),
				RKey: binary.BigEndian.Uint32(hello[28:]),
			}
			f.Buffer().Release()
			// Ours, with a ring of our own exposed.
			mine, err := raw.Alloc(MinRingSize)
			require.NoError(t, err)
			defer mine.Release()
			region, err := raw.Expose(mine, rdma.RemoteWrite)
			require.NoError(t, err)
			hb, err := raw.Alloc(helloSize)
			require.NoError(t, err)
			marshalHello(hb.Bytes(), region)
			require.NoError(t, raw.SendWithImm(hb, streamImm(opHello, 0)).Wait(ctx))
			hb.Release()

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

type onlyReader struct{ io.Reader }
