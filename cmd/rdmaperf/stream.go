package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/stream"
)

// --api=stream measures the net.Conn stream (stream.Dial and
// stream.Listen) with the stream's own defaults for message size and
// window: send_bw writes -s bytes per Write, -n times (or for -D seconds)
// and the server reads; send_lat is a ping-pong of -s bytes.

func streamOptions(p *params) []rdma.Option {
	// It measures the stream over RDMA: never its TCP fallback.
	opts := []rdma.Option{rdma.WithProvider(p.provider), rdma.WithPollMode(pollMode(p)), rdma.WithTCPFallback(false)}
	opts = append(opts, p.locked.options()...)
	if p.device != "" {
		opts = append(opts, rdma.WithDevice(p.device))
	}
	return opts
}

func runStream(ctx context.Context, p *params) ([]result, error) {
	o, err := oobConnect(ctx, p)
	if err != nil {
		return nil, err
	}
	defer o.Close()
	c, err := connectStream(ctx, p, o)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	rc := c.RDMAConn()
	if p.stats && p.stderr != nil {
		defer printStats(p.stderr, []*rdma.Conn{rc})
	}
	return runSizes(p, o, rc.Provider(), rc.Device(), 1, nil, func(size int) (result, error) {
		switch {
		case p.host == "" && p.isLat:
			return serveStreamLat(ctx, p, c, o, size)
		case p.host == "":
			return serveStreamBW(ctx, p, c, o, size)
		case p.isLat:
			return clientStreamLat(p, c, o, size)
		}
		return clientStreamBW(p, c, o, size)
	})
}

// connectStream listens (server) or dials (client) on -p+1 once the other
// side is known to be there.
func connectStream(ctx context.Context, p *params, o *oob) (*stream.Conn, error) {
	addr := net.JoinHostPort(p.host, strconv.Itoa(p.port+1))
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	var c net.Conn
	if p.host == "" {
		ln, err := stream.Listen("rdma", addr, streamOptions(p)...)
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		if err := o.barrier(1); err != nil { // listening
			return nil, err
		}
		if c, err = ln.(*stream.Listener).AcceptContext(ctx); err != nil {
			return nil, err
		}
	} else {
		if err := o.barrier(1); err != nil {
			return nil, err
		}
		var err error
		if c, err = stream.Dial(ctx, "rdma", addr, streamOptions(p)...); err != nil {
			return nil, err
		}
	}
	return c.(*stream.Conn), nil
}

// clientStreamBW writes the round and reports the bytes it wrote on the
// out-of-band connection. Its figures are the writer's: a Write returns
// once its bytes are posted, not received.
func clientStreamBW(p *params, c *stream.Conn, o *oob, size int) (result, error) {
	buf := make([]byte, size)
	m := newBWMeter(p, size)
	start := time.Now()
	m.begin(start)
	deadline := start.Add(p.duration)
	var refresh time.Time // when to push the write deadline on
	done := 0
	for {
		now := time.Now()
		if p.duration > 0 {
			if now.After(deadline) {
				break
			}
		} else if done == p.iters {
			break
		}
		if now.After(refresh) {
			if err := c.SetWriteDeadline(now.Add(p.timeout)); err != nil {
				return result{}, err
			}
			refresh = now.Add(time.Second)
		}
		if _, err := c.Write(buf); err != nil {
			return result{}, err
		}
		done++
		m.progress(time.Now(), done)
	}
	end := time.Now()
	if err := c.SetWriteDeadline(time.Time{}); err != nil {
		return result{}, err
	}
	if err := o.send(uint64(done) * uint64(size)); err != nil {
		return result{}, err
	}
	if _, err := o.recv(); err != nil {
		return result{}, err
	}
	r := m.result(p, size, done, end)
	r.StreamBytes = int64(done) * int64(size)
	return r, nil
}

// readStopper unblocks the server's Read once the client's stop message
// (the byte or message count) has arrived: it sets a read deadline in the
// past. closed is closed once it has.
type readStopper struct {
	st     *stopper
	closed chan struct{}
	fired  bool // a Read has met the stopper's deadline
}

func watchStream(ctx context.Context, c *stream.Conn, o *oob) *readStopper {
	rs := &readStopper{st: o.watchStop(ctx), closed: make(chan struct{})}
	go func() {
		defer close(rs.closed)
		<-rs.st.done
		c.SetReadDeadline(time.Now())
	}()
	return rs
}

// stopped is for a Read that failed with err: true when the failure is
// the stopper's deadline, after which the stop message is known; then
// Reads get the normal timeout again.
func (rs *readStopper) stopped(c *stream.Conn, err error, timeout time.Duration) (bool, error) {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false, err
	}
	if rs.fired {
		return false, fmt.Errorf("no data for %v: %w", timeout, err)
	}
	rs.fired = true
	<-rs.closed
	if e := rs.st.wait(); e != nil {
		return false, e
	}
	return true, c.SetReadDeadline(time.Now().Add(timeout))
}

// finish waits for the stopper and clears the read deadline.
func (rs *readStopper) finish(c *stream.Conn) error {
	<-rs.closed
	if err := rs.st.wait(); err != nil {
		return err
	}
	return c.SetReadDeadline(time.Time{})
}

// serveStreamBW reads until it has every byte the client says it wrote,
// and measures from the first read to the last.
func serveStreamBW(ctx context.Context, p *params, c *stream.Conn, o *oob, size int) (result, error) {
	rs := watchStream(ctx, c, o)
	buf := make([]byte, max(size, 64<<10))
	m := newBWMeter(p, size)
	var got int64
	for {
		if n, ok := rs.st.stopped(); ok && got >= int64(n) {
			break
		}
		k, err := c.Read(buf)
		if k > 0 {
			now := time.Now()
			if got == 0 {
				m.begin(now)
			}
			got += int64(k)
			m.progress(now, int(got/int64(size)))
		}
		if err != nil {
			if ok, err := rs.stopped(c, err, p.timeout); !ok {
				return result{}, err
			}
		}
	}
	end := time.Now()
	if err := rs.finish(c); err != nil {
		return result{}, err
	}
	want, _ := rs.st.stopped()
	if got != int64(want) {
		return result{}, fmt.Errorf("read %d bytes, the client wrote %d", got, want)
	}
	if got == 0 {
		return result{Test: p.test, API: p.api, Bytes: size}, o.send(0)
	}
	r := m.result(p, size, int(got/int64(size)), end)
	r.StreamBytes = got
	return r, o.send(0)
}

// clientStreamLat is the ping-pong: write -s bytes, read -s bytes back;
// a sample is half the round trip.
func clientStreamLat(p *params, c *stream.Conn, o *oob, size int) (result, error) {
	out, in := make([]byte, size), make([]byte, size)
	samples := make([]float64, 0, p.iters)
	ns := cycleNS()
	line := newProgressLine(p, size)
	start := time.Now()
	line.begin(start)
	deadline := start.Add(p.duration)
	var refresh time.Time
	for i := 0; ; i++ {
		if p.duration > 0 {
			if i > 0 && time.Now().After(deadline) {
				break
			}
		} else if i == p.iters {
			break
		}
		if i&1023 == 0 {
			if now := time.Now(); now.After(refresh) {
				if err := c.SetDeadline(now.Add(p.timeout)); err != nil {
					return result{}, err
				}
				refresh = now.Add(time.Second)
			}
		}
		out[size-1] = byte(i%251 + 1)
		t0 := cycles()
		if _, err := c.Write(out); err != nil {
			return result{}, err
		}
		if _, err := io.ReadFull(c, in); err != nil {
			return result{}, err
		}
		samples = append(samples, float64(cycles()-t0)*ns/2)
		if in[size-1] != out[size-1] {
			return result{}, fmt.Errorf("iteration %d: the answer ends in %d, want %d", i, in[size-1], out[size-1])
		}
		line.tick(samples)
	}
	line.end()
	if err := c.SetDeadline(time.Time{}); err != nil {
		return result{}, err
	}
	if err := o.send(uint64(len(samples))); err != nil {
		return result{}, err
	}
	if _, err := o.recv(); err != nil {
		return result{}, err
	}
	return latResult(p, size, samples), nil
}

// serveStreamLat answers each ping with the same bytes.
func serveStreamLat(ctx context.Context, p *params, c *stream.Conn, o *oob, size int) (result, error) {
	rs := watchStream(ctx, c, o)
	buf := make([]byte, size)
	answered := 0
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			ok, err := rs.stopped(c, err, p.timeout)
			if !ok {
				return result{}, err
			}
			if n, _ := rs.st.stopped(); answered != n {
				return result{}, fmt.Errorf("answered %d pings, the client counted %d", answered, n)
			}
			break
		}
		if _, err := c.Write(buf); err != nil {
			return result{}, err
		}
		answered++
	}
	if err := rs.finish(c); err != nil {
		return result{}, err
	}
	return result{}, o.send(0)
}
