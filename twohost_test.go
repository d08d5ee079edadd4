package rdma_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-rdma/rdma"
)

// Rule: the soft provider reaches another host over TCP: a connection
// between two machines moves SEND and WRITE data intact, with one-sided
// operations served by the target's provider.
//
// It runs in the two-VM harness (RDMA_TWOHOST_ROLE=server|client with
// RDMA_VM_SELF_IP and RDMA_VM_PEER_IP); elsewhere it has no second host.
func TestTwoHostSoft(t *testing.T) {
	self := twoHost(t)
	// The soft provider's transport listens on this host's address, so
	// the peer can reach it.
	t.Setenv("RDMA_SOFT_ADDR", self+":0")
	testTwoHost(t, rdma.ProviderSoft, 7473)
}

// Rule: the async API runs between two hosts on rxe: the same checks
// over the verbs provider, through each VM's rxe device.
func TestTwoHostVerbs(t *testing.T) {
	twoHost(t)
	requireDevice(t)
	testTwoHost(t, rdma.ProviderVerbs, 7474)
}

// twoHost skips outside the two-VM harness and returns this host's
// address.
func twoHost(t *testing.T) string {
	role, self, peer := os.Getenv("RDMA_TWOHOST_ROLE"), os.Getenv("RDMA_VM_SELF_IP"), os.Getenv("RDMA_VM_PEER_IP")
	if role == "" || self == "" || peer == "" {
		t.Skip("needs the two-VM harness (RDMA_TWOHOST_ROLE, RDMA_VM_SELF_IP, RDMA_VM_PEER_IP)")
	}
	return self
}

func testTwoHost(t *testing.T, provider string, port int) {
	role, self, peer := os.Getenv("RDMA_TWOHOST_ROLE"), os.Getenv("RDMA_VM_SELF_IP"), os.Getenv("RDMA_VM_PEER_IP")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := []rdma.Option{rdma.WithProvider(provider)}
	const size = 1 << 20
	addr := fmt.Sprintf(":%d", port)
	if role == "server" {
		ln, err := rdma.Listen("rdma", self+addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c, err := ln.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		target, _ := c.Alloc(size)
		defer target.Release()
		region, err := c.Expose(target, rdma.RemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.SendRegion(ctx, region); err != nil {
			t.Fatal(err)
		}
		r := c.Recv() // "done", sent after the WRITE completed
		wait(t, r)
		r.Buffer().Release()
		if !bytes.Equal(target.Bytes(), pattern(size)) {
			t.Fatal("written data differs")
		}
		return
	}
	var c *rdma.Conn
	var err error
	for c == nil { // the server VM may still be booting
		if c, err = rdma.Dial(ctx, "rdma", peer+addr, opts...); err != nil {
			if ctx.Err() != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond) // retry backoff
		}
	}
	defer c.Close()
	region, err := c.RecvRegion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	src, _ := c.Alloc(size)
	defer src.Release()
	copy(src.Bytes(), pattern(size))
	wait(t, c.Write(src, region))
	done, _ := c.Alloc(4)
	defer done.Release()
	wait(t, c.Send(done))
	// Wait for the server to close, so its checks ran with us connected.
	r := c.Recv()
	r.Wait(ctx)
	if b := r.Buffer(); b != nil {
		b.Release()
	}
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*131 + i>>9)
	}
	return b
}
