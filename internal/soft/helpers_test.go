package soft

import (
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/testchild"
	"github.com/go-rdma/rdma/internal/verbs"
)

func TestMain(m *testing.M) {
	testchild.Main(childRoles())
	goleak.VerifyTestMain(m)
}

// transports runs f once in-process and once over loopback TCP.
func transports(t *testing.T, f func(t *testing.T)) {
	for _, mode := range []string{"inproc", "tcp"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "tcp" {
				t.Setenv(EnvTransport, "tcp")
			} else {
				t.Setenv(EnvTransport, "")
			}
			f(t)
		})
	}
}

// side is one endpoint: a context with a PD, CQs, a QP and one MR.
type side struct {
	t   testing.TB
	ctx verbs.Context
	pd  verbs.PD
	scq verbs.CQ
	rcq verbs.CQ
	qp  verbs.QP
	mr  verbs.MR
	buf []byte
	ch  verbs.CompChannel // of scq, if sideOpt.channel
}

type sideOpt struct {
	typ    verbs.QPType
	caps   verbs.QPCap
	cqe    int
	size   int
	access verbs.Access
	srq    verbs.SRQ
	ctx    verbs.Context
	pd     verbs.PD
	// channel gives the send CQ a completion channel.
	channel bool
}

const allAccess = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic

func defaults(o sideOpt) sideOpt {
	if o.typ == 0 {
		o.typ = verbs.RC
	}
	if o.caps == (verbs.QPCap{}) {
		o.caps = verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 64}
	}
	if o.cqe == 0 {
		o.cqe = 256
	}
	if o.size == 0 {
		o.size = 1 << 16
	}
	if o.access == 0 {
		o.access = allAccess
	}
	return o
}

func newSide(t testing.TB, o sideOpt) *side {
	t.Helper()
	o = defaults(o)
	s := &side{t: t}
	var err error
	s.ctx = o.ctx
	if s.ctx == nil {
		s.ctx, err = Provider.Open(DeviceName)
		must(t, err)
		t.Cleanup(func() { mustClose(t, s.ctx) })
	}
	s.pd = o.pd
	if s.pd == nil {
		s.pd, err = s.ctx.AllocPD()
		must(t, err)
		t.Cleanup(func() { mustClose(t, s.pd) })
	}
	if o.channel {
		s.ch, err = s.ctx.CreateCompChannel()
		must(t, err)
		t.Cleanup(func() { mustClose(t, s.ch) })
	}
	s.scq, err = s.ctx.CreateCQ(o.cqe, s.ch)
	must(t, err)
	t.Cleanup(func() { mustClose(t, s.scq) })
	s.rcq, err = s.ctx.CreateCQ(o.cqe, nil)
	must(t, err)
	t.Cleanup(func() { mustClose(t, s.rcq) })
	s.buf = mapMem(t, o.size)
	s.mr, err = s.pd.RegMR(s.buf, o.access)
	must(t, err)
	t.Cleanup(func() { mustClose(t, s.mr) })
	s.qp, err = s.pd.CreateQP(verbs.QPInit{Type: o.typ, SendCQ: s.scq, RecvCQ: s.rcq, SRQ: o.srq, Cap: o.caps})
	must(t, err)
	t.Cleanup(func() { mustClose(t, s.qp) })
	return s
}

func mapMem(t testing.TB, n int) []byte {
	t.Helper()
	b, err := mem.Map(n)
	must(t, err)
	t.Cleanup(func() { mem.Unmap(b) })
	return b
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func mustClose(t testing.TB, c interface{ Close() error }) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Errorf("close %T: %v", c, err)
	}
}

// addr is the address peers use to reach s's device.
func (s *side) addr() verbs.Address {
	p := s.ctx.Info().Ports[0]
	g, err := verbs.SelectGID(p, true)
	must(s.t, err)
	return verbs.Address{Port: 1, LID: p.LID, GID: g.GID, SGIDIndex: uint8(g.Index), HopLimit: 64}
}

type connOpt struct {
	rnrRetry, minRNR, timeout, retry uint8
	access                           verbs.Access
	psnA, psnB                       uint32
}

// connect brings a and b to RTS, each pointed at the other.
func connect(t testing.TB, a, b *side, o connOpt) {
	t.Helper()
	if o.access == 0 {
		o.access = verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	}
	if o.timeout == 0 {
		o.timeout = 14
		o.retry = 7
	}
	up := func(x, y *side, sq, rq uint32) {
		must(t, x.qp.ToInit(verbs.InitAttr{Port: 1, Access: o.access, QKey: 0x1111}))
		if x.qp.Type() == verbs.UD {
			must(t, x.qp.ToRTR(verbs.RTRAttr{}))
			must(t, x.qp.ToRTS(verbs.RTSAttr{SQPSN: sq}))
			return
		}
		must(t, x.qp.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU4096, DestQPN: y.qp.QPN(), RQPSN: rq, Dest: y.addr(), MaxDestRdAtomic: 16, MinRNRTimer: o.minRNR}))
		must(t, x.qp.ToRTS(verbs.RTSAttr{SQPSN: sq, Timeout: o.timeout, RetryCount: o.retry, RNRRetry: o.rnrRetry, MaxRdAtomic: 16}))
	}
	up(a, b, o.psnA, o.psnB)
	if b != a {
		up(b, a, o.psnB, o.psnA)
	}
}

func pair(t testing.TB, typ verbs.QPType, co connOpt) (*side, *side) {
	a := newSide(t, sideOpt{typ: typ})
	b := newSide(t, sideOpt{typ: typ})
	connect(t, a, b, co)
	return a, b
}

func (s *side) sge(off, n int) verbs.SGE {
	return verbs.SGE{Addr: s.mr.Addr() + uint64(off), Length: uint32(n), LKey: s.mr.LKey()}
}

func (s *side) postRecv(id uint64, sges ...verbs.SGE) {
	s.t.Helper()
	_, err := s.qp.PostRecv([]verbs.RecvWR{{ID: id, SGL: sges}})
	must(s.t, err)
}

func (s *side) post(wrs ...verbs.SendWR) {
	s.t.Helper()
	_, err := s.qp.PostSend(wrs)
	must(s.t, err)
}

// poll waits (bounded) for exactly n completions on cq.
func poll(t testing.TB, cq verbs.CQ, n int) []verbs.WorkCompletion {
	t.Helper()
	out := make([]verbs.WorkCompletion, 0, n)
	wc := make([]verbs.WorkCompletion, 16)
	deadline := time.Now().Add(10 * time.Second)
	idle := 0
	for len(out) < n {
		k, err := cq.Poll(wc[:min(len(wc), n-len(out))])
		must(t, err)
		out = append(out, wc[:k]...)
		if k != 0 {
			idle = 0
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d of %d completions after 10s: %+v", len(out), n, out)
		}
		backoff(&idle)
	}
	return out
}

// backoff yields, then parks for growing moments: a poller that only
// yields keeps the Go scheduler from polling the network, which delays
// the TCP transport's goroutines by up to 10 ms a wake-up.
func backoff(idle *int) {
	*idle++
	if *idle < 50 {
		runtime.Gosched()
		return
	}
	time.Sleep(time.Duration(min(*idle-49, 100)) * 10 * time.Microsecond)
}

// pollOK waits for one successful completion.
func pollOK(t testing.TB, cq verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	wc := poll(t, cq, 1)[0]
	if wc.Status != verbs.WCSuccess {
		t.Fatalf("completion %+v: %v", wc, wc.Err())
	}
	return wc
}

// empty checks that cq holds nothing more, after letting the workers run.
func empty(t testing.TB, cq verbs.CQ) {
	t.Helper()
	var wc [4]verbs.WorkCompletion
	n, err := cq.Poll(wc[:])
	must(t, err)
	if n != 0 {
		t.Fatalf("unexpected completions: %+v", wc[:n])
	}
}

func waitState(t testing.TB, qp verbs.QP, want verbs.QPState) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	idle := 0
	for {
		st, err := qp.State()
		must(t, err)
		if st == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("QP %#x in %v, want %v", qp.QPN(), st, want)
		}
		backoff(&idle)
	}
}
