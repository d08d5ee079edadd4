package conformance

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Consume counts completions of cq through channel ch with the sequence
// that loses nothing: arm, poll until empty, then for each event
// GetEvent, AckEvents(1), ReqNotify, poll until empty; until want
// completions were handled, on reports an error, or ctx ends.
func Consume(ctx context.Context, ch verbs.CompChannel, cq verbs.CQ, want int, on func(verbs.WorkCompletion) error) (int, error) {
	got := 0
	buf := make([]verbs.WorkCompletion, 16)
	drain := func() error {
		for {
			k, err := cq.Poll(buf)
			if err != nil {
				return fmt.Errorf("poll: %w", err)
			}
			for _, wc := range buf[:k] {
				if err := on(wc); err != nil {
					return err
				}
			}
			got += k
			if k == 0 {
				return nil
			}
		}
	}
	if err := cq.ReqNotify(false); err != nil {
		return got, fmt.Errorf("ReqNotify: %w", err)
	}
	if err := drain(); err != nil {
		return got, err
	}
	for got < want {
		evcq, err := ch.GetEvent(ctx)
		if err != nil {
			return got, fmt.Errorf("GetEvent after %d of %d completions: %w", got, want, err)
		}
		if evcq != cq {
			return got, fmt.Errorf("GetEvent returned CQ %v, not the CQ attached to the channel (%v)", evcq, cq)
		}
		cq.AckEvents(1)
		if err := cq.ReqNotify(false); err != nil {
			return got, fmt.Errorf("ReqNotify: %w", err)
		}
		if err := drain(); err != nil {
			return got, err
		}
	}
	if got != want {
		return got, fmt.Errorf("%d completions, want %d", got, want)
	}
	return got, nil
}

const ruleCompChannel = "completion channels lose nothing: with 4 goroutines posting 4x500 signaled SENDs and WRITE_WITH_IMMs concurrently on " +
	"one QP, consumers that only use GetEvent, AckEvents(1), ReqNotify(false), poll-until-empty see exactly every send completion and every " +
	"receive completion, each once, within a bounded time"

func caseCompChannel(e *Env) {
	const (
		producers = 4
		perProd   = 500
		total     = producers * perProd
		slot      = 32
		sqDepth   = 64
		credit    = sqDepth / producers
	)
	if e.B.Attr.MaxQPWR > 0 && e.B.Attr.MaxQPWR < total {
		e.Fatalf("device MaxQPWR %d < %d receives this case pre-posts", e.B.Attr.MaxQPWR, total)
	}
	chA, chB := e.NewChannel(e.A), e.NewChannel(e.B)
	cqA := e.NewCQ(e.A, sqDepth+16, chA)
	cqB := e.NewCQ(e.B, total+16, chB)
	qa, qb := e.PairWith(
		QPConf{SendCQ: cqA, Cap: verbs.QPCap{MaxSendWR: sqDepth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}},
		QPConf{RecvCQ: cqB, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: total, MaxSendSGE: 1, MaxRecvSGE: 1}},
		ConnConf{}, ConnConf{})
	src := e.MapReg(e.A, total*slot, verbs.AccessLocalWrite, 0)
	rbuf := e.MapReg(e.B, total*slot, verbs.AccessLocalWrite, 0)
	rem := e.MapReg(e.B, total*slot, AccessAll, 0)
	id := func(p, s int) uint64 { return uint64(p)<<16 | uint64(s) }
	for p := range producers {
		for s := range perProd {
			b := src.Bytes()[(p*perProd+s)*slot:][:slot]
			Pattern(b, id(p, s))
			binary.BigEndian.PutUint32(b, uint32(id(p, s)))
		}
	}
	recvs := make([]verbs.RecvWR, total)
	for i := range recvs {
		recvs[i] = Recv(uint64(i), SGE(rbuf, i*slot, slot))
	}
	for i := 0; i < total; i += 100 {
		e.PostRecv(qb, recvs[i:min(i+100, total)]...)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 6*Timeout)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, producers+2)
	fail := func(err error) {
		errs <- err
		cancel()
	}
	credits := make([]chan struct{}, producers)
	for p := range credits {
		credits[p] = make(chan struct{}, credit)
		for range credit {
			credits[p] <- struct{}{}
		}
	}
	sendSeen := make([]int, total)
	recvSeen := make([]int, total)
	var sendGot, recvGot int
	wg.Add(2)
	go func() {
		defer wg.Done()
		n, err := Consume(ctx, chA, cqA, total, func(wc verbs.WorkCompletion) error {
			p, s := int(wc.WRID>>16), int(wc.WRID&0xffff)
			if wc.Status != verbs.WCSuccess || p >= producers || s >= perProd {
				return fmt.Errorf("send completion %s", FmtWC(wc))
			}
			sendSeen[p*perProd+s]++
			select {
			case credits[p] <- struct{}{}:
			default:
				return fmt.Errorf("producer %d has more send completions than posted WRs (%s)", p, FmtWC(wc))
			}
			return nil
		})
		sendGot = n
		if err != nil {
			fail(fmt.Errorf("sender consumer: %w", err))
		}
	}()
	go func() {
		defer wg.Done()
		n, err := Consume(ctx, chB, cqB, total, func(wc verbs.WorkCompletion) error {
			if wc.Status != verbs.WCSuccess || wc.WRID >= total || wc.QPN != qb.QPN() {
				return fmt.Errorf("receive completion %s", FmtWC(wc))
			}
			var tag uint64
			var data []byte
			switch wc.Opcode {
			case verbs.WCRecv:
				data = rbuf.Bytes()[int(wc.WRID)*slot:][:slot]
				tag = uint64(binary.BigEndian.Uint32(data))
			case verbs.WCRecvWriteWithImm:
				if wc.Flags&verbs.WCWithImm == 0 {
					return fmt.Errorf("WRITE_WITH_IMM receive without WITH_IMM: %s", FmtWC(wc))
				}
				tag = uint64(wc.Imm)
			default:
				return fmt.Errorf("receive completion with opcode %s: %s", wc.Opcode, FmtWC(wc))
			}
			p, s := int(tag>>16), int(tag&0xffff)
			if p >= producers || s >= perProd {
				return fmt.Errorf("receive completion %s carries tag %#x", FmtWC(wc), tag)
			}
			if wc.Opcode == verbs.WCRecvWriteWithImm {
				data = rem.Bytes()[(p*perProd+s)*slot:][:slot]
			}
			if diff := DiffBytes(data, src.Bytes()[(p*perProd+s)*slot:][:slot]); diff != "" {
				return fmt.Errorf("message of producer %d #%d (%s): %s", p, s, wc.Opcode, diff)
			}
			recvSeen[p*perProd+s]++
			return nil
		})
		recvGot = n
		if err != nil {
			fail(fmt.Errorf("receiver consumer: %w", err))
		}
	}()
	// Without immediate data (iWARP) every producer SENDs.
	noImm := e.Lacks(verbs.FeatureImmediate) != nil
	var pwg sync.WaitGroup
	for p := range producers {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			for s := 0; s < perProd; {
				n := min(1+s%4, perProd-s) // chains of 1..4 WRs
				wrs := make([]verbs.SendWR, n)
				for j := range wrs {
					select {
					case <-credits[p]:
					case <-ctx.Done():
						fail(fmt.Errorf("producer %d: no send credit after %d posts: %w", p, s, ctx.Err()))
						return
					}
					k := s + j
					off := (p*perProd + k) * slot
					wrs[j] = verbs.SendWR{ID: id(p, k), Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(src, off, slot)}}
					if p < 2 || noImm {
						wrs[j].Opcode = verbs.OpSend
					} else {
						wrs[j].Opcode = verbs.OpWriteWithImm
						wrs[j].Imm = uint32(id(p, k))
						wrs[j].RemoteAddr = rem.Addr() + uint64(off)
						wrs[j].RKey = rem.RKey()
					}
				}
				if got, err := qa.PostSend(wrs); err != nil || got != n {
					fail(fmt.Errorf("producer %d: PostSend of %d WRs at %d: n=%d err=%v", p, n, s, got, err))
					return
				}
				s += n
			}
		}()
	}
	pwg.Wait()
	wg.Wait()
	close(errs)
	for err := range errs {
		e.Error(err)
	}
	if e.Failed() {
		return
	}
	if sendGot != total || recvGot != total {
		e.Errorf("consumers counted %d send and %d receive completions; want %d each", sendGot, recvGot, total)
	}
	for i := range total {
		if sendSeen[i] != 1 || recvSeen[i] != 1 {
			e.Errorf("message %#x: %d send and %d receive completions; want 1 each", id(i/perProd, i%perProd), sendSeen[i], recvSeen[i])
			break
		}
	}
	e.ExpectEmpty(cqA, "sender CQ")
	e.ExpectEmpty(cqB, "receiver CQ")
}

const ruleSRQ = "one SRQ serves two QPs: SENDs to either QP take receives from the SRQ, and each receive completion names the QP " +
	"(qp_num) the message arrived on; a QP attached to an SRQ refuses PostRecv"

func caseSRQ(e *Env) {
	e.Need(verbs.FeatureSRQ)
	srq, err := e.B.PD.CreateSRQ(verbs.SRQInit{MaxWR: 16, MaxSGE: 1})
	if err != nil {
		e.Fatalf("CreateSRQ: %v", err)
	}
	e.CloseLater("SRQ", srq)
	if srq.MaxWR() < 16 {
		e.Errorf("SRQ.MaxWR() = %d, requested 16", srq.MaxWR())
	}
	qa1, qb1 := e.PairWith(QPConf{}, QPConf{SRQ: srq}, ConnConf{}, ConnConf{})
	qa2, qb2 := e.PairWith(QPConf{}, QPConf{SRQ: srq}, ConnConf{}, ConnConf{})
	src := e.MapReg(e.A, 4096, verbs.AccessLocalWrite, 0)
	rbuf := e.MapReg(e.B, 8*256, verbs.AccessLocalWrite, 0)
	var recvs []verbs.RecvWR
	for i := range 8 {
		recvs = append(recvs, Recv(uint64(0x500+i), SGE(rbuf, 256*i, 256)))
	}
	if n, err := srq.PostRecv(recvs); err != nil || n != len(recvs) {
		e.Fatalf("SRQ.PostRecv of %d: n=%d err=%v", len(recvs), n, err)
	}
	var n int
	if perr := NoPanic(func() { n, err = qb1.PostRecv([]verbs.RecvWR{Recv(1, SGE(rbuf, 0, 8))}) }); perr != nil {
		e.Errorf("PostRecv on a QP with an SRQ: %v", perr)
	} else if err == nil || n != 0 {
		e.Errorf("PostRecv on a QP attached to an SRQ: n=%d err=%v; want an error", n, err)
	}
	// Messages say which sender they came from in their first byte.
	senders := []struct {
		qa, qb verbs.QP
	}{{qa1, qb1}, {qa2, qb2}}
	for i := range 6 {
		s := senders[i%2]
		off := 100 * i
		b := src.Bytes()[off : off+100]
		Pattern(b, uint64(i))
		b[0] = byte(i % 2)
		b[1] = byte(i)
		e.PostSend(s.qa, verbs.SendWR{ID: uint64(i), Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(src, off, 100)}})
	}
	e.WaitN(e.A.CQ, 6, "sends")
	wcs := e.WaitN(e.B.CQ, 6, "SRQ receives")
	used := map[uint64]bool{}
	perQP := map[uint32]int{}
	for _, wc := range wcs {
		if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.WRID < 0x500 || wc.WRID >= 0x508 || used[wc.WRID] || wc.ByteLen != 100 {
			e.Errorf("SRQ receive completion %s; want SUCCESS RECV of 100 bytes with a fresh SRQ wr_id", FmtWC(wc))
			continue
		}
		used[wc.WRID] = true
		b := rbuf.Bytes()[256*(wc.WRID-0x500):][:100]
		from, i := int(b[0]), int(b[1])
		if from > 1 || i >= 6 {
			e.Errorf("SRQ receive %s holds garbage (%#x %#x)", FmtWC(wc), b[0], b[1])
			continue
		}
		if want := senders[from].qb.QPN(); wc.QPN != want {
			e.Errorf("message %d arrived on QP %#x but its completion says qp_num %#x", i, want, wc.QPN)
		}
		if diff := DiffBytes(b, src.Bytes()[100*i:100*i+100]); diff != "" {
			e.Errorf("message %d: %s", i, diff)
		}
		perQP[wc.QPN]++
	}
	if perQP[qb1.QPN()] != 3 || perQP[qb2.QPN()] != 3 {
		e.Errorf("receives per QP: %v; want 3 on %#x and 3 on %#x", perQP, qb1.QPN(), qb2.QPN())
	}
}

const ruleUD = "a UD SEND through an AH (CreateAH, RemoteQPN, RemoteQKey) arrives with the 40-byte GRH in front of the data: byte_len = " +
	"40 + payload, WC_WITH_GRH set (tested with &, also together with WITH_IMM), src_qp = the sender, payload intact after 40 bytes; " +
	"a wrong Q_Key drops the message; RDMA WRITE (with and without imm), READ and both atomics on UD fail at the post with ErrInvalid naming the operation"

func caseUD(e *Env) {
	e.Need(verbs.FeatureUD)
	const payload = 256
	const qkey = 0x11111111
	qa := e.CreateQP(e.A, QPConf{Type: verbs.UD, Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	qb := e.CreateQP(e.B, QPConf{Type: verbs.UD, Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	cc := ConnConf{QKey: qkey}
	for _, x := range []struct {
		qp verbs.QP
		s  *Side
	}{{qa, e.A}, {qb, e.B}} {
		e.ToInit(x.qp, x.s, cc)
		e.ToRTR(x.qp, x.s, nil, 0, 0, cc)
		e.ToRTS(x.qp, x.s, 0x123, cc)
	}
	if payload > e.MTU.Bytes() {
		e.Fatalf("path MTU %d below the UD payload %d", e.MTU.Bytes(), payload)
	}
	ah, err := e.A.PD.CreateAH(Addr(e.A, e.B))
	if err != nil {
		e.Fatalf("CreateAH(%+v): %v", Addr(e.A, e.B), err)
	}
	e.CloseLater("AH", ah)
	src := e.MapReg(e.A, 4096, verbs.AccessLocalWrite, 0)
	const rsz = verbs.GRHSize + payload
	rbuf := e.MapReg(e.B, 4*rsz, verbs.AccessLocalWrite, 0xee)
	for i := range 4 {
		e.PostRecv(qb, Recv(uint64(0x700+i), SGE(rbuf, i*rsz, rsz)))
	}
	send := func(id uint64, op verbs.Opcode, imm, rqkey uint32) []byte {
		off := int(id) * payload
		d := Patterned(payload, id)
		copy(src.Bytes()[off:], d)
		e.PostSend(qa, verbs.SendWR{ID: id, Opcode: op, Flags: verbs.SendSignaled, Imm: imm, SGL: []verbs.SGE{SGE(src, off, payload)},
			AH: ah, RemoteQPN: qb.QPN(), RemoteQKey: rqkey})
		e.CheckOK(e.Wait1(e.A.CQ, "UD send"), id, verbs.WCSend, "UD send completion")
		return d
	}
	check := func(wc verbs.WorkCompletion, recvID uint64, data []byte, imm bool, what string) {
		e.Helper()
		if !e.CheckOK(wc, recvID, verbs.WCRecv, what) {
			return
		}
		if wc.ByteLen != rsz {
			e.Errorf("%s: byte_len %d; want %d (40-byte GRH + %d)", what, wc.ByteLen, rsz, payload)
		}
		if wc.Flags&verbs.WCWithGRH == 0 {
			e.Errorf("%s: WC_WITH_GRH not set: %s", what, FmtWC(wc))
		}
		if imm && (wc.Flags&verbs.WCWithImm == 0 || wc.Imm != 0xdeadbeef) {
			e.Errorf("%s: want WITH_IMM and imm 0xdeadbeef: %s", what, FmtWC(wc))
		}
		if !imm && wc.Flags&verbs.WCWithImm != 0 {
			e.Errorf("%s: WITH_IMM set on a plain SEND: %s", what, FmtWC(wc))
		}
		if wc.QPN != qb.QPN() || wc.SrcQP != qa.QPN() {
			e.Errorf("%s: qp_num %#x src_qp %#x; want %#x, %#x", what, wc.QPN, wc.SrcQP, qb.QPN(), qa.QPN())
		}
		off := int(recvID-0x700) * rsz
		if diff := DiffBytes(rbuf.Bytes()[off+verbs.GRHSize:off+rsz], data); diff != "" {
			e.Errorf("%s: payload after the GRH: %s", what, diff)
		}
	}
	d1 := send(1, verbs.OpSend, 0, qkey)
	check(e.Wait1(e.B.CQ, "UD receive"), 0x700, d1, false, "UD SEND")
	d2 := send(2, verbs.OpSendWithImm, 0xdeadbeef, qkey)
	check(e.Wait1(e.B.CQ, "UD receive with imm"), 0x701, d2, true, "UD SEND_WITH_IMM")
	send(3, verbs.OpSend, 0, 0x22222222) // wrong Q_Key: dropped at the receiver
	d4 := send(4, verbs.OpSend, 0, qkey)
	check(e.Wait1(e.B.CQ, "UD receive after a wrong-Q_Key send"), 0x702, d4, false, "UD SEND after a wrong-Q_Key SEND (which must be dropped)")
	e.ExpectEmpty(e.B.CQ, "UD receiver CQ")

	for _, op := range []verbs.Opcode{verbs.OpWrite, verbs.OpWriteWithImm, verbs.OpRead, verbs.OpFetchAdd, verbs.OpCompareSwap} {
		var n int
		var err error
		if perr := NoPanic(func() {
			n, err = qa.PostSend([]verbs.SendWR{{ID: 9, Opcode: op, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(src, 0, 8)},
				RemoteAddr: rbuf.Addr(), RKey: rbuf.RKey(), AH: ah, RemoteQPN: qb.QPN(), RemoteQKey: qkey}})
		}); perr != nil {
			e.Errorf("%s on UD: %v", op, perr)
		} else if err == nil || n != 0 {
			e.Errorf("%s on UD: n=%d err=%v; want an error at the post", op, n, err)
		} else if !errors.Is(err, verbs.ErrInvalid) || !strings.Contains(err.Error(), op.String()) {
			e.Errorf("%s on UD: %v; want an error wrapping ErrInvalid that names %s", op, err, op)
		}
	}
	e.ExpectEmpty(e.A.CQ, "UD sender CQ")
}

const ruleCaps = "granted caps are at least the request (QP.Cap, CQ.Len, SRQ.MaxWR) and are real: a chain of exactly Cap().MaxSendWR " +
	"signaled WRITEs, Cap().MaxRecvWR receives and SRQ.MaxWR() receives are all accepted and complete"

func caseCaps(e *Env) {
	const limit = 1000
	req := verbs.QPCap{MaxSendWR: 5, MaxRecvWR: 3, MaxSendSGE: 3, MaxRecvSGE: 2}
	scq := e.NewCQ(e.A, limit+7, nil)
	rcq := e.NewCQ(e.B, limit+7, nil)
	qa, qb := e.PairWith(QPConf{Cap: req, SendCQ: scq, RecvCQ: scq}, QPConf{Cap: req, SendCQ: rcq, RecvCQ: rcq}, ConnConf{}, ConnConf{})
	got := qa.Cap()
	e.Logf("requested %+v, granted %+v (B: %+v)", req, got, qb.Cap())
	loc := e.MapReg(e.A, 4096, verbs.AccessLocalWrite, 0)
	rem := e.MapReg(e.B, 4096, AccessAll, 0)
	ns := min(got.MaxSendWR, limit)
	if ns < got.MaxSendWR {
		e.Logf("granted MaxSendWR %d; filling only %d", got.MaxSendWR, ns)
	}
	wrs := make([]verbs.SendWR, ns)
	for i := range wrs {
		wrs[i] = verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{SGE(loc, 0, 1), SGE(loc, 1, 1), SGE(loc, 2, 1)}[:req.MaxSendSGE], RemoteAddr: rem.Addr() + uint64(i%1024), RKey: rem.RKey()}
	}
	e.PostSend(qa, wrs...)
	wcs := e.WaitN(scq, ns, "a full send queue")
	for i, wc := range wcs {
		e.CheckOK(wc, uint64(i), verbs.WCWrite, fmt.Sprintf("WRITE %d of a full queue", i))
	}
	nr := min(qb.Cap().MaxRecvWR, limit)
	rwrs := make([]verbs.RecvWR, nr)
	for i := range rwrs {
		rwrs[i] = Recv(uint64(i), SGE(rem, 8*(i%256), 4), SGE(rem, 2048+8*(i%256), 4))
	}
	e.PostRecv(qb, rwrs...)
	if err := qb.ToError(); err != nil {
		e.Fatalf("ToError: %v", err)
	}
	ids := make([]uint64, nr)
	for i := range ids {
		ids[i] = uint64(i)
	}
	e.ExpectFlushed(qb, []verbs.CQ{rcq}, ids, "a full receive queue, flushed")

	srq, err := e.B.PD.CreateSRQ(verbs.SRQInit{MaxWR: 5, MaxSGE: 2})
	if err != nil {
		e.Fatalf("CreateSRQ: %v", err)
	}
	e.CloseLater("SRQ", srq)
	if srq.MaxWR() < 5 {
		e.Errorf("SRQ.MaxWR() = %d, requested 5", srq.MaxWR())
	}
	nq := min(srq.MaxWR(), limit)
	srecvs := make([]verbs.RecvWR, nq)
	for i := range srecvs {
		srecvs[i] = Recv(uint64(i), SGE(rem, 8*(i%256), 4), SGE(rem, 2048+8*(i%256), 4))
	}
	if n, err := srq.PostRecv(srecvs); err != nil || n != nq {
		e.Errorf("SRQ.PostRecv of MaxWR() = %d receives: n=%d err=%v", nq, n, err)
	}
}
