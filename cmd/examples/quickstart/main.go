// Command quickstart runs both ends of an RDMA connection in one process
// and exercises every operation of go-rdma's async API: Send/Recv with
// and without immediates, WRITE, WRITE_WITH_IMM, READ, compare-and-swap,
// fetch-and-add, exposing and requesting memory, and revocation. It uses a
// real device where one is usable and the pure-Go soft provider otherwise
// (set RDMA_PROVIDER=soft|verbs to choose).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/go-rdma/rdma"
)

func main() {
	n := flag.Int("n", 2000, "messages for the throughput run")
	size := flag.Int("size", 64<<10, "message size for the throughput run")
	flag.Parse()
	if err := run(*n, *size); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(n, size int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	ln, err := rdma.Listen("rdma", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	accepted := make(chan *rdma.Conn, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, "accept:", err)
		}
		accepted <- c
	}()
	client, err := rdma.Dial(ctx, "rdma", ln.Addr().String())
	if err != nil {
		return err
	}
	defer client.Close()
	server := <-accepted
	if server == nil {
		return errors.New("no connection accepted")
	}
	defer server.Close()
	fmt.Printf("connected %s -> %s over provider %q, device %s\n", client.LocalAddr(), client.RemoteAddr(), client.Provider(), client.Device())

	// Two-sided: a message lands in a pool buffer on the receiver.
	msg, err := client.Alloc(64)
	if err != nil {
		return err
	}
	copy(msg.Bytes(), "hello over RDMA")
	msg.SetLen(len("hello over RDMA"))
	recv := server.Recv()
	if err := client.SendWithImm(msg, 7).Wait(ctx); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	msg.Release()
	if err := recv.Wait(ctx); err != nil {
		return fmt.Errorf("recv: %w", err)
	}
	imm, _ := recv.Imm()
	fmt.Printf("send/recv:      %q with immediate %d\n", recv.Buffer().Bytes(), imm)
	recv.Buffer().Release()

	// One-sided: the server exposes 1 MiB; the client writes, reads and
	// runs atomics on it without the server's code taking part.
	mem, err := server.Alloc(1 << 20)
	if err != nil {
		return err
	}
	defer mem.Release()
	region, err := server.Expose(mem, rdma.RemoteRead|rdma.RemoteWrite|rdma.RemoteAtomic)
	if err != nil {
		return err
	}
	if err := server.SendRegion(ctx, region); err != nil {
		return err
	}
	remote, err := client.RecvRegion(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("exposed:        %v\n", remote)

	src, err := client.Alloc(4096)
	if err != nil {
		return err
	}
	defer src.Release()
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i)
	}
	at, _ := remote.Slice(8192, 4096)
	if err := client.Write(src, at).Wait(ctx); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	fmt.Printf("write:          4096 bytes at offset 8192, intact: %v\n", bytes.Equal(mem.Bytes()[8192:8192+4096], src.Bytes()))

	dst, err := client.Alloc(4096)
	if err != nil {
		return err
	}
	defer dst.Release()
	if err := client.Read(dst, at).Wait(ctx); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	fmt.Printf("read:           4096 bytes back, intact: %v\n", bytes.Equal(dst.Bytes(), src.Bytes()))

	note := server.Recv()
	if err := client.WriteWithImm(src, at, 99).Wait(ctx); err != nil {
		return fmt.Errorf("write with imm: %w", err)
	}
	if err := note.Wait(ctx); err != nil {
		return err
	}
	imm, _ = note.Imm()
	fmt.Printf("write_with_imm: the server's Recv saw immediate %d for %d bytes\n", imm, note.Len())

	word, _ := remote.Slice(0, 8)
	faa := client.FetchAdd(word, 10)
	if err := faa.Wait(ctx); err != nil {
		return fmt.Errorf("fetch-add: %w", err)
	}
	cas := client.CompareAndSwap(word, 10, 1234)
	if err := cas.Wait(ctx); err != nil {
		return fmt.Errorf("compare-and-swap: %w", err)
	}
	fmt.Printf("atomics:        fetch_add old=%d, compare_and_swap old=%d\n", faa.Old(), cas.Old())

	granted, err := client.RequestRegion(ctx, 64<<10, rdma.RemoteWrite)
	if err != nil {
		return fmt.Errorf("request region: %w", err)
	}
	fmt.Printf("request_region: the server granted %v\n", granted)

	if err := server.Revoke(ctx, region); err != nil {
		return err
	}
	err = client.Write(src, at).Wait(ctx)
	fmt.Printf("revoked:        a later write fails: %v\n", errors.Is(err, rdma.ErrRegionRevoked))
	if !errors.Is(err, rdma.ErrRegionRevoked) {
		return fmt.Errorf("a write after Revoke: %v, want ErrRegionRevoked", err)
	}
	if err == nil {
		return errors.New("write to a revoked region succeeded")
	}

	// The failed write broke that connection, as it would on hardware.
	// Throughput runs on a fresh pair.
	return throughput(ctx, n, size)
}

func throughput(ctx context.Context, n, size int) error {
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithMaxMessage(size))
	if err != nil {
		return err
	}
	defer ln.Close()
	accepted := make(chan *rdma.Conn, 1)
	go func() {
		c, _ := ln.Accept(ctx)
		accepted <- c
	}()
	client, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), rdma.WithMaxMessage(size))
	if err != nil {
		return err
	}
	defer client.Close()
	server := <-accepted
	if server == nil {
		return errors.New("no connection accepted")
	}
	defer server.Close()

	buf, err := client.Alloc(size)
	if err != nil {
		return err
	}
	defer buf.Release()
	start := time.Now()
	recvs := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			f := server.Recv()
			if err := f.Wait(ctx); err != nil {
				recvs <- err
				return
			}
			f.Buffer().Release()
		}
		recvs <- nil
	}()
	// Keep 64 sends in flight: wait for the oldest before posting anew.
	var window [64]*rdma.Future
	for i := 0; i < n+len(window); i++ {
		if f := window[i%len(window)]; f != nil {
			if err := f.Wait(ctx); err != nil {
				return err
			}
			window[i%len(window)] = nil
		}
		if i < n {
			window[i%len(window)] = client.Send(buf)
		}
	}
	if err := <-recvs; err != nil {
		return err
	}
	el := time.Since(start)
	fmt.Printf("throughput:     %d sends of %d KiB in %v: %.2f Gb/s, %.0f msg/s\n", n, size>>10, el.Round(time.Millisecond),
		float64(n)*float64(size)*8/el.Seconds()/1e9, float64(n)/el.Seconds())
	return nil
}
