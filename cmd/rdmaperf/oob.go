package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"
)

// oob is the out-of-band TCP connection: the exchange of QP and memory
// details, and the barrier before and after each size.
type oob struct {
	c       net.Conn
	timeout time.Duration
}

func oobConnect(ctx context.Context, p *params) (*oob, error) {
	addr := net.JoinHostPort(p.host, strconv.Itoa(p.port))
	if p.host == "" {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort("", strconv.Itoa(p.port)))
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		if p.connected != nil {
			p.connected()
		}
		stop := context.AfterFunc(ctx, func() { ln.Close() })
		defer stop()
		c, err := ln.Accept()
		if err != nil {
			return nil, err
		}
		return &oob{c: c, timeout: p.timeout}, nil
	}
	// The server may not listen yet: retry for a while, as perftest does.
	deadline := time.Now().Add(p.timeout)
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return &oob{c: c, timeout: p.timeout}, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("connect to %s: %w", addr, err)
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

func (o *oob) Close() error { return o.c.Close() }

// exchange sends v and reads the peer's value into peer (fixed-size
// structs, big endian).
func (o *oob) exchange(v, peer any) error {
	o.c.SetDeadline(time.Now().Add(o.timeout))
	defer o.c.SetDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() { errc <- binary.Write(o.c, binary.BigEndian, v) }()
	if err := binary.Read(o.c, binary.BigEndian, peer); err != nil {
		return fmt.Errorf("out-of-band exchange: %w", err)
	}
	if err := <-errc; err != nil {
		return fmt.Errorf("out-of-band exchange: %w", err)
	}
	return nil
}

// barrier exchanges v and checks that the peer sent the same.
func (o *oob) barrier(v uint64) error {
	var got uint64
	if err := o.exchange(v, &got); err != nil {
		return err
	}
	if got != v {
		return fmt.Errorf("peer is at step %d, we are at %d: do both sides run the same test with the same flags?", got, v)
	}
	return nil
}

// send and recv carry one value one way.
func (o *oob) send(v uint64) error {
	o.c.SetWriteDeadline(time.Now().Add(o.timeout))
	return binary.Write(o.c, binary.BigEndian, v)
}

func (o *oob) recv() (uint64, error) {
	o.c.SetReadDeadline(time.Time{})
	var v uint64
	err := binary.Read(o.c, binary.BigEndian, &v)
	return v, err
}

// stopper is the server's side of a round: the client's "done, after N
// operations" arrives on the TCP connection while the server spins. ctx
// ends when it has arrived (or the connection failed), so that a wait for
// a completion event ends too.
type stopper struct {
	count  atomic.Int64 // -1 until the client's message arrives
	err    atomic.Value
	done   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
}

func (o *oob) watchStop(ctx context.Context) *stopper {
	s := &stopper{done: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(ctx)
	s.count.Store(-1)
	go func() {
		defer s.cancel()
		defer close(s.done)
		v, err := o.recv()
		if err != nil {
			s.err.Store(err)
			s.count.Store(0)
			return
		}
		s.count.Store(int64(v))
	}()
	return s
}

// stopped reports the client's count once it has arrived.
func (s *stopper) stopped() (int, bool) {
	n := s.count.Load()
	return int(n), n >= 0
}

func (s *stopper) wait() error {
	<-s.done
	if e, ok := s.err.Load().(error); ok {
		return fmt.Errorf("peer: %w", e)
	}
	return nil
}
