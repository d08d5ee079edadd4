// Command antspool serves messages of many connections with a RecvHandler
// that runs on an ants worker pool the service owns
// (github.com/panjf2000/ants/v2), rather than on the engine's own
// workers: the pool that bounds the service's other work bounds its
// message handlers too (rdma.WithHandlerPool).
//
//	antspool -conns 100 -msgs 50 -workers 8
//
// It listens, dials -conns connections to itself, sends -msgs messages
// of 64 bytes on each, and counts them as the pool's workers handle
// them, each connection's in order. It prints what it counted and exits
// 0 when every message arrived in order, 1 otherwise.
//
// It is a module of its own: ants starts a default pool's goroutines
// when it is imported, which a library must not do to its users, so
// go-rdma itself does not import it.
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/ants/v2"

	"github.com/go-rdma/rdma"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main with its arguments and outputs, for the test.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("antspool", flag.ContinueOnError)
	fs.SetOutput(stderr)
	conns := fs.Int("conns", 100, "connections")
	msgs := fs.Int("msgs", 50, "messages per connection")
	workers := fs.Int("workers", 8, "the ants pool's workers")
	provider := fs.String("provider", rdma.ProviderAuto, "auto, verbs or soft")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := serve(*conns, *msgs, *workers, *provider, stdout); err != nil {
		fmt.Fprintln(stderr, "antspool:", err)
		return 1
	}
	return 0
}

// counter checks that each connection's messages come in order, and
// closes done when all of them came.
type counter struct {
	mu      sync.Mutex
	next    map[*rdma.Conn]uint32
	handled atomic.Int64
	total   int64
	done    chan struct{}
	running atomic.Int32
	most    atomic.Int32
	bad     error
}

// handle is the RecvHandler: it runs on the ants pool.
func (k *counter) handle(c *rdma.Conn, f *rdma.Future) {
	defer f.Buffer().Release()
	n := k.running.Add(1)
	defer k.running.Add(-1)
	for m := k.most.Load(); n > m && !k.most.CompareAndSwap(m, n); m = k.most.Load() {
	}
	seq := binary.BigEndian.Uint32(f.Buffer().Bytes())
	k.mu.Lock()
	if seq != k.next[c] && k.bad == nil {
		k.bad = fmt.Errorf("connection %v: message %d after %d", c.RemoteAddr(), seq, k.next[c])
	}
	k.next[c] = seq + 1
	k.mu.Unlock()
	if k.handled.Add(1) == k.total {
		close(k.done)
	}
}

func serve(conns, msgs, workers int, provider string, out io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := ants.NewPool(workers)
	if err != nil {
		return err
	}
	defer pool.Release()
	k := &counter{next: map[*rdma.Conn]uint32{}, total: int64(conns * msgs), done: make(chan struct{})}
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithProvider(provider),
		rdma.WithRecvHandler(k.handle), rdma.WithHandlerPool(pool))
	if err != nil {
		return err
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	var servers []*rdma.Conn
	go func() {
		for range conns {
			s, err := ln.Accept(ctx)
			if err != nil {
				accepted <- err
				return
			}
			servers = append(servers, s)
		}
		accepted <- nil
	}()
	var clients []*rdma.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
		for _, s := range servers {
			s.Close()
		}
	}()
	for range conns {
		c, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), rdma.WithProvider(provider))
		if err != nil {
			return err
		}
		clients = append(clients, c)
	}
	if err := <-accepted; err != nil {
		return err
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for _, c := range clients {
		wg.Go(func() {
			b, err := c.Alloc(64)
			if err != nil {
				errs <- err
				return
			}
			defer b.Release()
			for i := range msgs {
				binary.BigEndian.PutUint32(b.Bytes(), uint32(i))
				if err := c.Send(b).Wait(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	select {
	case <-k.done:
	case <-ctx.Done():
		return fmt.Errorf("%d of %d messages handled", k.handled.Load(), conns*msgs)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.bad != nil {
		return k.bad
	}
	fmt.Fprintf(out, "%d messages of %d connections handled in order in %v, at most %d at once on a pool of %d\n",
		k.handled.Load(), conns, time.Since(start).Round(time.Millisecond), k.most.Load(), workers)
	if int(k.most.Load()) > workers {
		return fmt.Errorf("%d handlers ran at once on a pool of %d", k.most.Load(), workers)
	}
	return nil
}
