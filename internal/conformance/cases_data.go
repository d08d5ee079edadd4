package conformance

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// splitAt cuts n into parts at the given fractions of n and drops empty
// parts.
func splitAt(n int, cuts ...float64) []int {
	var parts []int
	prev := 0
	for _, c := range cuts {
		at := int(float64(n) * c)
		parts = append(parts, at-prev)
		prev = at
	}
	parts = append(parts, n-prev)
	return slices.DeleteFunc(parts, func(p int) bool { return p <= 0 })
}

// scatter lays parts out in mr from offset off with gap bytes between
// them and returns the SGEs and their offsets.
func scatter(mr verbs.MR, off, gap int, parts []int) ([]verbs.SGE, []int) {
	var sgl []verbs.SGE
	var offs []int
	for _, p := range parts {
		sgl = append(sgl, SGE(mr, off, p))
		offs = append(offs, off)
		off += p + gap
	}
	return sgl, offs
}

const ruleSendRecv = "SEND delivers exactly the sent bytes, scattered over the receive SGEs in order and nowhere else; " +
	"the receive completion is SUCCESS, opcode RECV, byte_len = message size, qp_num = the receiving QP, no WITH_IMM flag; " +
	"the send completion is SUCCESS, opcode SEND (sizes 0, 1, 4095, 4096, 1 MiB; 1-3 send SGEs, 1-4 receive SGEs with different split points)"

func caseSendRecv(e *Env) {
	const (
		big   = 1 << 20
		gap   = 64
		slack = 8
		fill  = 0xee
	)
	qa, qb := e.Pair(QPConf{Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 3, MaxRecvSGE: 4}})
	src := e.MapReg(e.A, big+8*gap, verbs.AccessLocalWrite, 0)
	dst := e.MapReg(e.B, big+8*gap+slack, verbs.AccessLocalWrite, fill)
	layouts := []struct {
		name       string
		send, recv []float64
	}{
		{"1x1", nil, nil},
		{"3x2", []float64{1.0 / 7, 4.0 / 7}, []float64{0.5}},
		{"3x4", []float64{1.0 / 3, 2.0 / 3}, []float64{0.2, 0.5, 0.75}},
		{"2x3", []float64{0.9}, []float64{0.1, 0.45}},
	}
	seq := uint64(0)
	for _, size := range []int{0, 1, 4095, 4096, big} {
		for _, l := range layouts {
			seq++
			what := fmt.Sprintf("size %d layout %s", size, l.name)
			data := Patterned(size, seq)
			sendParts := splitAt(size, l.send...)
			recvParts := splitAt(size, l.recv...)
			if len(recvParts) == 0 {
				recvParts = []int{0}
			}
			recvParts[len(recvParts)-1] += slack
			ssgl, soffs := scatter(src, 0, gap, sendParts)
			rsgl, roffs := scatter(dst, 0, gap, recvParts)
			if len(ssgl) > qa.Cap().MaxSendSGE || len(rsgl) > qb.Cap().MaxRecvSGE {
				e.Fatalf("%s: layout needs %d/%d SGEs, caps are %d/%d", what, len(ssgl), len(rsgl), qa.Cap().MaxSendSGE, qb.Cap().MaxRecvSGE)
			}
			p := 0
			for i, n := range sendParts {
				copy(src.Bytes()[soffs[i]:soffs[i]+n], data[p:p+n])
				p += n
			}
			d := dst.Bytes()
			for i := range d {
				d[i] = fill
			}
			e.PostRecv(qb, Recv(1000+seq, rsgl...))
			e.PostSend(qa, verbs.SendWR{ID: seq, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: ssgl})
			rwc := e.Wait1(e.B.CQ, what+": receive")
			swc := e.Wait1(e.A.CQ, what+": send")
			e.CheckOK(swc, seq, verbs.WCSend, what+": send completion")
			if !e.CheckOK(rwc, 1000+seq, verbs.WCRecv, what+": receive completion") {
				continue
			}
			if rwc.ByteLen != uint32(size) {
				e.Errorf("%s: receive byte_len = %d, want %d", what, rwc.ByteLen, size)
			}
			if rwc.QPN != qb.QPN() {
				e.Errorf("%s: receive qp_num = %#x, want %#x", what, rwc.QPN, qb.QPN())
			}
			if rwc.Flags&verbs.WCWithImm != 0 {
				e.Errorf("%s: plain SEND's receive has the WITH_IMM flag: %s", what, FmtWC(rwc))
			}
			// Gather the receive SGEs and compare; check the gaps
			// between them were not written.
			var got []byte
			for i, n := range recvParts {
				got = append(got, d[roffs[i]:roffs[i]+n]...)
				if i+1 < len(recvParts) {
					e.CheckFill(d, roffs[i]+n, roffs[i+1], fill, what+": gap between receive SGEs")
				}
			}
			if diff := DiffBytes(got[:size], data); diff != "" {
				e.Errorf("%s: received data wrong: %s", what, diff)
			}
			last := roffs[len(roffs)-1] + recvParts[len(recvParts)-1]
			e.CheckFill(d, last, len(d), fill, what+": memory after the last receive SGE")
		}
	}
}

const ruleSendWithImm = "SEND_WITH_IMM delivers its 32-bit immediate in host order (0xdeadbeef, so byte order matters) " +
	"and sets WC_WITH_IMM (tested with &) in the receive completion, along with the data"

func caseSendWithImm(e *Env) {
	e.Need(verbs.FeatureImmediate)
	qa, qb := e.Pair(QPConf{})
	src := e.MapReg(e.A, 4096, verbs.AccessLocalWrite, 0)
	dst := e.MapReg(e.B, 4096, verbs.AccessLocalWrite, 0xee)
	msgs := []struct {
		imm  uint32
		size int
	}{{0xdeadbeef, 100}, {0x01020304, 0}, {0x80000001, 2000}}
	for i, m := range msgs {
		id := uint64(i + 1)
		what := fmt.Sprintf("SEND_WITH_IMM %#x, %d bytes", m.imm, m.size)
		data := Patterned(m.size, id+77)
		copy(src.Bytes(), data)
		e.PostRecv(qb, Recv(100+id, SGE(dst, 0, 4096)))
		wr := verbs.SendWR{ID: id, Opcode: verbs.OpSendWithImm, Flags: verbs.SendSignaled, Imm: m.imm}
		if m.size > 0 {
			wr.SGL = []verbs.SGE{SGE(src, 0, m.size)}
		}
		e.PostSend(qa, wr)
		rwc := e.Wait1(e.B.CQ, what+": receive")
		e.CheckOK(e.Wait1(e.A.CQ, what+": send"), id, verbs.WCSend, what+": send completion")
		if !e.CheckOK(rwc, 100+id, verbs.WCRecv, what+": receive completion") {
			continue
		}
		if rwc.Flags&verbs.WCWithImm == 0 {
			e.Errorf("%s: receive completion lacks WC_WITH_IMM: %s", what, FmtWC(rwc))
		}
		if rwc.Imm != m.imm {
			e.Errorf("%s: immediate = %#x, want %#x (byte order?)", what, rwc.Imm, m.imm)
		}
		if rwc.ByteLen != uint32(m.size) || rwc.QPN != qb.QPN() {
			e.Errorf("%s: byte_len %d qp_num %#x; want %d, %#x", what, rwc.ByteLen, rwc.QPN, m.size, qb.QPN())
		}
		if diff := DiffBytes(dst.Bytes()[:m.size], data); diff != "" {
			e.Errorf("%s: data: %s", what, diff)
		}
	}
}

const ruleWriteRead = "RDMA WRITE places the bytes exactly at the remote sub-range it names (not at offset 0) and nowhere else; " +
	"RDMA READ fetches exactly a remote sub-range into the local SGEs; completions are SUCCESS with opcodes RDMA_WRITE and RDMA_READ"

func caseWriteRead(e *Env) {
	const fill = 0x5a
	qa, _ := e.Pair(QPConf{})
	loc := e.MapReg(e.A, 64<<10, verbs.AccessLocalWrite, 0)
	rem := e.MapReg(e.B, 64<<10, AccessAll, fill)
	rb := rem.Bytes()

	// WRITE from two local SGEs to [12345, 13345) of the remote region.
	d1 := Patterned(1000, 1)
	copy(loc.Bytes()[100:], d1[:700])
	copy(loc.Bytes()[2000:], d1[700:])
	e.PostSend(qa, verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{SGE(loc, 100, 700), SGE(loc, 2000, 300)}, RemoteAddr: rem.Addr() + 12345, RKey: rem.RKey()})
	e.CheckOK(e.Wait1(e.A.CQ, "WRITE 1000 bytes"), 1, verbs.WCWrite, "WRITE completion")
	e.Placed(qa, e.A.CQ, rem)
	if diff := DiffBytes(rb[12345:13345], d1); diff != "" {
		e.Errorf("WRITE of 1000 bytes at offset 12345: %s", diff)
	}
	e.CheckFill(rb, 0, 12345, fill, "remote memory before the WRITE range")
	e.CheckFill(rb, 13345, 20003, fill, "remote memory after the WRITE range")

	// A multi-packet WRITE at an odd offset.
	d2 := Patterned(9000, 2)
	copy(loc.Bytes()[8192:], d2)
	e.PostSend(qa, verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{SGE(loc, 8192, 9000)}, RemoteAddr: rem.Addr() + 20003, RKey: rem.RKey()})
	e.CheckOK(e.Wait1(e.A.CQ, "WRITE 9000 bytes"), 2, verbs.WCWrite, "WRITE completion")
	e.Placed(qa, e.A.CQ, rem)
	if diff := DiffBytes(rb[20003:29003], d2); diff != "" {
		e.Errorf("WRITE of 9000 bytes at offset 20003: %s", diff)
	}
	e.CheckFill(rb, 29003, 33333, fill, "remote memory after the second WRITE")

	// READ [33333, 33333+3777) into two local SGEs.
	d3 := Patterned(3777, 3)
	copy(rb[33333:], d3)
	lb := loc.Bytes()
	for i := 40000; i < len(lb); i++ {
		lb[i] = 0x11
	}
	sgl := []verbs.SGE{SGE(loc, 40000, 1777), SGE(loc, 50000, 2000)}
	if e.A.Attr.MaxSGERd == 1 {
		// The device scatters a READ into one SGE only (siw reports
		// max_sge_rd 1): the same READ into one.
		e.Logf("device %s reports max_sge_rd 1: the READ goes into one SGE", e.Target.DeviceA)
		sgl = []verbs.SGE{SGE(loc, 40000, 3777)}
	}
	e.PostSend(qa, verbs.SendWR{ID: 3, Opcode: verbs.OpRead, Flags: verbs.SendSignaled,
		SGL: sgl, RemoteAddr: rem.Addr() + 33333, RKey: rem.RKey()})
	e.CheckOK(e.Wait1(e.A.CQ, "READ 3777 bytes"), 3, verbs.WCRead, "READ completion")
	got := slices.Clone(lb[40000:43777])
	if len(sgl) == 2 {
		got = append(slices.Clone(lb[40000:41777]), lb[50000:52000]...)
		e.CheckFill(lb, 41777, 50000, 0x11, "local memory between the READ SGEs")
		e.CheckFill(lb, 52000, len(lb), 0x11, "local memory after the READ SGEs")
	} else {
		e.CheckFill(lb, 43777, len(lb), 0x11, "local memory after the READ SGE")
	}
	if diff := DiffBytes(got, d3); diff != "" {
		e.Errorf("READ of 3777 bytes at remote offset 33333: %s", diff)
	}

	// A 1-byte READ at the very last byte of the region (range check
	// inclusive of the end).
	rb[len(rb)-1] = 0xc3
	e.PostSend(qa, verbs.SendWR{ID: 4, Opcode: verbs.OpRead, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{SGE(loc, 60000, 1)}, RemoteAddr: rem.Addr() + uint64(len(rb)-1), RKey: rem.RKey()})
	e.CheckOK(e.Wait1(e.A.CQ, "READ last byte"), 4, verbs.WCRead, "READ of the last byte")
	if lb[60000] != 0xc3 {
		e.Errorf("READ of the region's last byte gave %#02x, want 0xc3", lb[60000])
	}
	e.ExpectEmpty(e.A.CQ, "sender CQ after the WRITEs and READs")
	e.ExpectEmpty(e.B.CQ, "responder CQ: WRITE and READ consume no receive and make no completion")
}

const ruleWriteWithImm = "WRITE_WITH_IMM puts the data at the remote address (not in the receive buffer), consumes exactly one posted receive " +
	"(opcode RECV_RDMA_WITH_IMM, WC_WITH_IMM set, the immediate in host order), and leaves the next posted receive for the next SEND"

func caseWriteWithImm(e *Env) {
	e.Need(verbs.FeatureImmediate)
	const fill = 0xee
	qa, qb := e.Pair(QPConf{})
	src := e.MapReg(e.A, 8192, verbs.AccessLocalWrite, 0)
	rem := e.MapReg(e.B, 16384, AccessAll, fill)
	rbuf := e.MapReg(e.B, 2*4096, verbs.AccessLocalWrite, fill)
	e.PostRecv(qb, Recv(501, SGE(rbuf, 0, 4096)), Recv(502, SGE(rbuf, 4096, 4096)))

	data := Patterned(3000, 9)
	copy(src.Bytes(), data)
	e.PostSend(qa, verbs.SendWR{ID: 1, Opcode: verbs.OpWriteWithImm, Flags: verbs.SendSignaled, Imm: 0xdeadbeef,
		SGL: []verbs.SGE{SGE(src, 0, 3000)}, RemoteAddr: rem.Addr() + 4096 + 17, RKey: rem.RKey()})
	e.CheckOK(e.Wait1(e.A.CQ, "WRITE_WITH_IMM"), 1, verbs.WCWrite, "WRITE_WITH_IMM send completion")
	rwc := e.Wait1(e.B.CQ, "WRITE_WITH_IMM receive")
	if e.CheckOK(rwc, 501, verbs.WCRecvWriteWithImm, "WRITE_WITH_IMM receive completion (the first posted receive)") {
		if rwc.Flags&verbs.WCWithImm == 0 {
			e.Errorf("WRITE_WITH_IMM receive completion lacks WC_WITH_IMM: %s", FmtWC(rwc))
		}
		if rwc.Imm != 0xdeadbeef {
			e.Errorf("WRITE_WITH_IMM immediate = %#x, want 0xdeadbeef", rwc.Imm)
		}
		if rwc.QPN != qb.QPN() {
			e.Errorf("WRITE_WITH_IMM receive qp_num %#x, want %#x", rwc.QPN, qb.QPN())
		}
		e.Logf("WRITE_WITH_IMM receive byte_len = %d (3000 written)", rwc.ByteLen)
	}
	rb := rem.Bytes()
	if diff := DiffBytes(rb[4113:4113+3000], data); diff != "" {
		e.Errorf("WRITE_WITH_IMM data at remote offset 4113: %s", diff)
	}
	e.CheckFill(rb, 0, 4113, fill, "remote region before the written range")
	e.CheckFill(rb, 4113+3000, len(rb), fill, "remote region after the written range")
	e.CheckFill(rbuf.Bytes(), 0, len(rbuf.Bytes()), fill, "receive buffers (WRITE_WITH_IMM data must not land there)")
	// Exactly one receive consumed: nothing else on B's CQ, and the next
	// SEND lands in receive 502.
	e.ExpectEmpty(e.B.CQ, "receiver CQ after one WRITE_WITH_IMM")
	msg := Patterned(64, 10)
	copy(src.Bytes()[4096:], msg)
	e.PostSend(qa, verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(src, 4096, 64)}})
	e.CheckOK(e.Wait1(e.A.CQ, "SEND"), 2, verbs.WCSend, "SEND completion")
	rwc = e.Wait1(e.B.CQ, "SEND receive")
	if e.CheckOK(rwc, 502, verbs.WCRecv, "SEND after WRITE_WITH_IMM goes to the second receive") {
		if rwc.ByteLen != 64 || rwc.Flags&verbs.WCWithImm != 0 {
			e.Errorf("SEND receive: %s; want byte_len 64 without WITH_IMM", FmtWC(rwc))
		}
		if diff := DiffBytes(rbuf.Bytes()[4096:4096+64], msg); diff != "" {
			e.Errorf("SEND data in the second receive: %s", diff)
		}
	}
}

const ruleAtomics = "CAS and FAA on an 8-byte-aligned remote word return the old value into the local 8-byte SGE and update remote memory; " +
	"a CAS whose compare does not match leaves memory unchanged and still returns the current value; neighbouring words are untouched"

func needAtomics(e *Env) {
	e.Helper()
	e.Need(verbs.FeatureAtomics)
}

func caseAtomics(e *Env) {
	needAtomics(e)
	const fill = 0x77
	qa, _ := e.Pair(QPConf{})
	loc := e.MapReg(e.A, 4096, verbs.AccessLocalWrite, 0xff)
	rem := e.MapReg(e.B, 4096, AccessAll, fill)
	const woff = 8 * 37
	word := rem.Bytes()[woff : woff+8]
	ne := binary.NativeEndian
	v0 := uint64(0x1122334455667788)
	v1 := uint64(0x0102030405060708)
	ne.PutUint64(word, v0)
	steps := []struct {
		name        string
		op          verbs.Opcode
		cmpAdd, swp uint64
		old, after  uint64
	}{
		{"CAS matching", verbs.OpCompareSwap, v0, v1, v0, v1},
		{"CAS not matching", verbs.OpCompareSwap, v0, 0x9999, v1, v1},
		{"FAA +0x10", verbs.OpFetchAdd, 0x10, 0, v1, v1 + 0x10},
		{"FAA -1 (wraps)", verbs.OpFetchAdd, ^uint64(0), 0, v1 + 0x10, v1 + 0xf},
	}
	for i, s := range steps {
		id := uint64(i + 1)
		loff := 64 + 16*i
		e.PostSend(qa, verbs.SendWR{ID: id, Opcode: s.op, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(loc, loff, 8)},
			RemoteAddr: rem.Addr() + woff, RKey: rem.RKey(), CompareAdd: s.cmpAdd, Swap: s.swp})
		if !e.CheckOK(e.Wait1(e.A.CQ, s.name), id, verbs.WCOpcodeOf(s.op), s.name) {
			continue
		}
		if got := ne.Uint64(loc.Bytes()[loff:]); got != s.old {
			e.Errorf("%s: returned old value %#x, want %#x", s.name, got, s.old)
		}
		if got := ne.Uint64(word); got != s.after {
			e.Errorf("%s: remote word is %#x afterwards, want %#x", s.name, got, s.after)
		}
		e.CheckFill(loc.Bytes(), loff+8, loff+16, 0xff, s.name+": local memory after the 8-byte result SGE")
	}
	e.CheckFill(rem.Bytes(), 0, woff, fill, "remote words before the atomic word")
	e.CheckFill(rem.Bytes(), woff+8, 4096, fill, "remote words after the atomic word")
}

const ruleAtomicContention = "FAA is atomic across QPs: two connected pairs each issuing 500 FAA(+1) on the same remote word, " +
	"in chains of 10, lose no increment; the old values returned are exactly 0..999, each once"

func caseAtomicContention(e *Env) {
	needAtomics(e)
	const (
		perQP = 500
		chain = 10
	)
	rem := e.MapReg(e.B, 4096, AccessAll, 0)
	const woff = 256
	type worker struct {
		qp  verbs.QP
		cq  verbs.CQ
		res verbs.MR
	}
	var ws [2]worker
	for i := range ws {
		cq := e.NewCQ(e.A, 64, nil)
		qp, _ := e.PairWith(QPConf{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}}, QPConf{}, ConnConf{}, ConnConf{})
		ws[i] = worker{qp: qp, cq: cq, res: e.MapReg(e.A, perQP*8, verbs.AccessLocalWrite, 0xff)}
	}
	errs := make(chan error, len(ws))
	var wg sync.WaitGroup
	deadline := time.Now().Add(3 * Timeout)
	for wi, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				for base := 0; base < perQP; base += chain {
					wrs := make([]verbs.SendWR, chain)
					for j := range wrs {
						k := base + j
						wrs[j] = verbs.SendWR{ID: uint64(k), Opcode: verbs.OpFetchAdd, Flags: verbs.SendSignaled,
							SGL: []verbs.SGE{SGE(w.res, 8*k, 8)}, RemoteAddr: rem.Addr() + woff, RKey: rem.RKey(), CompareAdd: 1}
					}
					if n, err := w.qp.PostSend(wrs); err != nil || n != chain {
						return fmt.Errorf("QP %d: PostSend chain at %d: n=%d err=%v", wi, base, n, err)
					}
					wcs, err := PollN(w.cq, chain, deadline)
					if err != nil {
						return fmt.Errorf("QP %d: chain at %d: %w", wi, base, err)
					}
					for j, wc := range wcs {
						if wc.Status != verbs.WCSuccess || wc.WRID != uint64(base+j) || wc.Opcode != verbs.WCFetchAdd {
							return fmt.Errorf("QP %d: chain at %d: completion %d is %s; want wr_id %d SUCCESS FETCH_ADD", wi, base, j, FmtWC(wc), base+j)
						}
					}
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			e.Error(err)
		}
	}
	if e.Failed() {
		return
	}
	ne := binary.NativeEndian
	if got := ne.Uint64(rem.Bytes()[woff:]); got != 2*perQP {
		e.Errorf("remote counter = %d after 2x%d FAA(+1); want %d (lost increments)", got, perQP, 2*perQP)
	}
	seen := make([]int, 2*perQP)
	for wi, w := range ws {
		for k := 0; k < perQP; k++ {
			old := ne.Uint64(w.res.Bytes()[8*k:])
			if old >= uint64(len(seen)) {
				e.Errorf("QP %d FAA %d returned old value %d, out of 0..%d", wi, k, old, len(seen)-1)
				continue
			}
			seen[old]++
		}
	}
	for v, n := range seen {
		if n != 1 {
			e.Errorf("old value %d was returned %d times; every value 0..%d must come back exactly once", v, n, len(seen)-1)
			break
		}
	}
}

const ruleInline = "an inline SEND (SendInline, size <= the granted MaxInlineData) copies its data at post time: " +
	"the buffer is overwritten right after PostSend returns and the peer still receives the original bytes. " +
	"Skipped (inline part only) when the provider grants MaxInlineData = 0"

func caseInline(e *Env) {
	qc := QPConf{Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}}
	qa, err := e.TryCreateQP(e.A, qc)
	if err != nil {
		e.Logf("CreateQP with MaxInlineData 64 failed (%v); retrying without inline", err)
		qc.Cap.MaxInlineData = 0
		qa = e.CreateQP(e.A, qc)
	}
	granted := qa.Cap().MaxInlineData
	if granted == 0 {
		e.Skipf("inline part skipped: provider granted MaxInlineData = 0 (requested 64); nothing may be posted inline on this QP")
	}
	qb := e.CreateQP(e.B, QPConf{Cap: qc.Cap})
	e.Connect(qa, qb, ConnConf{}, ConnConf{})
	src := e.MapReg(e.A, 8192, verbs.AccessLocalWrite, 0)
	dst := e.MapReg(e.B, 8192, verbs.AccessLocalWrite, 0xee)
	sizes := []int{1, min(granted, 64)}
	if granted > 64 && granted <= 4096 {
		sizes = append(sizes, granted)
	}
	e.Logf("granted MaxInlineData = %d; inline sizes %v", granted, sizes)
	for i, n := range slices.Compact(sizes) {
		id := uint64(i + 1)
		what := fmt.Sprintf("inline SEND of %d bytes", n)
		data := Patterned(n, id+40)
		sb := src.Bytes()
		copy(sb, data)
		e.PostRecv(qb, Recv(100+id, SGE(dst, 0, 8192)))
		// Two SGEs when possible, so the copy gathers.
		sgl := []verbs.SGE{SGE(src, 0, n)}
		if n > 1 {
			sgl = []verbs.SGE{SGE(src, 0, n/2), SGE(src, n/2, n-n/2)}
		}
		e.PostSend(qa, verbs.SendWR{ID: id, Opcode: verbs.OpSend, Flags: verbs.SendSignaled | verbs.SendInline, SGL: sgl})
		for j := range n { // overwrite at once: inline data was copied at post time
			sb[j] = ^data[j]
		}
		rwc := e.Wait1(e.B.CQ, what+": receive")
		e.CheckOK(e.Wait1(e.A.CQ, what+": send"), id, verbs.WCSend, what+": send completion")
		if e.CheckOK(rwc, 100+id, verbs.WCRecv, what+": receive completion") {
			if rwc.ByteLen != uint32(n) {
				e.Errorf("%s: byte_len %d", what, rwc.ByteLen)
			}
			if diff := DiffBytes(dst.Bytes()[:n], data); diff != "" {
				e.Errorf("%s: the peer did not get the bytes as they were at post time: %s", what, diff)
			}
		}
	}
}

const ruleUnsignaled = "unsignaled WRs complete silently: after N unsignaled WRITEs and one signaled WRITE, exactly one completion " +
	"(the signaled wr_id) arrives on the sender CQ, nothing for the others (checked with a later signaled marker), " +
	"and the data of all N+1 WRITEs is at the remote"

func caseUnsignaled(e *Env) {
	const n = 8
	qa, _ := e.Pair(QPConf{})
	loc := e.MapReg(e.A, 16384, verbs.AccessLocalWrite, 0)
	rem := e.MapReg(e.B, 16384, AccessAll, 0xee)
	var wrs []verbs.SendWR
	var datas [][]byte
	for i := 0; i <= n; i++ {
		d := Patterned(300, uint64(i)+500)
		datas = append(datas, d)
		copy(loc.Bytes()[i*512:], d)
		wr := verbs.SendWR{ID: uint64(i + 1), Opcode: verbs.OpWrite, SGL: []verbs.SGE{SGE(loc, i*512, 300)},
			RemoteAddr: rem.Addr() + uint64(i*1024+3), RKey: rem.RKey()}
		if i == n {
			wr.ID = 100
			wr.Flags = verbs.SendSignaled
		}
		wrs = append(wrs, wr)
	}
	// Post the unsignaled ones singly and the signaled one alone, the
	// common pattern of a sender that signals every N-th WR.
	for _, wr := range wrs {
		e.PostSend(qa, wr)
	}
	e.CheckOK(e.Wait1(e.A.CQ, "signaled WRITE after unsignaled ones"), 100, verbs.WCWrite, "the only completion")
	e.PostSend(qa, verbs.SendWR{ID: 200, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(loc, 9000, 8)},
		RemoteAddr: rem.Addr() + 12000, RKey: rem.RKey()})
	e.CheckOK(e.Wait1(e.A.CQ, "marker WRITE"), 200, verbs.WCWrite, "next completion must be the marker (no completion for unsignaled WRs)")
	e.ExpectEmpty(e.A.CQ, "sender CQ")
	e.Placed(qa, e.A.CQ, rem)
	for i, d := range datas {
		off := i*1024 + 3
		if diff := DiffBytes(rem.Bytes()[off:off+300], d); diff != "" {
			e.Errorf("WRITE %d (signaled=%v) data at remote: %s", i, i == n, diff)
		}
	}
}
