package rdma

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	ieng "github.com/go-rdma/rdma/internal/engine"
)

// ErrPortDown means the device port a connection runs on went down (the
// device reported PORT_ERR): the connection cannot carry anything more.
var ErrPortDown = ieng.ErrPortDown

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
func (c *conn) logConnected() {
	c.rc.Life.MarkUp()
	c.eng.lifecycle.opened.Add(1)
	if l := c.cfg.log; l != nil {
		l.Info("rdma: connected", "local", c.local, "remote", c.rc.Remote, "provider", c.eng.Prov.Name(),
			"device", c.eng.Name(), "qpn", c.rc.QP.QPN())
	}
}

// logEnded records why a connection ended; it runs once, with the first
// error. An orderly close, by either side, is "rdma: connection closed"
// at Info, whatever its first error was (a receive flushed by the peer's
// teardown can come before the close itself); a failure is
// "rdma: connection ended" at Warn, with its cause.
func (c *conn) logEnded(err error) {
	l := c.cfg.log
	if l == nil || !c.rc.Life.Up() {
		return // a handshake that failed is the listener's to log
	}
	if c.rc.Life.Orderly() {
		by := "local"
		if c.rc.Life.CloseHeard() {
			by = "peer"
		}
		l.Info("rdma: connection closed", "local", c.local, "remote", c.rc.Remote, "by", by)
		return
	}
	lvl := slog.LevelWarn
	if errors.Is(err, ErrClosed) && !errors.Is(err, ErrPeerClosed) {
		lvl = slog.LevelInfo // closed here
	}
	l.Log(context.Background(), lvl, "rdma: connection ended", "local", c.local, "remote", c.rc.Remote,
		"peer_closed", errors.Is(err, ErrPeerClosed), "peer_lost", errors.Is(err, ErrPeerLost), "cause", err)
}

// logRefused counts a handshake the listener refused (refused: by its
// accept check) or that failed, and logs it once per logEvery for its
// peer's address and reason: a flood of bad handshakes does not flood
// the log, and one peer's flood does not hide another's refusal.
func (l *Listener) logRefused(remote net.Addr, err error, refused bool) {
	if refused {
		l.eng.lifecycle.handshakeRefused.Add(1)
	} else {
		l.eng.lifecycle.handshake(err)
	}
	lg := l.cfg.log
	if lg == nil {
		return
	}
	ok, more, others := l.logLimit.Allow(refusalKey(remote, err), time.Now())
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
