package rdma

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
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
// event of one type, a handshake refused by one peer address for one
// reason) is logged once per second at most, its record counting those
// not logged since ("more_since"). A listener tracks a bounded number
// of such addresses and reasons: refusals past them are counted and
// reported with the next record logged ("others_since").
// Without it nothing is logged.
func WithLogger(l *slog.Logger) LoggerOption {
	return loggerOpt(func(c *config) error {
		if l == nil {
			return fmt.Errorf("rdma: %w: nil logger", ErrInvalid)
		}
		c.log = l
		return nil
	})
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
// accept check) or that failed, and logs it once per logEvery for its
// peer's address and reason: a flood of bad handshakes does not flood
// the log, and one peer's flood does not hide another's refusal.
func (l *Listener) logRefused(remote net.Addr, err error, refused bool) {
	if refused {
		l.eng.life.handshakeRefused.Add(1)
	} else {
		l.eng.life.handshake(err)
	}
	lg := l.cfg.log
	if lg == nil {
		return
	}
	ok, more, others := l.logLimit.allow(refusalKey(remote, err), time.Now())
	if !ok {
		return
	}
	attrs := []any{"listener", l.addr, "remote", remote, "reason", err, "more_since", more}
	if others > 0 {
		attrs = append(attrs, "others_since", others)
	}
	lg.Warn("rdma: handshake refused", attrs...)
}

// maxRefusalKey bounds the text of a refusal's key.
const maxRefusalKey = 256

// refusalKey is what a refused handshake is rate-limited by: the peer's
// host (its port changes with every dial) and the reason, with the
// peer's address taken out of the reason's text.
func refusalKey(remote net.Addr, err error) string {
	addr := remote.String()
	host, _, serr := net.SplitHostPort(addr)
	if serr != nil {
		host = addr
	}
	key := host + " " + strings.ReplaceAll(err.Error(), addr, "")
	return key[:min(len(key), maxRefusalKey)]
}

// logEvery is how often a repeated event (a device event of one type, a
// refused handshake of one peer and reason) is logged at most; the
// record says how many more came since the last one logged.
const logEvery = time.Second

// maxLogKeys bounds the keys a logLimiter tracks: a refused handshake's
// key names its peer and reason, so an attacker chooses how many there
// are.
const maxLogKeys = 64

// logLimiter rate-limits repeated log records by key. It tracks at most
// maxLogKeys keys: past them, the keys not logged for logEvery are
// forgotten, and if none is, a record of a new key is held back. What
// forgotten keys held back, and the records held back so, are counted
// as others and reported with the next record logged: nothing goes
// uncounted, and the log takes at most maxLogKeys records per logEvery.
type logLimiter struct {
	mu     sync.Mutex
	last   map[string]*logCount
	others int
}

type logCount struct {
	at   time.Time // the last record logged
	more int       // records not logged since
}

// allow reports whether a record of key is logged at now and, if so, how
// many of key were not logged since the last one, and how many of other
// keys were held back and not reported yet.
func (l *logLimiter) allow(key string, now time.Time) (ok bool, more, others int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.last[key]
	switch {
	case n == nil:
		if l.last == nil {
			l.last = map[string]*logCount{}
		}
		if len(l.last) >= maxLogKeys {
			l.forget(now)
		}
		if len(l.last) >= maxLogKeys {
			l.others++
			return false, 0, 0
		}
		l.last[key] = &logCount{at: now}
	case now.Sub(n.at) < logEvery:
		n.more++
		return false, 0, 0
	default:
		more = n.more
		n.at, n.more = now, 0
	}
	others, l.others = l.others, 0
	return true, more, others
}

// forget drops the keys not logged for logEvery, counting what they
// held back as others.
func (l *logLimiter) forget(now time.Time) {
	for k, n := range l.last {
		if now.Sub(n.at) >= logEvery {
			l.others += n.more
			delete(l.last, k)
		}
	}
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
		// A device has a few event types: no key is held back.
		if ok, more, _ := e.logLimit.allow(ev.Type.String(), time.Now()); ok {
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
