package conformance

import (
	"context"
	"fmt"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/verbs"
)

const ruleSRQLimit = "SRQ.SetLimit(k) arms a one-shot low watermark: taking receives while k or more stay posted raises no event; the " +
	"receive that leaves fewer than k raises exactly one EventSRQLimitReached on the context's AsyncEvent, whose SRQ is that SRQ; later " +
	"receives raise none until SetLimit arms it again, and then it fires again; a second SetLimit replaces the first, SetLimit(0) " +
	"disarms, and SetLimit(k) with k < 0 or k >= MaxWR() fails with ErrInvalid"

// srqLine is an RC QP on A sending to an RC QP on B that takes its
// receives from srq, with CQs of its own so its completions are counted
// apart from everything else.
type srqLine struct {
	e        *Env
	name     string
	srq      verbs.SRQ
	qa, qb   verbs.QP
	cqA, cqB verbs.CQ
	src, dst verbs.MR
	posted   int // receives on the SRQ, as this line counts them
	nextID   uint64
}

const srqLineSlot = 64

func newSRQLine(e *Env, name string, maxWR int) *srqLine {
	e.Helper()
	srq, err := e.B.PD.CreateSRQ(verbs.SRQInit{MaxWR: maxWR, MaxSGE: 1})
	require.NoError(e, err, "%s: CreateSRQ(MaxWR %d)", name, maxWR)
	e.CloseLater("SRQ "+name, srq)
	require.GreaterOrEqual(e, srq.MaxWR(), maxWR, "%s: granted MaxWR", name)
	l := &srqLine{e: e, name: name, srq: srq, cqA: e.NewCQ(e.A, 64, nil), cqB: e.NewCQ(e.B, 64, nil)}
	l.qa, l.qb = e.PairWith(QPConf{SendCQ: l.cqA, RecvCQ: l.cqA}, QPConf{SendCQ: l.cqB, RecvCQ: l.cqB, SRQ: srq}, ConnConf{}, ConnConf{})
	l.src = e.MapReg(e.A, srqLineSlot, verbs.AccessLocalWrite, 0)
	l.dst = e.MapReg(e.B, srqLineSlot, verbs.AccessLocalWrite, 0)
	return l
}

// post puts n receives on the SRQ.
func (l *srqLine) post(n int) {
	l.e.Helper()
	wrs := make([]verbs.RecvWR, n)
	for i := range wrs {
		wrs[i] = Recv(l.nextID, SGE(l.dst, 0, srqLineSlot))
		l.nextID++
	}
	k, err := l.srq.PostRecv(wrs)
	require.NoError(l.e, err, "%s: SRQ.PostRecv of %d", l.name, n)
	require.Equal(l.e, n, k, "%s: SRQ.PostRecv of %d", l.name, n)
	l.posted += n
}

// consume sends n SENDs, each taking one receive from the SRQ, and waits
// for their receive completions.
func (l *srqLine) consume(n int) {
	l.e.Helper()
	require.LessOrEqual(l.e, n, l.posted, "%s: the case would make the sender wait for RNR", l.name)
	wrs := make([]verbs.SendWR, n)
	for i := range wrs {
		wrs[i] = verbs.SendWR{ID: uint64(i), Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(l.src, 0, 8)}}
	}
	l.e.PostSend(l.qa, wrs...)
	for i, wc := range l.e.WaitN(l.cqA, n, l.name+": sends") {
		l.e.CheckOK(wc, uint64(i), verbs.WCSend, l.name+": send")
	}
	for _, wc := range l.e.WaitN(l.cqB, n, l.name+": SRQ receives") {
		if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.QPN != l.qb.QPN() || wc.WRID >= l.nextID {
			l.e.Errorf("%s: SRQ receive %s; want a SUCCESS RECV on QP %#x of a posted wr_id", l.name, FmtWC(wc), l.qb.QPN())
		}
	}
	l.posted -= n
}

// readUntil reads side B's async events until one satisfies stop, within
// Timeout, and returns how many limit events named srq before it.
func (e *Env) readUntil(srq verbs.SRQ, stop func(verbs.AsyncEvent) bool, what string) int {
	e.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	n := 0
	for {
		ev, err := e.B.Ctx.AsyncEvent(ctx)
		require.NoError(e, err, "%s: AsyncEvent (%d limit events of the SRQ seen so far)", what, n)
		if stop(ev) {
			return n
		}
		if ev.Type == verbs.EventSRQLimitReached && ev.SRQ == srq {
			n++
		}
	}
}

func isLimitOf(srq verbs.SRQ) func(verbs.AsyncEvent) bool {
	return func(ev verbs.AsyncEvent) bool { return ev.Type == verbs.EventSRQLimitReached && ev.SRQ == srq }
}

func caseSRQLimit(e *Env) {
	e.Need(verbs.FeatureSRQ)
	l := newSRQLine(e, "watched", 16)
	// The marker line proves an event did not happen. Its limit event is
	// raised after everything the watched line did, and one context
	// reads its events in the order they were raised (rxe queues an
	// SRQ's event before it completes the receive that raised it, and so
	// does soft), so a watched event that was raised is read before the
	// marker's. No wait is needed to show absence.
	m := newSRQLine(e, "marker", 4)
	m.post(1)
	quiet := func(what string) {
		e.Helper()
		m.post(1) // 2 posted
		require.NoError(e, m.srq.SetLimit(2), "marker: SetLimit(2)")
		m.consume(1) // 1 posted: below 2
		n := e.readUntil(l.srq, isLimitOf(m.srq), what)
		assert.Zero(e, n, "%s: EventSRQLimitReached of the watched SRQ raised", what)
	}
	// fires waits for the watched SRQ's event; the quiet check after it
	// shows it came only once.
	fires := func(what string) {
		e.Helper()
		e.readUntil(l.srq, isLimitOf(l.srq), what)
	}

	maxWR := l.srq.MaxWR()
	for _, k := range []int{-1, maxWR, maxWR + 1} {
		assert.ErrorIs(e, l.srq.SetLimit(k), verbs.ErrInvalid, "SetLimit(%d) with MaxWR() %d", k, maxWR)
	}
	require.NoError(e, l.srq.SetLimit(0), "SetLimit(0) on an unarmed SRQ")

	l.post(8)
	require.NoError(e, l.srq.SetLimit(4))
	l.consume(4)
	quiet("limit 4, receives taken from 8 down to 4 posted")
	l.consume(1)
	fires("limit 4, the receive that left 3 posted")
	l.consume(2)
	quiet("after the one-shot fired, receives taken from 3 down to 1 posted")

	l.post(7) // 8
	require.NoError(e, l.srq.SetLimit(6))
	l.consume(2)
	quiet("re-armed at 6, receives taken from 8 down to 6 posted")
	l.consume(1)
	fires("re-armed at 6, the receive that left 5 posted")
	l.consume(1)
	quiet("after the re-armed one-shot fired, 5 down to 4 posted")

	l.post(4) // 8
	require.NoError(e, l.srq.SetLimit(6))
	require.NoError(e, l.srq.SetLimit(0))
	l.consume(3)
	quiet("armed at 6 then disarmed with SetLimit(0), 8 down to 5 posted")

	l.post(3) // 8
	require.NoError(e, l.srq.SetLimit(7))
	require.NoError(e, l.srq.SetLimit(2))
	l.consume(2)
	quiet("armed at 7 then at 2, 8 down to 6 posted")
	l.consume(5)
	fires("armed at 7 then at 2, the receive that left 1 posted")
	quiet(fmt.Sprintf("after the last one-shot fired (%d posted)", l.posted))
}
