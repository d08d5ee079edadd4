package engine

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/soft"
	"github.com/go-rdma/rdma/internal/verbs"
)

// The rig of the credit-grant tests: a real SRQ of an engine on the
// soft provider, its receives posted and taken by the soft device, and
// fake connections (fakeConn) that take credits from it as the root
// package's Conn does (credit.go, credit_word.go, endpoint.go), each
// with the peer that sends to it. A message is a zero-length SEND on a
// loopback pair of QPs whose receiving QP shares the SRQ: it takes a
// receive of the soft SRQ when sent (a SEND that finds none fails with
// RNR_RETRY_EXC_ERR, rnr_retry 0), and reaches the SRQ's accounting
// when the test hands its completion to the engine's completion path
// (Engine.completions), as a poller would. Everything runs on the
// test's goroutine, one step at a time, chosen by a seeded generator
// or by a fuzzer's bytes, so that a failure replays from its seed:
//   - the SRQ limit event's refill is turned off (SetRefillPaths) and
//     is a step of its own;
//   - the retry and decay timers are replaced by timers that only record
//     that they fired: a step runs what they would run (refill, decayLook)
//     while they are armed;
//   - time passes only in a step: after each call into the SRQ the last
//     recall's time is set far ahead (a recall just happened), and the
//     "tick" step sets it to zero (recallGap has passed since).

// choices picks the rig's next step.
type choices interface {
	intn(n int) int // in [0, n); n > 0
}

// seeded draws from a seeded PCG: the property test.
type seeded struct{ r *rand.Rand }

func newSeeded(seed uint64) seeded { return seeded{rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))} }
func (c seeded) intn(n int) int    { return c.r.IntN(n) }

// fuzzed draws from a fuzzer's bytes, one a choice; 0 once they run out.
type fuzzed struct{ b []byte }

func (c *fuzzed) intn(n int) int {
	if len(c.b) == 0 {
		return 0
	}
	v := int(c.b[0])
	c.b = c.b[1:]
	return v % n
}

func newFuzzed(b []byte) *fuzzed  { return &fuzzed{b: b} }
func (c *fuzzed) exhausted() bool { return len(c.b) == 0 }

const (
	rigMsgSize = 64  // the SRQ's receive size
	maxRigLog  = 120 // steps kept for a failure's report
)

// farFuture is the last recall's time while recallGap has not passed.
var farFuture = time.Now().Add(1000 * time.Hour)

// grantRig is one SRQ with its fake connections.
type grantRig struct {
	t     testing.TB
	e     *Engine
	s     *SRQ
	ch    choices
	depth int

	conns  []*fakeConn // on the SRQ, in the order they joined
	nextID int

	// The loopback pair: tx sends the messages, rx takes receives of s.
	cq     verbs.CQ
	tx, rx verbs.QP
	u      *Unit
	ep     rigEndpoint
	wc     []verbs.WorkCompletion
	inCQ   []verbs.WorkCompletion // receive completions not yet handed to the engine
	owners []*fakeConn            // whose message each of them is, oldest first

	noNonReaders bool // connections that join read
	noProgress   bool // settle checks the safety only

	retryFired, decayFired atomic.Bool
	bad                    []string   // contract breaches seen under the SRQ's lock
	log                    []logEntry // the last steps, for a failure's report
	steps                  int
	closed                 bool
}

// openSoftEngine opens an engine on the soft provider, released at the
// end of the test; every pool buffer must be back by then.
func openSoftEngine(t testing.TB) *Engine {
	t.Helper()
	e, err := Open(Config{Port: 1}, soft.Provider, "")
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, e.Release())
		select {
		case <-e.Pool.Drained():
		default:
			t.Errorf("pool buffers not released")
		}
	})
	return e
}

// newGrantRig makes an SRQ of depth receives on e (none may be open for
// the rig's message size) with one connection per cap in caps; reads
// says whether each one's application takes its messages.
func newGrantRig(t testing.TB, e *Engine, depth int, ch choices, caps []int, reads []bool) *grantRig {
	t.Helper()
	r := &grantRig{t: t, e: e, ch: ch, depth: depth}
	r.ep = rigEndpoint{r}
	restore := SetRefillPaths(false, true)
	t.Cleanup(restore)
	t.Cleanup(r.close)
	for i, c := range caps {
		r.join(c, reads[i])
	}
	return r
}

// join puts a new connection of cap credits on the SRQ; the first one
// makes it.
func (r *grantRig) join(cap int, reads bool) *fakeConn {
	c := &fakeConn{r: r, id: r.nextID, cap: min(cap, r.depth), reads: reads}
	r.nextID++
	if r.s == nil {
		// SRQFor reads the depth when it makes the queue.
		r.e.Cfg.SharedRecvs = r.depth
	}
	s, err := r.e.SRQFor(rigMsgSize, c)
	require.NoError(r.t, err)
	if r.s == nil {
		r.s = s
		require.Equal(r.t, r.depth, s.Depth())
		// The rig's own use, dropped by close: the SRQ outlives its
		// connections (all may leave, and others join).
		r.e.mu.Lock()
		s.users.Add(1)
		r.e.mu.Unlock()
		r.takeTimers()
		r.openPair()
	}
	require.Same(r.t, r.s, s)
	r.conns = append(r.conns, c)
	r.logf("join c%d cap %d reads %v", c.id, c.cap, reads)
	return c
}

// takeTimers replaces the SRQ's retry and decay timers by ones that
// only record that they fired: steps run what they would.
func (r *grantRig) takeTimers() {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.retry.Stop()
	s.decay.Stop()
	s.retry = time.AfterFunc(time.Hour, func() { r.retryFired.Store(true) })
	s.retry.Stop()
	s.decay = time.AfterFunc(time.Hour, func() { r.decayFired.Store(true) })
	s.decay.Stop()
}

// openPair makes the loopback pair whose SENDs are the messages.
func (r *grantRig) openPair() {
	t, e, s := r.t, r.e, r.s
	var err error
	r.cq, err = e.Ctx.CreateCQ(2*r.depth+2, nil)
	require.NoError(t, err)
	r.tx, err = e.PD.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: r.cq, RecvCQ: r.cq,
		Cap: verbs.QPCap{MaxSendWR: r.depth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	r.rx, err = e.PD.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: r.cq, RecvCQ: r.cq, SRQ: s.q,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxSendSGE: 1}})
	require.NoError(t, err)
	gid, err := e.GIDFor(netip.Addr{}) // the port's GID
	require.NoError(t, err)
	for _, q := range []verbs.QP{r.tx, r.rx} {
		require.NoError(t, q.ToInit(verbs.InitAttr{Port: e.Port.Port}))
	}
	for _, c := range [][2]verbs.QP{{r.tx, r.rx}, {r.rx, r.tx}} {
		require.NoError(t, c[0].ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU1024, DestQPN: c[1].QPN(), RQPSN: 1,
			Dest: verbs.Address{Port: e.Port.Port, LID: e.Port.LID, GID: gid.GID, SGIDIndex: uint8(gid.Index)}, MinRNRTimer: 1}))
		// No RNR retry: a message that finds no receive fails at once.
		require.NoError(t, c[0].ToRTS(verbs.RTSAttr{SQPSN: 1, Timeout: 14, RetryCount: 7, RNRRetry: 0}))
	}
	r.u = &Unit{}
	e.RegisterQPN(r.rx.QPN(), r.ep, r.u)
	r.wc = make([]verbs.WorkCompletion, 2*r.depth+2)
}

// rigEndpoint routes the messages rx takes to the fakeConn that sent
// them: one QP carries every connection's, in order.
type rigEndpoint struct{ r *grantRig }

func (ep rigEndpoint) Complete(*verbs.WorkCompletion) {}
func (ep rigEndpoint) Fail(error)                     {}
func (ep rigEndpoint) Received(pb *pool.Buffer, _ *verbs.WorkCompletion) {
	r := ep.r
	c := r.owners[0]
	r.owners = r.owners[1:]
	c.inflight--
	c.arrived(pb)
}

// send posts n messages of c as one chain and collects their
// completions: every SEND must find a receive.
func (r *grantRig) send(c *fakeConn, n int) {
	wrs := make([]verbs.SendWR, n)
	for i := range wrs {
		wrs[i] = verbs.SendWR{ID: uint64(i), Opcode: verbs.OpSend, Flags: verbs.SendSignaled}
	}
	if posted, err := r.tx.PostSend(wrs); err != nil || posted != n {
		r.failf("c%d: %d of %d messages posted: %v", c.id, posted, n, err)
	}
	for range n {
		r.owners = append(r.owners, c)
	}
	c.inflight += n
	sends, recvs := 0, 0
	deadline := time.Now().Add(5 * time.Second)
	for sends < n || recvs < n {
		m, err := r.cq.Poll(r.wc)
		if err != nil {
			r.failf("poll: %v", err)
		}
		for i := range m {
			wc := r.wc[i]
			if wc.QPN == r.rx.QPN() {
				if wc.Status != verbs.WCSuccess {
					r.failf("c%d's message: the receive failed: %v", c.id, wc.Err())
				}
				r.inCQ = append(r.inCQ, wc)
				recvs++
				continue
			}
			if wc.Status != verbs.WCSuccess {
				r.failf("c%d's message found no receive posted at the SRQ: %v", c.id, wc.Err())
			}
			sends++
		}
		if m == 0 {
			if time.Now().After(deadline) {
				r.failf("c%d's %d messages: %d sends and %d receives completed", c.id, n, sends, recvs)
			}
			runtime.Gosched()
		}
	}
}

// poll hands the oldest k receive completions to the engine, as a
// poller does: the SRQ takes their receives, the connections account
// for the messages, and a refill may follow.
func (r *grantRig) poll(k int) {
	wcs := append([]verbs.WorkCompletion(nil), r.inCQ[:k]...)
	r.inCQ = append(r.inCQ[:0], r.inCQ[k:]...)
	left := len(r.owners) - k
	r.e.completions(r.u, wcs)
	r.clock()
	if len(r.owners) != left {
		r.failf("the engine handed over %d messages of %d", k-(len(r.owners)-left), k)
	}
}

func (r *grantRig) pollAll() {
	if len(r.inCQ) > 0 {
		r.poll(len(r.inCQ))
	}
}

// clock keeps time still: a recall that just happened holds the next
// one off until a tick.
func (r *grantRig) clock() {
	s := r.s
	s.mu.Lock()
	if !s.recallAt.IsZero() {
		s.recallAt = farFuture
	}
	s.mu.Unlock()
}

// tick lets recallGap pass.
func (r *grantRig) tick() {
	r.s.mu.Lock()
	r.s.recallAt = time.Time{}
	r.s.mu.Unlock()
}

// recalled makes as if a recall just went out: the next waits for a
// tick.
func (r *grantRig) recalled() {
	r.s.mu.Lock()
	r.s.recallAt = farFuture
	r.s.mu.Unlock()
}

// retryArmed reports whether the retry timer was set since it last
// fired (by a step), and disarms it: the caller fires it.
func (r *grantRig) retryArmed() bool {
	r.s.mu.Lock()
	armed := r.s.retry.Stop()
	r.s.mu.Unlock()
	return r.retryFired.Swap(false) || armed
}

// fireRetry runs what the retry timer runs, srqRetry (more than
// recallGap) after it was set.
func (r *grantRig) fireRetry() {
	r.tick()
	r.s.refill(RefillRetry)
	r.clock()
}

// fireDecay runs the decay look, which the timer runs while decayArmed.
func (r *grantRig) fireDecay() {
	r.s.mu.Lock()
	r.s.decay.Stop()
	r.s.mu.Unlock()
	r.decayFired.Store(false)
	r.s.decayLook()
	r.clock()
}

// leave takes c off the SRQ as Conn's teardown does: its QP is gone
// (its messages in flight were handed over), then what it held goes back.
func (r *grantRig) leave(c *fakeConn) {
	r.pollAll()
	c.left = true
	for _, pb := range c.bufs {
		pb.Release()
	}
	c.bufs = nil
	held := int64(c.held + c.taken)
	out := c.out
	c.held, c.taken, c.out = 0, 0, 0
	c.dropSender()
	c.rjobs, c.toSender = nil, nil
	r.s.Leave(c, held, out)
	r.clock()
	for i, x := range r.conns {
		if x == c {
			r.conns = append(r.conns[:i], r.conns[i+1:]...)
			break
		}
	}
	require.NoError(r.t, r.e.DropSRQ(r.s))
}

// close takes every connection off, closes the pair and then the SRQ
// (the rig's DropSRQ is the last); nothing is left granted or held.
func (r *grantRig) close() {
	if r.closed || r.s == nil {
		return
	}
	r.closed = true
	r.pollAll()
	r.e.UnregisterQPN(r.rx.QPN(), r.ep)
	require.NoError(r.t, r.tx.Close())
	require.NoError(r.t, r.rx.Close())
	require.NoError(r.t, r.cq.Close())
	for len(r.conns) > 0 {
		r.leave(r.conns[len(r.conns)-1])
	}
	require.NoError(r.t, r.e.DropSRQ(r.s))
	require.Zero(r.t, r.s.granted.Load(), "credits outstanding after every connection left")
	require.Zero(r.t, r.s.held.Load(), "messages held after every connection left")
}

// logf records a step for a failure's report; it is formatted only
// then.
func (r *grantRig) logf(format string, args ...any) {
	if len(r.log) == maxRigLog {
		r.log = r.log[1:]
	}
	r.log = append(r.log, logEntry{r.steps, format, args})
}

type logEntry struct {
	step   int
	format string
	args   []any
}

func (l logEntry) String() string {
	return fmt.Sprintf("%d: ", l.step) + fmt.Sprintf(l.format, l.args...)
}

func (r *grantRig) breach(format string, args ...any) {
	r.bad = append(r.bad, fmt.Sprintf(format, args...))
}

// failf fails the test with the rig's state and its last steps.
func (r *grantRig) failf(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("%s\n%s", fmt.Sprintf(format, args...), r.state())
}

func (r *grantRig) state() string {
	var b strings.Builder
	s := r.s
	s.mu.Lock()
	fmt.Fprintf(&b, "SRQ depth %d: posted %d granted %d held %d withdrawing %d; waiting:", r.depth,
		s.posted.Load(), s.granted.Load(), s.held.Load(), s.withdrawing.Load())
	for _, w := range s.wq.ws {
		fmt.Fprintf(&b, " c%d(want %d need %d chain %d)", w.c.(*fakeConn).id, w.want, w.need, w.chain)
	}
	if s.wq.reserved != nil {
		fmt.Fprintf(&b, "; reserved c%d", s.wq.reserved.(*fakeConn).id)
	}
	s.mu.Unlock()
	fmt.Fprintf(&b, "\nin flight %d\n", len(r.inCQ))
	for _, c := range r.conns {
		fmt.Fprintf(&b, "  %v\n", c)
	}
	b.WriteString("last steps:\n")
	for _, l := range r.log {
		b.WriteString("  " + l.String() + "\n")
	}
	return b.String()
}

// check asserts the invariants that hold between any two steps.
func (r *grantRig) check() {
	r.t.Helper()
	if len(r.bad) > 0 {
		r.failf("breach: %s", strings.Join(r.bad, "; "))
	}
	s := r.s
	var out, msgs int64
	for _, c := range r.conns {
		out += int64(c.out)
		msgs += int64(c.held + c.taken)
		if c.CreditRoom() < 0 {
			r.failf("c%d: %d credits out, %d messages here, %d taken: over its cap %d", c.id, c.out, c.held, c.taken, c.cap)
		}
		if c.failed {
			continue
		}
		// Every credit given is at the sender, in its word or an answer
		// to come, on its way back, or used by a message in flight.
		if at := c.credits + int(int32(c.total-c.seen)) + c.backInFlight() + c.inflight; at != c.out || c.credits < 0 {
			r.failf("c%d: %d credits out, but the sender holds %d, has %d to see, %d on their way back and %d messages in flight",
				c.id, c.out, c.credits, int32(c.total-c.seen), c.backInFlight(), c.inflight)
		}
	}
	granted, posted, withdrawing := s.granted.Load(), s.posted.Load(), s.withdrawing.Load()
	if granted != out {
		r.failf("the SRQ counts %d credits out, the connections %d", granted, out)
	}
	if held := s.held.Load(); held != msgs {
		r.failf("the SRQ counts %d messages held, the connections %d", held, msgs)
	}
	if granted > posted-withdrawing {
		r.failf("%d credits out, more than the %d receives posted (%d of them withdrawing)", granted, posted-withdrawing, withdrawing)
	}
	if posted > int64(r.depth) {
		r.failf("%d receives posted, more than the depth %d", posted, r.depth)
	}
}

// A step of the rig: what it does and to which connection.
type stepKind uint8

const (
	stepPost        stepKind = iota // the sender's application posts a chain
	stepSenderJob                   // the sender's control worker runs a job (ask, give-back)
	stepRecvJob                     // the receiver's control worker runs a job (recall, credit answer)
	stepToRecv                      // a control frame reaches the receiver
	stepToSender                    // a control frame reaches the sender
	stepSettle                      // the sender's send completions come (its queue drains)
	stepPoll                        // the poller hands messages to the engine
	stepTake                        // the receiver's application takes messages
	stepIdle                        // the sender's idle timer fires
	stepLeaveFailed                 // a failed connection is torn down
	stepTick                        // recallGap passes
	stepRetry                       // the SRQ's retry timer fires
	stepDecay                       // the SRQ's decay timer fires
	stepEvent                       // the SRQ's limit event comes
	stepJoin                        // a connection joins
	stepLeave                       // a connection closes
	stepFail                        // a connection fails
	stepKinds
)

// stepWeights weigh the steps of the random walk.
var stepWeights = [stepKinds]int{
	stepPost: 10, stepSenderJob: 8, stepRecvJob: 8, stepToRecv: 8, stepToSender: 8, stepSettle: 3,
	stepPoll: 8, stepTake: 8, stepIdle: 1, stepLeaveFailed: 2, stepTick: 3, stepRetry: 2, stepDecay: 1,
	stepEvent: 1, stepJoin: 1, stepLeave: 1, stepFail: 1,
}

type step struct {
	kind stepKind
	c    *fakeConn
}

// enabled lists the steps that can run now; progress only those that
// answer recalls and take messages (no posts, joins, leaves, failures
// or idle and decay timers).
func (r *grantRig) enabled(progress bool, into []step) []step {
	add := func(k stepKind, c *fakeConn) { into = append(into, step{k, c}) }
	for _, c := range r.conns {
		if c.failed {
			add(stepLeaveFailed, c)
			continue
		}
		if !progress && c.pendingMsgs() < 3*c.cap {
			add(stepPost, c)
		}
		if len(c.sjobs) > 0 {
			add(stepSenderJob, c)
		}
		if len(c.rjobs) > 0 {
			add(stepRecvJob, c)
		}
		if len(c.toRecv) > 0 {
			add(stepToRecv, c)
		}
		if len(c.toSender) > 0 {
			add(stepToSender, c)
		}
		if c.unsettled > 0 {
			add(stepSettle, c)
		}
		if c.reads && c.held > 0 {
			add(stepTake, c)
		}
		if !progress && c.idleArmed {
			add(stepIdle, c)
		}
	}
	if len(r.inCQ) > 0 {
		add(stepPoll, nil)
	}
	if !progress {
		add(stepTick, nil)
		add(stepRetry, nil) // runs only when armed
		add(stepEvent, nil)
		if r.s.decayArmed.Load() {
			add(stepDecay, nil)
		}
		if len(r.conns) < 12 {
			add(stepJoin, nil)
		}
		if len(r.conns) > 0 {
			// A connection picked when the step runs.
			add(stepFail, nil)
			add(stepLeave, nil)
		}
	}
	return into
}

// pick chooses one of steps by weight.
func (r *grantRig) pick(steps []step) step {
	sum := 0
	for _, st := range steps {
		sum += stepWeights[st.kind]
	}
	n := r.ch.intn(sum)
	for _, st := range steps {
		if n -= stepWeights[st.kind]; n < 0 {
			return st
		}
	}
	return steps[len(steps)-1]
}

// run does one step.
func (r *grantRig) run(st step) {
	r.steps++
	c := r.ch
	switch st.kind {
	case stepPost:
		var n int
		switch c.intn(4) {
		case 0, 1:
			n = 1
		case 2:
			n = 1 + c.intn(st.c.cap)
		default:
			n = st.c.cap
		}
		r.logf("c%d posts %d", st.c.id, n)
		st.c.post(n)
	case stepSenderJob:
		st.c.runSenderJob()
	case stepRecvJob:
		st.c.runRecvJob()
	case stepToRecv:
		st.c.deliverToRecv()
	case stepToSender:
		st.c.deliverToSender()
	case stepSettle:
		r.logf("c%d's sends complete", st.c.id)
		st.c.settle()
	case stepPoll:
		k := 1 + c.intn(len(r.inCQ))
		r.logf("poll %d", k)
		r.poll(k)
	case stepTake:
		k := 1 + c.intn(st.c.held)
		r.logf("c%d takes %d", st.c.id, k)
		for range k {
			st.c.took()
		}
	case stepIdle:
		r.logf("c%d idle", st.c.id)
		st.c.idleCredits()
	case stepLeave:
		st.c = r.conns[c.intn(len(r.conns))]
		fallthrough
	case stepLeaveFailed:
		r.logf("c%d leaves", st.c.id)
		r.leave(st.c)
	case stepTick:
		r.logf("tick")
		r.tick()
	case stepRetry:
		if r.retryArmed() {
			r.logf("retry")
			r.fireRetry()
		}
	case stepDecay:
		r.logf("decay look")
		r.fireDecay()
	case stepEvent:
		r.logf("limit event")
		r.s.refill(RefillEvent)
		r.clock()
	case stepJoin:
		r.join(r.randCap(), r.noNonReaders || c.intn(5) > 0)
	case stepFail:
		st.c = r.conns[c.intn(len(r.conns))]
		r.logf("c%d fails", st.c.id)
		st.c.fail()
	}
	r.check()
}

// randCap is a connection's cap: 1, a few, or up to the SRQ's depth.
func (r *grantRig) randCap() int {
	switch r.ch.intn(4) {
	case 0:
		return 1
	case 1:
		return 1 + r.ch.intn(4)
	case 2:
		return 1 + r.ch.intn(r.depth)
	}
	return r.depth
}

// walk runs n random steps (fewer when the choices run out).
func (r *grantRig) walk(n int) {
	var buf []step
	for range n {
		if f, ok := r.ch.(*fuzzed); ok && f.exhausted() {
			return
		}
		buf = r.enabled(false, buf[:0])
		r.run(r.pick(buf))
	}
}

// pace says which timers settle lets fire when nothing else can run.
type pace uint8

const (
	// promptly: the SRQ's retry timer (5 ms), whose refill recalls the
	// credits others hold: the design's claim.
	promptly pace = iota
	// eventually: and, once a second of retries (200) changed nothing,
	// the decay look (whose recall reaches every quiet connection) and
	// the senders' idle timers.
	eventually
)

// retriesPerSecond is how often the retry timer (srqRetry) fires in a
// second, the decay look's and the idle timers' period.
const retriesPerSecond = int(time.Second / srqRetry)

// settle runs the steps that answer recalls, hand messages over and let
// the applications take them, in a random order, and, whenever nothing
// else can run, the timers p lets fire, until nothing but a timer can
// run and every chain of a connection whose application reads has gone
// out, and a connection that does not read waits only for a chain its
// own messages leave no room for (settled). Nothing is posted meanwhile.
// It reports how many seconds of slow timers that took.
func (r *grantRig) settle(limit int, p pace) (seconds int) {
	r.t.Helper()
	r.logf("settle")
	var buf []step
	retries := 0 // since the last step that was not a timer
	for range limit {
		if buf = r.enabled(true, buf[:0]); len(buf) > 0 {
			retries = 0
			r.run(r.pick(buf))
			continue
		}
		why := r.unsettled()
		if why == "" && !r.noProgress {
			return seconds
		}
		r.steps++
		retry := r.retryArmed()
		if retry && retries < retriesPerSecond {
			retries++
			r.logf("retry")
			r.fireRetry()
			r.check()
			continue
		}
		if r.noProgress && (p == promptly || seconds == 3 || !r.slowArmed()) {
			return seconds // only the safety is checked
		}
		if p == promptly {
			r.failf("hold and wait: %s; the SRQ's recalls got nothing moving (%d retries)", why, retries)
		}
		if seconds == 10 {
			r.failf("wedged: %s; 10 s of decay looks and idle timers got nothing moving", why)
		}
		seconds++
		retries = 0
		r.logf("a second passes")
		if r.s.decayArmed.Load() {
			r.fireDecay()
		}
		for _, c := range r.conns {
			if c.idleArmed && !c.failed {
				r.logf("c%d idle", c.id)
				c.idleCredits()
			}
		}
		if retry {
			r.fireRetry()
		}
		r.check()
	}
	if r.noProgress {
		return seconds // a livelock is no breach of the safety
	}
	r.failf("no rest after %d steps: something keeps going", limit)
	return seconds
}

// quiet runs the steps that answer recalls, hand messages over and let
// the applications take them, in a random order, until none can run; no
// timer fires.
func (r *grantRig) quiet() {
	var buf []step
	for {
		if buf = r.enabled(true, buf[:0]); len(buf) == 0 {
			return
		}
		r.run(r.pick(buf))
	}
}

// slowArmed reports whether the decay look or an idle timer is armed.
func (r *grantRig) slowArmed() bool {
	if r.s.decayArmed.Load() {
		return true
	}
	for _, c := range r.conns {
		if c.idleArmed && !c.failed {
			return true
		}
	}
	return false
}

// underLoad runs rounds of load: feed posts more, then up to 50 steps
// that answer recalls, hand messages over and let the applications
// take them, in a random order, with the retry timer when nothing else
// can run. It returns the round in which done reports true, and fails
// the test when none of rounds does.
func (r *grantRig) underLoad(rounds int, feed func(), done func() bool) int {
	r.t.Helper()
	var buf []step
	for round := range rounds {
		if done() {
			return round
		}
		r.logf("round %d", round)
		feed()
		for range 50 {
			if buf = r.enabled(true, buf[:0]); len(buf) > 0 {
				r.run(r.pick(buf))
				continue
			}
			r.steps++
			if !r.retryArmed() {
				break
			}
			r.logf("retry")
			r.fireRetry()
			r.check()
		}
	}
	r.failf("not done after %d rounds of load", rounds)
	return rounds
}

// unsettled says why the connections have not settled, or "".
func (r *grantRig) unsettled() string {
	for _, c := range r.conns {
		if len(c.pending) == 0 {
			continue
		}
		if c.reads {
			return fmt.Sprintf("c%d (its application reads) has %d messages waiting (chains %v)", c.id, c.pendingMsgs(), c.pending)
		}
		if room := c.cap - c.held - c.taken; c.pending[0] <= room {
			return fmt.Sprintf("c%d does not read but has room for its first chain of %d (cap %d, %d messages held)",
				c.id, c.pending[0], c.cap, c.held)
		}
	}
	return ""
}
