package rdma_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/testchild"
)

// BenchmarkPacketPingPongProcesses is a 64-byte round trip between two
// processes on loopback: this one writes and reads, a child of the test
// binary echoes. "rdma" is a PacketConn at each end (the soft provider),
// "udp" a UDP socket at each end, the baseline. Run both in one
// invocation and compare them (-count interleaves nothing, so take a few
// rounds: -count 5):
//
//	go test -run '^$' -bench PacketPingPongProcesses -benchtime 20000x -count 5 .
func BenchmarkPacketPingPongProcesses(b *testing.B) {
	for _, network := range []string{"rdma", "udp"} {
		b.Run(network, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			child := testchild.Start(ctx, b, "echo", "RDMA_TEST_NET="+network)
			to := child.ReadLine(b)
			var pc net.PacketConn
			var addr net.Addr
			var err error
			if network == "rdma" {
				pc, err = rdma.ListenPacket("rdma", "127.0.0.1:0", rdma.WithProvider(rdma.ProviderSoft))
				if err == nil {
					addr, err = rdma.ResolvePacketAddr(to)
				}
			} else {
				pc, err = net.ListenPacket("udp", "127.0.0.1:0")
				if err == nil {
					addr, err = net.ResolveUDPAddr("udp", to)
				}
			}
			require.NoError(b, err)
			defer pc.Close()
			msg, buf := make([]byte, 64), make([]byte, 128)
			// The first round trip resolves the address (rdma) and warms
			// both ends.
			roundTrip := func() {
				_, err := pc.WriteTo(msg, addr)
				if err == nil {
					_, _, err = pc.ReadFrom(buf)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			roundTrip()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				roundTrip()
			}
		})
	}
}

// echoChild is BenchmarkPacketPingPongProcesses's other process: it
// listens on 127.0.0.1 ($RDMA_TEST_NET "rdma": a PacketConn on soft;
// "udp": a UDP socket), prints its address, and sends every datagram
// back to its sender until its stdin closes.
func echoChild() int {
	var pc net.PacketConn
	var err error
	if os.Getenv("RDMA_TEST_NET") == "rdma" {
		pc, err = rdma.ListenPacket("rdma", "127.0.0.1:0", rdma.WithProvider(rdma.ProviderSoft))
	} else {
		pc, err = net.ListenPacket("udp", "127.0.0.1:0")
	}
	if err != nil {
		fmt.Println("listen:", err)
		return 1
	}
	fmt.Println(pc.LocalAddr())
	go func() {
		io.Copy(io.Discard, os.Stdin) // until the parent's test ends
		pc.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err == nil {
			_, err = pc.WriteTo(buf[:n], from)
		}
		if err != nil {
			return 0
		}
	}
}

// Rule: a round trip between two processes on soft (a PacketConn at each
// end, the peer a child echoing) allocates nothing in this process, the
// provider's reader and the poller included. A kick of a parked poller
// once made a context and a channel per datagram written.
func TestPacketAllocsProcesses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	child := testchild.Start(ctx, t, "echo", "RDMA_TEST_NET=rdma")
	to, err := rdma.ResolvePacketAddr(child.ReadLine(t))
	require.NoError(t, err)
	pc, err := rdma.ListenPacket("rdma", "127.0.0.1:0", rdma.WithProvider(rdma.ProviderSoft))
	require.NoError(t, err)
	defer pc.Close()
	msg, buf := make([]byte, 64), make([]byte, 128)
	round := func() {
		_, err := pc.WriteTo(msg, to)
		if err == nil {
			_, _, err = pc.ReadFrom(buf)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	round() // resolves the child's address
	allocs := testing.AllocsPerRun(200, round)
	assert.Less(t, allocs, 0.5, "allocations per round trip")
}
