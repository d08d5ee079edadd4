package rdma_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
)

// packetEngine opens an engine for opts, closed when the test ends, on
// which ListenPacket works: a device without UD queue pairs skips the
// test naming the feature, except under RDMA_TEST_REQUIRE_DEVICE=1,
// where the default device is rxe (which has UD) and a skip would hide a
// failure.
func packetEngine(t *testing.T, opts []rdma.Option) *rdma.Engine {
	t.Helper()
	e, err := rdma.OpenEngine(engineOpts(opts)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, e.Close())
		assert.Zero(t, e.PoolStats().BuffersInUse, "buffers of the engine's pool in use after every PacketConn closed")
	})
	p, err := e.ListenPacket("rdma", "127.0.0.1:0")
	if errors.Is(err, rdma.ErrNotSupported) && os.Getenv("RDMA_TEST_REQUIRE_DEVICE") != "1" {
		t.Skipf("device %s lacks UD queue pairs: %v", e.Device(), err)
	}
	require.NoError(t, err)
	require.NoError(t, p.Close())
	return e
}

// listenPacket opens a PacketConn on e at 127.0.0.1, closed when the
// test ends.
func listenPacket(t *testing.T, e *rdma.Engine, opts ...rdma.ConnOption) *rdma.PacketConn {
	t.Helper()
	p, err := e.ListenPacket("rdma", "127.0.0.1:0", opts...)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
	return p
}

// readWithin reads one datagram, failing the test after 10 s.
func readWithin(t *testing.T, p *rdma.PacketConn, b []byte) (int, net.Addr) {
	t.Helper()
	require.NoError(t, p.SetReadDeadline(time.Now().Add(10*time.Second)))
	n, a, err := p.ReadFrom(b)
	require.NoError(t, err)
	return n, a
}

// Rule: a datagram WriteTo sends to a PacketConn's address arrives whole,
// ReadFrom reports the sender's ip:port (its LocalAddr), and a reply to
// that address reaches the sender, which sees the replier's address.
func TestPacketPingPong(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		e := packetEngine(t, opts)
		a, b := listenPacket(t, e), listenPacket(t, e)
		assert.Equal(t, "rdma", a.LocalAddr().Network())
		t.Logf("%s device %s, MaxDatagram %d", a.Provider(), a.Device(), a.MaxDatagram())
		buf := make([]byte, 8192)
		for i := range 20 {
			msg := []byte(fmt.Sprintf("ping %d", i))
			n, err := a.WriteTo(msg, b.LocalAddr())
			require.NoError(t, err)
			require.Equal(t, len(msg), n)
			n, from := readWithin(t, b, buf)
			require.Equal(t, string(msg), string(buf[:n]))
			require.Equal(t, a.LocalAddr().String(), from.String(), "sender reported")
			_, err = b.WriteTo([]byte("pong"), from)
			require.NoError(t, err)
			n, from = readWithin(t, a, buf)
			require.Equal(t, "pong", string(buf[:n]))
			require.Equal(t, b.LocalAddr().String(), from.String())
		}
		st := a.PacketStats()
		assert.Equal(t, uint64(20), st.Sent)
		assert.Equal(t, uint64(20), st.Received)
		assert.Equal(t, uint64(1), st.Resolved, "a asked b's side channel once")
		assert.Zero(t, b.PacketStats().Resolved, "b learnt a from its request")
	})
}

// Rule: the package-level ListenPacket takes Dial's options, the
// provider among them; WriteTo takes a *net.UDPAddr and what
// ResolvePacketAddr returns; a network other than "rdma" is refused.
func TestPacketListenAndAddresses(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		packetEngine(t, opts) // skips where the device lacks UD
		a, err := rdma.ListenPacket("rdma", "127.0.0.1:0", opts...)
		require.NoError(t, err)
		defer a.Close()
		b, err := rdma.ListenPacket("rdma", "127.0.0.1:0", opts...)
		require.NoError(t, err)
		defer b.Close()
		ua, err := net.ResolveUDPAddr("udp", b.LocalAddr().String())
		require.NoError(t, err)
		pa, err := rdma.ResolvePacketAddr(b.LocalAddr().String())
		require.NoError(t, err)
		assert.Equal(t, b.LocalAddr().String(), pa.String())
		buf := make([]byte, 64)
		for _, to := range []net.Addr{ua, pa} {
			_, err := a.WriteTo([]byte("x"), to)
			require.NoError(t, err, "WriteTo %T", to)
			n, from := readWithin(t, b, buf)
			assert.Equal(t, "x", string(buf[:n]))
			assert.Equal(t, a.LocalAddr().String(), from.String())
		}
		_, err = a.WriteTo([]byte("x"), &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1})
		assert.ErrorIs(t, err, rdma.ErrInvalid)
		_, err = rdma.ListenPacket("udp", "127.0.0.1:0", opts...)
		assert.ErrorIs(t, err, rdma.ErrInvalid)
		_, err = rdma.ListenPacket("rdma", "127.0.0.1:0", append(opts, rdma.WithRDMACM())...)
		assert.ErrorIs(t, err, rdma.ErrInvalid)
	})
}

// Rule: deadlines work as net.PacketConn's: a past one fails ReadFrom and
// WriteTo at once with a timeout wrapping os.ErrDeadlineExceeded, one set
// while ReadFrom waits ends the wait, and clearing it makes the
// PacketConn usable again.
func TestPacketDeadlines(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		e := packetEngine(t, opts)
		a, b := listenPacket(t, e), listenPacket(t, e)
		buf := make([]byte, 64)

		require.NoError(t, b.SetReadDeadline(time.Now().Add(-time.Second)))
		start := time.Now()
		_, _, err := b.ReadFrom(buf)
		requireTimeout(t, err)
		assert.Less(t, time.Since(start), time.Second, "a past deadline fails at once")

		require.NoError(t, a.SetWriteDeadline(time.Now().Add(-time.Second)))
		_, err = a.WriteTo([]byte("x"), b.LocalAddr())
		requireTimeout(t, err)
		require.NoError(t, a.SetWriteDeadline(time.Time{}))

		// A deadline set while ReadFrom waits (or just before it
		// starts: either way it must end the call) ends the wait.
		require.NoError(t, b.SetReadDeadline(time.Time{}))
		done := make(chan error, 1)
		go func() {
			_, _, err := b.ReadFrom(buf)
			done <- err
		}()
		require.NoError(t, b.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
		select {
		case err := <-done:
			requireTimeout(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("ReadFrom still blocked 10 s after its deadline")
		}

		require.NoError(t, b.SetDeadline(time.Time{}))
		_, err = a.WriteTo([]byte("again"), b.LocalAddr())
		require.NoError(t, err)
		n, _ := readWithin(t, b, buf)
		assert.Equal(t, "again", string(buf[:n]))
	})
}

func requireTimeout(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout(), "Timeout() of %v", err)
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
}

// Rule: Close unblocks a ReadFrom that waits and a WriteTo that waits
// for a peer's side channel, with an error wrapping net.ErrClosed, and
// later calls fail the same way; Close is idempotent.
func TestPacketCloseUnblocks(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		e := packetEngine(t, opts)
		p, err := e.ListenPacket("rdma", "127.0.0.1:0")
		require.NoError(t, err)
		other := listenPacket(t, e)
		silent, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		defer silent.Close()
		done := make(chan error, 2)
		go func() {
			_, _, err := p.ReadFrom(make([]byte, 64))
			done <- err
		}()
		go func() {
			_, err := p.WriteTo([]byte("x"), silent.LocalAddr()) // waits ~3 s for an answer
			done <- err
		}()
		require.NoError(t, p.Close())
		for range 2 {
			select {
			case err := <-done:
				require.ErrorIs(t, err, net.ErrClosed)
				var oe *net.OpError
				require.ErrorAs(t, err, &oe)
				assert.Contains(t, []string{"read", "write"}, oe.Op)
			case <-time.After(10 * time.Second):
				t.Fatal("ReadFrom or WriteTo still blocked 10 s after Close")
			}
		}
		_, err = p.WriteTo([]byte("x"), other.LocalAddr())
		require.ErrorIs(t, err, net.ErrClosed)
		_, _, err = p.ReadFrom(make([]byte, 1))
		require.ErrorIs(t, err, net.ErrClosed)
		require.NoError(t, p.Close())
	})
}

// Rule: a datagram of exactly MaxDatagram bytes arrives whole; one byte
// more fails at WriteTo with an error wrapping ErrInvalid that names the
// MTU, and nothing is sent.
func TestPacketMTU(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		e := packetEngine(t, opts)
		a, b := listenPacket(t, e), listenPacket(t, e)
		mtu := a.MaxDatagram()
		require.Contains(t, []int{256, 512, 1024, 2048, 4096}, mtu)
		big := make([]byte, mtu+1)
		for i := range big {
			big[i] = byte(i * 7)
		}
		_, err := a.WriteTo(big, b.LocalAddr())
		require.ErrorIs(t, err, rdma.ErrInvalid)
		assert.Contains(t, err.Error(), fmt.Sprintf("%d-byte MTU", mtu))
		assert.Zero(t, a.PacketStats().Sent)
		n, err := a.WriteTo(big[:mtu], b.LocalAddr())
		require.NoError(t, err)
		require.Equal(t, mtu, n)
		buf := make([]byte, mtu+100)
		n, _ = readWithin(t, b, buf)
		require.Equal(t, mtu, n)
		assert.Equal(t, big[:mtu], buf[:n])
		// A buffer shorter than the datagram gets its first bytes, as
		// with UDP.
		_, err = a.WriteTo(big[:mtu], b.LocalAddr())
		require.NoError(t, err)
		n, _ = readWithin(t, b, buf[:10])
		assert.Equal(t, 10, n)
		assert.Equal(t, big[:10], buf[:10])
	})
}

// Rule: datagrams from several senders to one receiver each report their
// own sender; the receiver's replies reach each sender.
func TestPacketManySenders(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		e := packetEngine(t, opts)
		const senders, each = 4, 40 // 160: below the default receive depth, so none is dropped
		recv := listenPacket(t, e)
		var ps []*rdma.PacketConn
		for range senders {
			ps = append(ps, listenPacket(t, e))
		}
		var wg sync.WaitGroup
		errs := make(chan error, senders)
		for i, p := range ps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range each {
					if _, err := p.WriteTo([]byte(fmt.Sprintf("%d %d", i, j)), recv.LocalAddr()); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		next := make([]int, senders)
		from := make([]net.Addr, senders)
		buf := make([]byte, 64)
		for range senders * each {
			n, a := readWithin(t, recv, buf)
			var i, j int
			_, err := fmt.Sscanf(string(buf[:n]), "%d %d", &i, &j)
			require.NoError(t, err)
			require.Equal(t, ps[i].LocalAddr().String(), a.String(), "sender of %q", buf[:n])
			require.Equal(t, next[i], j, "datagrams of sender %d out of order", i)
			next[i]++
			from[i] = a
		}
		for i, p := range ps {
			_, err := recv.WriteTo([]byte("reply"), from[i])
			require.NoError(t, err)
			n, a := readWithin(t, p, buf)
			assert.Equal(t, "reply", string(buf[:n]))
			assert.Equal(t, recv.LocalAddr().String(), a.String())
		}
		st := recv.PacketStats()
		assert.Equal(t, uint64(senders*each), st.Received)
		assert.Zero(t, st.DroppedQueueFull)
		assert.Equal(t, senders, st.Peers)
	})
}

// Rule: a receiver that falls behind drops what does not fit its queue
// (UD's rule) and counts it; what it reads afterwards is whole and in
// order.
func TestPacketQueueFull(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		e := packetEngine(t, opts)
		const depth, sent = 8, 12
		a := listenPacket(t, e)
		b := listenPacket(t, e, rdma.WithQueueDepth(16, depth))
		for i := range sent {
			_, err := a.WriteTo([]byte{byte(i)}, b.LocalAddr())
			require.NoError(t, err)
			// One at a time, each received before the next is sent:
			// a receive is posted again for each, so only the queue
			// for ReadFrom can drop them (a datagram that finds no
			// receive posted is dropped by the device, uncounted).
			require.Eventually(t, func() bool { return b.PacketStats().Received == uint64(i+1) }, 10*time.Second, 100*time.Microsecond,
				"datagram %d not received: %+v", i, b.PacketStats())
		}
		st := b.PacketStats()
		assert.Equal(t, uint64(sent-depth), st.DroppedQueueFull, "%+v", st)
		buf := make([]byte, 16)
		for i := range depth {
			n, _ := readWithin(t, b, buf)
			require.Equal(t, 1, n)
			require.Equal(t, byte(i), buf[0], "the first datagrams stay queued; the later ones are dropped")
		}
		require.NoError(t, b.SetReadDeadline(time.Now().Add(-time.Second)))
		_, _, err := b.ReadFrom(buf)
		requireTimeout(t, err)
	})
}

// Rule: the side channel survives a hostile peer: datagrams too short,
// too long, of the wrong magic, answers nobody asked for, and requests
// that claim a GID other than their sender's are ignored and counted;
// the PacketConn goes on working.
func TestPacketHostileSideChannel(t *testing.T) {
	e := packetEngine(t, []rdma.Option{rdma.WithProvider(rdma.ProviderSoft)})
	a, b := listenPacket(t, e), listenPacket(t, e)
	u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer u.Close()
	to, err := net.ResolveUDPAddr("udp", b.LocalAddr().String())
	require.NoError(t, err)
	valid := func(kind byte, gid [16]byte) []byte {
		m := make([]byte, 64)
		copy(m, "RDUD")
		m[4], m[5] = 1, kind
		m[16+2], m[16+3] = 0x12, 0x34 // QPN 0x1234
		copy(m[24:40], gid[:])
		m[40+1] = 1  // LID 1
		m[42] = 0x10 // MTU 4096
		return m
	}
	self := [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 1} // 127.0.0.1, mapped
	other := [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 9} // 10.0.0.9: not the sender's
	hostile := [][]byte{
		{},
		[]byte("RDUD"),
		make([]byte, 63),
		make([]byte, 64),
		append(valid(1, self), 0), // 65 bytes
		valid(2, self),            // an answer to no request
		valid(1, other),           // a GID not the sender's
		valid(3, self),            // an unknown kind
		[]byte(strings.Repeat("x", 2000)),
	}
	for _, m := range hostile {
		_, err := u.WriteTo(m, to)
		require.NoError(t, err)
	}
	bad := valid(1, self)
	bad[16] = 0xff // QPN 0xff001234: more than 24 bits
	_, err = u.WriteTo(bad, to)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.PacketStats().Ignored == uint64(len(hostile)+1) }, 10*time.Second, time.Millisecond,
		"ignored: %+v", b.PacketStats())
	// A valid request is answered with as many bytes as it had.
	_, err = u.WriteTo(valid(1, self), to)
	require.NoError(t, err)
	require.NoError(t, u.SetReadDeadline(time.Now().Add(10*time.Second)))
	ans := make([]byte, 200)
	n, _, err := u.ReadFrom(ans)
	require.NoError(t, err)
	assert.Equal(t, 64, n, "the answer is as long as the request")
	assert.Equal(t, "RDUD", string(ans[:4]))
	assert.Equal(t, byte(2), ans[5])
	buf := make([]byte, 64)
	_, err = a.WriteTo([]byte("still here"), b.LocalAddr())
	require.NoError(t, err)
	n, from := readWithin(t, b, buf)
	assert.Equal(t, "still here", string(buf[:n]))
	assert.Equal(t, a.LocalAddr().String(), from.String())
}

// Rule: WriteTo to an address where no PacketConn listens fails with a
// clear error, within the write deadline when one is set.
func TestPacketResolveFails(t *testing.T) {
	e := packetEngine(t, []rdma.Option{rdma.WithProvider(rdma.ProviderSoft)})
	a := listenPacket(t, e)
	u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}) // answers nothing
	require.NoError(t, err)
	defer u.Close()
	require.NoError(t, a.SetWriteDeadline(time.Now().Add(200*time.Millisecond)))
	_, err = a.WriteTo([]byte("x"), u.LocalAddr())
	requireTimeout(t, err)
	assert.Contains(t, err.Error(), "no answer from its side channel")
	require.NoError(t, a.SetWriteDeadline(time.Time{}))
	_, err = a.WriteTo([]byte("x"), u.LocalAddr())
	require.Error(t, err)
	assert.NotErrorIs(t, err, os.ErrDeadlineExceeded)
	assert.Contains(t, err.Error(), "no datagram endpoint")
	assert.Equal(t, uint64(1), a.PacketStats().ResolveFailed)
}

// Rule: an engine with a PacketConn on it still reports its stats (the
// PacketConn is not a connection), and an empty datagram is a datagram.
func TestPacketEngineStatsAndEmpty(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		e := packetEngine(t, opts)
		a, b := listenPacket(t, e), listenPacket(t, e)
		st := e.Stats()
		assert.Zero(t, st.Conns)
		_, err := a.WriteTo(nil, b.LocalAddr())
		require.NoError(t, err)
		n, from := readWithin(t, b, make([]byte, 8))
		assert.Zero(t, n)
		assert.Equal(t, a.LocalAddr().String(), from.String())
	})
}

// Rule: ReadFrom and WriteTo may be called from many goroutines at once
// (under -race): every datagram is read once, whole.
func TestPacketConcurrent(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		e := packetEngine(t, opts)
		a, b := listenPacket(t, e), listenPacket(t, e)
		const writers, each = 4, 50 // 200: below the receive depth
		var seen sync.Map
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					_, err := a.WriteTo([]byte(fmt.Sprintf("%d/%d", w, i)), b.LocalAddr())
					assert.NoError(t, err)
				}
			}()
		}
		errs := make(chan error, writers)
		for range writers {
			go func() {
				buf := make([]byte, 32)
				for range each {
					n, _, err := b.ReadFrom(buf)
					if err != nil {
						errs <- err
						return
					}
					if _, dup := seen.LoadOrStore(string(buf[:n]), true); dup {
						errs <- fmt.Errorf("%q read twice", buf[:n])
						return
					}
				}
				errs <- nil
			}()
		}
		wg.Wait()
		require.NoError(t, b.SetReadDeadline(time.Now().Add(10*time.Second)))
		for range writers {
			require.NoError(t, <-errs)
		}
		for w := range writers {
			for i := range each {
				_, ok := seen.Load(fmt.Sprintf("%d/%d", w, i))
				require.True(t, ok, "datagram %d/%d never read", w, i)
			}
		}
	})
}

// Rule: on an iWARP device (siw), which has no UD queue pairs,
// ListenPacket fails with ErrNotSupported naming the transport, the
// package-level one and an engine's alike. Multicast (JoinGroup) needs a
// PacketConn, so this is where siw's lack of it shows: there is no
// PacketConn to join a group with.
func TestVerbsIWARPPacketNotSupported(t *testing.T) {
	ip0, _ := siwAddrs(t)
	_, err := rdma.ListenPacket("rdma", ip0+":0")
	require.ErrorIs(t, err, rdma.ErrNotSupported)
	assert.Contains(t, err.Error(), "iWARP")
	assert.Contains(t, err.Error(), "UD")

	devs, err := rdma.Devices()
	require.NoError(t, err)
	for _, d := range devs {
		if d.Transport != "iWARP" || !d.Usable {
			continue
		}
		e, err := rdma.OpenEngine(rdma.WithProvider(rdma.ProviderVerbs), rdma.WithDevice(d.Name))
		require.NoError(t, err)
		_, err = e.ListenPacket("rdma", ip0+":0")
		assert.ErrorIs(t, err, rdma.ErrNotSupported, "%s", d.Name)
		assert.ErrorContains(t, err, "UD")
		require.NoError(t, e.Close())
	}
}

// Rule: Close gives back every buffer: the receives posted, the
// datagrams no ReadFrom took, the sends in flight (the engine's cleanup
// checks its pool).
func TestPacketCloseReleases(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		e := packetEngine(t, opts)
		a := listenPacket(t, e)
		b, err := e.ListenPacket("rdma", "127.0.0.1:0")
		require.NoError(t, err)
		for i := range 5 {
			_, err := a.WriteTo([]byte{byte(i)}, b.LocalAddr())
			require.NoError(t, err)
			require.Eventually(t, func() bool { return b.PacketStats().Received == uint64(i+1) }, 10*time.Second, 100*time.Microsecond)
		}
		require.Positive(t, e.PoolStats().BuffersInUse)
		require.NoError(t, b.Close())
		require.NoError(t, a.Close())
		assert.Zero(t, e.PoolStats().BuffersInUse, "buffers in use after Close")
	})
}

// BenchmarkPacketPingPong is a 64-byte round trip between two
// PacketConns of one engine on soft, beside the same over UDP sockets on
// loopback; in the VM also between rxe0 and rxe1, beside UDP between
// their addresses.
func BenchmarkPacketPingPong(b *testing.B) {
	msg := make([]byte, 64)
	pingPong := func(b *testing.B, a, c net.PacketConn, to net.Addr) {
		buf := make([]byte, 128)
		done := make(chan error, 1)
		go func() {
			for range b.N {
				n, from, err := c.ReadFrom(buf)
				if err == nil {
					_, err = c.WriteTo(buf[:n], from)
				}
				if err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		rb := make([]byte, 128)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, err := a.WriteTo(msg, to); err != nil {
				b.Fatal(err)
			}
			if _, _, err := a.ReadFrom(rb); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.Run("rdma", func(b *testing.B) {
		e, err := rdma.OpenEngine(rdma.WithProvider(rdma.ProviderSoft))
		require.NoError(b, err)
		defer e.Close()
		a, err := e.ListenPacket("rdma", "127.0.0.1:0")
		require.NoError(b, err)
		defer a.Close()
		c, err := e.ListenPacket("rdma", "127.0.0.1:0")
		require.NoError(b, err)
		defer c.Close()
		pingPong(b, a, c, c.LocalAddr())
	})
	b.Run("udp", func(b *testing.B) {
		a, err := net.ListenPacket("udp", "127.0.0.1:0")
		require.NoError(b, err)
		defer a.Close()
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		require.NoError(b, err)
		defer c.Close()
		pingPong(b, a, c, c.LocalAddr())
	})
	// In the VM: between rxe0 and rxe1, and UDP between the same two
	// addresses (across the same veth pair).
	ip0, ip1 := os.Getenv("RDMA_VM_IP0"), os.Getenv("RDMA_VM_IP1")
	if ip0 == "" || ip1 == "" {
		return
	}
	b.Run("rxe", func(b *testing.B) {
		a, err := rdma.ListenPacket("rdma", ip0+":0", rdma.WithProvider(rdma.ProviderVerbs))
		require.NoError(b, err)
		defer a.Close()
		c, err := rdma.ListenPacket("rdma", ip1+":0", rdma.WithProvider(rdma.ProviderVerbs))
		require.NoError(b, err)
		defer c.Close()
		pingPong(b, a, c, c.LocalAddr())
	})
	b.Run("udp-veth", func(b *testing.B) {
		a, err := net.ListenPacket("udp", ip0+":0")
		require.NoError(b, err)
		defer a.Close()
		c, err := net.ListenPacket("udp", ip1+":0")
		require.NoError(b, err)
		defer c.Close()
		pingPong(b, a, c, c.LocalAddr())
	})
}

// Rule: between two devices (rxe0 and rxe1 in the VM, on a veth pair, so
// the datagrams cross a link), PacketConns at the devices' own addresses
// exchange datagrams of the path MTU both ways and see each other's
// ip:port; their GIDs are their addresses, so the side channel checks
// that each peer announces the GID of the address it sends from.
func TestVerbsPacketTwoDevices(t *testing.T) {
	ip0, ip1 := cmAddrs(t)
	a, err := rdma.ListenPacket("rdma", ip0+":0", rdma.WithProvider(rdma.ProviderVerbs))
	require.NoError(t, err)
	defer a.Close()
	b, err := rdma.ListenPacket("rdma", ip1+":0", rdma.WithProvider(rdma.ProviderVerbs))
	require.NoError(t, err)
	defer b.Close()
	require.NotEqual(t, a.Device(), b.Device(), "both on one device: the datagrams would not cross the link")
	t.Logf("%s (%s) <-> %s (%s), MaxDatagram %d/%d", a.LocalAddr(), a.Device(), b.LocalAddr(), b.Device(), a.MaxDatagram(), b.MaxDatagram())
	mtu := min(a.MaxDatagram(), b.MaxDatagram())
	msg := make([]byte, mtu)
	buf := make([]byte, mtu+1)
	for i := range 10 {
		msg[0], msg[mtu-1] = byte(i), byte(i+1)
		_, err := a.WriteTo(msg, b.LocalAddr())
		require.NoError(t, err)
		n, from := readWithin(t, b, buf)
		require.Equal(t, msg, buf[:n])
		require.Equal(t, a.LocalAddr().String(), from.String())
		_, err = b.WriteTo(buf[:n], from)
		require.NoError(t, err)
		n, from = readWithin(t, a, buf)
		require.Equal(t, msg, buf[:n])
		require.Equal(t, b.LocalAddr().String(), from.String())
	}
	assert.Zero(t, b.PacketStats().Ignored)
	assert.Zero(t, a.PacketStats().Ignored)
}

// Rule: the zero-copy path: SendTo sends a registered Buffer (or a Slice
// of one) and its Future resolves once the datagram has left; RecvFrom
// hands the datagram over in a pool Buffer with its sender, which the
// caller releases; a buffer of another engine, a datagram over the MTU
// and an end of the context fail as the copying calls do.
func TestPacketZeroCopy(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		e := packetEngine(t, opts)
		a, b := listenPacket(t, e), listenPacket(t, e)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		src, err := a.Alloc(a.MaxDatagram() + 1)
		require.NoError(t, err)
		defer src.Release()
		for i := range src.Bytes() {
			src.Bytes()[i] = byte(i * 13)
		}
		f := a.SendTo(src, b.LocalAddr())
		require.ErrorIs(t, f.Wait(ctx), rdma.ErrInvalid, "a datagram over the MTU")
		f.Release()
		whole, err := src.Slice(0, a.MaxDatagram())
		require.NoError(t, err)
		part, err := src.Slice(5, 100)
		require.NoError(t, err)
		for _, l := range []rdma.Local{whole, part} {
			f := a.SendTo(l, b.LocalAddr())
			require.NoError(t, f.Wait(ctx))
			f.Release()
			got, from, err := b.RecvFrom(ctx)
			require.NoError(t, err)
			assert.Equal(t, a.LocalAddr().String(), from.String())
			want := src.Bytes()[:a.MaxDatagram()]
			if got.Len() == 100 {
				want = src.Bytes()[5:105]
			}
			assert.Equal(t, want, got.Bytes())
			require.NoError(t, got.Release())
		}
		// A reply to the address RecvFrom reported, read by ReadFrom.
		three, err := src.Slice(0, 3)
		require.NoError(t, err)
		f = b.SendTo(three, a.LocalAddr())
		require.NoError(t, f.Wait(ctx))
		n, from := readWithin(t, a, make([]byte, 8))
		assert.Equal(t, 3, n)
		assert.Equal(t, b.LocalAddr().String(), from.String())

		other, err := rdma.OpenEngine(engineOpts(opts)...)
		require.NoError(t, err)
		defer other.Close()
		foreign, err := other.Alloc(8)
		require.NoError(t, err)
		defer foreign.Release()
		require.ErrorIs(t, a.SendTo(foreign, b.LocalAddr()).Wait(ctx), rdma.ErrInvalid, "a buffer of another engine")

		short, cancelShort := context.WithCancel(ctx)
		cancelShort()
		_, _, err = b.RecvFrom(short)
		require.ErrorIs(t, err, context.Canceled)
		require.NoError(t, a.Close())
		_, err = a.Alloc(8)
		require.ErrorIs(t, err, net.ErrClosed)
		require.ErrorIs(t, a.SendTo(src, b.LocalAddr()).Wait(ctx), net.ErrClosed)
	})
}

// Rule: a WriteTo and the ReadFrom of its datagram allocate nothing on
// soft once the peer is known: ReadFrom hands out the address it made
// once for the peer.
func TestPacketAllocs(t *testing.T) {
	e := packetEngine(t, []rdma.Option{rdma.WithProvider(rdma.ProviderSoft)})
	a, b := listenPacket(t, e), listenPacket(t, e)
	msg, buf := make([]byte, 64), make([]byte, 128)
	to := b.LocalAddr()
	round := func() {
		if _, err := a.WriteTo(msg, to); err != nil {
			t.Fatal(err)
		}
		if _, _, err := b.ReadFrom(buf); err != nil {
			t.Fatal(err)
		}
	}
	round() // resolves b
	allocs := testing.AllocsPerRun(200, round)
	assert.Less(t, allocs, 0.5, "allocations per datagram written and read")
}

func ExampleListenPacket() {
	// Two PacketConns; usually in two processes on two hosts.
	a, err := rdma.ListenPacket("rdma", "127.0.0.1:0", rdma.WithProvider("soft"))
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := rdma.ListenPacket("rdma", "127.0.0.1:0", rdma.WithProvider("soft"))
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	// The first datagram to b asks b's side channel for its queue pair.
	if _, err := a.WriteTo([]byte("ping"), b.LocalAddr()); err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, b.MaxDatagram())
	n, from, err := b.ReadFrom(buf)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(buf[:n]), "from a:", from.String() == a.LocalAddr().String())
	// A reply to the sender's address reaches it.
	if _, err := b.WriteTo([]byte("pong"), from); err != nil {
		log.Fatal(err)
	}
	n, _, err = a.ReadFrom(buf)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(buf[:n]), "up to", a.MaxDatagram(), "bytes a datagram")
	// Output:
	// ping from a: true
	// pong up to 4096 bytes a datagram
}

// Rule: a batch posts its datagrams in one call, to several peers; its
// Future resolves once all have left, with the bytes sent; the batch is
// empty after Post and reusable; an invalid datagram fails the whole
// batch and sends none; a batch over the send depth is refused.
func TestPacketBatch(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		e := packetEngine(t, opts)
		a := listenPacket(t, e, rdma.WithQueueDepth(8, 64))
		b, c := listenPacket(t, e), listenPacket(t, e)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		src, err := a.Alloc(64)
		require.NoError(t, err)
		defer src.Release()
		copy(src.Bytes(), "0123456789")
		batch := a.NewBatch()
		for round := range 2 {
			for i := range 6 {
				part, err := src.Slice(i, 1)
				require.NoError(t, err)
				to := b.LocalAddr()
				if i%2 == 1 {
					to = c.LocalAddr()
				}
				batch.SendTo(part, to)
			}
			require.Equal(t, 6, batch.Len())
			f := batch.Post()
			require.NoError(t, f.Wait(ctx), "round %d", round)
			assert.Equal(t, 6, f.Len())
			f.Release()
			assert.Zero(t, batch.Len())
			for i := range 6 {
				to := b
				if i%2 == 1 {
					to = c
				}
				got, from, err := to.RecvFrom(ctx)
				require.NoError(t, err)
				assert.Equal(t, []byte{byte('0' + i)}, got.Bytes())
				assert.Equal(t, a.LocalAddr().String(), from.String())
				require.NoError(t, got.Release())
			}
		}
		// One bad datagram: nothing is sent.
		batch.SendTo(src, b.LocalAddr())
		batch.SendTo(src, &net.TCPAddr{})
		require.ErrorIs(t, batch.Post().Wait(ctx), rdma.ErrInvalid)
		for range 9 {
			batch.SendTo(src, b.LocalAddr())
		}
		require.ErrorIs(t, batch.Post().Wait(ctx), rdma.ErrInvalid, "9 datagrams, send depth 8")
		assert.Equal(t, uint64(12), a.PacketStats().Sent)
		require.NoError(t, b.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
		_, _, err = b.ReadFrom(make([]byte, 64))
		requireTimeout(t, err)
	})
}
