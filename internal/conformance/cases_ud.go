package conformance

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The UD cases beside caseUD (cases_more.go), in the spirit of
// google/rdma-unit-test's UD tests. A datagram that must not arrive is
// checked with a marker: a later datagram from the same sender QP that
// does arrive, with nothing before it. Each UD QP of these cases has a
// CQ of its own, so a completion shows which QP took the datagram.

const (
	udQKey    = 0x11111111
	udPayload = 256
	udRecvSz  = verbs.GRHSize + udPayload
)

// udEnd is one UD QP in RTS with its own CQ (send and receive) and a
// registered buffer of slots of udRecvSz bytes.
type udEnd struct {
	s   *Side
	qp  verbs.QP
	cq  verbs.CQ
	buf verbs.MR
}

func (e *Env) udEnd(s *Side, slots int) udEnd {
	e.Helper()
	cq := e.NewCQ(s, 32, nil)
	qp := e.CreateQP(s, QPConf{Type: verbs.UD, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	cc := ConnConf{QKey: udQKey}
	e.ToInit(qp, s, cc)
	e.ToRTR(qp, s, nil, 0, 0, cc)
	e.ToRTS(qp, s, 0x123, cc)
	return udEnd{s: s, qp: qp, cq: cq, buf: e.MapReg(s, slots*udRecvSz, verbs.AccessLocalWrite, 0xee)}
}

// slot is receive slot i of the end's buffer.
func (u udEnd) slot(i int) []byte { return u.buf.Bytes()[i*udRecvSz : (i+1)*udRecvSz] }

// recv posts a receive of the whole slot i, with wr_id 0x700+i.
func (e *Env) udRecv(u udEnd, i int) {
	e.Helper()
	e.PostRecv(u.qp, Recv(uint64(0x700+i), SGE(u.buf, i*udRecvSz, udRecvSz)))
}

// udSetup checks what every UD case needs and makes the AH from A to B.
func (e *Env) udSetup() verbs.AH {
	e.Helper()
	e.Need(verbs.FeatureUD)
	if udPayload > e.MTU.Bytes() {
		e.Fatalf("path MTU %d below the UD payload %d", e.MTU.Bytes(), udPayload)
	}
	return e.udAH(Addr(e.A, e.B))
}

func (e *Env) udAH(a verbs.Address) verbs.AH {
	e.Helper()
	ah, err := e.A.PD.CreateAH(a)
	if err != nil {
		e.Fatalf("CreateAH(%+v): %v", a, err)
	}
	e.CloseLater("AH", ah)
	return ah
}

// udSend sends the pattern of seed (udPayload bytes, from slot 0 of
// from's buffer) through ah to QP qpn with Q_Key qkey, waits for the
// send's successful completion, and returns the data sent.
func (e *Env) udSend(from udEnd, ah verbs.AH, qpn, qkey uint32, seed uint64) []byte {
	e.Helper()
	d := Patterned(udPayload, seed)
	copy(from.slot(0), d)
	e.PostSend(from.qp, verbs.SendWR{ID: seed, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(from.buf, 0, udPayload)},
		AH: ah, RemoteQPN: qpn, RemoteQKey: qkey})
	e.CheckOK(e.Wait1(from.cq, fmt.Sprintf("UD send %d", seed)), seed, verbs.WCSend, fmt.Sprintf("UD send %d (a UD send completes once sent, whatever becomes of it)", seed))
	return d
}

// udCheckRecv checks that wc is the successful receive of data from QP
// src into slot i of to.
func (e *Env) udCheckRecv(to udEnd, wc verbs.WorkCompletion, i int, src uint32, data []byte, what string) {
	e.Helper()
	if !e.CheckOK(wc, uint64(0x700+i), verbs.WCRecv, what) {
		return
	}
	if wc.ByteLen != udRecvSz || wc.Flags&verbs.WCWithGRH == 0 || wc.QPN != to.qp.QPN() || wc.SrcQP != src {
		e.Errorf("%s: %s; want byte_len %d (GRH + %d), WITH_GRH, qp_num %#x, src_qp %#x", what, FmtWC(wc), udRecvSz, udPayload, to.qp.QPN(), src)
	}
	if diff := DiffBytes(to.slot(i)[verbs.GRHSize:], data); diff != "" {
		e.Errorf("%s: payload after the GRH: %s", what, diff)
	}
}

const ruleUDNoRecv = "a UD SEND to a QP with no receive posted completes successfully at the sender and is dropped at the receiver: " +
	"nothing completes on its CQ, and a receive posted later takes the next datagram, not the dropped one (which had arrived: " +
	"a datagram the sender sent after it to a second QP was received first)"

func caseUDNoRecv(e *Env) {
	ah := e.udSetup()
	a := e.udEnd(e.A, 1)
	b := e.udEnd(e.B, 1)
	c := e.udEnd(e.B, 1)
	e.udRecv(c, 0)
	e.udSend(a, ah, b.qp.QPN(), udQKey, 1) // no receive at b: dropped
	m := e.udSend(a, ah, c.qp.QPN(), udQKey, 2)
	e.udCheckRecv(c, e.Wait1(c.cq, "the datagram to the second QP"), 0, a.qp.QPN(), m, "UD SEND to the second QP, after the one that found no receive")
	e.ExpectEmpty(b.cq, "CQ of the QP without a receive")
	e.udRecv(b, 0)
	d := e.udSend(a, ah, b.qp.QPN(), udQKey, 3)
	e.udCheckRecv(b, e.Wait1(b.cq, "the datagram after the dropped one"), 0, a.qp.QPN(), d, "UD SEND after one that found no receive (the receive must hold the later datagram)")
	e.ExpectEmpty(b.cq, "CQ of the receiving QP")
	e.ExpectEmpty(c.cq, "CQ of the second QP")
}

const ruleUDWrongAddress = "a UD SEND to a QPN the receiver does not have, or with a Q_Key other than the receiving QP's, is dropped " +
	"(the sender completes successfully); the receiver's posted receives stay for the next datagram addressed right, " +
	"which takes the first of them"

func caseUDWrongAddress(e *Env) {
	ah := e.udSetup()
	a := e.udEnd(e.A, 1)
	b := e.udEnd(e.B, 2)
	e.udRecv(b, 0)
	e.udRecv(b, 1)
	other := b.qp.QPN() ^ 0x800000 // a QPN far from any the device hands out
	e.udSend(a, ah, other, udQKey, 1)
	e.udSend(a, ah, b.qp.QPN(), udQKey^0x01010101, 2) // wrong Q_Key (high bit clear: not "the sender's own")
	d := e.udSend(a, ah, b.qp.QPN(), udQKey, 3)
	e.udCheckRecv(b, e.Wait1(b.cq, "the datagram addressed right"), 0, a.qp.QPN(), d,
		fmt.Sprintf("UD SEND after one to QPN %#x and one with the wrong Q_Key (both dropped)", other))
	e.ExpectEmpty(b.cq, "receiver CQ")
	e.CheckFill(b.slot(1), 0, udRecvSz, 0xee, "the second receive's buffer")
}

const ruleUDRecvTooSmall = "a UD receive too small for the GRH and the payload fails with an error completion of its wr_id: LOC_LEN_ERR, " +
	"after which the QP goes on and the next receive takes the next datagram; or LOC_QP_OP_ERR (rxe), after which the QP is in ERR " +
	"and the next receive is flushed. Never a success, and never a receive lost"

func caseUDRecvTooSmall(e *Env) {
	ah := e.udSetup()
	a := e.udEnd(e.A, 1)
	b := e.udEnd(e.B, 2)
	small := verbs.GRHSize + udPayload/2
	e.PostRecv(b.qp, Recv(0x700, SGE(b.buf, 0, small)))
	e.udRecv(b, 1)
	e.udSend(a, ah, b.qp.QPN(), udQKey, 1)
	wc := e.Wait1(b.cq, "the receive too small")
	if wc.WRID != 0x700 || wc.QPN != b.qp.QPN() {
		e.Fatalf("too-small receive: %s; want wr_id 0x700 of QP %#x", FmtWC(wc), b.qp.QPN())
	}
	e.CheckFill(b.slot(1), 0, udRecvSz, 0xee, "the second receive's buffer (the datagram went to the first)")
	switch wc.Status {
	case verbs.WCLocLenErr:
		if !errors.Is(wc.Err(), verbs.ErrLocalLength) {
			e.Errorf("LOC_LEN_ERR completion: Err() = %v; want ErrLocalLength", wc.Err())
		}
		if st, err := b.qp.State(); err != nil || st != verbs.StateRTS {
			e.Errorf("after LOC_LEN_ERR: QP state %v, %v; want RTS", st, err)
		}
		d := e.udSend(a, ah, b.qp.QPN(), udQKey, 2)
		e.udCheckRecv(b, e.Wait1(b.cq, "the datagram after the length error"), 1, a.qp.QPN(), d, "UD SEND after a length error")
	case verbs.WCLocQPOpErr:
		e.Logf("the device completes a too-small UD receive with LOC_QP_OP_ERR and moves the QP to ERR (rxe)")
		e.WaitState(b.qp, verbs.StateError)
		if wc := e.Wait1(b.cq, "the next receive, flushed"); wc.WRID != 0x701 || wc.Status != verbs.WCWRFlushErr {
			e.Errorf("next receive after LOC_QP_OP_ERR: %s; want wr_id 0x701 WR_FLUSH_ERR", FmtWC(wc))
		}
	default:
		e.Fatalf("too-small receive: %s; want LOC_LEN_ERR (or rxe's LOC_QP_OP_ERR)", FmtWC(wc))
	}
	e.ExpectEmpty(b.cq, "receiver CQ")
}

const ruleUDGRH = "the GRH in front of a UD receive parses (verbs.ParseGRH) in the form of the address family: RoCE v2 over IPv4 the " +
	"IPv4 header in bytes 20..39, else the IPv6 header; its source is the sender's GID and its destination the receiver's, on RoCE v2 the " +
	"next header UDP with the length of what followed it on the wire (UDP, BTH, DETH, the immediate, the padded payload, the ICRC), " +
	"and the hop limit the AH's"

func caseUDGRH(e *Env) {
	ah := e.udSetup()
	a := e.udEnd(e.A, 1)
	b := e.udEnd(e.B, 2)
	e.udRecv(b, 0)
	e.udRecv(b, 1)
	d := e.udSend(a, ah, b.qp.QPN(), udQKey, 1)
	e.udCheckRecv(b, e.Wait1(b.cq, "UD receive"), 0, a.qp.QPN(), d, "UD SEND")
	e.checkGRH(b.slot(0), e.A.GID.GID, e.B.GID.GID, udPayload, false, "UD SEND")
	// With an immediate, the header counts 4 bytes more.
	copy(a.slot(0), d)
	e.PostSend(a.qp, verbs.SendWR{ID: 2, Opcode: verbs.OpSendWithImm, Imm: 7, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(a.buf, 0, udPayload)},
		AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: udQKey})
	e.CheckOK(e.Wait1(a.cq, "UD SEND_WITH_IMM"), 2, verbs.WCSend, "UD SEND_WITH_IMM")
	wc := e.Wait1(b.cq, "UD receive with imm")
	if e.CheckOK(wc, 0x701, verbs.WCRecv, "UD SEND_WITH_IMM") {
		e.checkGRH(b.slot(1), e.A.GID.GID, e.B.GID.GID, udPayload, true, "UD SEND_WITH_IMM")
	}
}

// checkGRH parses the GRH at the start of b and checks it names src and
// dst in the form of their address family, with what followed it on the
// wire for a payload of n bytes.
func (e *Env) checkGRH(b []byte, src, dst verbs.GID, n int, imm bool, what string) {
	e.Helper()
	g, err := verbs.ParseGRH(b[:verbs.GRHSize])
	if err != nil {
		e.Errorf("%s: GRH % x: %v", what, b[:verbs.GRHSize], err)
		return
	}
	want := verbs.GRHIPv6
	if src.IP().Is4() && dst.IP().Is4() {
		want = verbs.GRHIPv4
	}
	if g.Form != want || g.SrcGID() != src || g.DstGID() != dst {
		e.Errorf("%s: GRH %+v (% x); want the %v form from %v to %v", what, g, b[:verbs.GRHSize], want, src, dst)
	}
	if g.HopLimit != 64 {
		e.Errorf("%s: GRH hop limit %d; want the AH's 64", what, g.HopLimit)
	}
	if e.B.Port.LinkLayer != "Ethernet" {
		return
	}
	l := 8 + 12 + 8 + (n+3)&^3 + 4
	if imm {
		l += 4
	}
	if g.NextHeader != verbs.GRHNextUDP || g.PayloadLen != l {
		e.Errorf("%s: GRH next header %d, payload length %d; want UDP (17) and %d (UDP, BTH, DETH, imm, padded payload, ICRC)", what, g.NextHeader, g.PayloadLen, l)
	}
}

const ruleUDMulticast = "AttachMcast and DetachMcast on UD QPs: a SEND through an AH to the group (RemoteQPN 0xFFFFFF) reaches every " +
	"attached QP once, with the group as the GRH's destination and the sender as its source; one with the wrong Q_Key reaches none; after " +
	"DetachMcast nothing arrives (a later unicast marker to each QP is the first it receives). Attaching an RC QP, attaching to a unicast " +
	"GID and detaching from a group not attached fail with ErrInvalid; on a device without multicast (siw) AttachMcast fails with " +
	"ErrNotSupported naming the feature, and the case skips"

func caseUDMulticast(e *Env) {
	group := verbs.GIDFromIP(netip.MustParseAddr("239.71.82.3"))
	if !e.B.GID.GID.IP().Is4() {
		group = verbs.GIDFromIP(netip.MustParseAddr("ff0e::db8:71:82:3"))
	}
	rc := e.CreateQP(e.B, QPConf{})
	if why := e.Lacks(verbs.FeatureMulticast); why != nil {
		// Where the device has no multicast, the call says so, naming
		// the feature, whatever the QP.
		if err := rc.AttachMcast(group, 0); !errors.Is(err, verbs.ErrNotSupported) || !strings.Contains(err.Error(), string(verbs.FeatureMulticast)) {
			e.Errorf("AttachMcast on a device without multicast: %v; want ErrNotSupported naming %q", err, verbs.FeatureMulticast)
		}
		e.Skipf("feature %q: %v", verbs.FeatureMulticast, why)
	}
	ah := e.udSetup()
	a := e.udEnd(e.A, 1)
	m1 := e.udEnd(e.B, 2)
	m2 := e.udEnd(e.B, 2)
	if err := rc.AttachMcast(group, 0); !errors.Is(err, verbs.ErrInvalid) {
		e.Errorf("AttachMcast on an RC QP: %v; want ErrInvalid", err)
	}
	if err := m1.qp.AttachMcast(e.B.GID.GID, 0); !errors.Is(err, verbs.ErrInvalid) {
		e.Errorf("AttachMcast to the unicast GID %v: %v; want ErrInvalid", e.B.GID.GID, err)
	}
	if err := m1.qp.DetachMcast(group, 0); !errors.Is(err, verbs.ErrInvalid) {
		e.Errorf("DetachMcast of a group not attached: %v; want ErrInvalid", err)
	}
	for _, m := range []udEnd{m1, m2} {
		if err := m.qp.AttachMcast(group, 0); err != nil {
			e.Fatalf("AttachMcast(%v) of QP %#x: %v", group, m.qp.QPN(), err)
		}
		e.udRecv(m, 0)
	}
	mah := e.udAH(verbs.Address{Port: 1, GID: group, SGIDIndex: uint8(e.A.GID.Index), HopLimit: 64})
	e.udSend(a, mah, verbs.MulticastQPN, udQKey^0x01010101, 1) // wrong Q_Key: no member takes it
	d := e.udSend(a, mah, verbs.MulticastQPN, udQKey, 2)
	for i, m := range []udEnd{m1, m2} {
		what := fmt.Sprintf("member %d (QP %#x) of group %v", i+1, m.qp.QPN(), group)
		e.udCheckRecv(m, e.Wait1(m.cq, what), 0, a.qp.QPN(), d, what+": the datagram to the group (the one with the wrong Q_Key before it must be dropped)")
		e.checkGRH(m.slot(0), e.A.GID.GID, group, udPayload, false, what)
	}
	for _, m := range []udEnd{m1, m2} {
		if err := m.qp.DetachMcast(group, 0); err != nil {
			e.Fatalf("DetachMcast(%v) of QP %#x: %v", group, m.qp.QPN(), err)
		}
		e.udRecv(m, 1)
	}
	e.udSend(a, mah, verbs.MulticastQPN, udQKey, 3) // after detach: reaches no one
	for i, m := range []udEnd{m1, m2} {
		what := fmt.Sprintf("former member %d (QP %#x)", i+1, m.qp.QPN())
		mk := e.udSend(a, ah, m.qp.QPN(), udQKey, uint64(4+i))
		e.udCheckRecv(m, e.Wait1(m.cq, what), 1, a.qp.QPN(), mk, what+": the unicast marker (the datagram to the group after DetachMcast must be dropped)")
		e.ExpectEmpty(m.cq, what+" CQ")
	}
}
