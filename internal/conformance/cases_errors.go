package conformance

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// ExpectFlushed polls cqs until each id in ids has come back exactly once
// as a WR_FLUSH_ERR completion of qp, then checks the CQs hold nothing else.
func (e *Env) ExpectFlushed(qp verbs.QP, cqs []verbs.CQ, ids []uint64, what string) {
	e.Helper()
	if missing := e.CollectFlushed(qp, cqs, ids, what); len(missing) > 0 {
		e.Fatalf("%s: after %v, no completion for wr_ids %#x (of %#x)", what, Timeout, missing, ids)
	}
}

// CollectFlushed is ExpectFlushed that returns the wr_ids still missing
// after Timeout instead of failing.
func (e *Env) CollectFlushed(qp verbs.QP, cqs []verbs.CQ, ids []uint64, what string) (missing []uint64) {
	e.Helper()
	want := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	seen := make(map[uint64]int, len(ids))
	deadline := time.Now().Add(Timeout)
	buf := make([]verbs.WorkCompletion, 16)
	for len(seen) < len(want) {
		got := 0
		for _, cq := range cqs {
			k, err := cq.Poll(buf)
			if err != nil {
				e.Fatalf("%s: Poll: %v", what, err)
			}
			got += k
			for _, wc := range buf[:k] {
				switch {
				case !want[wc.WRID]:
					e.Errorf("%s: unexpected completion %s (waiting for flushes of %#x)", what, FmtWC(wc), ids)
				case seen[wc.WRID] > 0:
					e.Errorf("%s: wr_id %#x completed twice: %s", what, wc.WRID, FmtWC(wc))
				case wc.Status != verbs.WCWRFlushErr || wc.QPN != qp.QPN():
					e.Errorf("%s: wr_id %#x: %s; want status WR_FLUSH_ERR on QP %#x", what, wc.WRID, FmtWC(wc), qp.QPN())
				case !errors.Is(wc.Err(), verbs.ErrFlushed) || !errors.Is(wc.Err(), verbs.ErrCompletionFailure):
					e.Errorf("%s: wr_id %#x: Err() = %v does not match ErrFlushed and ErrCompletionFailure", what, wc.WRID, wc.Err())
				}
				seen[wc.WRID]++
			}
		}
		if got == 0 {
			if time.Now().After(deadline) {
				for _, id := range ids {
					if seen[id] == 0 {
						missing = append(missing, id)
					}
				}
				return missing
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	for _, cq := range cqs {
		e.ExpectEmpty(cq, what+": after all flushes")
	}
	return nil
}

// CheckErrorState checks that qp reaches the error state, that the WRs
// that were outstanding (sendIDs, recvIDs) complete with WR_FLUSH_ERR, each
// once with its wr_id, and that sends posted afterwards are flushed too.
// mr is any local MR of qp's PD with 64 bytes to use. (Receives posted
// after the error are the RecvAfterError case.)
func (e *Env) CheckErrorState(qp verbs.QP, scq, rcq verbs.CQ, mr verbs.MR, sendIDs, recvIDs []uint64) {
	e.Helper()
	e.WaitState(qp, verbs.StateError)
	cqs := []verbs.CQ{scq}
	if rcq != scq {
		cqs = append(cqs, rcq)
	}
	e.ExpectFlushed(qp, cqs, append(slices.Clone(sendIDs), recvIDs...), "outstanding WRs flushed by the error")
	if err := e.Lacks(verbs.FeatureFlushInError); err != nil {
		e.Logf("no sends posted after the error: %v", err)
		return
	}
	var ids []uint64
	for i := range 3 {
		id := uint64(0xf100 + i)
		wr := verbs.SendWR{ID: id, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(mr, 8*i, 8)}}
		if n, err := qp.PostSend([]verbs.SendWR{wr}); err != nil || n != 1 {
			e.Fatalf("PostSend of wr_id %#x to a QP in ERR: n=%d err=%v; posting in ERR must succeed and flush", wr.ID, n, err)
		}
		ids = append(ids, id)
	}
	e.ExpectFlushed(qp, cqs, ids, "sends posted after the error")
}

const ruleRecvAfterError = "a receive posted to a QP that is already in ERR completes with WR_FLUSH_ERR, wr_id intact, exactly once: " +
	"after ToError (once the outstanding receives were flushed) and after an asynchronous error (a WRITE with a wrong rkey)"

func caseRecvAfterError(e *Env) {
	recvAfter := func(e *Env, qp verbs.QP, cqs []verbs.CQ, mr verbs.MR) {
		e.Helper()
		ids := []uint64{0xf200, 0xf201, 0xf202}
		for i, id := range ids {
			if n, err := qp.PostRecv([]verbs.RecvWR{Recv(id, SGE(mr, 32+8*i, 8))}); err != nil || n != 1 {
				e.Fatalf("PostRecv of wr_id %#x to a QP in ERR: n=%d err=%v; posting in ERR must succeed and flush", id, n, err)
			}
		}
		missing := e.CollectFlushed(qp, cqs, ids, "receives posted in ERR")
		if len(missing) == 0 {
			return
		}
		// Diagnose: does moving the QP to ERR again flush them (a
		// provider that does not notice receives posted in ERR)?
		diag := "ToError() again failed"
		if err := qp.ToError(); err == nil {
			if still := e.CollectFlushed(qp, cqs, missing, "receives posted in ERR, after ToError again"); len(still) == 0 {
				diag = "a second ToError() then flushed them: the provider does not notice receives posted in ERR until the QP is modified again"
			} else {
				diag = "a second ToError() did not flush them either"
			}
		}
		e.Errorf("receives %#x posted to a QP in ERR never completed within %v; %s", missing, Timeout, diag)
	}
	e.Need(verbs.FeatureFlushInError)
	e.Sub("AfterToError", func(e *Env) {
		_, qb := e.Pair(QPConf{})
		mr := e.MapReg(e.B, 4096, verbs.AccessLocalWrite, 0)
		e.PostRecv(qb, Recv(0xa1, SGE(mr, 1024, 64)))
		if err := qb.ToError(); err != nil {
			e.Fatalf("ToError: %v", err)
		}
		e.WaitState(qb, verbs.StateError)
		e.ExpectFlushed(qb, []verbs.CQ{e.B.CQ}, []uint64{0xa1}, "outstanding receive")
		recvAfter(e, qb, []verbs.CQ{e.B.CQ}, mr)
	})
	e.Sub("AfterAsyncError", func(e *Env) {
		e.Need(verbs.FeatureRemoteWriteError)
		rcq := e.NewCQ(e.A, 64, nil)
		qa, _ := e.PairWith(QPConf{RecvCQ: rcq}, QPConf{}, ConnConf{}, ConnConf{})
		loc := e.MapReg(e.A, 4096, verbs.AccessLocalWrite, 0)
		rem := e.MapReg(e.B, 4096, AccessAll, 0)
		e.PostSend(qa, verbs.SendWR{ID: 91, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(loc, 0, 64)},
			RemoteAddr: rem.Addr(), RKey: rem.RKey() ^ 0x00a5a500})
		if wc := e.Wait1(e.A.CQ, "WRITE with a wrong rkey"); wc.WRID != 91 || wc.Status != verbs.WCRemAccessErr {
			e.Fatalf("WRITE with a wrong rkey completed %s; want wr_id 91 REM_ACCESS_ERR", FmtWC(wc))
		}
		e.WaitState(qa, verbs.StateError)
		recvAfter(e, qa, []verbs.CQ{e.A.CQ, rcq}, loc)
	})
}

const ruleRNR = "a SEND with no receive posted at the peer is retried on RNR NAKs (RNR retry 1, min RNR timer 0.01 ms) and then fails " +
	"with RNR_RETRY_EXC_ERR (errors.Is ErrRNRRetryExceeded); the QP goes to ERR and every outstanding WR and every later send is flushed with its wr_id (later receives: RecvAfterError)"

func caseRNR(e *Env) {
	e.Need(verbs.FeatureRNRRetry)
	rcq := e.NewCQ(e.A, 64, nil)
	qa, _ := e.PairWith(QPConf{RecvCQ: rcq}, QPConf{},
		ConnConf{RNRRetry: 1, SetRNRRetry: true},
		ConnConf{MinRNRTimer: 1})
	mr := e.MapReg(e.A, 4096, verbs.AccessLocalWrite, 0)
	e.PostRecv(qa, Recv(0xe001, SGE(mr, 1024, 64)), Recv(0xe002, SGE(mr, 2048, 64)))
	e.PostSend(qa,
		verbs.SendWR{ID: 77, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(mr, 0, 16)}},
		verbs.SendWR{ID: 78, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(mr, 16, 16)}})
	wc := e.Wait1(e.A.CQ, "SEND without a receive at the peer")
	if wc.WRID != 77 || wc.Status != verbs.WCRNRRetryExcErr {
		e.Fatalf("first send completion is %s; want wr_id 77 status RNR_RETRY_EXC_ERR", FmtWC(wc))
	}
	if wc.QPN != qa.QPN() {
		e.Errorf("failed completion qp_num %#x, want %#x", wc.QPN, qa.QPN())
	}
	err := wc.Err()
	if !errors.Is(err, verbs.ErrRNRRetryExceeded) || !errors.Is(err, verbs.ErrCompletionFailure) {
		e.Errorf("Err() = %v; want errors.Is ErrRNRRetryExceeded and ErrCompletionFailure", err)
	}
	var we *verbs.WCError
	if !errors.As(err, &we) || we.WRID != 77 {
		e.Errorf("Err() = %#v; want a *verbs.WCError with WRID 77", err)
	}
	e.CheckErrorState(qa, e.A.CQ, rcq, mr, []uint64{78}, []uint64{0xe001, 0xe002})
}

const ruleRemoteAccess = "a WRITE that breaks the remote region's rules completes with REM_ACCESS_ERR (errors.Is ErrRemoteAccess) and changes no " +
	"remote byte: wrong rkey, a range past the end of the region, a region registered without REMOTE_WRITE, a region deregistered after a READ " +
	"through its rkey succeeded; then the QP is in ERR and " +
	"every outstanding WR and every later send completes WR_FLUSH_ERR exactly once with its wr_id (later receives: RecvAfterError)"

func caseRemoteAccess(e *Env) {
	e.Need(verbs.FeatureRemoteWriteError)
	subs := []struct {
		name string
		acc  verbs.Access
		rkey func(verbs.MR) uint32
		off  int
		// dereg: a READ through the region first, then the region is
		// deregistered (a provider that remembers the last region a key
		// found must not find this one).
		dereg bool
	}{
		{"WrongRKey", AccessAll, func(m verbs.MR) uint32 { return m.RKey() ^ 0x00a5a500 }, 1000, false},
		{"PastEnd", AccessAll, verbs.MR.RKey, 4096 - 16, false}, // 64 bytes from 16 before the end
		{"NoRemoteWrite", verbs.AccessLocalWrite | verbs.AccessRemoteRead, verbs.MR.RKey, 1000, false},
		{"Deregistered", AccessAll, verbs.MR.RKey, 1000, true},
	}
	for _, s := range subs {
		e.Sub(s.name, func(e *Env) {
			const fill = 0x3c
			rcq := e.NewCQ(e.A, 64, nil)
			qa, _ := e.PairWith(QPConf{RecvCQ: rcq}, QPConf{}, ConnConf{}, ConnConf{})
			loc := e.MapReg(e.A, 4096, verbs.AccessLocalWrite, 0)
			Pattern(loc.Bytes(), 5)
			// Register only the first page of two mapped pages: past the
			// region's end is mapped memory that must stay untouched.
			mapping := e.Map(8192)
			for i := range mapping {
				mapping[i] = fill
			}
			var rem verbs.MR
			if s.dereg {
				var err error
				if rem, err = e.B.PD.RegMR(mapping[:4096], s.acc); err != nil {
					e.Fatalf("RegMR: %v", err)
				}
			} else {
				rem = e.Reg(e.B, mapping[:4096], s.acc)
			}
			// Keys and address are read before a deregistration, after
			// which the MR is not to be used.
			addr, rkey, goodKey := rem.Addr(), s.rkey(rem), rem.RKey()
			if s.dereg {
				e.PostSend(qa, verbs.SendWR{ID: 90, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(loc, 3200, 64)},
					RemoteAddr: addr + 1000, RKey: rkey})
				if wc := e.Wait1(e.A.CQ, "READ before the deregistration"); wc.WRID != 90 || wc.Status != verbs.WCSuccess {
					e.Fatalf("READ before the deregistration completed %s; want wr_id 90 SUCCESS", FmtWC(wc))
				}
				if err := rem.Close(); err != nil {
					e.Fatalf("deregister: %v", err)
				}
			}
			e.PostRecv(qa, Recv(0xe001, SGE(loc, 3000, 64)))
			e.PostSend(qa,
				verbs.SendWR{ID: 91, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(loc, 0, 64)},
					RemoteAddr: addr + uint64(s.off), RKey: rkey},
				verbs.SendWR{ID: 92, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(loc, 64, 64)},
					RemoteAddr: addr + 2000, RKey: goodKey})
			wc := e.Wait1(e.A.CQ, "bad WRITE")
			if wc.WRID != 91 || wc.Status != verbs.WCRemAccessErr {
				e.Errorf("bad WRITE completion %s; want wr_id 91 status REM_ACCESS_ERR", FmtWC(wc))
			} else if !errors.Is(wc.Err(), verbs.ErrRemoteAccess) {
				e.Errorf("Err() = %v; want errors.Is ErrRemoteAccess", wc.Err())
			}
			if wc.WRID != 91 {
				e.FailNow()
			}
			e.CheckErrorState(qa, e.A.CQ, rcq, loc, []uint64{92}, []uint64{0xe001})
			e.CheckFill(mapping, 0, len(mapping), fill, "remote mapping (region and the page after it) after the refused WRITE and the flushed one")
		})
	}
}

const ruleToError = "ToError on a healthy QP flushes its outstanding receives with WR_FLUSH_ERR, wr_ids intact, each once; " +
	"State() is ERR, and sends posted afterwards are flushed too"

func caseToError(e *Env) {
	_, qb := e.Pair(QPConf{})
	mr := e.MapReg(e.B, 4096, verbs.AccessLocalWrite, 0)
	ids := []uint64{0xa1, 0xa2, 0xa3}
	for i, id := range ids {
		e.PostRecv(qb, Recv(id, SGE(mr, 1024+64*i, 64)))
	}
	if err := qb.ToError(); err != nil {
		e.Fatalf("ToError: %v", err)
	}
	e.CheckErrorState(qb, e.B.CQ, e.B.CQ, mr, nil, ids)
}

const rulePostState = "a send posted to a QP that is not in RTS (RESET, INIT, RTR) fails at the post (error, n == 0) and is never executed; " +
	"receives may be posted from INIT on; after RTS the first SENDs land in the first receives"

func casePostState(e *Env) {
	qa := e.CreateQP(e.A, QPConf{})
	qb := e.CreateQP(e.B, QPConf{})
	src := e.MapReg(e.A, 4096, verbs.AccessLocalWrite, 0)
	dst := e.MapReg(e.B, 4096, verbs.AccessLocalWrite, 0xee)
	for i := range 8 {
		Pattern(src.Bytes()[i*256:(i+1)*256], uint64(i))
	}
	try := func(id uint64, state string) {
		e.Helper()
		var n int
		var err error
		if perr := NoPanic(func() {
			n, err = qa.PostSend([]verbs.SendWR{{ID: id, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(src, int(id)*256, 256)}}})
		}); perr != nil {
			e.Errorf("PostSend in %s: %v", state, perr)
			return
		}
		if err == nil || n != 0 {
			e.Errorf("PostSend in %s: n=%d err=%v; want an error and n == 0", state, n, err)
			return
		}
		e.Logf("PostSend in %s refused: %v (wraps ErrQPState: %v)", state, err, errors.Is(err, verbs.ErrQPState))
	}
	try(1, "RESET")
	e.ToInit(qa, e.A, ConnConf{})
	try(2, "INIT")
	e.ToInit(qb, e.B, ConnConf{})
	// Receives may be posted in INIT.
	e.PostRecv(qb, Recv(301, SGE(dst, 0, 256)), Recv(302, SGE(dst, 256, 256)))
	if err := e.Lacks(verbs.FeatureManualConnect); err != nil {
		// rdma_cm moves through RTR on its own; only RTS is seen.
		e.Logf("no post in RTR: %v", err)
		e.Connect(qa, qb, ConnConf{}, ConnConf{})
	} else {
		e.ToRTR(qa, e.A, e.B, qb.QPN(), psnB, ConnConf{})
		try(3, "RTR")
		e.ToRTR(qb, e.B, e.A, qa.QPN(), psnA, ConnConf{})
		e.ToRTS(qa, e.A, psnA, ConnConf{})
		e.ToRTS(qb, e.B, psnB, ConnConf{})
	}
	for _, id := range []uint64{5, 6} {
		e.PostSend(qa, verbs.SendWR{ID: id, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(src, int(id)*256, 256)}})
	}
	swcs := e.WaitN(e.A.CQ, 2, "SENDs in RTS")
	e.CheckOK(swcs[0], 5, verbs.WCSend, "first send completion (no completion for refused posts)")
	e.CheckOK(swcs[1], 6, verbs.WCSend, "second send completion")
	rwcs := e.WaitN(e.B.CQ, 2, "receives")
	for i, want := range []uint64{5, 6} {
		if !e.CheckOK(rwcs[i], uint64(301+i), verbs.WCRecv, fmt.Sprintf("receive %d", i)) {
			continue
		}
		if diff := DiffBytes(dst.Bytes()[i*256:(i+1)*256], src.Bytes()[want*256:(want+1)*256]); diff != "" {
			e.Errorf("receive %d must hold SEND %d (a refused SEND was executed?): %s", i, want, diff)
		}
	}
	e.ExpectEmpty(e.A.CQ, "sender CQ")
	e.ExpectEmpty(e.B.CQ, "receiver CQ")
}

const ruleBadChain = "in a chain whose WR 2 of 5 has more SGEs than Cap().MaxSendSGE, PostSend returns n == 2 and a *verbs.PostError " +
	"with Posted == 2; exactly WRs 0 and 1 execute and complete, no others (checked with a later marker); the same for PostRecv " +
	"(WR 1 of 3 with too many SGEs: n == 1, only WR 0 posted, shown by flushing)"

func caseBadChain(e *Env) {
	const fill = 0xee
	qa, qb := e.Pair(QPConf{Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2}})
	gs, gr := qa.Cap().MaxSendSGE, qb.Cap().MaxRecvSGE
	if gs > 4096 || gr > 4096 {
		e.Fatalf("granted SGE counts %d/%d are implausible", gs, gr)
	}
	loc := e.MapReg(e.A, 8*(gs+1)+4096, verbs.AccessLocalWrite, 0)
	Pattern(loc.Bytes(), 8)
	rem := e.MapReg(e.B, 8192, AccessAll, fill)
	var chain []verbs.SendWR
	for i := range 5 {
		wr := verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{SGE(loc, 8*(gs+1)+64*i, 64)}, RemoteAddr: rem.Addr() + uint64(1024*i+8), RKey: rem.RKey()}
		if i == 2 {
			wr.SGL = nil
			for j := 0; j <= gs; j++ {
				wr.SGL = append(wr.SGL, SGE(loc, 8*j, 8))
			}
		}
		chain = append(chain, wr)
	}
	var n int
	var err error
	if perr := NoPanic(func() { n, err = qa.PostSend(chain) }); perr != nil {
		e.Fatalf("PostSend: %v", perr)
	}
	var pe *verbs.PostError
	if n != 2 || !errors.As(err, &pe) || pe.Posted != 2 {
		e.Errorf("PostSend of a chain whose WR 2 has %d SGEs (cap %d): n=%d err=%v; want n == 2 and *PostError{Posted: 2}", gs+1, gs, n, err)
	} else {
		e.Logf("refused: %v", err)
	}
	e.PostSend(qa, verbs.SendWR{ID: 50, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{SGE(loc, 0, 8)}, RemoteAddr: rem.Addr() + 7000, RKey: rem.RKey()})
	wcs := e.WaitN(e.A.CQ, 3, "WRs 0, 1 and the marker")
	for i, id := range []uint64{0, 1, 50} {
		e.CheckOK(wcs[i], id, verbs.WCWrite, fmt.Sprintf("completion %d", i))
	}
	e.ExpectEmpty(e.A.CQ, "sender CQ after the marker")
	e.Placed(qa, e.A.CQ, rem)
	rb := rem.Bytes()
	for i := range 5 {
		off := 1024*i + 8
		lo := 8*(gs+1) + 64*i
		if i < 2 {
			if diff := DiffBytes(rb[off:off+64], loc.Bytes()[lo:lo+64]); diff != "" {
				e.Errorf("WR %d (posted) data at remote: %s", i, diff)
			}
		} else {
			e.CheckFill(rb, off, off+64, fill, fmt.Sprintf("remote target of WR %d (not posted)", i))
		}
	}

	// Receives: WR 1 of 3 has one SGE too many.
	rloc := e.MapReg(e.B, 8*(gr+1)+4096, verbs.AccessLocalWrite, 0)
	var rchain []verbs.RecvWR
	for i := range 3 {
		wr := Recv(uint64(0x300+i), SGE(rloc, 8*(gr+1)+64*i, 64))
		if i == 1 {
			wr.SGL = nil
			for j := 0; j <= gr; j++ {
				wr.SGL = append(wr.SGL, SGE(rloc, 8*j, 8))
			}
		}
		rchain = append(rchain, wr)
	}
	pe = nil
	if perr := NoPanic(func() { n, err = qb.PostRecv(rchain) }); perr != nil {
		e.Fatalf("PostRecv: %v", perr)
	}
	if n != 1 || !errors.As(err, &pe) || pe.Posted != 1 {
		e.Errorf("PostRecv of a chain whose WR 1 has %d SGEs (cap %d): n=%d err=%v; want n == 1 and *PostError{Posted: 1}", gr+1, gr, n, err)
	}
	if err := qb.ToError(); err != nil {
		e.Fatalf("ToError: %v", err)
	}
	e.ExpectFlushed(qb, []verbs.CQ{e.B.CQ}, []uint64{0x300}, "receive chain: only WR 0 was posted")
}

const ruleBadOpcode = "an opcode the QP type cannot carry (RDMA READ, CAS, FAA on UC) fails at the post with an error (n == 0), never a panic; " +
	"the same UC pair still carries a WRITE_WITH_IMM afterwards"

func caseBadOpcode(e *Env) {
	e.Need(verbs.FeatureUC)
	qa, qb := e.Pair(QPConf{Type: verbs.UC})
	loc := e.MapReg(e.A, 4096, verbs.AccessLocalWrite, 0)
	rem := e.MapReg(e.B, 4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite, 0xee)
	rbuf := e.MapReg(e.B, 4096, verbs.AccessLocalWrite, 0)
	for i, op := range []verbs.Opcode{verbs.OpRead, verbs.OpCompareSwap, verbs.OpFetchAdd} {
		var n int
		var err error
		if perr := NoPanic(func() {
			n, err = qa.PostSend([]verbs.SendWR{{ID: uint64(i + 1), Opcode: op, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{SGE(loc, 8*i, 8)}, RemoteAddr: rem.Addr(), RKey: rem.RKey(), CompareAdd: 1}})
		}); perr != nil {
			e.Errorf("%s on UC: %v", op, perr)
			continue
		}
		if err == nil || n != 0 {
			e.Errorf("%s on UC: n=%d err=%v; want an error at the post and n == 0", op, n, err)
			continue
		}
		e.Logf("%s on UC refused: %v", op, err)
	}
	e.PostRecv(qb, Recv(9, SGE(rbuf, 0, 64)))
	data := Patterned(200, 4)
	copy(loc.Bytes()[1024:], data)
	e.PostSend(qa, verbs.SendWR{ID: 10, Opcode: verbs.OpWriteWithImm, Flags: verbs.SendSignaled, Imm: 7,
		SGL: []verbs.SGE{SGE(loc, 1024, 200)}, RemoteAddr: rem.Addr() + 100, RKey: rem.RKey()})
	e.CheckOK(e.Wait1(e.A.CQ, "UC WRITE_WITH_IMM"), 10, verbs.WCWrite, "UC WRITE_WITH_IMM send completion (no completion for refused WRs)")
	rwc := e.Wait1(e.B.CQ, "UC WRITE_WITH_IMM receive")
	if e.CheckOK(rwc, 9, verbs.WCRecvWriteWithImm, "UC WRITE_WITH_IMM receive") && (rwc.Flags&verbs.WCWithImm == 0 || rwc.Imm != 7) {
		e.Errorf("UC WRITE_WITH_IMM receive: %s; want WITH_IMM and imm 7", FmtWC(rwc))
	}
	if diff := DiffBytes(rem.Bytes()[100:300], data); diff != "" {
		e.Errorf("UC WRITE_WITH_IMM data: %s", diff)
	}
	e.CheckFill(rem.Bytes(), 0, 100, 0xee, "UC remote region before the write (a refused atomic must not have run)")
	e.ExpectEmpty(e.A.CQ, "UC sender CQ")
}

const ruleAtomicBadArgs = "an atomic with an unaligned remote address, a 4-byte local SGE or two SGEs fails clearly — refused at the post (n == 0) " +
	"or completed with an error status, never SUCCESS and never a panic — and changes neither the remote word nor local memory past the SGE"

func caseAtomicBadArgs(e *Env) {
	needAtomics(e)
	subs := []struct {
		name   string
		remOff int
		sgl    func(verbs.MR) []verbs.SGE
	}{
		{"UnalignedRemote", 64 + 4, func(m verbs.MR) []verbs.SGE { return []verbs.SGE{SGE(m, 0, 8)} }},
		{"LocalSGE4Bytes", 64, func(m verbs.MR) []verbs.SGE { return []verbs.SGE{SGE(m, 0, 4)} }},
		{"TwoSGEs", 64, func(m verbs.MR) []verbs.SGE { return []verbs.SGE{SGE(m, 0, 8), SGE(m, 8, 8)} }},
	}
	for _, s := range subs {
		e.Sub(s.name, func(e *Env) {
			qa, _ := e.Pair(QPConf{})
			loc := e.MapReg(e.A, 4096, verbs.AccessLocalWrite, 0xcd)
			rem := e.MapReg(e.B, 4096, AccessAll, 0x11)
			for _, op := range []verbs.Opcode{verbs.OpFetchAdd} {
				var n int
				var err error
				if perr := NoPanic(func() {
					n, err = qa.PostSend([]verbs.SendWR{{ID: 1, Opcode: op, Flags: verbs.SendSignaled, SGL: s.sgl(loc),
						RemoteAddr: rem.Addr() + uint64(s.remOff), RKey: rem.RKey(), CompareAdd: 1}})
				}); perr != nil {
					e.Fatalf("%s: %v", op, perr)
				}
				if err != nil {
					if n != 0 {
						e.Errorf("%s refused with n=%d; want 0", op, n)
					}
					e.Logf("%s refused at the post: %v", op, err)
				} else {
					wc := e.Wait1(e.A.CQ, op.String())
					if wc.Status == verbs.WCSuccess || wc.WRID != 1 {
						e.Errorf("%s accepted at the post and completed %s; want an error status", op, FmtWC(wc))
					} else {
						e.Logf("%s failed in its completion: %v", op, wc.Err())
					}
				}
			}
			e.CheckFill(rem.Bytes(), 0, 4096, 0x11, "remote region")
			e.CheckFill(loc.Bytes(), 16, 4096, 0xcd, "local memory past the SGEs")
			if s.name == "LocalSGE4Bytes" {
				e.CheckFill(loc.Bytes(), 4, 16, 0xcd, "local bytes past the 4-byte SGE")
			}
		})
	}
}
