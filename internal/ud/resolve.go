package ud

import (
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// resolveCall is one address being asked of its side channel; the
// WriteTo calls to it wait for done.
type resolveCall struct {
	nonce uint64
	done  chan struct{}
	p     *peer // set before done closes, or err
	err   error
}

// resolveError is a resolve that got no answer in time: a timeout (a
// net.Error) when the write deadline ended it.
type resolveError struct {
	msg     string
	timeout bool
}

func (e *resolveError) Error() string { return e.msg }
func (e *resolveError) Timeout() bool { return e.timeout }
func (e *resolveError) Unwrap() error {
	if e.timeout {
		return os.ErrDeadlineExceeded
	}
	return nil
}

// resolve asks ap's side channel for its route, or joins the request
// already under way, and waits for the answer, the write deadline dl, or
// Close.
func (e *Endpoint) resolve(ap netip.AddrPort, dl <-chan struct{}) (*peer, error) {
	e.pmu.Lock()
	if e.closed.Load() {
		e.pmu.Unlock()
		return nil, verbs.ErrClosed
	}
	c := e.pending[ap]
	if c == nil {
		if len(e.pending) >= maxResolving {
			e.pmu.Unlock()
			return nil, fmt.Errorf("rdma: resolve %v: %d addresses are being resolved already", ap, maxResolving)
		}
		c = &resolveCall{nonce: randUint64(), done: make(chan struct{})}
		e.pending[ap] = c
		e.wg.Add(1)
		go e.ask(ap, c)
	}
	e.pmu.Unlock()
	select {
	case <-c.done:
		return c.p, c.err
	case <-dl:
		return nil, &resolveError{msg: fmt.Sprintf("rdma: resolve %v: no answer from its side channel before the write deadline", ap), timeout: true}
	case <-e.done:
		return nil, verbs.ErrClosed
	}
}

// reask asks ap's side channel again, in the background, unless a
// request is under way: its answer replaces the cached route. Nobody
// waits for it; no answer leaves the route as it was.
func (e *Endpoint) reask(ap netip.AddrPort) {
	e.pmu.Lock()
	defer e.pmu.Unlock()
	if e.pending[ap] != nil || len(e.pending) >= maxResolving || e.closed.Load() {
		return
	}
	c := &resolveCall{nonce: randUint64(), done: make(chan struct{})}
	e.pending[ap] = c
	e.wg.Add(1)
	go e.ask(ap, c)
}

// ask sends c's request to ap until it is answered, resolveTries times at
// most, or the endpoint closes.
func (e *Endpoint) ask(ap netip.AddrPort, c *resolveCall) {
	defer e.wg.Done()
	var b [msgSize]byte
	m := msg{kind: kindReq, nonce: c.nonce, route: e.route}
	m.put(b[:])
	wait, total := resolveWait, time.Duration(0)
	t := time.NewTimer(wait)
	defer t.Stop()
	for try := 0; try < resolveTries; try++ {
		if try > 0 {
			t.Reset(wait)
		}
		e.udp.WriteToUDPAddrPort(b[:], ap) // a lost request is retried
		select {
		case <-c.done:
			return
		case <-e.done:
			return
		case <-t.C:
		}
		total += wait
		wait = min(2*wait, time.Second)
	}
	e.finish(ap, c, nil, &resolveError{msg: fmt.Sprintf("rdma: resolve %v: no answer from its side channel to %d requests over %v: no datagram endpoint (ListenPacket) there",
		ap, resolveTries, total.Round(time.Millisecond))})
}

// finish ends c, still pending for ap, with p or err.
func (e *Endpoint) finish(ap netip.AddrPort, c *resolveCall, p *peer, err error) bool {
	e.pmu.Lock()
	defer e.pmu.Unlock()
	if e.pending[ap] != c {
		return false
	}
	delete(e.pending, ap)
	c.p, c.err = p, err
	if err != nil {
		e.st.resolveFailed.Add(1)
	} else {
		e.st.resolved.Add(1)
	}
	close(c.done)
	return true
}

// serveSide reads the side channel until Close: it answers requests and
// takes the answers to its own.
func (e *Endpoint) serveSide() {
	defer e.wg.Done()
	var b [msgSize + 1]byte // one more: a longer datagram reads as such
	lim := tokenBucket{rate: answerRate, burst: answerBurst}
	for {
		n, src, err := e.udp.ReadFromUDPAddrPort(b[:])
		if err != nil {
			if e.closed.Load() {
				return
			}
			continue // an ICMP error of an earlier request, say
		}
		src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
		m, err := parseMsg(b[:n])
		if err != nil || (e.checkGID && m.route.GID.IP() != src.Addr()) {
			e.st.ignored.Add(1)
			continue
		}
		switch m.kind {
		case kindReq:
			if !lim.allow(time.Now()) {
				e.st.ignored.Add(1)
				continue
			}
			e.peers.learn(src, m.route)
			a := msg{kind: kindAns, nonce: m.nonce, route: e.route}
			a.put(b[:])
			if _, err := e.udp.WriteToUDPAddrPort(b[:msgSize], src); err == nil {
				e.st.answered.Add(1)
			}
		case kindAns:
			e.pmu.Lock()
			c := e.pending[src]
			e.pmu.Unlock()
			if c == nil || c.nonce != m.nonce {
				e.st.ignored.Add(1)
				continue
			}
			e.finish(src, c, e.peers.learn(src, m.route), nil)
		}
	}
}

// tokenBucket allows rate events a second in bursts of burst; its one
// user is the side channel's reader.
type tokenBucket struct {
	rate, burst float64
	tokens      float64
	last        time.Time
}

func (l *tokenBucket) allow(now time.Time) bool {
	if l.last.IsZero() {
		l.tokens = l.burst
	} else {
		l.tokens = min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.rate)
	}
	l.last = now
	if l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}
