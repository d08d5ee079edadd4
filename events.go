package rdma

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/go-rdma/rdma/internal/verbs"
)

// ErrPortDown means the device port a connection runs on went down (the
// device reported PORT_ERR): the connection cannot carry anything more.
var ErrPortDown = errors.New("device port went down")

// WithLogger sends the connections' lifecycle events to l: a connection
// made, a connection ended with its cause (at Warn when the peer went
// away or the connection failed), a handshake refused with its reason;
// and, given to OpenEngine or to the first Dial or Listen of a shared
// engine, the device's asynchronous events (port down and up, a QP or CQ
// error, the SRQ limit at Debug). Without it nothing is logged.
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
	if l := c.cfg.log; l != nil {
		l.Info("rdma: connected", "local", c.local, "remote", c.remote, "provider", c.eng.prov.Name(),
			"device", c.eng.ctx.Info().Name, "qpn", c.qp.QPN())
	}
}

// logEnded records why a connection ended; it runs once, with the first
// error.
func (c *Conn) logEnded(err error) {
	l := c.cfg.log
	if l == nil || !c.up.Load() {
		return // a handshake that failed is the listener's to log
	}
	lvl := slog.LevelWarn
	if errors.Is(err, ErrClosed) {
		lvl = slog.LevelInfo // closed here
	}
	l.Log(context.Background(), lvl, "rdma: connection ended", "local", c.local, "remote", c.remote,
		"peer_closed", errors.Is(err, ErrPeerClosed), "cause", err)
}

// logRefused records a handshake the listener refused or that failed.
func (l *Listener) logRefused(remote any, err error) {
	if lg := l.cfg.log; lg != nil {
		lg.Warn("rdma: handshake refused", "listener", l.addr, "remote", remote, "reason", err)
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
		l.Log(context.Background(), lvl, "rdma: device event", "device", e.ctx.Info().Name, "event", ev.Type.String(),
			"port", ev.Port, "qpn", ev.QPN)
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
