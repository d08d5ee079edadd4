package stream_test

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/stream"
)

// onlyReader and onlyWriter hide io.WriterTo and io.ReaderFrom, so that
// io.Copy takes the stream's ReadFrom and WriteTo.
type onlyReader struct{ io.Reader }
type onlyWriter struct{ io.Writer }

// TestStreamReadFromWriteTo: io.Copy into and out of a stream uses
// ReadFrom and WriteTo, which move the bytes between the caller's reader
// or writer and ring memory; every byte arrives, in order, and each
// returns nil at the end (the source's EOF, the peer's fin).
func TestStreamReadFromWriteTo(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		c, s := streamPair(t, opts...)
		size := 8<<20 + 12345
		if inVM() {
			size = 1<<20 + 123
		}
		data := make([]byte, size)
		rnd := rand.New(rand.NewPCG(1, 2))
		for i := range data {
			data[i] = byte(rnd.Uint32())
		}
		got := make(chan []byte, 1)
		errs := make(chan error, 1)
		go func() {
			var b bytes.Buffer
			n, err := s.WriteTo(onlyWriter{&b})
			if err == nil && n != int64(b.Len()) {
				err = io.ErrShortWrite
			}
			errs <- err
			got <- b.Bytes()
		}()
		n, err := c.ReadFrom(onlyReader{bytes.NewReader(data)})
		require.NoError(t, err)
		require.Equal(t, int64(len(data)), n)
		require.NoError(t, c.CloseWrite())
		require.NoError(t, <-errs)
		assert.True(t, bytes.Equal(data, <-got), "bytes differ")

		// And through io.Copy, the other way.
		go func() {
			_, err := io.Copy(s, onlyReader{bytes.NewReader(data[:100000])})
			if err == nil {
				err = s.CloseWrite()
			}
			errs <- err
		}()
		var b bytes.Buffer
		_, err = io.Copy(onlyWriter{&b}, c)
		require.NoError(t, err)
		require.NoError(t, <-errs)
		assert.True(t, bytes.Equal(data[:100000], b.Bytes()), "bytes differ")
	})
}

// blockedReader blocks in Read until release is closed, then ends.
type blockedReader struct {
	entered chan struct{}
	release chan struct{}
}

func (r *blockedReader) Read(p []byte) (int, error) {
	close(r.entered)
	<-r.release
	return copy(p, "late"), io.EOF
}

// blockedWriter blocks in Write until release is closed.
type blockedWriter struct {
	entered chan struct{}
	release chan struct{}
}

func (w *blockedWriter) Write(p []byte) (int, error) {
	close(w.entered)
	<-w.release
	return len(p), nil
}

// TestStreamCloseDuringCopy: Close returns at once while ReadFrom waits
// in its reader's Read and WriteTo in its writer's Write (each holding a
// piece of registered memory); they fail with net.ErrClosed once those
// return, nothing is sent after the close, and the stream's memory goes
// back to the pool (the leak check of TestMain).
func TestStreamCloseDuringCopy(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		c, s := streamPair(t, opts...)
		br := &blockedReader{entered: make(chan struct{}), release: make(chan struct{})}
		rf := make(chan error, 1)
		go func() { _, err := c.ReadFrom(br); rf <- err }()
		<-br.entered

		_, err := s.Write([]byte("to the blocked writer"))
		require.NoError(t, err)
		bw := &blockedWriter{entered: make(chan struct{}), release: make(chan struct{})}
		wt := make(chan error, 1)
		go func() { _, err := c.WriteTo(bw); wt <- err }()
		<-bw.entered

		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		select {
		case err := <-closed:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Fatal("Close waited for a blocked ReadFrom or WriteTo")
		}
		close(br.release)
		close(bw.release)
		require.ErrorIs(t, <-rf, net.ErrClosed)
		err = <-wt
		require.Error(t, err) // the piece was written; the next wait finds the close
		require.ErrorIs(t, err, net.ErrClosed)

		// The peer got the fin and none of the late bytes.
		require.NoError(t, s.SetReadDeadline(time.Now().Add(20*time.Second)))
		rest, err := io.ReadAll(s)
		require.NoError(t, err)
		assert.Empty(t, rest)
	})
}

// ringPair is a connected pair of streams whose listener's ring is
// lring bytes and dialer's dring; the listener stays open until the
// test ends.
func ringPair(t *testing.T, opts []rdma.Option, lring, dring int) (c, s net.Conn, ln net.Listener) {
	t.Helper()
	ctx := t.Context()
	lc := stream.ListenConfig{Options: opts, RingSize: lring}
	ln, err := lc.Listen(ctx, "rdma", listenAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	acc := make(chan net.Conn, 1)
	go func() { c, _ := ln.Accept(); acc <- c }()
	d := stream.Dialer{Options: opts, RingSize: dring}
	c, err = d.DialContext(ctx, "rdma", ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	s = <-acc
	require.NotNil(t, s)
	t.Cleanup(func() { s.Close() })
	return c, s, ln
}

// TestStreamStagingSmallerThanRing: a writer's staging is its peer's
// ring up to 1 MiB, so that what a side holds does not grow with the
// ring past what WRITEs in flight need. Here the rings are a little over
// 2 MiB, which 1 MiB does not divide: WRITEs end at staging's end and at
// the ring's, at different bytes, both ways at once, with every byte
// arriving in order.
func TestStreamStagingSmallerThanRing(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		ring := 2<<20 + 12<<10
		c, s, _ := ringPair(t, opts, ring, ring)

		size := 12 << 20
		if inVM() {
			size = 3 << 20
		}
		exchangeRandom(t, c, s, size, 200<<10, 150<<10, 4)
		for _, x := range []net.Conn{c, s} {
			assert.Equal(t, 1<<20, stream.StagingSize(x.(*stream.Conn)), "staging")
		}
	})
}

// TestStreamSmallRing: the smallest rings (4 KiB here, 8 KiB at the
// peer), both ways at once with writes and reads of random sizes, so
// that the ring wraps, corked bytes span its end, and credits gate the
// writers many times; and ring sizes out of bounds are refused at the
// call.
func TestStreamSmallRing(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		ctx := t.Context()
		c, s, ln := ringPair(t, opts, stream.MinRingSize, 2*stream.MinRingSize)

		size := 1 << 20
		if inVM() {
			size = 64 << 10
		}
		exchangeRandom(t, c, s, size, 6000, 7000, 3)

		for _, bad := range []int{-1, stream.MinRingSize - 1, stream.MaxRingSize + 1} {
			_, err := (&stream.Dialer{Options: opts, RingSize: bad}).DialContext(ctx, "rdma", ln.Addr().String())
			require.ErrorIs(t, err, rdma.ErrInvalid, "ring of %d", bad)
			_, err = (&stream.ListenConfig{Options: opts, RingSize: bad}).Listen(ctx, "rdma", "127.0.0.1:0")
			require.ErrorIs(t, err, rdma.ErrInvalid, "ring of %d", bad)
		}
	})
}

// TestStreamPairsAtOnce: eight pairs exchange both ways at once on one
// engine, rings of several sizes (one a little over 2 MiB, whose WRITEs
// end at staging's end and at the ring's at different bytes), every
// byte in order and no pair stalled. In header mode a Write waited for
// the peer when the room it waited for came from its own corked bytes
// going out (TestStreamCorkedWriteWakes): eight pairs stalled within a
// few runs.
func TestStreamPairsAtOnce(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		size := 3 << 20
		if inVM() {
			size = 256 << 10
		}
		t.Run("pairs", func(t *testing.T) {
			for i := range 8 {
				ring := 2<<20 + 12<<10
				if i%2 == 1 {
					ring = stream.MinRingSize << (i % 4)
				}
				t.Run(fmt.Sprintf("pair%d-ring%d", i, ring), func(t *testing.T) {
					t.Parallel()
					c, s, _ := ringPair(t, opts, ring, ring)
					exchangeRandom(t, c, s, size, 200<<10, 150<<10, uint64(i))
				})
			}
		})
	})
}
