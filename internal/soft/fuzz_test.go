package soft

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// FuzzFrames feeds arbitrary bytes, as a peer would send them after the
// hello, to a connection's reader in front of real QPs: an RC responder
// (B), a UD QP (U) and an RC requester (A) with WRs waiting for
// responses. Whatever the bytes, the reader must not panic, allocate by
// the lengths it is told, or leak a reference to an MR or QP.
//
// The seeds are symbolic so that they reach the QPs whatever their
// numbers and keys: in each frame header a destination QPN of 1, 2 or 3
// names B, U or A, and an rkey of 1 names B's MR, with the remote address
// taken as an offset into it.
func FuzzFrames(f *testing.F) {
	env := newFuzzEnv(f) // seeds: testdata/fuzz/FuzzFrames (see TestFuzzSeeds)
	f.Fuzz(func(t *testing.T, data []byte) {
		env.arm(t)
		c := newStreamConn(bytes.NewReader(env.symbolize(data)), fuzzPeer)
		env.bind(c)
		for i := 0; i <= len(data)/hdrSize; i++ {
			if err := c.readFrame(); err != nil {
				c.fail(err, errors.Is(err, errProtocol))
				break
			}
		}
		c.fail(errors.New("end of input"), false)
		env.check(t)
	})
}

var fuzzPeer = netip.MustParseAddrPort("127.0.0.1:9")

type fuzzEnv struct {
	ctx        verbs.Context
	pd         verbs.PD
	cq         verbs.CQ
	mr         *mr
	a, b, u    *qp
	buf        []byte
	wc         []verbs.WorkCompletion
	fakeRemote verbs.Address
}

func newFuzzEnv(f *testing.F) *fuzzEnv {
	e := &fuzzEnv{wc: make([]verbs.WorkCompletion, 64)}
	var err error
	e.ctx, err = Provider.Open(DeviceName)
	must(f, err)
	f.Cleanup(func() { mustClose(f, e.ctx) })
	e.pd, err = e.ctx.AllocPD()
	must(f, err)
	f.Cleanup(func() { mustClose(f, e.pd) })
	e.cq, err = e.ctx.CreateCQ(maxCQE, nil)
	must(f, err)
	f.Cleanup(func() { mustClose(f, e.cq) })
	e.buf = mapMem(f, 1<<16)
	m, err := e.pd.RegMR(e.buf, allAccess)
	must(f, err)
	f.Cleanup(func() { mustClose(f, m) })
	e.mr = m.(*mr)
	mk := func(typ verbs.QPType) *qp {
		q, err := e.pd.CreateQP(verbs.QPInit{Type: typ, SendCQ: e.cq, RecvCQ: e.cq, Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 2, MaxRecvSGE: 2}})
		must(f, err)
		f.Cleanup(func() { mustClose(f, q) })
		return q.(*qp)
	}
	e.a, e.b, e.u = mk(verbs.RC), mk(verbs.RC), mk(verbs.UD)
	e.fakeRemote = verbs.Address{Port: 1, LID: fuzzPeer.Port(), GID: verbs.GIDFromIP(fuzzPeer.Addr())}
	return e
}

func (e *fuzzEnv) sge(off, n int) verbs.SGE {
	return verbs.SGE{Addr: e.mr.addr + uint64(off), Length: uint32(n), LKey: e.mr.lkey}
}

// arm resets the QPs to a known state: B and U with receives posted, A
// with a WRITE, a READ and a FAA sent and waiting for their responses.
func (e *fuzzEnv) arm(t *testing.T) {
	for _, q := range []*qp{e.a, e.b, e.u} {
		must(t, q.ToReset())
		must(t, q.ToInit(verbs.InitAttr{Port: 1, Access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic, QKey: 0x1111}))
		if q == e.u {
			must(t, q.ToRTR(verbs.RTRAttr{}))
		} else {
			must(t, q.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU4096, DestQPN: fakeQPN, Dest: e.fakeRemote, MinRNRTimer: 1}))
		}
		must(t, q.ToRTS(verbs.RTSAttr{Timeout: 31, RetryCount: 7, RNRRetry: 3, MaxRdAtomic: 16}))
	}
	_, err := e.b.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{e.sge(0, 100)}}, {ID: 2, SGL: []verbs.SGE{e.sge(100, 50), e.sge(200, 50)}}})
	must(t, err)
	_, err = e.u.PostRecv([]verbs.RecvWR{{ID: 3, SGL: []verbs.SGE{e.sge(1000, 200)}}})
	must(t, err)
	// A's WRs, marked sent on the fuzz connection without a worker run.
	a := e.a
	a.mu.Lock()
	_, err = a.postSend([]verbs.SendWR{
		{ID: 10, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{e.sge(0, 16)}, RemoteAddr: 0, RKey: 1},
		{ID: 11, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{e.sge(2000, 16)}, RemoteAddr: 0, RKey: 1},
		{ID: 12, Opcode: verbs.OpFetchAdd, Flags: verbs.SendSignaled, SGL: []verbs.SGE{e.sge(3000, 8)}, RemoteAddr: 0, RKey: 1},
	})
	a.sent = a.tail
	a.rdOut = 2
	a.lastProgress = time.Now()
	a.mu.Unlock()
	must(t, err)
}

// bind makes c the connection A sent its WRs on.
func (e *fuzzEnv) bind(c *conn) {
	e.a.mu.Lock()
	e.a.conn = c
	e.a.mu.Unlock()
}

func (e *fuzzEnv) symbolize(data []byte) []byte {
	out := append([]byte(nil), data...)
	be := binary.BigEndian
	for off := 0; off+hdrSize <= len(out); {
		h := out[off : off+hdrSize]
		if be.Uint32(h) != wireMagic {
			break
		}
		switch be.Uint32(h[8:]) {
		case 1:
			be.PutUint32(h[8:], e.b.qpn)
		case 2:
			be.PutUint32(h[8:], e.u.qpn)
		case 3:
			be.PutUint32(h[8:], e.a.qpn)
		}
		if be.Uint32(h[28:]) == 1 {
			be.PutUint32(h[28:], e.mr.rkey)
			be.PutUint64(h[32:], be.Uint64(h[32:])+e.mr.addr)
		}
		off += hdrSize + int(be.Uint32(h[20:]))
	}
	return out
}

// check drains the CQ and verifies nothing is still held, once the
// QPs' workers have finished what they were doing (A's, after an RNR NAK,
// may be sending its WRs again, or dialing the peer whose connection
// just failed, with their SGEs resolved).
func (e *fuzzEnv) check(t *testing.T) {
	for _, q := range []*qp{e.a, e.b, e.u} {
		q.mu.Lock()
		for q.busy > 0 {
			q.idle.Wait()
		}
		q.mu.Unlock()
	}
	for {
		n, err := e.cq.Poll(e.wc)
		must(t, err)
		if n == 0 {
			break
		}
	}
	handleOverflows()
	if n := e.mr.refs.n.Load(); n != 0 {
		t.Fatalf("MR still held %d times", n)
	}
	for _, q := range []*qp{e.a, e.b, e.u} {
		if n := q.refs.n.Load(); n != 0 {
			t.Fatalf("QP %#x still held %d times", q.qpn, n)
		}
	}
}

type seed struct {
	name string
	data []byte
}

func frame(h header, payload ...byte) []byte {
	var b [hdrSize]byte
	h.length = uint32(len(payload))
	h.encode(&b)
	return append(b[:], payload...)
}

func req(op verbs.Opcode, psn uint32) header {
	return header{typ: frameRequest, op: uint8(op), qpType: verbs.RC, dst: 1, src: fakeQPN, psn: psn, key: 1}
}

func cat(frames ...[]byte) []byte { return bytes.Join(frames, nil) }

// fuzzSeeds are the checked-in corpus, built from the encoder.
func fuzzSeeds() []seed {
	pay := func(n int) []byte { return bytes.Repeat([]byte{0xab}, n) }
	write := req(verbs.OpWrite, 0)
	send := req(verbs.OpSend, 0)
	sendImm := req(verbs.OpSendWithImm, 0)
	sendImm.flags, sendImm.imm = flagImm|flagSolicited, 7
	writeImm := req(verbs.OpWriteWithImm, 0)
	writeImm.flags, writeImm.addr = flagImm, 64
	read := req(verbs.OpRead, 0)
	read.compare = 32
	cas := req(verbs.OpCompareSwap, 0)
	cas.addr, cas.compare, cas.swap = 8, 0, 5
	faa := req(verbs.OpFetchAdd, 1)
	faa.addr, faa.compare = 8, 3
	ud := header{typ: frameRequest, op: uint8(verbs.OpSend), qpType: verbs.UD, dst: 2, src: 0x99, key: 0x1111}
	resp := func(typ uint8, psn uint32) header { return header{typ: typ, dst: 3, src: fakeQPN, psn: psn} }
	nak := func(code uint8, psn uint32) header {
		h := resp(frameNak, psn)
		h.op, h.aux = code, 1
		return h
	}
	atomicResp := resp(frameAtomicResp, 2)
	atomicResp.compare = 42
	unknown := req(verbs.OpWrite, 0)
	unknown.dst = 0xfffff0
	badMagic := frame(write, pay(4)...)
	badMagic[0] = 'X'
	badVersion := frame(write, pay(4)...)
	badVersion[4] = 9
	huge := frame(write)
	binary.BigEndian.PutUint32(huge[20:], 0x7fffffff)
	hello := header{typ: frameHello}
	return []seed{
		{"write", frame(write, pay(16)...)},
		{"write-beyond-mr", frame(func() header { h := write; h.addr = 1<<16 - 4; return h }(), pay(16)...)},
		{"send", frame(send, pay(8)...)},
		{"send-two-sges", frame(sendImm, pay(90)...)},
		{"send-too-long", frame(send, pay(200)...)},
		{"write-imm", frame(writeImm, pay(8)...)},
		{"read", frame(read)},
		{"cas-faa", cat(frame(cas), frame(faa))},
		{"pipeline", cat(frame(write, pay(4)...), frame(func() header { h := send; h.psn = 1; return h }(), pay(4)...), frame(func() header { h := read; h.psn = 2; return h }()))},
		{"psn-gap", frame(func() header { h := write; h.psn = 5; return h }(), pay(4)...)},
		{"ud", frame(ud, pay(20)...)},
		{"ud-wrong-qkey", frame(func() header { h := ud; h.key = 2; return h }(), pay(20)...)},
		{"responses", cat(frame(resp(frameAck, 0)), frame(resp(frameReadResp, 1), pay(16)...), frame(atomicResp))},
		{"rnr-nak", frame(nak(nakRNR, 0))},
		{"access-nak", frame(nak(nakRemAccess, 0))},
		{"ack-all", frame(resp(frameAck, 2))},
		{"read-resp-short", cat(frame(resp(frameAck, 0)), frame(resp(frameReadResp, 1), pay(8)...))},
		{"unknown-qp", frame(unknown, pay(4)...)},
		{"bad-magic", badMagic},
		{"bad-version", badVersion},
		{"huge-length", huge},
		{"truncated-header", frame(write)[:40]},
		{"truncated-payload", frame(write, pay(64)...)[:hdrSize+10]},
		{"hello-mid-stream", frame(hello, pay(helloLen)...)},
	}
}

// TestFuzzSeeds keeps the checked-in corpus equal to fuzzSeeds; run with
// SOFT_UPDATE_SEEDS=1 to rewrite it after a change of the wire format.
func TestFuzzSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzFrames")
	for _, s := range fuzzSeeds() {
		want := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(s.data)))
		path := filepath.Join(dir, s.name)
		if os.Getenv("SOFT_UPDATE_SEEDS") == "1" {
			must(t, os.MkdirAll(dir, 0o755))
			must(t, os.WriteFile(path, []byte(want), 0o644))
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != want {
			t.Errorf("seed %s is stale or missing (regenerate with SOFT_UPDATE_SEEDS=1): %v", path, err)
		}
	}
}

func TestDecodeHeaderRoundTrip(t *testing.T) {
	h := header{typ: frameRequest, op: uint8(verbs.OpCompareSwap), flags: flagSolicited, qpType: verbs.RC, dst: 5, src: 6, psn: psnMask, key: 9, addr: 64, compare: 1, swap: 2}
	var b [hdrSize]byte
	h.encode(&b)
	var g header
	must(t, decodeHeader(b[:], &g))
	if g != h {
		t.Fatalf("%+v != %+v", g, h)
	}
	if err := decodeHeader(b[:10], &g); !errors.Is(err, errProtocol) {
		t.Fatal(err)
	}
}
