package soft

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

func TestDevice(t *testing.T) {
	if Provider.Name() != "soft" {
		t.Fatalf("name %q", Provider.Name())
	}
	if _, err := Provider.Open("mlx5_0"); !errors.Is(err, verbs.ErrNoDevice) {
		t.Fatalf("open mlx5_0: %v, want ErrNoDevice", err)
	}
	ctx, err := Provider.Open("")
	must(t, err)
	defer mustClose(t, ctx)
	info := ctx.Info()
	if info.Name != DeviceName || info.Transport != "software" || !info.Usable || len(info.Ports) != 1 {
		t.Fatalf("info %+v", info)
	}
	p := info.Ports[0]
	if p.State != verbs.PortActive || p.LinkLayer != "Ethernet" || p.ActiveMTU != verbs.MTU4096 || p.LID == 0 {
		t.Fatalf("port %+v", p)
	}
	g, err := verbs.SelectGID(p, true)
	must(t, err)
	if g.Type != verbs.GIDTypeRoCEv2 || g.GID.IP().String() != "127.0.0.1" {
		t.Fatalf("gid %+v", g)
	}
	devs, err := Provider.Devices()
	must(t, err)
	if len(devs) != 1 || devs[0].Ports[0].LID != p.LID {
		t.Fatalf("devices %+v, open port LID %d", devs, p.LID)
	}
	pa, err := ctx.QueryPort(1)
	must(t, err)
	if pa.LID != p.LID || pa.MaxMsgSize < 1<<20 {
		t.Fatalf("port attr %+v", pa)
	}
	if _, err := ctx.QueryPort(2); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("query port 2: %v", err)
	}
	gid, err := ctx.QueryGID(1, 0)
	must(t, err)
	if gid != g.GID {
		t.Fatalf("gid %v != %v", gid, g.GID)
	}
	// Two contexts share the device and its listener.
	ctx2, err := Provider.Open(DeviceName)
	must(t, err)
	if ctx2.Info().Ports[0].LID != p.LID {
		t.Fatal("second context sees another LID")
	}
	mustClose(t, ctx2)
}

func TestLifetime(t *testing.T) {
	ctx, err := Provider.Open(DeviceName)
	must(t, err)
	pd, err := ctx.AllocPD()
	must(t, err)
	cq, err := ctx.CreateCQ(8, nil)
	must(t, err)
	buf := mapMem(t, 4096)
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite)
	must(t, err)
	qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	must(t, err)

	for _, c := range []interface{ Close() error }{ctx, pd, cq} {
		if err := c.Close(); !errors.Is(err, verbs.ErrBusy) {
			t.Fatalf("close %T with children: %v, want ErrBusy", c, err)
		}
	}
	must(t, qp.Close())
	must(t, qp.Close()) // twice is fine
	if _, err := qp.State(); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("state after close: %v", err)
	}
	if _, err := qp.PostSend([]verbs.SendWR{{}}); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("post after close: %v", err)
	}
	if err := pd.Close(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("close pd with an MR: %v", err)
	}
	must(t, mr.Close())
	must(t, cq.Close())
	if _, err := cq.Poll(make([]verbs.WorkCompletion, 1)); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("poll after close: %v", err)
	}
	must(t, pd.Close())
	if _, err := pd.RegMR(buf, 0); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("reg mr on closed pd: %v", err)
	}
	must(t, ctx.Close())
	must(t, ctx.Close())
	if _, err := ctx.AllocPD(); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("alloc pd on closed context: %v", err)
	}
}

func TestRegMR(t *testing.T) {
	s := newSide(t, sideOpt{})
	if _, err := s.pd.RegMR(nil, verbs.AccessLocalWrite); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("zero-length: %v", err)
	}
	if _, err := s.pd.RegMR(make([]byte, 4096), verbs.AccessLocalWrite); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("Go heap memory: %v", err)
	}
	if _, err := s.pd.RegMR(s.buf, verbs.AccessRemoteWrite); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("REMOTE_WRITE without LOCAL_WRITE: %v", err)
	}
	// Keys are random: no two of many registrations are consecutive.
	var ks []uint32
	for range 16 {
		mr, err := s.pd.RegMR(s.buf[100:200], verbs.AccessLocalWrite)
		must(t, err)
		if mr.Addr() != s.mr.Addr()+100 || mr.Len() != 100 {
			t.Fatalf("addr %#x len %d", mr.Addr(), mr.Len())
		}
		ks = append(ks, mr.LKey(), mr.RKey())
		defer mr.Close()
	}
	seq := 0
	for i := 1; i < len(ks); i++ {
		if d := ks[i] - ks[i-1]; d <= 2 {
			seq++
		}
	}
	if seq > 1 {
		t.Fatalf("keys look sequential: %x", ks)
	}
}

func TestSendRecv(t *testing.T) {
	transports(t, func(t *testing.T) {
		a := newSide(t, sideOpt{size: 4 << 20})
		b := newSide(t, sideOpt{size: 4 << 20})
		connect(t, a, b, connOpt{rnrRetry: 7})
		for _, n := range []int{0, 1, 4095, 4096, 1 << 20} {
			fill(a.buf[:n], byte(n))
			clear(b.buf[:n+16])
			b.postRecv(uint64(n), b.sge(0, n+16))
			a.post(verbs.SendWR{ID: 7, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, n)}})
			wc := pollOK(t, a.scq)
			if wc.WRID != 7 || wc.Opcode != verbs.WCSend {
				t.Fatalf("send wc %+v", wc)
			}
			wc = pollOK(t, b.rcq)
			if wc.WRID != uint64(n) || wc.Opcode != verbs.WCRecv || int(wc.ByteLen) != n || wc.Flags&verbs.WCWithImm != 0 || wc.QPN != b.qp.QPN() || wc.SrcQP != a.qp.QPN() {
				t.Fatalf("recv wc %+v", wc)
			}
			if !bytes.Equal(a.buf[:n], b.buf[:n]) {
				t.Fatalf("%d bytes: data differs", n)
			}
		}
		// Several SGEs on both sides, with immediate.
		fill(a.buf[:300], 3)
		b.postRecv(99, b.sge(1000, 100), b.sge(5000, 50), b.sge(9000, 200))
		a.post(verbs.SendWR{ID: 8, Opcode: verbs.OpSendWithImm, Imm: 0xdeadbeef, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{a.sge(0, 120), a.sge(120, 30), a.sge(150, 150)}})
		pollOK(t, a.scq)
		wc := pollOK(t, b.rcq)
		if wc.Flags&verbs.WCWithImm == 0 || wc.Imm != 0xdeadbeef || wc.ByteLen != 300 {
			t.Fatalf("imm wc %+v", wc)
		}
		got := append(append(append([]byte{}, b.buf[1000:1100]...), b.buf[5000:5050]...), b.buf[9000:9150]...)
		if !bytes.Equal(got, a.buf[:300]) {
			t.Fatal("scattered data differs")
		}
	})
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

func TestOneSided(t *testing.T) {
	transports(t, func(t *testing.T) {
		a, b := pair(t, verbs.RC, connOpt{rnrRetry: 7})
		// WRITE at an offset.
		fill(a.buf[:5000], 1)
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 5000)}, RemoteAddr: b.mr.Addr() + 333, RKey: b.mr.RKey()})
		if wc := pollOK(t, a.scq); wc.Opcode != verbs.WCWrite || wc.WRID != 1 {
			t.Fatalf("write wc %+v", wc)
		}
		if !bytes.Equal(b.buf[333:5333], a.buf[:5000]) {
			t.Fatal("write data differs")
		}
		empty(t, b.rcq)

		// WRITE_WITH_IMM: data at the address, one receive consumed.
		fill(a.buf[:100], 9)
		b.postRecv(55)
		a.post(verbs.SendWR{ID: 2, Opcode: verbs.OpWriteWithImm, Imm: 42, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 100)}, RemoteAddr: b.mr.Addr() + 8000, RKey: b.mr.RKey()})
		pollOK(t, a.scq)
		wc := pollOK(t, b.rcq)
		if wc.WRID != 55 || wc.Opcode != verbs.WCRecvWriteWithImm || wc.Flags&verbs.WCWithImm == 0 || wc.Imm != 42 || wc.ByteLen != 100 {
			t.Fatalf("write-imm recv wc %+v", wc)
		}
		if !bytes.Equal(b.buf[8000:8100], a.buf[:100]) {
			t.Fatal("write-imm data differs")
		}

		// READ into two SGEs.
		fill(b.buf[20000:23000], 5)
		a.post(verbs.SendWR{ID: 3, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(30000, 1000), a.sge(40000, 2000)}, RemoteAddr: b.mr.Addr() + 20000, RKey: b.mr.RKey()})
		if wc := pollOK(t, a.scq); wc.Opcode != verbs.WCRead || wc.ByteLen != 3000 {
			t.Fatalf("read wc %+v", wc)
		}
		if !bytes.Equal(a.buf[30000:31000], b.buf[20000:21000]) || !bytes.Equal(a.buf[40000:42000], b.buf[21000:23000]) {
			t.Fatal("read data differs")
		}

		// CAS and FAA return the old value.
		word := b.buf[4096:4104]
		binary.NativeEndian.PutUint64(word, 10)
		a.post(verbs.SendWR{ID: 4, Opcode: verbs.OpCompareSwap, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(64, 8)}, RemoteAddr: b.mr.Addr() + 4096, RKey: b.mr.RKey(), CompareAdd: 10, Swap: 77})
		if wc := pollOK(t, a.scq); wc.Opcode != verbs.WCCompareSwap {
			t.Fatalf("cas wc %+v", wc)
		}
		if old := binary.NativeEndian.Uint64(a.buf[64:]); old != 10 || binary.NativeEndian.Uint64(word) != 77 {
			t.Fatalf("cas: old %d, now %d", old, binary.NativeEndian.Uint64(word))
		}
		a.post(verbs.SendWR{ID: 5, Opcode: verbs.OpCompareSwap, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(64, 8)}, RemoteAddr: b.mr.Addr() + 4096, RKey: b.mr.RKey(), CompareAdd: 10, Swap: 1})
		pollOK(t, a.scq)
		if old := binary.NativeEndian.Uint64(a.buf[64:]); old != 77 || binary.NativeEndian.Uint64(word) != 77 {
			t.Fatal("failed cas changed the word")
		}
		a.post(verbs.SendWR{ID: 6, Opcode: verbs.OpFetchAdd, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(64, 8)}, RemoteAddr: b.mr.Addr() + 4096, RKey: b.mr.RKey(), CompareAdd: 3})
		if wc := pollOK(t, a.scq); wc.Opcode != verbs.WCFetchAdd {
			t.Fatalf("faa wc %+v", wc)
		}
		if old := binary.NativeEndian.Uint64(a.buf[64:]); old != 77 || binary.NativeEndian.Uint64(word) != 80 {
			t.Fatal("faa")
		}
	})
}

func TestAtomicsContended(t *testing.T) {
	transports(t, func(t *testing.T) {
		target := newSide(t, sideOpt{})
		const per = 300
		var wg sync.WaitGroup
		for i := range 3 {
			a := newSide(t, sideOpt{})
			peer := newSide(t, sideOpt{ctx: target.ctx, pd: target.pd})
			connect(t, a, peer, connOpt{})
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < per; k++ {
					a.post(verbs.SendWR{ID: uint64(k), Opcode: verbs.OpFetchAdd, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(8*(k%8), 8)}, RemoteAddr: target.mr.Addr(), RKey: target.mr.RKey(), CompareAdd: 1})
					pollOK(t, a.scq)
				}
			}()
			_ = i
		}
		// The target's application adds too, with sync/atomic.
		for k := 0; k < per; k++ {
			atomicOp(target.buf[:8], verbs.OpFetchAdd, 1, 0)
		}
		wg.Wait()
		if got := binary.NativeEndian.Uint64(target.buf); got != 4*per {
			t.Fatalf("counter %d, want %d", got, 4*per)
		}
	})
}

func TestInlineAndUnsignaled(t *testing.T) {
	transports(t, func(t *testing.T) {
		a, b := pair(t, verbs.RC, connOpt{rnrRetry: 7})
		if c := a.qp.Cap(); c.MaxInlineData < 64 || c.MaxSendWR < 64 || c.MaxSendSGE < 4 {
			t.Fatalf("granted caps %+v below the request", c)
		}
		fill(a.buf[:64], 1)
		want := append([]byte{}, a.buf[:64]...)
		b.postRecv(1, b.sge(0, 64))
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendInline | verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 64)}})
		clear(a.buf[:64]) // the inline buffer is free at once
		pollOK(t, a.scq)
		pollOK(t, b.rcq)
		if !bytes.Equal(b.buf[:64], want) {
			t.Fatal("inline data was read after the post")
		}
		big := a.qp.Cap().MaxInlineData + 1
		if _, err := a.qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, Flags: verbs.SendInline, SGL: []verbs.SGE{a.sge(0, big)}}}); !errors.Is(err, verbs.ErrInvalid) {
			t.Fatalf("inline beyond the cap: %v", err)
		}

		// Ten unsignaled WRITEs, then a signaled one: one completion.
		for i := range 10 {
			a.post(verbs.SendWR{ID: uint64(100 + i), Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.sge(0, 16)}, RemoteAddr: b.mr.Addr() + uint64(16*i), RKey: b.mr.RKey()})
		}
		a.post(verbs.SendWR{ID: 200, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 16)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
		if wc := pollOK(t, a.scq); wc.WRID != 200 {
			t.Fatalf("got %+v, want only wr 200", wc)
		}
		empty(t, a.scq)
	})
}

func TestSignalAll(t *testing.T) {
	a := newSide(t, sideOpt{})
	b := newSide(t, sideOpt{})
	qp, err := a.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: a.scq, RecvCQ: a.rcq, SignalAll: true, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
	must(t, err)
	defer qp.Close()
	a2 := *a
	a2.qp = qp
	connect(t, &a2, b, connOpt{})
	a2.post(verbs.SendWR{ID: 3, Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	if wc := pollOK(t, a.scq); wc.WRID != 3 {
		t.Fatalf("%+v", wc)
	}
}

func TestRNR(t *testing.T) {
	transports(t, func(t *testing.T) {
		a, b := pair(t, verbs.RC, connOpt{rnrRetry: 2, minRNR: 1})
		start := time.Now()
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 8)}},
			verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 8)}})
		wcs := poll(t, a.scq, 2)
		if wcs[0].WRID != 1 || wcs[0].Status != verbs.WCRNRRetryExcErr || !errors.Is(wcs[0].Err(), verbs.ErrRNRRetryExceeded) {
			t.Fatalf("first %+v", wcs[0])
		}
		if wcs[1].WRID != 2 || wcs[1].Status != verbs.WCWRFlushErr {
			t.Fatalf("second %+v", wcs[1])
		}
		waitState(t, a.qp, verbs.StateError)
		if time.Since(start) > 5*time.Second {
			t.Fatalf("RNR failure took %v", time.Since(start))
		}
		if err := QPError(a.qp); err == nil {
			t.Fatal("no error recorded")
		}
		// The responder is not hurt by an RNR.
		waitState(t, b.qp, verbs.StateRTS)
	})
}

func TestRNRRecovers(t *testing.T) {
	transports(t, func(t *testing.T) {
		a, b := pair(t, verbs.RC, connOpt{rnrRetry: 7, minRNR: 1})
		fill(a.buf[:32], 4)
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 32)}},
			verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 32)}, RemoteAddr: b.mr.Addr() + 100, RKey: b.mr.RKey()})
		// The send waits (RNR, infinite retries) until a receive appears;
		// the WRITE behind it waits too.
		runtimeYield(50)
		empty(t, a.scq)
		b.postRecv(9, b.sge(0, 32))
		wcs := poll(t, a.scq, 2)
		if wcs[0].WRID != 1 || wcs[1].WRID != 2 || wcs[0].Status != 0 || wcs[1].Status != 0 {
			t.Fatalf("%+v", wcs)
		}
		pollOK(t, b.rcq)
		if !bytes.Equal(b.buf[:32], a.buf[:32]) || !bytes.Equal(b.buf[100:132], a.buf[:32]) {
			t.Fatal("data")
		}
	})
}

// runtimeYield lets the provider's goroutines run a while; it is not a
// synchronisation, the test holds either way.
func runtimeYield(n int) {
	for range n {
		time.Sleep(100 * time.Microsecond)
	}
}

func TestRemoteAccessErrors(t *testing.T) {
	transports(t, func(t *testing.T) {
		cases := []struct {
			name string
			wr   func(a, b *side) verbs.SendWR
			acc  verbs.Access
		}{
			{"bad rkey", func(a, b *side) verbs.SendWR {
				return verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey() ^ 0x5a5a}
			}, allAccess},
			{"lkey as rkey", func(a, b *side) verbs.SendWR {
				return verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.LKey()}
			}, allAccess},
			{"past the end", func(a, b *side) verbs.SendWR {
				return verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.sge(0, 16)}, RemoteAddr: b.mr.Addr() + uint64(b.mr.Len()) - 8, RKey: b.mr.RKey()}
			}, allAccess},
			{"before the start", func(a, b *side) verbs.SendWR {
				return verbs.SendWR{Opcode: verbs.OpRead, SGL: []verbs.SGE{a.sge(0, 16)}, RemoteAddr: b.mr.Addr() - 8, RKey: b.mr.RKey()}
			}, allAccess},
			{"no REMOTE_WRITE", func(a, b *side) verbs.SendWR {
				return verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
			}, verbs.AccessLocalWrite | verbs.AccessRemoteRead},
			{"no REMOTE_READ", func(a, b *side) verbs.SendWR {
				return verbs.SendWR{Opcode: verbs.OpRead, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
			}, verbs.AccessLocalWrite | verbs.AccessRemoteWrite},
			{"no REMOTE_ATOMIC", func(a, b *side) verbs.SendWR {
				return verbs.SendWR{Opcode: verbs.OpFetchAdd, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey(), CompareAdd: 1}
			}, verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				a := newSide(t, sideOpt{})
				b := newSide(t, sideOpt{access: c.acc})
				connect(t, a, b, connOpt{})
				b.postRecv(77, b.sge(0, 64))
				wr := c.wr(a, b)
				wr.ID, wr.Flags = 1, verbs.SendSignaled
				a.post(wr, verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
				wcs := poll(t, a.scq, 2)
				if wcs[0].WRID != 1 || wcs[0].Status != verbs.WCRemAccessErr || !errors.Is(wcs[0].Err(), verbs.ErrRemoteAccess) {
					t.Fatalf("first %+v", wcs[0])
				}
				if wcs[1].WRID != 2 || wcs[1].Status != verbs.WCWRFlushErr {
					t.Fatalf("second (unsignaled, flushed) %+v", wcs[1])
				}
				waitState(t, a.qp, verbs.StateError)
				waitState(t, b.qp, verbs.StateError) // RC: the responder too
				if wc := poll(t, b.rcq, 1)[0]; wc.WRID != 77 || wc.Status != verbs.WCWRFlushErr {
					t.Fatalf("responder receive %+v", wc)
				}
				// Later WRs flush with their IDs, sends and receives alike.
				a.post(verbs.SendWR{ID: 3, Opcode: verbs.OpSend, SGL: []verbs.SGE{a.sge(0, 8)}})
				a.postRecv(4, a.sge(0, 8))
				if wc := poll(t, a.scq, 1)[0]; wc.WRID != 3 || wc.Status != verbs.WCWRFlushErr {
					t.Fatalf("later send %+v", wc)
				}
				if wc := poll(t, a.rcq, 1)[0]; wc.WRID != 4 || wc.Status != verbs.WCWRFlushErr {
					t.Fatalf("later recv %+v", wc)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				ev, err := b.ctx.AsyncEvent(ctx)
				must(t, err)
				if ev.Type != verbs.EventQPAccessErr || ev.QPN != b.qp.QPN() {
					t.Fatalf("event %+v", ev)
				}
			})
		}
	})
}

func TestLocalProtection(t *testing.T) {
	a, b := pair(t, verbs.RC, connOpt{})
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{{Addr: a.mr.Addr(), Length: 8, LKey: a.mr.LKey() + 1}}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	if wc := poll(t, a.scq, 1)[0]; wc.Status != verbs.WCLocProtErr {
		t.Fatalf("%+v", wc)
	}
	waitState(t, a.qp, verbs.StateError)
	waitState(t, b.qp, verbs.StateRTS)
}

func TestPostRules(t *testing.T) {
	a := newSide(t, sideOpt{})
	b := newSide(t, sideOpt{})
	wr := verbs.SendWR{ID: 1, Opcode: verbs.OpSend, SGL: []verbs.SGE{a.sge(0, 8)}}
	// RESET, INIT, RTR: the post fails.
	check := func(state string) {
		t.Helper()
		n, err := a.qp.PostSend([]verbs.SendWR{wr})
		var pe *verbs.PostError
		if n != 0 || !errors.Is(err, verbs.ErrQPState) || !errors.As(err, &pe) || pe.Posted != 0 {
			t.Fatalf("post in %s: %d, %v", state, n, err)
		}
	}
	check("RESET")
	if _, err := a.qp.PostRecv([]verbs.RecvWR{{ID: 1}}); !errors.Is(err, verbs.ErrQPState) {
		t.Fatalf("post recv in RESET: %v", err)
	}
	must(t, a.qp.ToInit(verbs.InitAttr{Port: 1, Access: verbs.AccessRemoteWrite}))
	check("INIT")
	if err := a.qp.ToRTS(verbs.RTSAttr{}); !errors.Is(err, verbs.ErrQPState) {
		t.Fatalf("INIT→RTS: %v", err)
	}
	must(t, a.qp.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU1024, DestQPN: b.qp.QPN(), Dest: b.addr()}))
	check("RTR")
	must(t, b.qp.ToInit(verbs.InitAttr{Port: 1, Access: verbs.AccessRemoteWrite}))
	must(t, b.qp.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU1024, DestQPN: a.qp.QPN(), Dest: a.addr()}))
	must(t, a.qp.ToRTS(verbs.RTSAttr{Timeout: 14, RetryCount: 7, RNRRetry: 7}))
	must(t, b.qp.ToRTS(verbs.RTSAttr{Timeout: 14, RetryCount: 7, RNRRetry: 7}))

	// A chain with a bad WR in the middle: the prefix is posted and completes.
	too := make([]verbs.SGE, a.qp.Cap().MaxSendSGE+1)
	for i := range too {
		too[i] = a.sge(0, 1)
	}
	w := func(id uint64) verbs.SendWR {
		return verbs.SendWR{ID: id, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
	}
	for _, bad := range []verbs.SendWR{
		{ID: 3, Opcode: verbs.OpWrite, SGL: too, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
		{ID: 3, Opcode: verbs.OpFetchAdd, SGL: []verbs.SGE{a.sge(0, 4)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
		{ID: 3, Opcode: verbs.OpCompareSwap, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr() + 4, RKey: b.mr.RKey()},
		{ID: 3, Opcode: verbs.Opcode(42)},
	} {
		n, err := a.qp.PostSend([]verbs.SendWR{w(1), w(2), bad, w(4)})
		var pe *verbs.PostError
		if n != 2 || !errors.As(err, &pe) || pe.Posted != 2 || !errors.Is(err, verbs.ErrInvalid) {
			t.Fatalf("chain with %v: %d, %v", bad.Opcode, n, err)
		}
		wcs := poll(t, a.scq, 2)
		if wcs[0].WRID != 1 || wcs[1].WRID != 2 || wcs[0].Status != 0 || wcs[1].Status != 0 {
			t.Fatalf("%+v", wcs)
		}
	}
	empty(t, a.scq)

	// UD opcodes on an RC QP and READ on UC are refused at the post.
	uc := newSide(t, sideOpt{typ: verbs.UC})
	uc2 := newSide(t, sideOpt{typ: verbs.UC})
	connect(t, uc, uc2, connOpt{})
	if _, err := uc.qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpRead, SGL: []verbs.SGE{uc.sge(0, 8)}}}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("READ on UC: %v", err)
	}
	// Queue full.
	small := newSide(t, sideOpt{caps: verbs.QPCap{MaxSendWR: 2, MaxRecvWR: 2}})
	small2 := newSide(t, sideOpt{})
	connect(t, small, small2, connOpt{rnrRetry: 7})
	n, err := small.qp.PostRecv([]verbs.RecvWR{{ID: 1}, {ID: 2}, {ID: 3}})
	if n != 2 || !errors.Is(err, verbs.ErrQueueFull) {
		t.Fatalf("recv queue full: %d %v", n, err)
	}
}

func TestToErrorFlushes(t *testing.T) {
	transports(t, func(t *testing.T) {
		a, b := pair(t, verbs.RC, connOpt{rnrRetry: 7, minRNR: 20})
		for i := range 5 {
			a.postRecv(uint64(100+i), a.sge(0, 8))
		}
		// The send waits on RNR for ever; the rest queue behind it.
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 8)}},
			verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
			verbs.SendWR{ID: 3, Opcode: verbs.OpRead, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
		must(t, a.qp.ToError())
		wcs := poll(t, a.scq, 3)
		for i, wc := range wcs {
			if wc.WRID != uint64(i+1) || wc.Status != verbs.WCWRFlushErr || wc.QPN != a.qp.QPN() {
				t.Fatalf("send %d: %+v", i, wc)
			}
		}
		wcs = poll(t, a.rcq, 5)
		for i, wc := range wcs {
			if wc.WRID != uint64(100+i) || wc.Status != verbs.WCWRFlushErr {
				t.Fatalf("recv %d: %+v", i, wc)
			}
		}
		// Back to RESET and up again works.
		must(t, a.qp.ToReset())
		must(t, b.qp.ToReset())
		connect(t, a, b, connOpt{psnA: 100, psnB: 5000})
		a.post(verbs.SendWR{ID: 9, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
		pollOK(t, a.scq)
	})
}

func TestPSNMismatch(t *testing.T) {
	transports(t, func(t *testing.T) {
		a := newSide(t, sideOpt{})
		b := newSide(t, sideOpt{})
		connect(t, a, b, connOpt{})
		must(t, b.qp.ToReset())
		must(t, b.qp.ToInit(verbs.InitAttr{Port: 1, Access: verbs.AccessRemoteWrite}))
		must(t, b.qp.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU4096, DestQPN: a.qp.QPN(), RQPSN: 1234, Dest: a.addr()}))
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
		if wc := poll(t, a.scq, 1)[0]; wc.Status != verbs.WCRetryExcErr || wc.VendorErr != VendorErrPSN {
			t.Fatalf("%+v", wc)
		}
	})
}

func TestCompChannel(t *testing.T) {
	transports(t, func(t *testing.T) {
		a := newSide(t, sideOpt{})
		ch, err := a.ctx.CreateCompChannel()
		must(t, err)
		defer mustClose(t, ch)
		cq, err := a.ctx.CreateCQ(2048, ch) // room for every WR: no overrun
		must(t, err)
		if err := ch.Close(); !errors.Is(err, verbs.ErrBusy) {
			t.Fatalf("close channel with a CQ: %v", err)
		}
		qp, err := a.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: a.rcq, Cap: verbs.QPCap{MaxSendWR: 512, MaxRecvWR: 1, MaxSendSGE: 1}})
		must(t, err)
		defer mustClose(t, cq)
		defer mustClose(t, qp)
		b := newSide(t, sideOpt{})
		x := *a
		x.qp = qp
		connect(t, &x, b, connOpt{})

		const total = 2000
		posted := make(chan struct{})
		go func() {
			defer close(posted)
			wr := verbs.SendWR{Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
			for i := 0; i < total; {
				wr.ID = uint64(i)
				if _, err := qp.PostSend([]verbs.SendWR{wr}); err != nil {
					if errors.Is(err, verbs.ErrQueueFull) {
						time.Sleep(10 * time.Microsecond)
						continue
					}
					t.Error(err)
					return
				}
				i++
			}
		}()
		must(t, cq.ReqNotify(false))
		got := 0
		seen := make([]bool, total)
		wc := make([]verbs.WorkCompletion, 7)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for got < total {
			c, err := ch.GetEvent(ctx)
			if err != nil {
				t.Fatalf("after %d completions: %v", got, err)
			}
			if c != cq {
				t.Fatal("event for another CQ")
			}
			c.AckEvents(1)
			must(t, c.ReqNotify(false))
			for {
				n, err := c.Poll(wc)
				must(t, err)
				for _, w := range wc[:n] {
					if w.Status != 0 || seen[w.WRID] {
						t.Fatalf("%+v (dup %v)", w, seen[w.WRID])
					}
					seen[w.WRID] = true
				}
				got += n
				if n == 0 {
					break
				}
			}
		}
		<-posted
		// GetEvent honours ctx: once the event of the last arm (if it
		// fired) is taken, the next GetEvent ends with the context.
		for i := 0; ; i++ {
			short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
			c, err := ch.GetEvent(short)
			cancel2()
			if errors.Is(err, context.DeadlineExceeded) {
				break
			}
			if err != nil || i > 0 {
				t.Fatalf("GetEvent with nothing pending: %v, %v", c, err)
			}
			c.AckEvents(1)
		}
	})
}

func TestGetEventClose(t *testing.T) {
	ctx, err := Provider.Open(DeviceName)
	must(t, err)
	defer mustClose(t, ctx)
	ch, err := ctx.CreateCompChannel()
	must(t, err)
	done := make(chan error)
	go func() {
		_, err := ch.GetEvent(context.Background())
		done <- err
	}()
	runtimeYield(10)
	must(t, ch.Close())
	select {
	case err := <-done:
		if !errors.Is(err, verbs.ErrClosed) {
			t.Fatalf("GetEvent after Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("GetEvent not woken by Close")
	}
}

func TestSRQ(t *testing.T) {
	transports(t, func(t *testing.T) {
		ctx, err := Provider.Open(DeviceName)
		must(t, err)
		t.Cleanup(func() { mustClose(t, ctx) })
		pd, err := ctx.AllocPD()
		must(t, err)
		t.Cleanup(func() { mustClose(t, pd) })
		srq, err := pd.CreateSRQ(verbs.SRQInit{MaxWR: 16, MaxSGE: 2})
		must(t, err)
		t.Cleanup(func() { mustClose(t, srq) })
		r1 := newSide(t, sideOpt{ctx: ctx, pd: pd, srq: srq})
		r2 := newSide(t, sideOpt{ctx: ctx, pd: pd, srq: srq})
		if _, err := r1.qp.PostRecv([]verbs.RecvWR{{ID: 1}}); !errors.Is(err, verbs.ErrInvalid) {
			t.Fatalf("PostRecv on an SRQ QP: %v", err)
		}
		if err := srq.Close(); !errors.Is(err, verbs.ErrBusy) {
			t.Fatalf("close SRQ in use: %v", err)
		}
		s1 := newSide(t, sideOpt{})
		s2 := newSide(t, sideOpt{})
		connect(t, s1, r1, connOpt{rnrRetry: 7})
		connect(t, s2, r2, connOpt{rnrRetry: 7})
		buf := mapMem(t, 4096)
		mr, err := pd.RegMR(buf, verbs.AccessLocalWrite)
		must(t, err)
		t.Cleanup(func() { mustClose(t, mr) })
		_, err = srq.PostRecv([]verbs.RecvWR{
			{ID: 10, SGL: []verbs.SGE{{Addr: mr.Addr(), Length: 100, LKey: mr.LKey()}}},
			{ID: 11, SGL: []verbs.SGE{{Addr: mr.Addr() + 100, Length: 100, LKey: mr.LKey()}}},
		})
		must(t, err)
		fill(s1.buf[:10], 1)
		fill(s2.buf[:10], 2)
		s1.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s1.sge(0, 10)}})
		pollOK(t, s1.scq)
		w1 := pollOK(t, r1.rcq)
		s2.post(verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s2.sge(0, 10)}})
		pollOK(t, s2.scq)
		w2 := pollOK(t, r2.rcq)
		if w1.WRID != 10 || w2.WRID != 11 || w1.QPN != r1.qp.QPN() || w2.QPN != r2.qp.QPN() {
			t.Fatalf("%+v %+v", w1, w2)
		}
		if !bytes.Equal(buf[:10], s1.buf[:10]) || !bytes.Equal(buf[100:110], s2.buf[:10]) {
			t.Fatal("data")
		}
	})
}

func TestUD(t *testing.T) {
	transports(t, func(t *testing.T) {
		a := newSide(t, sideOpt{typ: verbs.UD})
		b := newSide(t, sideOpt{typ: verbs.UD})
		connect(t, a, b, connOpt{})
		ah, err := a.pd.CreateAH(b.addr())
		must(t, err)
		defer mustClose(t, ah)
		fill(a.buf[:1000], 6)
		b.postRecv(5, b.sge(0, verbs.GRHSize+1000))
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSendWithImm, Imm: 7, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 1000)}, AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: 0x1111})
		pollOK(t, a.scq)
		wc := pollOK(t, b.rcq)
		if wc.Flags&verbs.WCWithGRH == 0 || wc.ByteLen != verbs.GRHSize+1000 || wc.SrcQP != a.qp.QPN() || wc.Imm != 7 {
			t.Fatalf("%+v", wc)
		}
		if !bytes.Equal(b.buf[verbs.GRHSize:verbs.GRHSize+1000], a.buf[:1000]) {
			t.Fatal("data")
		}
		// soft0's GID is IPv4-mapped: the GRH is in the IPv4 form, as
		// rxe writes it.
		grh, err := verbs.ParseGRH(b.buf[:verbs.GRHSize])
		if err != nil || grh.Form != verbs.GRHIPv4 || grh.SrcGID() != a.addr().GID || grh.DstGID() != b.addr().GID {
			t.Fatalf("grh % x: %+v, %v; want the IPv4 form from %v to %v", b.buf[:verbs.GRHSize], grh, err, a.addr().GID, b.addr().GID)
		}
		// A wrong Q_Key is dropped silently; the sender still completes.
		b.postRecv(6, b.sge(0, verbs.GRHSize+1000))
		a.post(verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 10)}, AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: 0x2222})
		pollOK(t, a.scq)
		// A message beyond the MTU fails locally.
		a.post(verbs.SendWR{ID: 3, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 5000)}, AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: 0x1111})
		if wc := poll(t, a.scq, 1)[0]; wc.Status != verbs.WCLocLenErr {
			t.Fatalf("%+v", wc)
		}
		empty(t, b.rcq)
		if _, err := a.qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpWrite}}); !errors.Is(err, verbs.ErrInvalid) {
			t.Fatalf("WRITE on UD: %v", err)
		}
	})
}

func TestUC(t *testing.T) {
	transports(t, func(t *testing.T) {
		a, b := pair(t, verbs.UC, connOpt{})
		fill(a.buf[:100], 8)
		// No receive: the message is lost, the sender completes. The
		// WRITE behind it lands after it (UC keeps order), so once the
		// marker is in memory the SEND has been dropped.
		binary.NativeEndian.PutUint64(a.buf[1000:], 0x600d)
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 10)}},
			verbs.SendWR{ID: 0, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(1000, 8)}, RemoteAddr: b.mr.Addr() + 1000, RKey: b.mr.RKey()})
		poll(t, a.scq, 2)
		deadline := time.Now().Add(10 * time.Second)
		for idle := 0; binary.NativeEndian.Uint64(b.buf[1000:]) != 0x600d; {
			if time.Now().After(deadline) {
				t.Fatal("UC WRITE never landed")
			}
			backoff(&idle)
		}
		b.postRecv(3, b.sge(0, 100))
		a.post(verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 100)}, RemoteAddr: b.mr.Addr() + 200, RKey: b.mr.RKey()},
			verbs.SendWR{ID: 3, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 100)}})
		poll(t, a.scq, 2)
		wc := pollOK(t, b.rcq)
		if wc.WRID != 3 || wc.ByteLen != 100 {
			t.Fatalf("%+v", wc)
		}
		if !bytes.Equal(b.buf[200:300], a.buf[:100]) || !bytes.Equal(b.buf[:100], a.buf[:100]) {
			t.Fatal("data")
		}
	})
}

func TestCQOverrun(t *testing.T) {
	transports(t, func(t *testing.T) {
		a := newSide(t, sideOpt{cqe: 4})
		b := newSide(t, sideOpt{})
		connect(t, a, b, connOpt{})
		if a.scq.Len() != 4 {
			t.Fatalf("granted %d", a.scq.Len())
		}
		for i := range 8 {
			a.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ev, err := a.ctx.AsyncEvent(ctx)
		must(t, err)
		if ev.Type != verbs.EventCQErr {
			t.Fatalf("event %+v", ev)
		}
		waitState(t, a.qp, verbs.StateError)
		if !errors.Is(QPError(a.qp), errCQOverrun) {
			t.Fatalf("qp error %v", QPError(a.qp))
		}
		wcs := poll(t, a.scq, 4) // the ring held 4, the rest was dropped
		for i, wc := range wcs {
			if wc.WRID != uint64(i) {
				t.Fatalf("%+v", wcs)
			}
		}
		empty(t, a.scq)
	})
}

func TestRandomTraffic(t *testing.T) {
	transports(t, func(t *testing.T) {
		a, b := pair(t, verbs.RC, connOpt{rnrRetry: 7})
		rng := rand.New(rand.NewPCG(1, 2))
		fill(a.buf, 11)
		const rounds = 400
		want := 0
		for i := range rounds {
			n := rng.IntN(8192)
			off := rng.IntN(len(b.buf) - n)
			switch rng.IntN(3) {
			case 0:
				a.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, n)}, RemoteAddr: b.mr.Addr() + uint64(off), RKey: b.mr.RKey()})
			case 1:
				a.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(len(a.buf)/2, n)}, RemoteAddr: b.mr.Addr() + uint64(off), RKey: b.mr.RKey()})
			case 2:
				b.postRecv(uint64(i), b.sge(off, n))
				a.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, n)}})
			}
			want++
			if want == 32 || i == rounds-1 {
				for j, wc := range poll(t, a.scq, want) {
					if wc.Status != verbs.WCSuccess {
						t.Fatalf("wc %d: %+v", j, wc)
					}
				}
				want = 0
			}
		}
	})
}

// TestDropAfterRNR: a responder that sent an RNR NAK drops requests until
// the retried PSN comes; a requester reconnected with another PSN is not
// told "success" for a request that was dropped.
func TestDropAfterRNR(t *testing.T) {
	transports(t, func(t *testing.T) {
		a, b := pair(t, verbs.RC, connOpt{rnrRetry: 0, minRNR: 1})
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 8)}})
		if wc := poll(t, a.scq, 1)[0]; wc.Status != verbs.WCRNRRetryExcErr {
			t.Fatalf("%+v", wc)
		}
		must(t, a.qp.ToReset())
		must(t, a.qp.ToInit(verbs.InitAttr{Port: 1}))
		must(t, a.qp.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU4096, DestQPN: b.qp.QPN(), Dest: b.addr()}))
		must(t, a.qp.ToRTS(verbs.RTSAttr{SQPSN: 7, Timeout: 10, RetryCount: 1}))
		a.post(verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
		if wc := poll(t, a.scq, 1)[0]; wc.Status != verbs.WCRetryExcErr {
			t.Fatalf("%+v", wc)
		}
	})
}

// TestQueuesGrowInOrder: a send queue and a CQ start small and grow to
// their depths as WRs and completions pile up, keeping their order: 200
// signaled WRs posted in chains of 50 complete in order, each exactly
// once, and a CQ of 256 holds all 200 completions unpolled.
func TestQueuesGrowInOrder(t *testing.T) {
	transports(t, func(t *testing.T) {
		a := newSide(t, sideOpt{caps: verbs.QPCap{MaxSendWR: 200, MaxRecvWR: 1, MaxSendSGE: 2, MaxRecvSGE: 1}, cqe: 256})
		b := newSide(t, sideOpt{})
		connect(t, a, b, connOpt{})
		const n = 200
		for c := range n / 50 {
			wrs := make([]verbs.SendWR, 50)
			for i := range wrs {
				id := uint64(c*50 + i)
				wrs[i] = verbs.SendWR{ID: id, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
					SGL: []verbs.SGE{a.sge(0, 8), a.sge(64, 8)}, RemoteAddr: b.mr.Addr() + id*16, RKey: b.mr.RKey()}
			}
			a.post(wrs...)
		}
		wcs := poll(t, a.scq, n)
		for i, wc := range wcs {
			if wc.WRID != uint64(i) || wc.Status != verbs.WCSuccess {
				t.Fatalf("completion %d: %+v", i, wc)
			}
		}
		empty(t, a.scq)
	})
}
