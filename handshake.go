package rdma

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-rdma/rdma/internal/rc"
)

// The out-of-band handshake runs over the TCP connection that Dial opens
// and Listen accepts. Each side sends a hello; the listener answers with
// its own hello or a refusal. Then both move their QPs to RTS and send one
// ready byte, so neither side sends before the other's receives are
// posted. The TCP connection stays open afterwards as the control channel
// (regions, region requests, orderly close) and as a liveness signal.

// dialHandshake is Dial's side of the handshake over tc: its queue pair
// exists before its hello, which names it. It closes tc on failure.
func dialHandshake(ctx context.Context, eng *engine, cfg config, tc net.Conn) (*conn, error) {
	release := bound(ctx, tc, cfg.setup)
	defer release()
	if cfg.tls != nil {
		var err error
		if tc, err = startTLS(ctx, tc, cfg.tls); err != nil {
			return nil, err
		}
	}
	c, err := newConn(eng, cfg, tc, tc.LocalAddr(), tc.RemoteAddr())
	if err != nil {
		tc.Close()
		return nil, err
	}
	me, err := c.rc.Prepare()
	if err == nil {
		me.Flags |= fallbackFlags(eng, &cfg, true)
		copy(me.Provider[:], helloProvider(eng, true))
		err = rc.WriteHello(tc, &me)
	}
	br := bufio.NewReaderSize(tc, ctrlReadBuffer)
	var peer *rc.Hello
	if f := beforeAnswer.Load(); f != nil && err == nil {
		(*f)()
	}
	if err == nil && cfg.tls != nil {
		err = tlsAnswered(tc, br)
	}
	if err == nil {
		peer, err = rc.ReadAnswer(br)
	}
	if err == nil && peer.Flags&rc.HelloTCP != 0 {
		return dialTCP(c, &me, tc, br, release)
	}
	if err == nil {
		err = sameProvider(eng, peer, true)
	}
	if err == nil {
		err = rc.SameProtocol(cfg.protocol, peer, true)
	}
	if err == nil {
		err = rc.SameTransport(cfg.transport == UC, peer, true)
	}
	if err == nil {
		err = c.rc.Connect(br, &me, peer, release)
	}
	if err != nil {
		c.rc.AbortSetup()
		return nil, err
	}
	return c, nil
}

// sameProvider refuses a peer on another provider: a soft QP cannot
// talk to a verbs one (unless the connection falls back to TCP).
func sameProvider(eng *engine, peer *rc.Hello, dialing bool) error {
	if p, mine := rc.ProviderName(peer.Provider), helloProvider(eng, dialing); p != mine {
		return fmt.Errorf("%w: peer uses provider %q, this side %q", ErrRefused, p, mine)
	}
	return nil
}

// ctrlReadBuffer is the size of the buffered reader of a connection's
// TCP socket: hellos and control frames are small.
const ctrlReadBuffer = 512

// readPeerHello is the listener's first step: it reads and checks the
// dialer's hello, and refuses (telling the dialer why) a hello it cannot
// serve. Nothing costly exists yet: no queue pair, no receive, no
// registered memory. tcp says that the connection falls back to TCP
// (WithTCPFallback): then the providers need not match.
func readPeerHello(eng *engine, cfg *config, tc net.Conn, br *bufio.Reader) (peer *rc.Hello, tcp bool, err error) {
	peer, err = rc.ReadHello(br)
	if err == nil {
		tcp = rc.FallBack(fallbackFlags(eng, cfg, false), peer.Flags)
	}
	if err == nil && !tcp {
		err = sameProvider(eng, peer, false)
	}
	if err == nil {
		err = rc.SameProtocol(cfg.protocol, peer, false)
	}
	if err == nil {
		err = rc.SameTransport(cfg.transport == UC, peer, false)
	}
	if err != nil {
		rc.WriteRefusal(tc, err.Error())
		return nil, false, err
	}
	return peer, tcp, nil
}

// acceptConn is the listener's side after a valid hello: it makes the
// connection and answers. A failure here is sent to the dialer as a
// refusal, so it learns why instead of seeing the socket close. From
// its answer on it waits on the dialer, and calls waiting first. It
// closes tc on failure.
func acceptConn(eng *engine, cfg config, tc net.Conn, br *bufio.Reader, peer *rc.Hello, release func() bool, waiting func()) (*conn, error) {
	c, err := newConn(eng, cfg, tc, tc.LocalAddr(), tc.RemoteAddr())
	if err != nil {
		rc.WriteRefusal(tc, err.Error())
		tc.Close()
		return nil, err
	}
	me, err := c.rc.Prepare()
	if err != nil {
		rc.WriteRefusal(tc, err.Error())
		c.rc.AbortSetup()
		return nil, err
	}
	copy(me.Provider[:], helloProvider(eng, false))
	_, err = tc.Write([]byte{rc.AnswerAccept})
	if err == nil {
		err = rc.WriteHello(tc, &me)
	}
	if err == nil {
		waiting()
		err = c.rc.Connect(br, &me, peer, release)
	}
	if err != nil {
		c.rc.AbortSetup()
		return nil, err
	}
	return c, nil
}

// bound limits the handshake on tc to d and to ctx. release lifts both;
// it reports false if ctx ended first (tc then stays bounded, so that its
// reads fail; a deadline set after release overrides that bound). Calling
// it again does nothing. The socket's deadline is d alone: ctx's deadline
// ends the handshake through ctx, so that by the time a read fails,
// ctx.Err() says so (a socket deadline set to ctx's could fire first, and
// the dial would not match context.DeadlineExceeded).
func bound(ctx context.Context, tc net.Conn, d time.Duration) (release func() bool) {
	tc.SetDeadline(time.Now().Add(d))
	cut := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		tc.SetDeadline(time.Unix(1, 0))
		close(cut)
	})
	var once sync.Once
	var ok bool
	return func() bool {
		once.Do(func() {
			if ok = stop(); ok {
				tc.SetDeadline(time.Time{})
			} else {
				<-cut
			}
		})
		return ok
	}
}
