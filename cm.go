package rdma

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/internal/verbs"
)

// WithRDMACM makes Dial and Listen set connections up through rdma_cm
// (librdmacm) instead of go-rdma's TCP handshake, so go-rdma talks to
// peers it did not write: rdma_server, rdma_client, rsockets-free C
// services. It needs the verbs provider.
//
// Such connections have no TCP control channel: Send, Recv, Write, Read,
// atomics, batches and Expose work; SendRegion, RecvRegion and
// RequestRegion return an error wrapping ErrNotSupported. They have no
// credits (Credited): a message is posted at once, and one that finds
// the peer's receive queue empty is retried by the device (RNR) or, on
// iWARP, ends the connection; a protocol keeps at most SendWindow
// messages unread by the peer's Recv. A go-rdma peer says its largest
// message and its receive window in the rdma_cm private data; with
// another peer Send assumes it takes what this side accepts
// (WithMaxMessage), and SendWindow is 0. A peer's disconnect fails the
// connection with ErrPeerClosed; a connection that fails here (or Abort)
// disconnects at once, so its peer learns of it without waiting, though
// not why. On iWARP, Dial returns once the peer has answered an RDMA
// READ (of a byte a go-rdma listener names, zero bytes of another), so
// that siw reads the first message (docs/providers.md).
func WithRDMACM() ConnOption {
	return connOpt(func(c *config) error { c.cm = true; return nil })
}

// cmEngine returns, with a reference, the engine for an rdma_cm
// connection on device dev: eng if it is on dev, else the shared one.
func cmEngine(eng *engine, cfg config, dev string) (*engine, error) {
	if err := ibv.CMAvailable(); err != nil {
		return nil, fmt.Errorf("rdma: rdma_cm: %w", err)
	}
	if cfg.provider == ProviderSoft {
		return nil, fmt.Errorf("rdma: %w: rdma_cm needs the verbs provider", ErrInvalid)
	}
	if eng != nil {
		if eng.Prov.Name() != ProviderVerbs || (dev != "" && eng.Name() != dev) {
			return nil, fmt.Errorf("rdma: %w: rdma_cm chose device %q, the engine is on %s device %q", ErrInvalid, dev, eng.Prov.Name(), eng.Name())
		}
		if err := eng.Acquire(); err != nil {
			return nil, err
		}
	} else {
		cfg.provider, cfg.device = ProviderVerbs, dev
		var err error
		if eng, err = sharedEngine(cfg, netip.Addr{}); err != nil {
			return nil, err
		}
	}
	if err := eng.check(cfg); err != nil {
		eng.Release()
		return nil, err
	}
	return eng, nil
}

// cmDialAttempts bounds the dials of dialCM that fail with
// EADDRNOTAVAIL.
const cmDialAttempts = 4

// dialCM connects through rdma_cm. On iWARP the connect is a TCP connect
// from the port rdma_cm chose in its own port space, which the host's
// TCP stack may still hold for an earlier connection of that port
// (TIME_WAIT): rdma_connect then fails with EADDRNOTAVAIL, before
// anything reached the listener, and a new id (a new port) is tried.
func dialCM(ctx context.Context, eng *engine, cfg config, address string) (*conn, error) {
	for attempt := 1; ; attempt++ {
		c, err := dialCMOnce(ctx, eng, cfg, address)
		if err == nil || !errors.Is(err, syscall.EADDRNOTAVAIL) || attempt == cmDialAttempts || ctx.Err() != nil {
			return c, err
		}
	}
}

// dialCMOnce is one attempt of dialCM, on one rdma_cm id.
func dialCMOnce(ctx context.Context, eng *engine, cfg config, address string) (*conn, error) {
	id, err := ibv.CMDial(ctx, "", address)
	if err != nil {
		return nil, err
	}
	eng, err = cmEngine(eng, cfg, id.Device())
	if err != nil {
		id.Close()
		return nil, err
	}
	c, err := cmConn(eng, cfg, id, func(c *conn) (cmHello, error) {
		ours := cmHelloFor(cfg)
		ours.goFirst = c.iwarp()
		if err := id.Connect(ctx, c.rc.QP, ibv.CMParams{PrivateData: ours.marshal()}); err != nil {
			return cmHello{}, cmRefused(err)
		}
		return learnCMHello(cfg, id.PrivateData(), true)
	})
	eng.Release() // the connection holds its own reference
	if err != nil {
		return nil, err
	}
	if err := c.settleIWARP(ctx, id.ReadDepth()); err != nil {
		c.api.Close()
		return nil, err
	}
	return c, nil
}

// cmConn makes the connection of id on eng: QP to INIT, receives posted,
// then connect (or accept) through rdma_cm, which gives the peer's hello.
func cmConn(eng *engine, cfg config, id *ibv.CMID, connect func(*conn) (cmHello, error)) (_ *conn, err error) {
	c, err := newConn(eng, cfg, nil, id.LocalAddr(), id.RemoteAddr())
	if err != nil {
		id.Close()
		return nil, err
	}
	c.rc.CM = id
	c.rc.SQ.UnlimitedCredits()
	defer func() {
		// c, not the result: a failure returns a nil *conn.
		if err != nil {
			c.rc.Ctl.End()
			c.rc.Teardown()
		}
	}()
	if err := id.ModifyQP(c.rc.QP, verbs.StateInit); err != nil {
		return nil, err
	}
	if err := c.rc.RQ.PostReceives(); err != nil {
		return nil, err
	}
	peer, err := connect(c)
	if err != nil {
		return nil, err
	}
	c.rc.Peer.MaxMsg, c.rc.Peer.RecvWindow = peer.maxMsg, peer.recvWindow
	c.iw.named(peer.settle)
	go func() {
		defer c.rc.Ctl.End()
		if id.WaitDisconnect(c.rc.Context()) == nil {
			c.rc.Fail(fmt.Errorf("rdma: peer %v: %w", c.rc.Remote, ErrPeerClosed))
			// Answer the peer's disconnect request, or its rdma_cm
			// waits for a timeout before it can tear down.
			id.Disconnect()
		}
	}()
	c.logConnected()
	return c, nil
}

// listenCM listens through rdma_cm on one device: the one whose GID
// carries the listening address, or the configured (or first usable)
// device for a wildcard address.
func listenCM(eng *engine, cfg config, address string) (*Listener, error) {
	ln, err := ibv.CMListen(address, 64)
	if err != nil {
		return nil, err
	}
	dev := cfg.device
	if dev == "" {
		if ta, ok := ln.Addr().(ibv.CMAddr); ok && !ta.Addr().IsUnspecified() {
			_, devs, _ := chooseProvider(ProviderVerbs, "")
			dev = deviceFor(devs, ta.Addr())
		}
	}
	eng, err = cmEngine(eng, cfg, dev)
	if err != nil {
		ln.Close()
		return nil, err
	}
	l := &Listener{eng: eng, cfg: cfg, conns: make(chan *conn), cmln: ln, addr: ln.Addr()}
	l.ctx, l.stop = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.acceptCM()
	return l, nil
}

func (l *Listener) acceptCM() {
	defer l.wg.Done()
	sem := make(chan struct{}, maxHandshakes)
	for {
		req, err := l.cmln.Accept(l.ctx)
		if err != nil {
			return
		}
		if req.Device() != l.eng.Name() {
			req.Reject([]byte("go-rdma: request on another device than the listener's"))
			req.Close()
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-l.ctx.Done():
			req.Close()
			return
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(l.ctx, l.cfg.setup)
			defer cancel()
			peer, closed, err := l.checkCMRequest(ctx, req)
			if closed {
				return // the check's peer is refused when the check returns
			}
			if err != nil {
				req.Reject(cmRejectData(err))
				req.Close()
				l.eng.lifecycle.handshake(err)
				return
			}
			c, err := cmConn(l.eng, l.cfg, req.CMID, func(c *conn) (cmHello, error) {
				ours := cmHelloFor(l.cfg)
				var err error
				if ours.settle, err = c.offerSettleByte(); err != nil {
					return cmHello{}, err
				}
				// The peer's settle byte is none: a dialer names none.
				peer.settle = RemoteRegion{}
				if peer.goFirst && ours.settle.Len > 0 {
					c.awaitGo() // before the accept: nothing is posted yet
				}
				return peer, req.Accept(ctx, c.rc.QP, ibv.CMParams{PrivateData: ours.marshal()})
			})
			if err != nil {
				return
			}
			select {
			case l.conns <- c:
			case <-l.ctx.Done():
				c.api.Close()
			}
		}()
	}
}

// checkCMRequest checks a connection request's hello and runs the accept
// check (WithAcceptCheck) on it, bounded by ctx, before anything is made
// for the peer; it returns the hello. closed reports that the listener
// closed while the check ran: the request is then rejected when the
// check returns, and the caller must leave it alone.
func (l *Listener) checkCMRequest(ctx context.Context, req *ibv.CMRequest) (peer cmHello, closed bool, err error) {
	peer, err = learnCMHello(l.cfg, req.PrivateData(), false)
	if err != nil || l.cfg.acceptCheck == nil {
		return peer, false, err
	}
	info := PeerInfo{RemoteAddr: req.RemoteAddr(), LocalAddr: req.LocalAddr(), Context: ctx}
	closed, err = l.runCheck(ctx, info, func(why error) {
		req.Reject(cmRejectData(why))
		req.Close()
	})
	return peer, closed, err
}
