package rdma

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestRecvWindow: while its peer sends, whichever way messages are taken
// (from the ready queue, or by a waiting Recv), a Conn accounts for every
// credit of its depth (out, held, or taken and not given back yet), gives
// them back at once when the peer has none, and never has fewer out or
// held than its RecvWindow, which its peer learns as SendWindow. The
// stream's window relies on it to never wait for credits.
func TestRecvWindow(t *testing.T) {
	for _, depth := range []int{5, 8, 15, 16, 17, 32, 64, 100} {
		t.Run(strconv.Itoa(depth), func(t *testing.T) {
			opts := []Option{WithProvider(ProviderSoft), WithQueueDepth(8, depth)}
			ln, err := Listen("rdma", "127.0.0.1:0", opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			acc := make(chan *Conn, 1)
			go func() { c, _ := ln.Accept(ctx); acc <- c }()
			c, err := Dial(ctx, "rdma", ln.Addr().String(), opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s := <-acc
			if s == nil {
				t.Fatal("accept failed")
			}
			defer s.Close()
			if w := s.RecvWindow(); w < 1 || w > depth || c.SendWindow() != w {
				t.Fatalf("RecvWindow %d, the peer's SendWindow %d, depth %d", w, c.SendWindow(), depth)
			}
			buf, _ := c.Alloc(8)
			defer buf.Release()
			for i := 0; i < 3*depth; i++ {
				var f *Future
				if i%3 == 0 {
					f = s.Recv() // a waiter: the message resolves it
				}
				if err := c.Send(buf).Wait(ctx); err != nil {
					t.Fatal(err)
				}
				if f == nil {
					// The message waits in ready, or is about to.
					f = s.Recv()
				}
				if err := f.Wait(ctx); err != nil {
					t.Fatal(err)
				}
				f.Buffer().Release()
				s.rc.RQ.Mutex().Lock()
				o, h, k := s.rc.Grants.Counts()
				out, held, taken := int(o), int(h), int(k)
				s.rc.RQ.Mutex().Unlock()
				if out+held+taken != depth {
					t.Fatalf("after %d messages: %d credits out, %d messages held, %d taken: want %d in all", i+1, out, held, taken, depth)
				}
				if out == 0 && taken > 0 {
					t.Fatalf("after %d messages: the peer has no credit and %d are not given back", i+1, taken)
				}
				if out+held < s.RecvWindow() {
					t.Fatalf("after %d messages: %d credits out or messages held, want at least RecvWindow %d", i+1, out+held, s.RecvWindow())
				}
			}
		})
	}
}
