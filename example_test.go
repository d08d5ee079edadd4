package rdma_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/go-rdma/rdma"
)

// examplePair connects a client to a server in this process over the soft
// provider, so the examples run on any machine. closeAll closes both ends
// and the listener.
func examplePair(ctx context.Context, opts ...rdma.Option) (client, server *rdma.Conn, closeAll func()) {
	opts = append([]rdma.Option{rdma.WithProvider("soft")}, opts...)
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	if err != nil {
		log.Fatal(err)
	}
	accepted := make(chan *rdma.Conn, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			log.Print(err)
		}
		accepted <- c
	}()
	client, err = rdma.Dial(ctx, "rdma", ln.Addr().String(), opts...)
	if err != nil {
		log.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		log.Fatal("no connection accepted")
	}
	return client, server, func() {
		client.Close()
		server.Close()
		ln.Close()
	}
}

// exampleExpose exposes buf on server with access and hands the region
// to the client, as a server does with SendRegion and a client with
// RecvRegion.
func exampleExpose(ctx context.Context, server, client *rdma.Conn, buf *rdma.Buffer, access rdma.Access) rdma.RemoteRegion {
	r, err := server.Expose(buf, access)
	if err != nil {
		log.Fatal(err)
	}
	if err := server.SendRegion(ctx, r); err != nil {
		log.Fatal(err)
	}
	r, err = client.RecvRegion(ctx)
	if err != nil {
		log.Fatal(err)
	}
	return r
}

// exampleAlloc allocates n bytes on c and copies s into them. Pool memory
// is recycled, so it clears the rest.
func exampleAlloc(c *rdma.Conn, n int, s string) *rdma.Buffer {
	b, err := c.Alloc(n)
	if err != nil {
		log.Fatal(err)
	}
	clear(b.Bytes()[copy(b.Bytes(), s):])
	return b
}

func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// A listener to dial; usually another process on another host.
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithProvider("soft"))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		if c, err := ln.Accept(ctx); err == nil {
			c.Recv().Wait(ctx) // wait for the client to close
			c.Close()
		}
	}()

	conn, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), rdma.WithProvider("soft"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("connected over", conn.Provider(), "to", conn.Device())
	fmt.Println("peer accepts messages up to", conn.MaxMessage(), "bytes")
	conn.Close()
	<-served
	// Output:
	// connected over soft to soft0
	// peer accepts messages up to 65536 bytes
}

func ExampleListen() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	ln, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithProvider("soft"))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()

	// Two clients; one listener serves both, sharing its device, pollers
	// and buffer pool between their connections.
	dialed := make(chan *rdma.Conn, 2)
	for range 2 {
		go func() {
			c, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), rdma.WithProvider("soft"))
			if err != nil {
				log.Print(err)
			}
			dialed <- c
		}()
	}
	for i := range 2 {
		conn, err := ln.Accept(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("accepted connection %d over %s\n", i+1, conn.Provider())
		defer conn.Close()
		if c := <-dialed; c != nil {
			defer c.Close()
		}
	}
	// Output:
	// accepted connection 1 over soft
	// accepted connection 2 over soft
}

func ExampleConn_Send() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, server, closeAll := examplePair(ctx)
	defer closeAll()

	// Recv hands over a pool buffer holding the message; no copy into a
	// user slice.
	recv := server.Recv()

	msg := exampleAlloc(client, 64, "hello")
	msg.SetLen(len("hello"))
	send := client.Send(msg)
	msg.Release() // safe: the send keeps the memory until it completes
	if err := send.Wait(ctx); err != nil {
		log.Fatal(err)
	}

	if err := recv.Wait(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("received %q (%d bytes)\n", recv.Buffer().Bytes(), recv.Len())
	recv.Buffer().Release()

	// SendWithImm adds a 32-bit value that the receiver's Recv reports.
	recv = server.Recv()
	msg = exampleAlloc(client, 64, "with imm")
	msg.SetLen(len("with imm"))
	err := client.SendWithImm(msg, 7).Wait(ctx)
	msg.Release()
	if err != nil {
		log.Fatal(err)
	}
	if err := recv.Wait(ctx); err != nil {
		log.Fatal(err)
	}
	imm, ok := recv.Imm()
	fmt.Printf("received %q, immediate %d (%v)\n", recv.Buffer().Bytes(), imm, ok)
	recv.Buffer().Release()
	// Output:
	// received "hello" (5 bytes)
	// received "with imm", immediate 7 (true)
}

func ExampleConn_Write() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, server, closeAll := examplePair(ctx)
	defer closeAll()

	mem := exampleAlloc(server, 64, "")
	defer mem.Release()
	region := exampleExpose(ctx, server, client, mem, rdma.RemoteWrite)

	// Write to bytes 16..27 of the server's buffer. The server's code
	// takes no part in it.
	src := exampleAlloc(client, 12, "written here")
	defer src.Release()
	at, err := region.Slice(16, 12)
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Write(src, at).Wait(ctx); err != nil {
		log.Fatal(err)
	}

	// A completed WRITE means the data is in the server's memory, not that
	// the server knows: tell it with a message, which RC delivers after
	// the data.
	note := server.Recv()
	done := exampleAlloc(client, 4, "done")
	err = client.Send(done).Wait(ctx)
	done.Release()
	if err != nil {
		log.Fatal(err)
	}
	if err := note.Wait(ctx); err != nil {
		log.Fatal(err)
	}
	note.Buffer().Release()
	fmt.Printf("server memory [16:28]: %q\n", mem.Bytes()[16:28])
	// Output:
	// server memory [16:28]: "written here"
}

func ExampleConn_Read() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, server, closeAll := examplePair(ctx)
	defer closeAll()

	mem := exampleAlloc(server, 64, "the server's table of contents")
	defer mem.Release()
	region := exampleExpose(ctx, server, client, mem, rdma.RemoteRead)

	// Read 5 bytes from offset 13 of the server's memory into a sub-range
	// of a local buffer.
	dst := exampleAlloc(client, 32, "read: ?????")
	defer dst.Release()
	into, err := dst.Slice(6, 5)
	if err != nil {
		log.Fatal(err)
	}
	from, err := region.Slice(13, 5)
	if err != nil {
		log.Fatal(err)
	}
	f := client.Read(into, from)
	if err := f.Wait(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s (%d bytes)\n", dst.Bytes()[:11], f.Len())
	// Output:
	// read: table (5 bytes)
}

func ExampleConn_WriteWithImm() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, server, closeAll := examplePair(ctx)
	defer closeAll()

	mem := exampleAlloc(server, 4096, "")
	defer mem.Release()
	region := exampleExpose(ctx, server, client, mem, rdma.RemoteWrite)

	// Each WRITE_WITH_IMM consumes one of the server's receives: the
	// server learns that the data arrived, and the immediate says which
	// part it was (here, a chunk number).
	note := server.Recv()
	src := exampleAlloc(client, 1024, "chunk three")
	defer src.Release()
	chunk3, _ := region.Slice(3*1024, 1024)
	if err := client.WriteWithImm(src, chunk3, 3).Wait(ctx); err != nil {
		log.Fatal(err)
	}

	if err := note.Wait(ctx); err != nil {
		log.Fatal(err)
	}
	imm, _ := note.Imm()
	// The data went to the region, so the receive has no buffer.
	fmt.Printf("chunk %d arrived: %d bytes, buffer %v\n", imm, note.Len(), note.Buffer())
	fmt.Printf("server memory at chunk %d: %q\n", imm, mem.Bytes()[imm*1024:imm*1024+11])
	// Output:
	// chunk 3 arrived: 1024 bytes, buffer <nil>
	// server memory at chunk 3: "chunk three"
}

func ExampleConn_CompareAndSwap() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, server, closeAll := examplePair(ctx)
	defer closeAll()

	// A lock word in the server's memory: 0 is free, otherwise the owner.
	lock := exampleAlloc(server, 8, "")
	defer lock.Release()
	word := exampleExpose(ctx, server, client, lock, rdma.RemoteAtomic)

	for _, owner := range []uint64{1, 2} {
		cas := client.CompareAndSwap(word, 0, owner)
		if err := cas.Wait(ctx); err != nil {
			log.Fatal(err)
		}
		if cas.Old() == 0 {
			fmt.Printf("owner %d took the lock\n", owner)
		} else {
			fmt.Printf("owner %d found it held by %d\n", owner, cas.Old())
		}
	}
	// Output:
	// owner 1 took the lock
	// owner 2 found it held by 1
}

func ExampleConn_FetchAdd() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, server, closeAll := examplePair(ctx)
	defer closeAll()

	counter := exampleAlloc(server, 8, "")
	defer counter.Release()
	word := exampleExpose(ctx, server, client, counter, rdma.RemoteAtomic)

	// Many clients could take tickets at once; each gets a distinct one.
	for range 3 {
		f := client.FetchAdd(word, 1)
		if err := f.Wait(ctx); err != nil {
			log.Fatal(err)
		}
		fmt.Println("ticket", f.Old())
	}
	// Output:
	// ticket 0
	// ticket 1
	// ticket 2
}

func ExampleConn_Expose() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, server, closeAll := examplePair(ctx)
	defer closeAll()

	mem := exampleAlloc(server, 4096, "exposed for reading")
	defer mem.Release()

	// Expose exactly the first 19 bytes, read-only, and hand the region
	// to the peer.
	part, err := mem.Slice(0, 19)
	if err != nil {
		log.Fatal(err)
	}
	region, err := server.Expose(part, rdma.RemoteRead)
	if err != nil {
		log.Fatal(err)
	}
	if err := server.SendRegion(ctx, region); err != nil {
		log.Fatal(err)
	}

	remote, err := client.RecvRegion(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("the client got a region of", remote.Len, "bytes")
	dst := exampleAlloc(client, remote.Len, "")
	defer dst.Release()
	if err := client.Read(dst, remote).Wait(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("read %q\n", dst.Bytes())

	// Revoke tells the client, which refuses accesses to the region from
	// then on, and deregisters the memory once the client's accesses in
	// flight are done. The connection stays up.
	if err := server.Revoke(ctx, region); err != nil {
		log.Fatal(err)
	}
	err = client.Read(dst, remote).Wait(ctx)
	fmt.Println("read after revoke:", errors.Is(err, rdma.ErrRegionRevoked))
	// Output:
	// the client got a region of 19 bytes
	// read "exposed for reading"
	// read after revoke: true
}

func ExampleConn_RequestRegion() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Each side lets its peer request up to 1 MiB in total.
	client, server, closeAll := examplePair(ctx, rdma.WithRegionLimit(1<<20))
	defer closeAll()
	_ = server // the server's library grants the request; its code does nothing

	// Ask the server for 64 KiB we may write and read.
	region, err := client.RequestRegion(ctx, 64<<10, rdma.RemoteWrite|rdma.RemoteRead)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("granted", region.Len, "bytes")

	// Use it as scratch space: park data there and fetch it back.
	src := exampleAlloc(client, 32, "parked in the peer's memory")
	defer src.Release()
	if err := client.Write(src, region).Wait(ctx); err != nil {
		log.Fatal(err)
	}
	dst := exampleAlloc(client, 32, "")
	defer dst.Release()
	if err := client.Read(dst, region).Wait(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("read back %q\n", dst.Bytes()[:27])
	if err := client.ReleaseRegion(ctx, region); err != nil {
		log.Fatal(err)
	}

	// The peer decides: a request over its limit is refused.
	_, err = client.RequestRegion(ctx, 2<<20, rdma.RemoteWrite)
	fmt.Println("2 MiB refused:", errors.Is(err, rdma.ErrRegionRefused))
	// Output:
	// granted 65536 bytes
	// read back "parked in the peer's memory"
	// 2 MiB refused: true
}

func ExampleFuture_Wait() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, server, closeAll := examplePair(ctx)
	defer closeAll()

	// Nothing has been sent yet: a Wait bounded by a short timeout gives
	// up, but the receive stays posted.
	recv := server.Recv()
	short, stop := context.WithTimeout(ctx, 10*time.Millisecond)
	err := recv.Wait(short)
	stop()
	fmt.Println("gave up:", errors.Is(err, context.DeadlineExceeded), "resolved:", recv.Resolved())

	msg := exampleAlloc(client, 5, "later")
	defer msg.Release()
	if err := client.Send(msg).Wait(ctx); err != nil {
		log.Fatal(err)
	}

	// The same future resolves when the message comes. Done suits select.
	select {
	case <-recv.Done():
	case <-ctx.Done():
		log.Fatal(ctx.Err())
	}
	if err := recv.Err(); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("then received %q\n", recv.Buffer().Bytes())
	recv.Buffer().Release()
	// Output:
	// gave up: true resolved: false
	// then received "later"
}
