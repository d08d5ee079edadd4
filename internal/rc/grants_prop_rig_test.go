package rc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	ieng "github.com/go-rdma/rdma/internal/engine"
	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/soft"
	"github.com/go-rdma/rdma/internal/verbs"
)

// The rig of the property tests of the credits: a real SRQ of an engine
// on the soft provider (its timers and clock in the rig's hand,
// grants_prop_srq_test.go) and connections made of the real parts, each
// a pair (propConn):
//   - the receiving side: a Grants on the SRQ, as Conn's (SRQFor with
//     the grants as its Grantee), with the send queue that posts their
//     credit WRITEs, over a fake QP;
//   - the sending side, its peer: a SendQueue over a fake QP whose
//     SENDs go out on a loopback pair of soft QPs whose receiving QP
//     shares the SRQ. A message takes a receive of the soft SRQ when it is
//     posted (a SEND that finds none fails: no RNR retry), and reaches
//     the SRQ's accounting and the grants (Arrived) when the rig hands
//     its completion to the engine's completion path, as a poller would.
//
// Each side's Owner queues its control jobs (Later) and the frames it
// writes (WriteControl); steps of the rig run the jobs and deliver the
// frames one at a time, in order, to the method Conn.ReadControl
// calls. A credit WRITE (an OpWrite to the sender's credit word) lands
// in the sender's word in a step, and completes in a later one
// (Grants.CreditWritten). The sender's idle timer, the SRQ's retry and
// decay timers and its limit event are steps too. Everything runs on
// the test's goroutine, chosen by a seeded generator or a fuzzer's bytes:
// a failure replays from its seed.

// propChoices picks the rig's next step.
type propChoices interface {
	intn(n int) int // in [0, n); n > 0
}

// propSeeded draws from a seeded PCG.
type propSeeded struct{ r *rand.Rand }

func newPropSeeded(seed uint64) propSeeded {
	return propSeeded{rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))}
}
func (c propSeeded) intn(n int) int { return c.r.IntN(n) }

// propFuzzed draws from a fuzzer's bytes, one a choice; 0 once they run
// out.
type propFuzzed struct{ b []byte }

func (c *propFuzzed) intn(n int) int {
	if len(c.b) == 0 {
		return 0
	}
	v := int(c.b[0])
	c.b = c.b[1:]
	return v % n
}

const (
	propMsgSize = 64  // the SRQ's receive size
	propLogLen  = 150 // steps kept for a failure's report
)

// propEngine opens an engine on the soft provider, released at the end
// of the test; every pool buffer must be back by then.
func propEngine(t testing.TB) *ieng.Engine {
	t.Helper()
	e, err := ieng.Open(ieng.Config{Port: 1}, soft.Provider, "")
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

// propInert is the rig's own user of the SRQ, so that it outlives its
// connections (all may leave, and others join): it holds, asks and is
// given nothing.
type propInert struct{}

func (propInert) CreditRoom() int   { return 0 }
func (propInert) CreditCap() int    { return 0 }
func (propInert) Give(int, bool)    {}
func (propInert) Given() uint32     { return 0 }
func (propInert) CreditsOut() int64 { return 0 }
func (propInert) Spare() bool       { return false }
func (propInert) WaitsForRoom() int { return 0 }
func (propInert) Recall()           {}
func (propInert) LookQuiet() bool   { return false }
func (propInert) Failed() bool      { return false }

// propRig is one SRQ with its connections.
type propRig struct {
	t     testing.TB
	e     *ieng.Engine
	srq   *ieng.SRQ
	s     *ieng.SRQHand
	ch    propChoices
	depth int
	inert propInert

	conns  []*propConn // on the SRQ, in the order they joined
	gone   []*propConn // left: nothing may reach them any more
	nextID int

	// The loopback pair: tx sends the messages, rx takes receives of the
	// SRQ.
	cq     verbs.CQ
	tx, rx verbs.QP
	u      *ieng.Unit
	ep     propEndpoint
	wc     []verbs.WorkCompletion
	inCQ   []verbs.WorkCompletion // receive completions not yet handed to the engine
	owners []*propConn            // whose message each of them is, oldest first

	noNonReaders bool // connections that join read
	noProgress   bool // settle checks the safety only

	ran    *propCounts // what the steps did, over the rigs that share it
	bad    []string    // breaches seen inside a step
	log    []propLog   // the last steps, for a failure's report
	steps  int
	closed bool
}

// newPropRig makes an SRQ of depth receives on e with one connection
// per cap in caps; reads says whether each one's application takes its
// messages.
func newPropRig(t testing.TB, e *ieng.Engine, depth int, ch propChoices, caps []int, reads []bool) *propRig {
	t.Helper()
	r := &propRig{t: t, e: e, ch: ch, depth: depth, ran: &propCounts{}}
	r.ep = propEndpoint{r}
	// The limit event's refill would run on the engine's event reader:
	// it is a step of its own.
	t.Cleanup(ieng.SetRefillPaths(false, true))
	e.Cfg.SharedRecvs = depth // SRQFor reads it as it makes the queue
	s, err := e.SRQFor(propMsgSize, &r.inert)
	require.NoError(t, err)
	require.Equal(t, depth, s.Depth(), "a new SRQ: the last rig closed its own")
	r.srq = s
	r.s = s.Hand()
	t.Cleanup(r.close)
	r.openPair()
	for i, c := range caps {
		r.join(c, reads[i])
	}
	return r
}

// openPair makes the loopback pair whose SENDs are the messages.
func (r *propRig) openPair() {
	t, e := r.t, r.e
	var err error
	r.cq, err = e.Ctx.CreateCQ(4*r.depth+2, nil)
	require.NoError(t, err)
	r.tx, err = e.PD.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: r.cq, RecvCQ: r.cq,
		Cap: verbs.QPCap{MaxSendWR: 2 * r.depth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	r.rx, err = e.PD.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: r.cq, RecvCQ: r.cq, SRQ: r.srq.Q(),
		Cap: verbs.QPCap{MaxSendWR: 1, MaxSendSGE: 1}})
	require.NoError(t, err)
	gid, err := e.GIDFor(netip.Addr{})
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
	r.u = &ieng.Unit{}
	e.RegisterQPN(r.rx.QPN(), r.ep, r.u)
	r.wc = make([]verbs.WorkCompletion, 4*r.depth+2)
}

// propEndpoint routes the messages rx takes to the connection that sent
// them: one QP carries every connection's, in order.
type propEndpoint struct{ r *propRig }

func (ep propEndpoint) Complete(*verbs.WorkCompletion) {}
func (ep propEndpoint) Fail(error)                     {}
func (ep propEndpoint) Received(pb *pool.Buffer, _ *verbs.WorkCompletion) {
	r := ep.r
	c := r.owners[0]
	r.owners = r.owners[1:]
	c.inflight--
	c.arrived(pb)
}

// send sends n messages of c as one chain and collects their
// completions: every SEND must find a receive.
func (r *propRig) send(c *propConn, n int) {
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
// poller does: the SRQ takes their receives, the grants account for the
// messages (Arrived), and a refill may follow.
func (r *propRig) poll(k int) {
	wcs := append([]verbs.WorkCompletion(nil), r.inCQ[:k]...)
	r.inCQ = append(r.inCQ[:0], r.inCQ[k:]...)
	left := len(r.owners) - k
	r.s.Completions(r.e, r.u, wcs)
	if len(r.owners) != left {
		r.failf("the engine handed over %d messages of %d", k-(len(r.owners)-left), k)
	}
}

func (r *propRig) pollAll() {
	if len(r.inCQ) > 0 {
		r.poll(len(r.inCQ))
	}
}

// join puts a new connection of cap credits on the SRQ. Its sender has
// a credit word, as every go-rdma peer of this version has.
func (r *propRig) join(cap int, reads bool) *propConn { return r.joinWord(cap, reads, true) }

// joinWord puts a new connection of cap credits on the SRQ, whose sender
// has a credit word if word is set (else the grants answer in frames
// only, as to a peer without one).
func (r *propRig) joinWord(cap int, reads, word bool) *propConn {
	cap = min(cap, r.depth)
	c := newPropConn(r, r.nextID, cap, reads, word, cap+r.ch.intn(cap+1))
	r.nextID++
	s, err := r.e.SRQFor(propMsgSize, &c.g)
	require.NoError(r.t, err)
	require.Same(r.t, r.srq, s)
	c.g.SetSRQ(s)
	r.conns = append(r.conns, c)
	r.logf("join c%d cap %d reads %v word %v send depth %d", c.id, c.cap, reads, c.word, c.sdepth)
	return c
}

// leave tears c down as Conn's close does: its QP is gone (its messages
// in flight were handed over), then the grants leave the SRQ with what
// they held.
func (r *propRig) leave(c *propConn) {
	r.pollAll()
	if !c.failed {
		c.end(errors.New("rig: closed"))
	}
	c.rmu.Lock()
	for _, pb := range c.msgs {
		pb.Release()
	}
	c.msgs = nil
	c.rmu.Unlock()
	c.g.Leave()
	c.left = true
	for i, x := range r.conns {
		if x == c {
			r.conns = append(r.conns[:i], r.conns[i+1:]...)
			break
		}
	}
	r.gone = append(r.gone, c)
	require.NoError(r.t, r.e.DropSRQ(r.srq))
}

// close takes every connection off, closes the pair and then the SRQ
// (the rig's user is the last); nothing is left granted or held.
func (r *propRig) close() {
	if r.closed {
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
	r.check()
	r.srq.Leave(&r.inert, 0, 0)
	st := r.srq.Stats()
	require.Zero(r.t, st.Granted, "credits outstanding after every connection left")
	require.Zero(r.t, st.Held, "messages held after every connection left")
	require.Zero(r.t, st.Waiting, "connections waiting after every connection left")
	r.s.Stop()
	require.NoError(r.t, r.e.DropSRQ(r.srq))
}

// propCounts count what the steps of rigs did, so a test can tell that
// its walks reach what they are meant to check.
type propCounts struct {
	steps    [pstepKinds]int
	frames   [CtrlRecall + 1]int // by type
	writes   int                 // credit WRITEs posted
	messages int                 // messages sent
	retries  int                 // retry timers fired in settle
}

// add adds the counts of o.
func (c *propCounts) add(o *propCounts) {
	for i := range c.steps {
		c.steps[i] += o.steps[i]
	}
	for i := range c.frames {
		c.frames[i] += o.frames[i]
	}
	c.writes += o.writes
	c.messages += o.messages
	c.retries += o.retries
}

// propLog is a step, formatted only for a failure's report.
type propLog struct {
	step   int
	format string
	args   []any
}

func (l propLog) String() string {
	return fmt.Sprintf("%d: ", l.step) + fmt.Sprintf(l.format, l.args...)
}

func (r *propRig) logf(format string, args ...any) {
	if len(r.log) == propLogLen {
		r.log = r.log[1:]
	}
	r.log = append(r.log, propLog{r.steps, format, args})
}

// breach records a breach seen inside a step; check fails the test on
// it after the step.
func (r *propRig) breach(format string, args ...any) {
	r.bad = append(r.bad, fmt.Sprintf(format, args...))
}

// failf fails the test with the rig's state and its last steps.
func (r *propRig) failf(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("%s\n%s", fmt.Sprintf(format, args...), r.state())
}

func (r *propRig) state() string {
	var b strings.Builder
	st := r.srq.Stats()
	fmt.Fprintf(&b, "SRQ depth %d: posted %d granted %d held %d withdrawing %d waiting %d; retry fired %v, decay armed %v\n",
		r.depth, st.Posted, st.Granted, st.Held, r.s.Withdrawing(), st.Waiting, r.s.RetryFired(), r.s.DecayArmed())
	fmt.Fprintf(&b, "messages in flight %d\n", len(r.inCQ))
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
func (r *propRig) check() {
	r.t.Helper()
	r.logGrants()
	if len(r.bad) > 0 {
		r.failf("breach: %s", strings.Join(r.bad, "; "))
	}
	var out, msgs int64
	for _, c := range r.conns {
		o, h, tk := c.g.Counts()
		out += o
		msgs += h + tk
		if o < 0 || h < 0 || tk < 0 || o+h+tk > int64(c.cap) {
			r.failf("c%d: %d credits out, %d messages here, %d taken: over its cap %d", c.id, o, h, tk, c.cap)
		}
		if h != int64(len(c.msgs)) {
			r.failf("c%d: the grants count %d messages here, the receive side holds %d", c.id, h, len(c.msgs))
		}
		if c.failed {
			continue
		}
		// Every credit given is at the sender, in its word or an answer
		// to come, on its way back, or used by a message in flight.
		unseen := int(int32(c.g.cw.Total() - c.ssq.creditSeen))
		if at := c.ssq.credits + unseen + c.backInFlight() + c.inflight; int64(at) != o || c.ssq.credits < 0 {
			r.failf("c%d: %d credits out, but the sender holds %d, has %d to see, %d on their way back and %d messages in flight",
				c.id, o, c.ssq.credits, unseen, c.backInFlight(), c.inflight)
		}
	}
	for _, c := range r.gone {
		if o, h, tk := c.g.Counts(); o != 0 || h != 0 || tk != 0 {
			r.failf("c%d left, but counts %d credits out, %d messages held, %d taken", c.id, o, h, tk)
		}
	}
	st := r.srq.Stats()
	if st.Granted != out {
		r.failf("the SRQ counts %d credits out, the grants %d", st.Granted, out)
	}
	if st.Held != msgs {
		r.failf("the SRQ counts %d messages held, the grants %d", st.Held, msgs)
	}
	if w := r.s.Withdrawing(); st.Granted > st.Posted-w {
		r.failf("%d credits out, more than the %d receives posted (%d of them withdrawing)", st.Granted, st.Posted-w, w)
	}
	if st.Posted > int64(r.depth) {
		r.failf("%d receives posted, more than the depth %d", st.Posted, r.depth)
	}
}

// A step of the rig: what it does and to which connection.
type propStep uint8

const (
	pstepPost        propStep = iota // the sender's application posts a chain
	pstepSenderJob                   // the sender's control worker runs a job (ask, give-back)
	pstepRecvJob                     // the receiver's control worker runs a job (recall, credit answer)
	pstepToRecv                      // a control frame reaches the receiver
	pstepToSender                    // a control frame reaches the sender
	pstepSendDone                    // send completions come: room goes back (Settle)
	pstepLand                        // the receiver's credit WRITE lands in the sender's word
	pstepWritten                     // its completion comes (CreditWritten)
	pstepPoll                        // the poller hands messages to the engine
	pstepTake                        // the receiver's application takes messages
	pstepIdle                        // the sender's idle timer fires
	pstepLeaveFailed                 // a failed connection is torn down
	pstepTick                        // recallGap passes
	pstepRetry                       // the SRQ's retry timer fires
	pstepDecay                       // the SRQ's decay timer fires
	pstepEvent                       // the SRQ's limit event comes
	pstepJoin                        // a connection joins
	pstepLeave                       // a connection closes
	pstepFail                        // a connection fails
	pstepKinds
)

// propWeights weigh the steps of the random walk.
var propWeights = [pstepKinds]int{
	pstepPost: 10, pstepSenderJob: 8, pstepRecvJob: 8, pstepToRecv: 8, pstepToSender: 8, pstepSendDone: 4,
	pstepLand: 6, pstepWritten: 6, pstepPoll: 8, pstepTake: 8, pstepIdle: 1, pstepLeaveFailed: 2, pstepTick: 3,
	pstepRetry: 2, pstepDecay: 1, pstepEvent: 1, pstepJoin: 1, pstepLeave: 1, pstepFail: 1,
}

type propAct struct {
	kind propStep
	c    *propConn
}

// enabled lists the steps that can run now; progress only those that
// answer recalls, complete sends and WRITEs and take messages (no posts,
// joins, leaves, failures or idle and decay timers).
func (r *propRig) enabled(progress bool, into []propAct) []propAct {
	add := func(k propStep, c *propConn) { into = append(into, propAct{k, c}) }
	for _, c := range r.conns {
		if c.failed {
			add(pstepLeaveFailed, c)
			continue
		}
		if !progress && c.ssq.pendingWRs < 3*c.cap {
			add(pstepPost, c)
		}
		if len(c.sside.jobs) > 0 {
			add(pstepSenderJob, c)
		}
		if len(c.rside.jobs) > 0 {
			add(pstepRecvJob, c)
		}
		if len(c.sside.out) > 0 {
			add(pstepToRecv, c)
		}
		if len(c.rside.out) > 0 {
			add(pstepToSender, c)
		}
		if len(c.sent) > 0 {
			add(pstepSendDone, c)
		}
		if len(c.writes) > 0 {
			if c.writes[0].landed {
				add(pstepWritten, c)
			} else {
				add(pstepLand, c)
			}
		}
		if c.reads && len(c.msgs) > 0 {
			add(pstepTake, c)
		}
		if !progress && c.ssq.idleArmed {
			add(pstepIdle, c)
		}
	}
	if len(r.inCQ) > 0 {
		add(pstepPoll, nil)
	}
	if !progress {
		add(pstepTick, nil)
		add(pstepRetry, nil) // runs only when armed
		add(pstepEvent, nil)
		if r.s.DecayArmed() {
			add(pstepDecay, nil)
		}
		if len(r.conns) < 12 {
			add(pstepJoin, nil)
		}
		if len(r.conns) > 0 {
			// A connection picked when the step runs.
			add(pstepFail, nil)
			add(pstepLeave, nil)
		}
	}
	return into
}

// pick chooses one of acts by weight.
func (r *propRig) pick(acts []propAct) propAct {
	sum := 0
	for _, a := range acts {
		sum += propWeights[a.kind]
	}
	n := r.ch.intn(sum)
	for _, a := range acts {
		if n -= propWeights[a.kind]; n < 0 {
			return a
		}
	}
	return acts[len(acts)-1]
}

// run does one step, then checks the invariants.
func (r *propRig) run(a propAct) {
	r.t.Helper()
	r.steps++
	r.ran.steps[a.kind]++
	ch, c := r.ch, a.c
	switch a.kind {
	case pstepPost:
		var n int
		switch ch.intn(4) {
		case 0, 1:
			n = 1
		case 2:
			n = 1 + ch.intn(c.cap)
		default:
			n = c.cap
		}
		r.logf("c%d posts %d", c.id, n)
		c.post(n)
	case pstepSenderJob:
		c.runSenderJob()
	case pstepRecvJob:
		c.runRecvJob()
	case pstepToRecv:
		c.deliverToRecv()
	case pstepToSender:
		c.deliverToSender()
	case pstepSendDone:
		k := 1 + ch.intn(len(c.sent))
		r.logf("c%d: %d sends complete", c.id, k)
		c.sendsDone(k)
	case pstepLand:
		c.land()
	case pstepWritten:
		c.written()
	case pstepPoll:
		k := 1 + ch.intn(len(r.inCQ))
		r.logf("poll %d", k)
		r.poll(k)
	case pstepTake:
		k := 1 + ch.intn(len(c.msgs))
		r.logf("c%d takes %d", c.id, k)
		c.take(k)
	case pstepIdle:
		r.logf("c%d idle", c.id)
		c.ssq.idleCredits()
	case pstepLeave:
		c = r.conns[ch.intn(len(r.conns))]
		fallthrough
	case pstepLeaveFailed:
		r.logf("c%d leaves", c.id)
		r.leave(c)
	case pstepTick:
		r.logf("tick")
		r.s.Tick()
	case pstepRetry:
		if r.s.RetryArmed() {
			r.logf("retry")
			r.s.FireRetry()
		}
	case pstepDecay:
		r.logf("decay look")
		r.s.FireDecay()
	case pstepEvent:
		r.logf("limit event")
		r.s.Refill(ieng.RefillEvent)
	case pstepJoin:
		r.join(r.randCap(), r.noNonReaders || ch.intn(5) > 0)
	case pstepFail:
		c = r.conns[ch.intn(len(r.conns))]
		r.logf("c%d fails", c.id)
		c.end(errors.New("rig: failed"))
	}
	r.s.Clock()
	r.check()
}

// logGrants logs the credits each connection was given in the last
// step, and records the totals for the next.
func (r *propRig) logGrants() {
	for _, c := range r.conns {
		if t := c.g.cw.Total(); t != c.logged {
			r.logf("  c%d given %d (total %d, spare %v)", c.id, int32(t-c.logged), t, c.g.spare.Load())
			c.logged = t
		}
	}
}

// randCap is a connection's cap: 1, a few, or up to the SRQ's depth.
func (r *propRig) randCap() int {
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

// walk runs n random steps (fewer when a fuzzer's choices run out).
func (r *propRig) walk(n int) {
	var buf []propAct
	for range n {
		if f, ok := r.ch.(*propFuzzed); ok && len(f.b) == 0 {
			return
		}
		buf = r.enabled(false, buf[:0])
		r.run(r.pick(buf))
	}
}

// propPace says which timers settle lets fire when nothing else can run.
type propPace uint8

const (
	// propPromptly: the SRQ's retry timer (5 ms) alone, whose refill
	// recalls the credits others hold: the design's claim.
	propPromptly propPace = iota
	// propEventually: and, once a second of retries (200) changed
	// nothing, the decay look and the senders' idle timers.
	propEventually
)

// propRetriesPerSecond is how often the retry timer (srqRetry, 5 ms)
// fires in a second, the decay look's and the idle timers' period.
const propRetriesPerSecond = 200

// propPromptRetries bounds the retries in a row, with nothing else to
// run, that propPromptly allows: the first waiter's wait of
// recallAllAfter (20 ms, 4 retries), after which every connection
// holding credits is recalled, and a retry more for the recall to go
// out; the recalls' answers are steps, not retries. (The walks of
// TestGrantsPropProgress pass with a bound of 1 as well: their waiters
// are served by the targeted recalls within a retry.) It was a second's
// worth, 200, before the recall of every holder.
const propPromptRetries = 6

// settle runs the steps that answer recalls, complete sends and WRITEs,
// hand messages over and let the applications take them, in a random
// order, and, whenever nothing else can run, the timers p lets fire,
// until nothing but a timer can run and every chain of a connection
// whose application reads has gone out, and a connection that does not
// read waits only for a chain its own messages leave no room for.
// Nothing is posted meanwhile. It reports how many seconds of slow
// timers that took.
func (r *propRig) settle(limit int, p propPace) (seconds int) {
	r.t.Helper()
	r.logf("settle")
	var buf []propAct
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
		retry := r.s.RetryArmed()
		bound := propRetriesPerSecond
		if p == propPromptly {
			bound = propPromptRetries
		}
		if retry && retries < bound {
			retries++
			r.ran.retries++
			r.logf("retry")
			r.s.FireRetry()
			r.check()
			continue
		}
		if r.noProgress && (p == propPromptly || seconds == 3 || !r.slowArmed()) {
			return seconds // only the safety is checked
		}
		if p == propPromptly {
			r.failf("hold and wait: %s; the SRQ's recalls got nothing moving (%d retries)", why, retries)
		}
		if seconds == 10 {
			r.failf("wedged: %s; 10 s of decay looks and idle timers got nothing moving", why)
		}
		seconds++
		retries = 0
		r.logf("a second passes")
		if r.s.DecayArmed() {
			r.s.FireDecay()
		}
		for _, c := range r.conns {
			if c.ssq.idleArmed && !c.failed {
				r.logf("c%d idle", c.id)
				c.ssq.idleCredits()
			}
		}
		if retry {
			r.s.FireRetry()
		}
		r.s.Clock()
		r.check()
	}
	if r.noProgress {
		return seconds
	}
	r.failf("no rest after %d steps: something keeps going", limit)
	return seconds
}

// quiet runs the steps settle runs until none can run; no timer fires.
func (r *propRig) quiet() {
	r.t.Helper()
	var buf []propAct
	for range 100000 {
		if buf = r.enabled(true, buf[:0]); len(buf) == 0 {
			return
		}
		r.run(r.pick(buf))
	}
	r.failf("no rest after 100000 steps: something keeps going")
}

// slowArmed reports whether the decay look or an idle timer is armed.
func (r *propRig) slowArmed() bool {
	if r.s.DecayArmed() {
		return true
	}
	for _, c := range r.conns {
		if c.ssq.idleArmed && !c.failed {
			return true
		}
	}
	return false
}

// underLoad runs rounds of load: feed posts more, then up to 60 steps
// that settle runs, with the retry timer when nothing else can run. It
// returns the round in which done reports true, and fails the test when
// none of rounds does.
func (r *propRig) underLoad(rounds int, feed func(), done func() bool) int {
	r.t.Helper()
	var buf []propAct
	for round := range rounds {
		if done() {
			return round
		}
		r.logf("round %d", round)
		feed()
		for range 60 {
			if buf = r.enabled(true, buf[:0]); len(buf) > 0 {
				r.run(r.pick(buf))
				continue
			}
			r.steps++
			if !r.s.RetryArmed() {
				break
			}
			r.logf("retry")
			r.s.FireRetry()
			r.check()
		}
	}
	r.failf("not done after %d rounds of load", rounds)
	return rounds
}

// unsettled says why the connections have not settled, or "".
func (r *propRig) unsettled() string {
	for _, c := range r.conns {
		if c.failed || c.ssq.pending.Len() == 0 {
			continue
		}
		if c.reads {
			return fmt.Sprintf("c%d (its application reads) has %d messages waiting", c.id, c.ssq.pendingWRs)
		}
		_, h, tk := c.g.Counts()
		need := NeedCredits(c.ssq.pending.Items()[0].wrs)
		if room := c.cap - int(h+tk); need <= room {
			return fmt.Sprintf("c%d does not read but has room for its first chain of %d (cap %d, %d messages held)",
				c.id, need, c.cap, h)
		}
	}
	return ""
}

// propConn is a connection on the rig's SRQ: the receiving side's grants
// and the send queue that posts their credit WRITEs, and its peer's
// sending side, the real parts, wired as Conn wires them.
type propConn struct {
	r      *propRig
	id     int
	cap    int  // the receive depth (WithQueueDepth): the grants' cap
	reads  bool // its application takes the messages that arrive
	word   bool // the sender has a credit word: grants go by WRITE
	sdepth int  // the sender's send depth

	failed, left bool

	// The receiving side.
	g        Grants
	rsq      SendQueue // posts the credit WRITEs
	rops     OpTable
	rlife    Life
	rmu      sync.Mutex
	recvs    atomic.Uint64
	sHello   Hello          // the sender's hello: its credit word
	msgs     []*pool.Buffer // messages here not taken; under rmu
	rside    propSide       // the receiver's control worker and its frames to the sender
	writes   []propWrite    // credit WRITEs posted, oldest first
	inflight int            // messages sent, not yet handed to the engine
	logged   uint32         // the total given as of the last step's log

	// The sending side, the peer.
	ssq       SendQueue
	sops      OpTable
	slife     Life
	scw       CreditWord // the word the receiver writes
	rHello    Hello      // the receiver's hello: its receive depth
	sent      []uint64   // wr_ids of messages posted, their completions to come
	sside     propSide   // the sender's control worker and its frames to the receiver
	idleFired atomic.Bool
}

// propWrite is a credit WRITE posted: the total it carries (inline, or
// the source word as it was posted: one is in flight at a time).
type propWrite struct {
	id     uint64
	total  uint32
	landed bool
}

// propMR stands for a credit word's registration.
type propMR struct{ verbs.MR }

func newPropConn(r *propRig, id, cap int, reads, word bool, sdepth int) *propConn {
	c := &propConn{r: r, id: id, cap: cap, reads: reads, word: word, sdepth: sdepth}
	c.rside = propSide{c: c, name: "receiver", life: &c.rlife}
	c.sside = propSide{c: c, name: "sender", life: &c.slife}
	c.rlife.Init(nil)
	c.slife.Init(nil)
	c.rHello.RecvDepth = uint32(cap)
	c.rHello.MaxMsg = propMsgSize
	c.scw.buf.Mem = make([]byte, ieng.CellSize)
	if word {
		c.scw.mr = propMR{}
		c.sHello.CreditAddr = 0x10000 * uint64(id+1)
		c.sHello.CreditRKey = 0x100 + uint32(id)
	}
	c.g.cw.buf.Mem = make([]byte, ieng.CellSize)
	c.g.cw.mr = propMR{}
	c.g.Init(cap, &c.rmu, &c.recvs, &c.rlife, &c.rsq, &c.sHello, true, &c.rside)
	c.rsq.Init(4, DefaultLimit(4), &c.rops, &c.rlife, c.g.Word(), &c.sHello, true, &c.rside)
	c.rsq.SetQP(&propQP{c: c, recv: true}, 4*r.ch.intn(2), nil, nil)
	c.ssq.Init(sdepth, DefaultLimit(sdepth), &c.sops, &c.slife, &c.scw, &c.rHello, true, &c.sside)
	c.ssq.SetQP(&propQP{c: c}, 0, nil, nil)
	// The idle timer only records that it fired: a step runs it.
	c.ssq.idleTimer = time.AfterFunc(time.Hour, func() { c.idleFired.Store(true) })
	c.ssq.idleTimer.Stop()
	return c
}

func (c *propConn) String() string {
	o, h, tk := c.g.Counts()
	return fmt.Sprintf("c%d cap %d reads %v word %v failed %v: out %d held %d taken %d total %d spare %v recalled %v wants %v | sender: credits %d seen %d pending %d (%d chains) sent %d asked %v back %d | jobs s%d r%d frames →r%v →s%v writes %v",
		c.id, c.cap, c.reads, c.word, c.failed, o, h, tk, c.g.cw.Total(), c.g.spare.Load(), c.g.recalled.Load(), c.g.peerWants.Load(), c.ssq.credits, c.ssq.creditSeen, c.ssq.pendingWRs,
		c.ssq.pending.Len(), len(c.sent), c.ssq.asked, c.ssq.creditBack.Load(), len(c.sside.jobs), len(c.rside.jobs),
		c.sside.out, c.rside.out, c.writes)
}

// propSide is one side's Owner: its control worker's jobs and the
// frames it wrote, in order, for the other side.
type propSide struct {
	c    *propConn
	name string
	life *Life
	jobs []func()
	out  []propFrame
}

// propFrame is a control frame on its way.
type propFrame struct {
	typ byte
	p   []byte
}

func (f propFrame) String() string {
	switch f.typ {
	case CtrlAsk:
		if len(f.p) == 16 {
			return fmt.Sprintf("ask(want %d seen %d need %d chain %d)", binary.BigEndian.Uint32(f.p), binary.BigEndian.Uint32(f.p[4:]),
				binary.BigEndian.Uint32(f.p[8:]), binary.BigEndian.Uint32(f.p[12:]))
		}
	case CtrlBack:
		if len(f.p) == 4 {
			return fmt.Sprintf("back(%d)", binary.BigEndian.Uint32(f.p))
		}
	case CtrlCredit:
		if len(f.p) == 4 {
			return fmt.Sprintf("credit(total %d)", binary.BigEndian.Uint32(f.p))
		}
	case CtrlRecall:
		return "recall"
	}
	return fmt.Sprintf("frame %d %x", f.typ, f.p)
}

func (o *propSide) Fail(err error) {
	o.c.r.breach("c%d's %s failed: %v", o.c.id, o.name, err)
}

func (o *propSide) CutOff(err error) {
	o.c.r.breach("c%d's %s cut its peer off: %v", o.c.id, o.name, err)
}

func (o *propSide) FailedRecv(wc *verbs.WorkCompletion) error {
	o.c.r.breach("c%d's %s had a receive fail: %v", o.c.id, o.name, wc.Status)
	return errors.New("rig: a receive failed")
}

func (o *propSide) RecvErr(wc *verbs.WorkCompletion) error {
	o.c.r.breach("c%d's %s had a beacon fail: %v", o.c.id, o.name, wc.Status)
	return errors.New("rig: a beacon failed")
}

func (o *propSide) Dispatch() {}

func (o *propSide) ProtocolErr(format string, args ...any) {
	o.c.r.breach("c%d's %s cut its peer off: %s", o.c.id, o.name, fmt.Sprintf(format, args...))
}

func (o *propSide) Later(job func()) {
	if o.c.failed {
		return // the control worker ended
	}
	o.jobs = append(o.jobs, job)
}

func (o *propSide) WriteControl(typ byte, p []byte) error {
	if o.c.failed {
		return errors.New("rig: the control channel ended")
	}
	o.c.r.logf("  c%d's %s writes %v", o.c.id, o.name, propFrame{typ, p})
	if int(typ) < len(o.c.r.ran.frames) {
		o.c.r.ran.frames[typ]++
	}
	o.out = append(o.out, propFrame{typ, append([]byte(nil), p...)})
	return nil
}

func (o *propSide) Finish(op *Op, err error) {
	if op.Signaled || op.Covered || err != nil {
		op.Resolve(err, op.N, 0)
	}
	o.life.OpDone()
}

// propQP is a side's QP: the sender's SENDs go out on the rig's soft
// pair, the receiver's credit WRITEs wait for the steps that land and
// complete them.
type propQP struct {
	verbs.QP // the rest of the interface: not called by the send queue
	c        *propConn
	recv     bool // the receiving side's: credit WRITEs only
}

func (q *propQP) PostSend(wrs []verbs.SendWR) (int, error) {
	c, r := q.c, q.c.r
	if q.recv {
		if len(wrs) != 1 {
			r.breach("c%d's receiver posted a chain of %d", c.id, len(wrs))
			return 0, errors.New("rig: a chain")
		}
		wr := wrs[0]
		switch {
		case wr.Opcode != verbs.OpWrite || wr.RKey != c.sHello.CreditRKey || wr.RemoteAddr != c.sHello.CreditAddr ||
			len(wr.SGL) != 1 || wr.SGL[0].Length != 4 || wr.Flags&verbs.SendSignaled == 0:
			r.breach("c%d's receiver posted %+v, not a signaled WRITE of its credit word", c.id, wr)
		case len(c.writes) > 0:
			r.breach("c%d's receiver posted a credit WRITE with one in flight", c.id)
		}
		t := atomic.LoadUint32(c.g.cw.word(creditWordOut))
		r.logf("  c%d credit WRITE posted (total %d)", c.id, t)
		c.writes = append(c.writes, propWrite{id: wr.ID, total: t})
		r.ran.writes++
		return 1, nil
	}
	for i := range wrs {
		if wrs[i].Opcode != verbs.OpSend {
			r.breach("c%d's sender posted a %v", c.id, wrs[i].Opcode)
		}
		c.sent = append(c.sent, wrs[i].ID)
	}
	r.logf("  c%d sends %d", c.id, len(wrs))
	r.ran.messages += len(wrs)
	r.send(c, len(wrs))
	return len(wrs), nil
}

// propFuture is a message's Future: a healthy connection fails none.
type propFuture struct{ c *propConn }

func (f propFuture) ResolveOp(gen uint32, err error, n int, old uint64) {
	if err != nil && !f.c.failed {
		f.c.r.breach("c%d: a message failed: %v", f.c.id, err)
	}
}

// The receiving side.

// arrived is Conn.onSharedRecv, for a message that took pb.
func (c *propConn) arrived(pb *pool.Buffer) {
	if !c.g.Arrived() {
		pb.Release()
		return
	}
	c.rmu.Lock()
	c.recvs.Add(1)
	c.msgs = append(c.msgs, pb)
	c.rmu.Unlock()
}

// take is the application taking k messages (Conn.refillLocked).
func (c *propConn) take(k int) {
	for range k {
		c.rmu.Lock()
		pb := c.msgs[0]
		c.msgs = c.msgs[1:]
		pb.Release()
		c.g.TookLocked()
		c.rmu.Unlock()
	}
}

// land writes the oldest credit WRITE into the sender's word.
func (c *propConn) land() {
	w := &c.writes[0]
	w.landed = true
	c.r.logf("c%d's credit WRITE lands (total %d)", c.id, w.total)
	if c.word {
		atomic.StoreUint32(c.scw.word(creditWordIn), w.total)
	}
}

// written completes the oldest credit WRITE (Conn.onCreditWritten).
func (c *propConn) written() {
	w := c.writes[0]
	c.writes = c.writes[1:]
	c.r.logf("c%d's credit WRITE completes", c.id)
	if _, ok := c.rops.Take(w.id); !ok {
		c.r.breach("c%d: the credit WRITE %#x is not in the op table", c.id, w.id)
	}
	c.rlife.OpDone()
	c.g.CreditWritten()
}

// runRecvJob runs the receiver's oldest control job.
func (c *propConn) runRecvJob() {
	j := c.rside.jobs[0]
	c.rside.jobs = c.rside.jobs[1:]
	c.r.logf("c%d's receiver runs a job", c.id)
	j()
}

// deliverToRecv hands the oldest frame from the sender to the receiver,
// as Conn.ReadControl does.
func (c *propConn) deliverToRecv() {
	f := c.sside.out[0]
	c.sside.out = c.sside.out[1:]
	c.r.logf("c%d's receiver reads %v", c.id, f)
	switch {
	case f.typ == CtrlAsk && len(f.p) == 16:
		c.g.OnAsk(binary.BigEndian.Uint32(f.p), binary.BigEndian.Uint32(f.p[4:]), binary.BigEndian.Uint32(f.p[8:]),
			binary.BigEndian.Uint32(f.p[12:]))
	case f.typ == CtrlBack && len(f.p) == 4:
		c.g.OnBack(binary.BigEndian.Uint32(f.p))
	default:
		c.r.breach("c%d's sender wrote %v", c.id, f)
	}
}

// The sending side.

// post issues a chain of n messages: one through Submit (Conn.post), more
// as a Batch (SubmitChain).
func (c *propConn) post(n int) {
	f := propFuture{c}
	if n == 1 {
		c.ssq.Submit(&verbs.SendWR{Opcode: verbs.OpSend, Flags: verbs.SendSignaled}, verbs.SGE{},
			&Op{Kind: OpSend, Fut: f, Signaled: true})
		return
	}
	wrs := make([]verbs.SendWR, n)
	ops := make([]Op, n)
	for i := range wrs {
		wrs[i] = verbs.SendWR{Opcode: verbs.OpSend, Flags: verbs.SendSignaled}
		ops[i] = Op{Kind: OpSend, Fut: f, Signaled: true}
	}
	if err := c.ssq.SubmitChain(wrs, ops); err != nil {
		c.r.breach("c%d: a chain of %d refused: %v", c.id, n, err)
	}
}

// sendsDone completes the oldest k messages posted, as the completion
// path does (onSendDone).
func (c *propConn) sendsDone(k int) {
	ids := append([]uint64(nil), c.sent[:k]...)
	c.sent = c.sent[k:]
	for _, id := range ids {
		o, ok := c.sops.Take(id)
		n := c.ssq.TakeCovered(id)
		if ok {
			c.sside.Finish(&o, nil)
		}
		c.ssq.Settle(n)
	}
}

// runSenderJob runs the sender's oldest control job.
func (c *propConn) runSenderJob() {
	j := c.sside.jobs[0]
	c.sside.jobs = c.sside.jobs[1:]
	c.r.logf("c%d's sender runs a job", c.id)
	j()
}

// deliverToSender hands the oldest frame from the receiver to the
// sender, as Conn.ReadControl does.
func (c *propConn) deliverToSender() {
	f := c.rside.out[0]
	c.rside.out = c.rside.out[1:]
	c.r.logf("c%d's sender reads %v", c.id, f)
	switch {
	case f.typ == CtrlCredit && len(f.p) == 4:
		c.ssq.OnCredit(binary.BigEndian.Uint32(f.p))
	case f.typ == CtrlRecall && len(f.p) == 0:
		c.ssq.OnRecall()
	default:
		c.r.breach("c%d's receiver wrote %v", c.id, f)
	}
}

// backInFlight is what the sender gives back and the receiver has not
// taken back yet.
func (c *propConn) backInFlight() int {
	n := int(c.ssq.creditBack.Load())
	for _, f := range c.sside.out {
		if f.typ == CtrlBack && len(f.p) == 4 {
			n += int(binary.BigEndian.Uint32(f.p))
		}
	}
	return n
}

// end fails the connection, both sides (the peer sees its control
// channel end): nothing more is sent or answered, what waited fails,
// and the rig tears it down later.
func (c *propConn) end(err error) {
	c.failed = true
	c.rlife.Fail(err)
	c.slife.Fail(err)
	c.ssq.FailPending()
	c.ssq.ClearSent() // stops the idle timer
	c.sent, c.writes = nil, nil
	c.rside.jobs, c.rside.out = nil, nil
	c.sside.jobs, c.sside.out = nil, nil
}
