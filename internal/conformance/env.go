package conformance

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Side is one end of a connection: an open device context with a PD and a
// default CQ, and the port-1 addressing the peer needs.
type Side struct {
	Name string
	Ctx  verbs.Context
	PD   verbs.PD
	CQ   verbs.CQ // default send and receive CQ of QPs made on this side
	Attr verbs.DeviceAttr
	Port verbs.PortInfo
	LID  uint16
	GID  verbs.GIDEntry
}

// Env is the per-case environment: sides A and B (which may share one
// device context) and the testing.T of the running (sub)test.
type Env struct {
	*testing.T
	Target Target
	A, B   *Side
	MTU    verbs.MTU // path MTU: the smaller active MTU of the two ports
}

// defaultCQE is the size of each side's default CQ; cases never have more
// completions outstanding on it.
const defaultCQE = 256

func newEnv(t *testing.T, tg Target) *Env {
	e := &Env{T: t, Target: tg}
	e.A = e.openSide("A", tg.DeviceA, nil)
	if tg.DeviceB == tg.DeviceA {
		e.B = e.openSide("B", tg.DeviceB, e.A.Ctx)
	} else {
		e.B = e.openSide("B", tg.DeviceB, nil)
	}
	e.MTU = min(e.A.activeMTU(e), e.B.activeMTU(e))
	return e
}

// Sub runs fn as a subtest with its own cleanups, on the same sides.
func (e *Env) Sub(name string, fn func(e *Env)) bool {
	return e.T.Run(name, func(t *testing.T) {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("panic: %v", r)
			}
		}()
		sub := *e
		sub.T = t
		fn(&sub)
	})
}

// CloseLater closes c when the current (sub)test ends and reports a
// non-nil error. Cleanups run last-registered first, so registering at
// creation closes children before parents.
func (e *Env) CloseLater(what string, c interface{ Close() error }) {
	t := e.T
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close %s: %v", what, err)
		}
	})
}

func (e *Env) openSide(name, dev string, shared verbs.Context) *Side {
	e.Helper()
	s := &Side{Name: name, Ctx: shared}
	if s.Ctx == nil {
		ctx, err := e.Target.Provider.Open(dev)
		if err != nil {
			e.Fatalf("side %s: open device %q: %v", name, dev, err)
		}
		s.Ctx = ctx
		e.CloseLater("context "+dev, ctx)
	}
	attr, err := s.Ctx.QueryDevice()
	if err != nil {
		e.Fatalf("side %s: QueryDevice: %v", name, err)
	}
	s.Attr = attr
	info := s.Ctx.Info()
	found := false
	for _, p := range info.Ports {
		if p.Port == 1 {
			s.Port, found = p, true
			break
		}
	}
	if !found {
		e.Fatalf("side %s: device %q: Info().Ports has no port 1 (ports: %+v)", name, dev, info.Ports)
	}
	s.LID = s.Port.LID
	if s.LID == 0 {
		// The soft provider encodes its TCP port in the LID; if the
		// listing has none, ask the port.
		if pa, err := s.Ctx.QueryPort(1); err == nil {
			s.LID = pa.LID
		}
	}
	g, err := verbs.SelectGID(s.Port, true)
	if err != nil && verbs.Lacks(info, attr, verbs.FeatureManualConnect) != nil && len(s.Port.GIDs) > 0 {
		// iWARP: the GID holds the MAC address, not an IP; rdma_cm
		// addresses the connection, the GID is never used.
		g, err = s.Port.GIDs[0], nil
	}
	if err != nil {
		g6, err6 := verbs.SelectGID(s.Port, false)
		if err6 != nil {
			e.Fatalf("side %s: device %q port 1: no usable GID: %v; %v (GIDs %+v)", name, dev, err, err6, s.Port.GIDs)
		}
		g = g6
	}
	s.GID = g
	pd, err := s.Ctx.AllocPD()
	if err != nil {
		e.Fatalf("side %s: AllocPD: %v", name, err)
	}
	s.PD = pd
	e.CloseLater("PD "+name, pd)
	s.CQ = e.NewCQ(s, defaultCQE, nil)
	return s
}

func (s *Side) activeMTU(e *Env) verbs.MTU {
	m := s.Port.ActiveMTU
	if m == 0 {
		if pa, err := s.Ctx.QueryPort(1); err == nil {
			m = pa.ActiveMTU
		}
	}
	if m == 0 {
		e.Logf("side %s: active MTU unknown, using 1024", s.Name)
		m = verbs.MTU1024
	}
	return m
}

// Addr is the address side local uses to reach side peer: the peer's LID
// (the soft provider's endpoint lives there) and GID, through the local GID
// index.
func Addr(local, peer *Side) verbs.Address {
	return verbs.Address{Port: 1, LID: peer.LID, GID: peer.GID.GID, SGIDIndex: uint8(local.GID.Index), HopLimit: 64}
}

// NewCQ makes a CQ of at least n entries on s, closed at the end of the
// test; it checks the granted size.
func (e *Env) NewCQ(s *Side, n int, ch verbs.CompChannel) verbs.CQ {
	e.Helper()
	cq, err := s.Ctx.CreateCQ(n, ch)
	if err != nil {
		e.Fatalf("side %s: CreateCQ(%d): %v", s.Name, n, err)
	}
	e.CloseLater("CQ "+s.Name, cq)
	if cq.Len() < n {
		e.Errorf("side %s: CreateCQ(%d) granted Len() = %d, less than requested", s.Name, n, cq.Len())
	}
	return cq
}

// NewChannel makes a completion channel on s.
func (e *Env) NewChannel(s *Side) verbs.CompChannel {
	e.Helper()
	ch, err := s.Ctx.CreateCompChannel()
	if err != nil {
		e.Fatalf("side %s: CreateCompChannel: %v", s.Name, err)
	}
	e.CloseLater("comp channel "+s.Name, ch)
	return ch
}

// Map maps n bytes off the Go heap, unmapped at the end of the test.
func (e *Env) Map(n int) []byte {
	e.Helper()
	b, err := mem.Map(n)
	if err != nil {
		e.Fatalf("mem.Map(%d): %v", n, err)
	}
	t := e.T
	t.Cleanup(func() {
		if err := mem.Unmap(b); err != nil {
			t.Errorf("mem.Unmap: %v", err)
		}
	})
	return b
}

// Reg registers buf (from Map) on s's PD; closed at the end of the test.
func (e *Env) Reg(s *Side, buf []byte, acc verbs.Access) verbs.MR {
	e.Helper()
	mr, err := s.PD.RegMR(buf, acc)
	if err != nil {
		e.Fatalf("side %s: RegMR(%d bytes, %v): %v", s.Name, len(buf), acc, err)
	}
	e.CloseLater("MR "+s.Name, mr)
	if mr.Len() != len(buf) {
		e.Errorf("side %s: MR.Len() = %d, registered %d bytes", s.Name, mr.Len(), len(buf))
	}
	return mr
}

// MapReg maps n bytes, fills them with fill and registers them.
func (e *Env) MapReg(s *Side, n int, acc verbs.Access, fill byte) verbs.MR {
	e.Helper()
	b := e.Map(n)
	for i := range b {
		b[i] = fill
	}
	return e.Reg(s, b, acc)
}

// AccessAll is every access right: what the responder sides of most cases
// register with.
const AccessAll = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic

// SGE names n bytes at offset off of mr.
func SGE(mr verbs.MR, off, n int) verbs.SGE {
	return verbs.SGE{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.LKey()}
}

// QPConf are the creation attributes the helpers use; zero fields take
// defaults.
type QPConf struct {
	Type      verbs.QPType // RC
	Cap       verbs.QPCap  // 32/32 WRs, 4/4 SGEs
	SendCQ    verbs.CQ     // the side's CQ
	RecvCQ    verbs.CQ     // the side's CQ
	SRQ       verbs.SRQ
	SignalAll bool
}

// ConnConf are the connection attributes; zero fields take defaults.
type ConnConf struct {
	Access      verbs.Access // granted to the peer at INIT; all remote rights
	MinRNRTimer uint8        // 12 (0.64 ms)
	RNRRetry    uint8        // 7 (for ever)
	RetryCount  uint8        // 7
	Timeout     uint8        // 16 (268 ms)
	QKey        uint32       // UD; 0x11111111
	// SetRNRRetry and SetMinRNR make a zero RNRRetry/MinRNRTimer
	// meaningful.
	SetRNRRetry, SetMinRNR bool
}

func (q QPConf) withDefaults(s *Side) QPConf {
	if q.Type == 0 {
		q.Type = verbs.RC
	}
	if q.Cap == (verbs.QPCap{}) {
		q.Cap = verbs.QPCap{MaxSendWR: 32, MaxRecvWR: 32, MaxSendSGE: 4, MaxRecvSGE: 4}
	}
	if q.SRQ != nil {
		q.Cap.MaxRecvWR, q.Cap.MaxRecvSGE = 0, 0
	}
	if q.SendCQ == nil {
		q.SendCQ = s.CQ
	}
	if q.RecvCQ == nil {
		q.RecvCQ = s.CQ
	}
	return q
}

func (c ConnConf) withDefaults() ConnConf {
	if c.Access == 0 {
		c.Access = AccessAll
	}
	if c.MinRNRTimer == 0 && !c.SetMinRNR {
		c.MinRNRTimer = 12
	}
	if c.RNRRetry == 0 && !c.SetRNRRetry {
		c.RNRRetry = 7
	}
	if c.RetryCount == 0 {
		c.RetryCount = 7
	}
	if c.Timeout == 0 {
		c.Timeout = 16
	}
	if c.QKey == 0 {
		c.QKey = 0x11111111
	}
	return c
}

// TryCreateQP creates a QP on s and checks its granted caps against the
// request; the QP is closed at the end of the test.
func (e *Env) TryCreateQP(s *Side, q QPConf) (verbs.QP, error) {
	e.Helper()
	q = q.withDefaults(s)
	qp, err := s.PD.CreateQP(verbs.QPInit{Type: q.Type, SendCQ: q.SendCQ, RecvCQ: q.RecvCQ, SRQ: q.SRQ, Cap: q.Cap, SignalAll: q.SignalAll})
	if err != nil {
		return nil, err
	}
	e.CloseLater(fmt.Sprintf("%v QP %s %#x", q.Type, s.Name, qp.QPN()), qp)
	checkCaps(e, s.Name, q.Cap, qp.Cap(), q.SRQ != nil)
	if qp.Type() != q.Type {
		e.Errorf("side %s: QP.Type() = %v, created %v", s.Name, qp.Type(), q.Type)
	}
	if st, err := qp.State(); err != nil || st != verbs.StateReset {
		e.Errorf("side %s: new QP State() = %v, %v; want RESET, nil", s.Name, st, err)
	}
	return qp, nil
}

// CreateQP is TryCreateQP that fails the test on error.
func (e *Env) CreateQP(s *Side, q QPConf) verbs.QP {
	e.Helper()
	qp, err := e.TryCreateQP(s, q)
	if err != nil {
		e.Fatalf("side %s: CreateQP(%+v): %v", s.Name, q.Cap, err)
	}
	return qp
}

func checkCaps(e *Env, side string, req, got verbs.QPCap, srq bool) {
	e.Helper()
	bad := got.MaxSendWR < req.MaxSendWR || got.MaxSendSGE < req.MaxSendSGE || got.MaxInlineData < req.MaxInlineData
	if !srq {
		bad = bad || got.MaxRecvWR < req.MaxRecvWR || got.MaxRecvSGE < req.MaxRecvSGE
	}
	if bad {
		// Fatal: the case would post past what the QP can hold.
		e.Fatalf("side %s: QP.Cap() = %+v is below the request %+v", side, got, req)
	}
}

// PSNs of the two ends of every connection the helpers make.
const (
	psnA = 0x00a11ce
	psnB = 0x0b0b000
)

func rdAtom(n int) uint8 {
	if n <= 0 {
		return 1
	}
	return uint8(min(n, 16))
}

// ToInit moves qp (on s) to INIT.
func (e *Env) ToInit(qp verbs.QP, s *Side, c ConnConf) {
	e.Helper()
	c = c.withDefaults()
	a := verbs.InitAttr{Port: 1, Access: c.Access}
	if qp.Type() == verbs.UD {
		a.Access = 0
		a.QKey = c.QKey
	}
	if qp.Type() == verbs.UC {
		a.Access &^= verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	}
	if err := qp.ToInit(a); err != nil {
		e.Fatalf("side %s: %v QP %#x: RESET->INIT: %v", s.Name, qp.Type(), qp.QPN(), err)
	}
}

// ToRTR moves qp (on s) to RTR, towards peerQPN on side peer.
func (e *Env) ToRTR(qp verbs.QP, s, peer *Side, peerQPN, peerPSN uint32, c ConnConf) {
	e.Helper()
	c = c.withDefaults()
	var a verbs.RTRAttr
	if qp.Type() != verbs.UD {
		a = verbs.RTRAttr{PathMTU: e.MTU, DestQPN: peerQPN, RQPSN: peerPSN, Dest: Addr(s, peer), MinRNRTimer: c.MinRNRTimer}
		if qp.Type() == verbs.RC {
			a.MaxDestRdAtomic = rdAtom(s.Attr.MaxQPRdAtom)
		}
	}
	if err := qp.ToRTR(a); err != nil {
		e.Fatalf("side %s: %v QP %#x: INIT->RTR: %v", s.Name, qp.Type(), qp.QPN(), err)
	}
}

// ToRTS moves qp (on s) to RTS.
func (e *Env) ToRTS(qp verbs.QP, s *Side, psn uint32, c ConnConf) {
	e.Helper()
	c = c.withDefaults()
	a := verbs.RTSAttr{SQPSN: psn}
	if qp.Type() == verbs.RC {
		a.Timeout, a.RetryCount, a.RNRRetry = c.Timeout, c.RetryCount, c.RNRRetry
		a.MaxRdAtomic = rdAtom(s.Attr.MaxQPInitRdAtom)
	}
	if err := qp.ToRTS(a); err != nil {
		e.Fatalf("side %s: %v QP %#x: RTR->RTS: %v", s.Name, qp.Type(), qp.QPN(), err)
	}
}

// Lacks is why side A's or side B's device lacks f (an error wrapping
// verbs.ErrNotSupported), or nil when both have it.
func (e *Env) Lacks(f verbs.Feature) error {
	for _, s := range []*Side{e.A, e.B} {
		if err := verbs.Lacks(s.Ctx.Info(), s.Attr, f); err != nil {
			return err
		}
	}
	return nil
}

// Need skips the (sub)test when a side's device lacks f, naming the
// feature: the only reason a case may skip on a kernel device. The
// features are the table in docs/providers.md.
func (e *Env) Need(f verbs.Feature) {
	e.Helper()
	if err := e.Lacks(f); err != nil {
		e.Skipf("feature %q: %v", f, err)
	}
}

// Connect brings qa (on A) and qb (on B) to RTS towards each other: each
// side RESET->INIT->RTR->RTS. ca and cb are the attributes of each side's
// own QP (the RNR timer a side's RTR sets is what that side NAKs with; the
// RNR retry count a side's RTS sets is how often that side resends).
// Where a device cannot be connected by hand (iWARP), rdma_cm connects
// them (Target.CMConnect) with its own attributes, and ca and cb are
// not used.
func (e *Env) Connect(qa, qb verbs.QP, ca, cb ConnConf) {
	e.Helper()
	if err := e.Lacks(verbs.FeatureManualConnect); err != nil {
		e.cmConnect(qa, qb, err)
		return
	}
	e.ToInit(qa, e.A, ca)
	e.ToInit(qb, e.B, cb)
	e.ToRTR(qa, e.A, e.B, qb.QPN(), psnB, ca)
	e.ToRTR(qb, e.B, e.A, qa.QPN(), psnA, cb)
	e.ToRTS(qa, e.A, psnA, ca)
	e.ToRTS(qb, e.B, psnB, cb)
	for _, q := range []verbs.QP{qa, qb} {
		if st, err := q.State(); err != nil || st != verbs.StateRTS {
			e.Fatalf("QP %#x after ToRTS: State() = %v, %v; want RTS", q.QPN(), st, err)
		}
	}
}

func (e *Env) cmConnect(qa, qb verbs.QP, why error) {
	e.Helper()
	if e.Target.CMConnect == nil {
		e.Fatalf("%v, and the target has no CMConnect", why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	c, err := e.Target.CMConnect(ctx, qa, qb)
	if err != nil {
		e.Fatalf("rdma_cm connect of QP %#x (%s) and QP %#x (%s): %v", qa.QPN(), e.Target.DeviceA, qb.QPN(), e.Target.DeviceB, err)
	}
	e.CloseLater("rdma_cm connection", c)
	for _, q := range []verbs.QP{qa, qb} {
		if st, err := q.State(); err != nil || st != verbs.StateRTS {
			e.Fatalf("QP %#x after rdma_cm connect: State() = %v, %v; want RTS", q.QPN(), st, err)
		}
	}
}

// Pair creates a QP on each side with the same attributes and connects
// them with default connection attributes.
func (e *Env) Pair(q QPConf) (qa, qb verbs.QP) {
	e.Helper()
	return e.PairWith(q, q, ConnConf{}, ConnConf{})
}

// PairWith creates and connects a QP on each side with their own
// attributes. CQs in qa must belong to side A and in qb to side B.
func (e *Env) PairWith(qca, qcb QPConf, ca, cb ConnConf) (qa, qb verbs.QP) {
	e.Helper()
	qa = e.CreateQP(e.A, qca)
	qb = e.CreateQP(e.B, qcb)
	e.Connect(qa, qb, ca, cb)
	return qa, qb
}

// PostSend posts wrs and fails the test unless all were accepted.
func (e *Env) PostSend(qp verbs.QP, wrs ...verbs.SendWR) {
	e.Helper()
	n, err := qp.PostSend(wrs)
	if err != nil || n != len(wrs) {
		e.Fatalf("QP %#x: PostSend of %d WRs (%s): n=%d, err=%v", qp.QPN(), len(wrs), wrs[0].Opcode, n, err)
	}
}

// PostRecv posts wrs to qp and fails the test unless all were accepted.
func (e *Env) PostRecv(qp verbs.QP, wrs ...verbs.RecvWR) {
	e.Helper()
	n, err := qp.PostRecv(wrs)
	if err != nil || n != len(wrs) {
		e.Fatalf("QP %#x: PostRecv of %d WRs: n=%d, err=%v", qp.QPN(), len(wrs), n, err)
	}
}

// Recv is a receive WR of one or more SGEs.
func Recv(id uint64, sgl ...verbs.SGE) verbs.RecvWR { return verbs.RecvWR{ID: id, SGL: sgl} }

// PollN polls cq until it has exactly n completions or the deadline
// passes. It never takes more than n from the CQ, so later ones stay for
// the next check. Empty polls back off with Gosched and short sleeps; that
// is polling, not synchronisation: the completion itself ends the wait.
func PollN(cq verbs.CQ, n int, deadline time.Time) ([]verbs.WorkCompletion, error) {
	out := make([]verbs.WorkCompletion, 0, n)
	buf := make([]verbs.WorkCompletion, 32)
	empty := 0
	for len(out) < n {
		k, err := cq.Poll(buf[:min(len(buf), n-len(out))])
		if err != nil {
			return out, fmt.Errorf("CQ.Poll: %w", err)
		}
		if k < 0 || k > min(len(buf), n-len(out)) {
			return out, fmt.Errorf("CQ.Poll returned %d for a slice of %d", k, min(len(buf), n-len(out)))
		}
		out = append(out, buf[:k]...)
		if k > 0 {
			empty = 0
			continue
		}
		if time.Now().After(deadline) {
			return out, fmt.Errorf("timed out: %d of %d completions arrived (got %s)", len(out), n, FmtWCs(out))
		}
		empty++
		if empty < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(100 * time.Microsecond)
		}
	}
	return out, nil
}

// WaitN waits up to Timeout for exactly n completions on cq.
func (e *Env) WaitN(cq verbs.CQ, n int, what string) []verbs.WorkCompletion {
	e.Helper()
	wcs, err := PollN(cq, n, time.Now().Add(Timeout))
	if err != nil {
		e.Fatalf("%s: waiting for %d completions: %v", what, n, err)
	}
	return wcs
}

// Wait1 waits for one completion.
func (e *Env) Wait1(cq verbs.CQ, what string) verbs.WorkCompletion {
	e.Helper()
	return e.WaitN(cq, 1, what)[0]
}

// Placed returns once the WRITEs qp (on side A) has completed are in
// rem's memory at the peer. On InfiniBand and RoCE a WRITE completes when
// the responder has acknowledged it, so that is already so; iWARP does not
// acknowledge WRITEs (a WRITE completes once sent, see
// verbs.FeatureRemoteWriteError), and there a 1-byte READ from rem, which
// the responder answers only after placing the WRITEs before it on the
// stream, shows it. cq is qp's send CQ; rem must allow remote reads.
func (e *Env) Placed(qp verbs.QP, cq verbs.CQ, rem verbs.MR) {
	e.Helper()
	if e.Lacks(verbs.FeatureRemoteWriteError) == nil {
		return
	}
	sink := e.MapReg(e.A, 64, verbs.AccessLocalWrite, 0)
	const id = 0x91ace0
	e.PostSend(qp, verbs.SendWR{ID: id, Opcode: verbs.OpRead, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{SGE(sink, 0, 1)}, RemoteAddr: rem.Addr(), RKey: rem.RKey()})
	e.CheckOK(e.Wait1(cq, "the READ that shows earlier WRITEs placed"), id, verbs.WCRead, "READ after WRITEs")
}

// ExpectEmpty polls cq once and reports anything it holds. Cases call it
// after a completion that, by queue order, comes after everything that
// might wrongly be there.
func (e *Env) ExpectEmpty(cq verbs.CQ, what string) {
	e.Helper()
	buf := make([]verbs.WorkCompletion, 16)
	k, err := cq.Poll(buf)
	if err != nil {
		e.Errorf("%s: Poll: %v", what, err)
		return
	}
	if k != 0 {
		e.Errorf("%s: expected no more completions, got %d: %s", what, k, FmtWCs(buf[:k]))
	}
}

// CheckOK reports wc unless it is a successful completion of wrid with
// opcode op.
func (e *Env) CheckOK(wc verbs.WorkCompletion, wrid uint64, op verbs.WCOpcode, what string) bool {
	e.Helper()
	if wc.Status != verbs.WCSuccess || wc.WRID != wrid || wc.Opcode != op {
		e.Errorf("%s: got %s; want wr_id %d status SUCCESS opcode %s", what, FmtWC(wc), wrid, op)
		return false
	}
	if wc.Err() != nil {
		e.Errorf("%s: successful completion has Err() = %v", what, wc.Err())
	}
	return true
}

// WaitState waits up to Timeout for qp to reach want.
func (e *Env) WaitState(qp verbs.QP, want verbs.QPState) {
	e.Helper()
	deadline := time.Now().Add(Timeout)
	for {
		st, err := qp.State()
		if err != nil {
			e.Fatalf("QP %#x: State(): %v", qp.QPN(), err)
		}
		if st == want {
			return
		}
		if time.Now().After(deadline) {
			e.Fatalf("QP %#x: state is %v after %v; want %v", qp.QPN(), st, Timeout, want)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// NoPanic runs fn and turns a panic into an error.
func NoPanic(fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	fn()
	return nil
}

// FmtWC formats a completion for messages.
func FmtWC(wc verbs.WorkCompletion) string {
	return fmt.Sprintf("{wr_id=%d status=%s opcode=%s byte_len=%d qpn=%#x src_qp=%#x flags=%#x imm=%#x vendor_err=%#x}",
		wc.WRID, wc.Status, wc.Opcode, wc.ByteLen, wc.QPN, wc.SrcQP, uint32(wc.Flags), wc.Imm, wc.VendorErr)
}

// FmtWCs formats completions for messages.
func FmtWCs(wcs []verbs.WorkCompletion) string {
	s := make([]string, len(wcs))
	for i, wc := range wcs {
		s[i] = FmtWC(wc)
	}
	return "[" + strings.Join(s, " ") + "]"
}

// Pattern fills b with bytes that depend on seed and position, so a
// misplaced or stale byte shows.
func Pattern(b []byte, seed uint64) {
	x := seed*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x >> 24)
	}
}

// Patterned is a new slice of n pattern bytes.
func Patterned(n int, seed uint64) []byte {
	b := make([]byte, n)
	Pattern(b, seed)
	return b
}

// DiffBytes describes the first difference between got and want, or "".
func DiffBytes(got, want []byte) string {
	if len(got) != len(want) {
		return fmt.Sprintf("length %d, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			n := 0
			for j := i; j < len(got); j++ {
				if got[j] != want[j] {
					n++
				}
			}
			return fmt.Sprintf("first difference at byte %d: got %#02x want %#02x (%d bytes differ of %d)", i, got[i], want[i], n, len(got))
		}
	}
	return ""
}

// CheckFill reports bytes of b[from:to] that are not fill.
func (e *Env) CheckFill(b []byte, from, to int, fill byte, what string) {
	e.Helper()
	for i := from; i < to; i++ {
		if b[i] != fill {
			e.Errorf("%s: byte %d is %#02x; it must be untouched (%#02x)", what, i, b[i], fill)
			return
		}
	}
}
