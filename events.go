package rdma

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// ErrPortDown means the device port a connection runs on went down (the
// device reported PORT_ERR): the connection cannot carry anything more.
var ErrPortDown = errors.New("device port went down")

// WithLogger sends the connections' lifecycle events to l: a connection
// made, a connection closed in order by either side (at Info), a
// connection ended by a failure with its cause (at Warn when the peer
// went away or the connection failed), a handshake refused with its
// reason; and, given to OpenEngine or to the first Dial or Listen of a
// shared engine, the device's asynchronous events (port down and up, a
// QP or CQ error, the SRQ limit at Debug). A repeated event (a device
// event of one type, a refused handshake) is logged once per second at
// most, its record counting those not logged since ("more_since").
// Without it nothing is logged.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("rdma: %w: nil logger", ErrInvalid)
		}
		c.log = l
		return nil
	}
}

// logConnected records a connection that is up.
func (c *Conn) logConnected() {
	c.up.Store(true)
	c.eng.life.opened.Add(1)
	if l := c.cfg.log; l != nil {
		l.Info("rdma: connected", "local", c.local, "remote", c.remote, "provider", c.eng.prov.Name(),
			"device", c.eng.ctx.Info().Name, "qpn", c.qp.QPN())
	}
}

// orderly reports whether the connection is in an orderly close, by
// Close or by the peer's: what fails from then on (the flushes of the
// receives left posted, above all) is the close's doing, not an error.
func (c *Conn) orderly() bool { return c.closeCalled.Load() || c.ctl.closeHeard.Load() }

// logEnded records why a connection ended; it runs once, with the first
// error. An orderly close, by either side, is "rdma: connection closed"
// at Info, whatever its first error was (a receive flushed by the peer's
// teardown can come before the close itself); a failure is
// "rdma: connection ended" at Warn, with its cause.
func (c *Conn) logEnded(err error) {
	l := c.cfg.log
	if l == nil || !c.up.Load() {
		return // a handshake that failed is the listener's to log
	}
	if c.orderly() {
		by := "local"
		if c.ctl.closeHeard.Load() {
			by = "peer"
		}
		l.Info("rdma: connection closed", "local", c.local, "remote", c.remote, "by", by)
		return
	}
	lvl := slog.LevelWarn
	if errors.Is(err, ErrClosed) && !errors.Is(err, ErrPeerClosed) {
		lvl = slog.LevelInfo // closed here
	}
	l.Log(context.Background(), lvl, "rdma: connection ended", "local", c.local, "remote", c.remote,
		"peer_closed", errors.Is(err, ErrPeerClosed), "peer_lost", errors.Is(err, ErrPeerLost), "cause", err)
}

// logRefused counts a handshake the listener refused (refused: by its
// accept check) or that failed, and logs it once per logEvery: a flood of bad handshakes does not flood the log.
func (l *Listener) logRefused(remote any, err error, refused bool) {
	if refused {
		l.eng.life.handshakeRefused.Add(1)
	} else {
		l.eng.life.handshake(err)
	}
	lg := l.cfg.log
	if lg == nil {
		return
	}
	if ok, more := l.logLimit.allow("refused"); ok {
		lg.Warn("rdma: handshake refused", "listener", l.addr, "remote", remote, "reason", err, "more_since", more)
	}
}

// logEvery is how often a repeated event (a device event of one type, a
// refused handshake) is logged at most; the record says how many more
// came since the last one logged.
const logEvery = time.Second

// logLimiter rate-limits repeated log records by key. Its keys are few
// (event types), so its memory is bounded.
type logLimiter struct {
	mu   sync.Mutex
	last map[string]*logCount
}

type logCount struct {
	at   time.Time // the last record logged
	more int       // records not logged since
}

// allow reports whether a record of key is logged now and, if so, how
// many of key were not logged since the last one.
func (l *logLimiter) allow(key string) (ok bool, more int) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.last[key]
	if n == nil {
		if l.last == nil {
			l.last = map[string]*logCount{}
		}
		l.last[key] = &logCount{at: now}
		return true, 0
	}
	if now.Sub(n.at) < logEvery {
		n.more++
		return false, 0
	}
	more = n.more
	n.at, n.more = now, 0
	return true, more
}

// onAsyncEvent handles one of the device's asynchronous events: it
// logs it, refills an SRQ at its limit, and fails the connections of a
// port that went down.
func (e *engine) onAsyncEvent(ev verbs.AsyncEvent) {
	if l := e.cfg.log; l != nil {
		lvl := slog.LevelWarn
		switch ev.Type {
		case verbs.EventSRQLimitReached, verbs.EventCommEst, verbs.EventQPLastWQEReached:
			lvl = slog.LevelDebug
		case verbs.EventPortActive:
			lvl = slog.LevelInfo
		}
		if ok, more := e.logLimit.allow(ev.Type.String()); ok {
			l.Log(context.Background(), lvl, "rdma: device event", "device", e.ctx.Info().Name, "event", ev.Type.String(),
				"port", ev.Port, "qpn", ev.QPN, "more_since", more)
		}
	}
	switch ev.Type {
	case verbs.EventSRQLimitReached:
		if !srqEventRefill.Load() {
			return
		}
		for i := range e.srqs {
			if s := e.srqs[i].Load(); s != nil && s.q == ev.SRQ {
				s.refill(refillEvent)
			}
		}
	case verbs.EventPortErr:
		if ev.Port != e.port.Port {
			return
		}
		err := fmt.Errorf("rdma: device %s port %d: %w", e.ctx.Info().Name, ev.Port, ErrPortDown)
		for _, c := range e.slots.all() {
			c.fail(err)
		}
	}
}
