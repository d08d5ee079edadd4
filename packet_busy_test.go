package rdma_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
)

// Rule: with PollBusy a goroutine waiting for a datagram (ReadFrom,
// RecvFrom) or for a SendTo's Future polls the CQ itself, as Future.Wait
// does on a connection, and its wait still ends at its deadline, at its
// context's end and at Close.
func TestPacketBusy(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		e := packetEngine(t, append(opts, rdma.WithPollMode(rdma.PollBusy)))
		a, b := listenPacket(t, e), listenPacket(t, e)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()

		// A ping-pong, each side reading on its own goroutine.
		const rounds = 200
		echo := make(chan error, 1)
		go func() {
			buf := make([]byte, 64)
			for range rounds {
				n, from, err := b.ReadFrom(buf)
				if err == nil {
					_, err = b.WriteTo(buf[:n], from)
				}
				if err != nil {
					echo <- err
					return
				}
			}
			echo <- nil
		}()
		before := e.Stats().Pollers.Drives
		msg, buf := []byte("busy ping"), make([]byte, 64)
		for i := range rounds {
			if i%2 == 0 {
				_, err := a.WriteTo(msg, b.LocalAddr())
				require.NoError(t, err)
				n, _ := readWithin(t, a, buf)
				require.Equal(t, msg, buf[:n])
				continue
			}
			src, err := a.Alloc(len(msg))
			require.NoError(t, err)
			copy(src.Bytes(), msg)
			require.NoError(t, a.SendTo(src, b.LocalAddr()).Wait(ctx))
			src.Release()
			got, _, err := a.RecvFrom(ctx)
			require.NoError(t, err)
			require.Equal(t, msg, got.Bytes())
			got.Release()
		}
		require.NoError(t, <-echo)
		assert.Greater(t, e.Stats().Pollers.Drives, before, "the waiting goroutines polled the CQ themselves")

		// A drive ends at the deadline, at the context's end, and at Close.
		require.NoError(t, a.SetReadDeadline(time.Now().Add(30*time.Millisecond)))
		_, _, err := a.ReadFrom(buf)
		requireTimeout(t, err)
		require.NoError(t, a.SetReadDeadline(time.Time{}))

		short, stop := context.WithTimeout(ctx, 30*time.Millisecond)
		_, _, err = a.RecvFrom(short)
		stop()
		require.ErrorIs(t, err, context.DeadlineExceeded)

		done := make(chan error, 1)
		go func() {
			_, _, err := a.ReadFrom(buf)
			done <- err
		}()
		// Whether the reader is waiting yet or about to, Close ends its
		// call: nothing else would (no datagram comes, no deadline).
		require.NoError(t, a.Close())
		select {
		case err := <-done:
			require.Error(t, err)
			assert.True(t, errors.Is(err, net.ErrClosed), "ReadFrom after Close: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("ReadFrom still waiting 10 s after Close")
		}
	})
}
