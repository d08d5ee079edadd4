package rdma

import (
	"encoding/binary"
	"sync"

	ieng "github.com/go-rdma/rdma/internal/engine"
	"github.com/go-rdma/rdma/internal/rc"

	"github.com/go-rdma/rdma/internal/poller"
	"github.com/go-rdma/rdma/internal/soft"
	"github.com/go-rdma/rdma/internal/verbs"
)

// ConnPollerStats is the counters of the poller that serves c's CQ.
func ConnPollerStats(c *Conn) poller.Stats { return c.rc.Unit.P.Stats() }

// ConnPollerConfig is the configuration of the poller that serves c's CQ.
func ConnPollerConfig(c *Conn) poller.Config { return c.rc.Unit.P.Config() }

// ConnPollerThread is the OS thread of c's poller, if it is locked.
func ConnPollerThread(c *Conn) int { return c.rc.Unit.P.ThreadID() }

// EnginePollerThreads are the OS threads of x's pollers, one per CQ.
func EnginePollerThreads(x *Engine) []int {
	var tids []int
	for _, u := range x.e.Units() {
		tids = append(tids, u.P.ThreadID())
	}
	return tids
}

// StopPoller stops c's poller as an error would, then fails c as
// engine.watch does when a poller stops on an error.
func StopPoller(c *Conn, err error) {
	c.rc.Unit.P.Close()
	c.rc.Fail(err)
}

// Control frame types, for tests that play a hostile peer.
const (
	CtrlRegion  = rc.CtrlRegion
	CtrlRequest = rc.CtrlRequest
	CtrlGrant   = rc.CtrlGrant
	CtrlFree    = rc.CtrlFree
	CtrlRevoked = rc.CtrlRevoked
	CtrlAbort   = rc.CtrlAbort
	CtrlDeny    = rc.CtrlDeny
	CtrlPing    = rc.CtrlPing
	CtrlPong    = rc.CtrlPong
)

// RequestsInFlight counts c's RequestRegion calls waiting for an answer.
func RequestsInFlight(c *Conn) int {
	n, _, _, _ := c.rc.Regions.Counts()
	return n
}

// CutControl closes c's control socket under it, as the kernel of a
// killed process does: no close or abort frame goes out.
func CutControl(c *Conn) { c.rc.Ctl.Conn().Close() }

// SendControl writes a raw control frame to c's peer, as a hostile peer
// could.
func SendControl(c *Conn, typ byte, p []byte) error { return c.rc.Ctl.Write(typ, p) }

// Granted is what c has granted to its peer's RequestRegion: bytes and
// regions.
func Granted(c *Conn) (bytes, regions int) {
	_, bytes, regions, _ = c.rc.Regions.Counts()
	return bytes, regions
}

// Exposed counts c's exposures.
func Exposed(c *Conn) int {
	_, _, _, n := c.rc.Regions.Counts()
	return n
}

// Deafen makes c read the peer's control frames and drop them, as a hung
// or hostile peer would: it answers nothing.
func Deafen(c *Conn) { c.rc.Ctl.Deafen() }

// SlowControl makes c's control reader wait, before it serves the next
// frame or the channel's end, until release is called.
func SlowControl(c *Conn) (release func()) {
	ch := make(chan struct{})
	c.rc.Ctl.Slow(ch)
	return sync.OnceFunc(func() { close(ch) })
}

// AwaitsVerdict reports whether c's completions wait for the control
// channel's word on why the peer went.
func AwaitsVerdict(c *Conn) bool { return rc.AwaitsVerdict(&c.rc) }

// PoolDrained is closed once the pool c shares with its engine (its
// Listener's, or its own for a dialed Conn) is closed and every slab is
// freed: then the engine closes the PD and the device context.
func PoolDrained(c *Conn) <-chan struct{} { return c.eng.Pool.Drained() }

// BufferAddr is the address of b's memory (0 after Release), to tell
// whether two handles got the same pool buffer.
func BufferAddr(b *Buffer) uint64 { return b.pb().Addr() }

// SetSRQRefill turns the SRQ's refill by its limit event and by the
// check after a poll on or off; restore turns both back on.
func SetSRQRefill(event, poll bool) (restore func()) { return ieng.SetRefillPaths(event, poll) }

// SharedRecvStats reports c's shared receive queue.
func SharedRecvStats(c *Conn) SRQStats {
	for _, q := range c.eng.stats(false).SharedReceives {
		if q.MessageSize == c.rc.SRQ.Size() {
			return q
		}
	}
	return SRQStats{}
}

// ForgeCredits gives c n credits its peer never gave, as a hostile
// peer would take them.
func ForgeCredits(c *Conn, n int) {
	c.rc.SQ.ForgeCredits(n)
}

// InjectDeviceEvent makes c's device report ev, on soft.
func InjectDeviceEvent(c *Conn, typ string, port uint8) bool {
	t := map[string]verbs.AsyncEventType{"PORT_ERR": verbs.EventPortErr, "PORT_ACTIVE": verbs.EventPortActive}[typ]
	return soft.InjectEvent(c.eng.Ctx, verbs.AsyncEvent{Type: t, Port: port})
}

// FailRecv hands c a receive completion with status st, as its poller
// would for a receive that failed.
func FailRecv(c *Conn, st verbs.WCStatus) error {
	pb, err := c.eng.Pool.Get(c.cfg.maxMsg)
	if err != nil {
		return err
	}
	c.rc.RQ.Mutex().Lock()
	c.rc.RQ.DeliverLocked(pb, &verbs.WorkCompletion{Status: st, QPN: 1})
	return nil
}

// CreditWord is c's credit word as its peer may reach it: the region the
// hello announced.
func CreditWord(c *Conn) RemoteRegion {
	mr := c.rc.Grants.Word().MR()
	return RemoteRegion{Addr: mr.Addr(), Len: mr.Len(), RKey: mr.RKey()}
}

// HoldPost takes c's post lock, as a goroutine posting at that moment
// would; posts meanwhile go to the combining queue. release lets go.
func HoldPost(c *Conn) (release func()) {
	release, _ = c.rc.SQ.HoldPost()
	return release
}

// SendCredits is how many credits c holds for its messages, its credit
// word read first.
func SendCredits(c *Conn) int { return c.rc.SQ.Credits() }

// HoldPostBare is HoldPost whose release only unlocks: it leaves what
// the combining queue holds to the next holder, as a holder between its
// unlock and its second look at the queue does (postUnlock).
func HoldPostBare(c *Conn) (release func()) {
	_, release = c.rc.SQ.HoldPost()
	return release
}

// PeerCloseHeard reports whether c has heard its peer close.
func PeerCloseHeard(c *Conn) bool { return c.rc.Life.PeerClosed() }

// CloseCalled reports whether c's Close has begun.
func CloseCalled(c *Conn) bool { return c.rc.Life.CloseCalled() }

// CreditIdleArmed reports whether c's idle give-back of credits
// (idleCredits) still runs.
func CreditIdleArmed(c *Conn) bool {
	return c.rc.SQ.IdleArmed()
}

// CreditsGiven is what c's peer holds of the credits c gave it (or used
// on messages not here yet), and whether some were given ahead of its
// asks (Spare).
func CreditsGiven(c *Conn) (out int64, ahead bool) {
	return c.rc.Grants.CreditsOut(), c.rc.Grants.Spare()
}

// SendRawControl writes b to c's control channel as it is, as a hostile
// peer could: a frame header with any length, or bytes of no frame.
func SendRawControl(c *Conn, b []byte) error {
	return c.rc.Ctl.WriteRaw(b)
}

// MaxCtrl is the largest control frame payload.
const MaxCtrl = rc.MaxCtrl

// HelloSize is the size of the hello each side of a TCP set-up sends.
var HelloSize = binary.Size(rc.Hello{})

// MaxHandshakes bounds the handshakes a Listener has made a queue pair for.
const MaxHandshakes = maxHandshakes

// EndSettled reports whether c's end has settled but for a handler that
// may still run: c failed, no message waits, and none can still come.
// It first lets c close Done if Done may close now, as each of the
// events that settle the end does.
func EndSettled(c *Conn) bool {
	return c.rc.RQ.Settled()
}

// InlineSize is the most bytes c posts inline.
func InlineSize(c *Conn) int { return c.rc.Inline }

// DebugFutures turns GORDMA_DEBUG=futures on until t ends and returns
// a function that takes the reports made since its last call.
func DebugFutures(t interface{ Cleanup(func()) }) (reports func() []string) {
	var mu sync.Mutex
	var got []string
	old := futureDebug.Swap(&futureDebugger{report: func(s string) {
		mu.Lock()
		got = append(got, s)
		mu.Unlock()
	}})
	t.Cleanup(func() { futureDebug.Store(old) })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		r := got
		got = nil
		return r
	}
}

// FuturesDebugged reports whether GORDMA_DEBUG=futures is on: released
// futures are then never reused.
func FuturesDebugged() bool { return futureDebug.Load() != nil }

// NudgeIWARP posts a zero-length RDMA READ on c when c is on iWARP, and
// reports whether it did: for a test whose third-party dialer's first
// message may wait unread in c's socket (settleIWARP).
func NudgeIWARP(c *Conn) bool {
	if c.eng.Ctx.Info().Transport != "iWARP" {
		return false
	}
	c.readSettle().Release() // resolves on its own
	return true
}

// ClaimDevice makes the hellos of this process's dialers and listeners
// claim an RDMA device (provider verbs, not "no device"), as a host with
// one would, until restore.
func ClaimDevice(dialer, listener bool) (restore func()) {
	claimDevice[0].Store(dialer)
	claimDevice[1].Store(listener)
	return func() {
		claimDevice[0].Store(false)
		claimDevice[1].Store(false)
	}
}

// BeforeAnswer runs f in Dial's handshake before it reads the listener's
// answer, until restore.
func BeforeAnswer(f func()) (restore func()) {
	beforeAnswer.Store(&f)
	return func() { beforeAnswer.Store(nil) }
}

// ReadAhead reports whether c's NetConn returns bytes its handshake read
// ahead first.
func ReadAhead(c *Conn) bool {
	_, ok := c.NetConn().(*aheadConn)
	return ok
}
