package rc

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Life is how far a connection is from its end, as every part of it
// reads it: its first error, a close begun here, the peer's end, and the
// WRs in flight that the teardown waits for. Its fields are atomic and
// change only through its methods.
type Life struct {
	remote      net.Addr
	up          atomic.Bool // the set-up completed: a failure of its own is told to the peer, its end is the API's to log
	failed      atomic.Pointer[error]
	closeCalled atomic.Bool // Close began: what fails from here on is the orderly close's
	closing     atomic.Bool // the teardown began: nothing more is posted
	peerClosed  atomic.Bool // the peer closed or went away: post nothing more
	closeHeard  atomic.Bool // the peer's orderly close came
	inflight    atomic.Int64
	drained     chan struct{} // closed when inflight reaches 0 while closing
	drainOnce   sync.Once
}

// MarkUp records that the set-up completed.
func (l *Life) MarkUp() { l.up.Store(true) }

// Up reports whether the set-up completed: from then a failure of the
// connection's own is told to the peer, and its end is the API's to log.
func (l *Life) Up() bool { return l.up.Load() }

// Owner is what the parts ask of their connection, never on the post
// path: fail it, cut the peer off (for breaking the protocol), run a
// job on its control worker, send a control frame, finish a send-side op
// that a completion covered, count a failed receive and name its error
// (or only name it, for the beacon's flush, which is no receive), and
// have the engine's workers run its RecvHandler.
type Owner interface {
	Fail(err error)
	CutOff(err error)
	ProtocolErr(format string, args ...any)
	Later(job func())
	WriteControl(typ byte, p []byte) error
	Finish(o *Op, err error)
	FailedRecv(wc *verbs.WorkCompletion) error
	RecvErr(wc *verbs.WorkCompletion) error
	Dispatch()
}

// Init starts the life of a connection to remote.
func (l *Life) Init(remote net.Addr) {
	l.remote = remote
	l.drained = make(chan struct{})
}

// Err is the connection's first error, nil while it is up.
func (l *Life) Err() error {
	if p := l.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// Fail records err as the connection's error unless one was recorded;
// it reports whether err was the first.
func (l *Life) Fail(err error) bool { return l.failed.CompareAndSwap(nil, &err) }

// ClosedErr is the error of an operation refused because the connection
// ended: it wraps ErrClosed, and the connection's error when it failed.
func (l *Life) ClosedErr() error {
	if err := l.Err(); err != nil {
		if errors.Is(err, net.ErrClosed) {
			return err
		}
		return fmt.Errorf("rdma: conn %v: %w by its failure: %w", l.remote, verbs.ErrClosed, err)
	}
	return fmt.Errorf("rdma: conn %v: %w", l.remote, verbs.ErrClosed)
}

// PeerClosedErr is the error of a connection whose peer closed it in
// order: one text, whatever failed since.
func (l *Life) PeerClosedErr() error { return fmt.Errorf("rdma: peer %v: %w", l.remote, ErrPeerClosed) }

// PeerLostErr is the error of a connection whose peer went away without
// closing it.
func (l *Life) PeerLostErr() error { return fmt.Errorf("rdma: peer %v: %w", l.remote, ErrPeerLost) }

// CallClose records that Close began.
func (l *Life) CallClose() { l.closeCalled.Store(true) }

// CloseCalled reports whether Close began.
func (l *Life) CloseCalled() bool { return l.closeCalled.Load() }

// Closing reports whether the teardown began.
func (l *Life) Closing() bool { return l.closing.Load() }

// SetPeerClosed records that the peer closed or went away.
func (l *Life) SetPeerClosed() { l.peerClosed.Store(true) }

// PeerClosed reports whether the peer closed or went away.
func (l *Life) PeerClosed() bool { return l.peerClosed.Load() }

// HearClose records the peer's orderly close, before it records the
// peer closed: a post that finds the peer closed then finds its close
// heard too, and does not fail as if the peer went away. It reports
// whether the close was heard before.
func (l *Life) HearClose() (again bool) {
	if l.closeHeard.Swap(true) {
		return true
	}
	l.peerClosed.Store(true)
	return false
}

// CloseHeard reports whether the peer's orderly close came.
func (l *Life) CloseHeard() bool { return l.closeHeard.Load() }

// Orderly reports whether the connection ends by a close, of this side or
// of the peer.
func (l *Life) Orderly() bool { return l.closeCalled.Load() || l.closeHeard.Load() }

// Ending reports whether a post would be refused now: the connection
// failed, is closing or its peer closed.
func (l *Life) Ending() bool {
	return l.closeCalled.Load() || l.closing.Load() || l.peerClosed.Load() || l.failed.Load() != nil
}

// AddInflight counts a WR about to be posted; OpDone counts it finished.
func (l *Life) AddInflight() { l.inflight.Add(1) }

// OpDone counts a finished WR, and ends the teardown's wait when it was
// the last.
func (l *Life) OpDone() {
	if l.inflight.Add(-1) == 0 && l.closing.Load() {
		l.drainOnce.Do(func() { close(l.drained) })
	}
}

// Inflight is the number of WRs posted and not finished.
func (l *Life) Inflight() int64 { return l.inflight.Load() }

// BeginTeardown stops posts for good.
func (l *Life) BeginTeardown() { l.closing.Store(true) }

// Drained is closed once the teardown began and no WR is in flight.
func (l *Life) Drained() <-chan struct{} {
	if l.closing.Load() && l.inflight.Load() == 0 {
		l.drainOnce.Do(func() { close(l.drained) })
	}
	return l.drained
}
