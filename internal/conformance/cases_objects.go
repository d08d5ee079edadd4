package conformance

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/go-rdma/rdma/internal/verbs"
)

const ruleRegMR = "RegMR refuses a zero-length or nil buffer, a Go-heap slice (registered memory must come from internal/mem) and access " +
	"flags that break the verbs rule (REMOTE_WRITE without LOCAL_WRITE); it accepts an unaligned sub-range of mapped memory and reports " +
	"exactly that range"

func caseRegMR(e *Env) {
	buf := e.Map(8192)
	refuse := func(b []byte, acc verbs.Access, what string) error {
		e.Helper()
		var mr verbs.MR
		var err error
		if perr := NoPanic(func() { mr, err = e.A.PD.RegMR(b, acc) }); perr != nil {
			e.Errorf("RegMR of %s: %v", what, perr)
			return nil
		}
		if err == nil {
			e.Errorf("RegMR of %s succeeded; it must fail", what)
			if mr != nil {
				if cerr := mr.Close(); cerr != nil {
					e.Errorf("close the wrongly registered MR: %v", cerr)
				}
			}
			return nil
		}
		if mr != nil {
			e.Errorf("RegMR of %s returned an error (%v) and a non-nil MR", what, err)
		}
		e.Logf("RegMR of %s refused: %v", what, err)
		return err
	}
	refuse(buf[:0], verbs.AccessLocalWrite, "a zero-length mapped slice")
	refuse(nil, verbs.AccessLocalWrite, "nil")
	heap := make([]byte, 4096)
	refuse(heap, verbs.AccessLocalWrite, "a Go-heap slice")
	if err := refuse(buf[:4096], verbs.AccessRemoteWrite, "REMOTE_WRITE without LOCAL_WRITE"); err != nil && !errors.Is(err, verbs.ErrInvalid) {
		e.Errorf("RegMR with invalid access flags: %v; want an error wrapping ErrInvalid (as Access.Validate gives)", err)
	}
	if err := refuse(buf[:4096], verbs.AccessLocalWrite|verbs.Access(1<<20), "unknown access flags"); err != nil && !errors.Is(err, verbs.ErrInvalid) {
		e.Errorf("RegMR with unknown access flags: %v; want an error wrapping ErrInvalid", err)
	}
	acc := verbs.AccessLocalWrite | verbs.AccessRemoteRead
	mr := e.Reg(e.A, buf[3:103], acc)
	if mr.Len() != 100 || len(mr.Bytes()) != 100 {
		e.Errorf("MR of buf[3:103]: Len() = %d, len(Bytes()) = %d; want 100", mr.Len(), len(mr.Bytes()))
	} else if unsafe.SliceData(mr.Bytes()) != &buf[3] {
		e.Errorf("MR.Bytes() is not the registered memory (it starts at %p, buf[3] is at %p)", unsafe.SliceData(mr.Bytes()), &buf[3])
	}
	if mr.Access() != acc {
		e.Errorf("MR.Access() = %v, registered %v", mr.Access(), acc)
	}
}

// wantClosed reports err unless it wraps ErrClosed.
func (e *Env) wantClosed(err error, what string) {
	e.Helper()
	if !errors.Is(err, verbs.ErrClosed) {
		e.Errorf("%s on a closed object: err = %v; want an error wrapping verbs.ErrClosed", what, err)
	}
}

const ruleClosed = "Close succeeds children first and a second Close returns nil; every other use of a closed context, PD, CQ, channel, " +
	"QP or SRQ fails with errors.Is(err, ErrClosed) — including a GetEvent or AsyncEvent that was waiting when its object closed"

func caseClosed(e *Env) {
	c, err := e.Target.Provider.Open(e.Target.DeviceA)
	if err != nil {
		e.Fatalf("Open(%q): %v", e.Target.DeviceA, err)
	}
	e.CloseLater("context", c)
	s := &Side{Name: "C", Ctx: c, Port: e.A.Port, LID: e.A.LID, GID: e.A.GID, Attr: e.A.Attr}
	pd, err := c.AllocPD()
	if err != nil {
		e.Fatalf("AllocPD: %v", err)
	}
	s.PD = pd
	e.CloseLater("PD", pd)
	ch := e.NewChannel(s)
	cq := e.NewCQ(s, 16, ch)
	s.CQ = cq
	srq, err := pd.CreateSRQ(verbs.SRQInit{MaxWR: 4, MaxSGE: 1})
	if err != nil {
		e.Fatalf("CreateSRQ: %v", err)
	}
	e.CloseLater("SRQ", srq)
	qp := e.CreateQP(s, QPConf{})
	// AHs are for UD; a device without UD has none to close.
	var ah verbs.AH
	noUD := e.Lacks(verbs.FeatureUD)
	if noUD == nil {
		if ah, err = pd.CreateAH(Addr(s, e.B)); err != nil {
			e.Fatalf("CreateAH: %v", err)
		}
		e.CloseLater("AH", ah)
	} else {
		e.Logf("no AH: %v", noUD)
	}
	mr := e.MapReg(s, 4096, verbs.AccessLocalWrite, 0)
	ch2, err := c.CreateCompChannel()
	if err != nil {
		e.Fatalf("CreateCompChannel: %v", err)
	}
	e.CloseLater("second channel", ch2)

	// Waiters that must be woken by Close.
	tctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	evErr := make(chan error, 1)
	go func() { _, err := ch2.GetEvent(tctx); evErr <- err }()
	asyncErr := make(chan error, 1)
	go func() { _, err := c.AsyncEvent(tctx); asyncErr <- err }()

	sge := []verbs.SGE{SGE(mr, 0, 8)}
	closeTwice := func(what string, o interface{ Close() error }) {
		e.Helper()
		if err := o.Close(); err != nil {
			e.Fatalf("close %s: %v", what, err)
		}
		if err := o.Close(); err != nil {
			e.Errorf("second close of %s: %v; want nil", what, err)
		}
	}
	if ah != nil {
		closeTwice("AH", ah)
	}
	closeTwice("MR", mr)
	closeTwice("QP", qp)
	closeTwice("SRQ", srq)
	closeTwice("CQ", cq)
	closeTwice("channel", ch)
	closeTwice("second channel", ch2)
	select {
	case err := <-evErr:
		e.wantClosed(err, "GetEvent waiting during Close")
	case <-time.After(Timeout):
		e.Errorf("GetEvent waiting on a channel was not woken by its Close within %v", Timeout)
	}

	_, err = qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.OpSend, SGL: sge}})
	e.wantClosed(err, "QP.PostSend")
	_, err = qp.PostRecv([]verbs.RecvWR{Recv(1, sge...)})
	e.wantClosed(err, "QP.PostRecv")
	_, err = qp.State()
	e.wantClosed(err, "QP.State")
	e.wantClosed(qp.ToInit(verbs.InitAttr{Port: 1}), "QP.ToInit")
	e.wantClosed(qp.ToError(), "QP.ToError")
	e.wantClosed(qp.ToReset(), "QP.ToReset")
	_, err = srq.PostRecv([]verbs.RecvWR{Recv(1, sge...)})
	e.wantClosed(err, "SRQ.PostRecv")
	e.wantClosed(srq.SetLimit(1), "SRQ.SetLimit")
	_, err = cq.Poll(make([]verbs.WorkCompletion, 4))
	e.wantClosed(err, "CQ.Poll")
	e.wantClosed(cq.ReqNotify(false), "CQ.ReqNotify")
	if perr := NoPanic(func() { cq.AckEvents(0) }); perr != nil {
		e.Errorf("CQ.AckEvents(0) on a closed CQ: %v", perr)
	}
	_, err = ch.GetEvent(tctx)
	e.wantClosed(err, "CompChannel.GetEvent")

	closeTwice("PD", pd)
	buf := e.Map(4096)
	_, err = pd.RegMR(buf, verbs.AccessLocalWrite)
	e.wantClosed(err, "PD.RegMR")
	_, err = pd.CreateSRQ(verbs.SRQInit{MaxWR: 4, MaxSGE: 1})
	e.wantClosed(err, "PD.CreateSRQ")
	if noUD == nil {
		_, err = pd.CreateAH(Addr(s, e.B))
		e.wantClosed(err, "PD.CreateAH")
	}

	// A QP on a closed PD: use a fresh CQ so only the PD is closed.
	cq2, err := c.CreateCQ(4, nil)
	if err != nil {
		e.Fatalf("CreateCQ: %v", err)
	}
	e.CloseLater("CQ 2", cq2)
	_, err = pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq2, RecvCQ: cq2, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	e.wantClosed(err, "PD.CreateQP")
	closeTwice("CQ 2", cq2)

	closeTwice("context", c)
	select {
	case err := <-asyncErr:
		e.wantClosed(err, "AsyncEvent waiting during Close")
	case <-time.After(Timeout):
		e.Errorf("AsyncEvent waiting on a context was not woken by its Close within %v", Timeout)
	}
	_, err = c.AllocPD()
	e.wantClosed(err, "Context.AllocPD")
	_, err = c.CreateCQ(4, nil)
	e.wantClosed(err, "Context.CreateCQ")
	_, err = c.CreateCompChannel()
	e.wantClosed(err, "Context.CreateCompChannel")
	_, err = c.QueryDevice()
	e.wantClosed(err, "Context.QueryDevice")
	_, err = c.QueryPort(1)
	e.wantClosed(err, "Context.QueryPort")
	_, err = c.QueryGID(1, 0)
	e.wantClosed(err, "Context.QueryGID")
	_, err = c.AsyncEvent(tctx)
	e.wantClosed(err, "Context.AsyncEvent")
}

const ruleBusy = "closing a parent with live children fails with ErrBusy and destroys nothing: a PD with a live MR (the MR still works " +
	"afterwards for a WRITE), a PD with a live QP, a CQ used by a QP, a channel used by a CQ, a context with a live PD; all close " +
	"cleanly children first afterwards"

func caseBusy(e *Env) {
	ch := e.NewChannel(e.A)
	cq := e.NewCQ(e.A, 16, ch)
	qa, _ := e.PairWith(QPConf{SendCQ: cq, RecvCQ: cq}, QPConf{}, ConnConf{}, ConnConf{})
	src := e.MapReg(e.A, 4096, verbs.AccessLocalWrite, 0)
	rem := e.MapReg(e.B, 4096, AccessAll, 0)
	busy := func(err error, what string) {
		e.Helper()
		if !errors.Is(err, verbs.ErrBusy) {
			e.Errorf("Close of %s: err = %v; want an error wrapping ErrBusy", what, err)
		}
	}
	busy(e.A.PD.Close(), "a PD with a live MR and QP")
	busy(cq.Close(), "a CQ used by a QP")
	busy(ch.Close(), "a channel used by a CQ")
	busy(e.A.Ctx.Close(), "a context with a live PD")

	// A PD whose only child is an MR.
	pd2, err := e.A.Ctx.AllocPD()
	if err != nil {
		e.Fatalf("AllocPD: %v", err)
	}
	e.CloseLater("PD 2", pd2)
	mr2, err := pd2.RegMR(e.Map(4096), verbs.AccessLocalWrite)
	if err != nil {
		e.Fatalf("RegMR: %v", err)
	}
	e.CloseLater("MR on PD 2", mr2)
	busy(pd2.Close(), "a PD whose only child is an MR")

	// Everything refused above still works.
	data := Patterned(512, 21)
	copy(src.Bytes()[100:], data)
	e.PostSend(qa, verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{SGE(src, 100, 512)},
		RemoteAddr: rem.Addr() + 1000, RKey: rem.RKey()})
	e.CheckOK(e.Wait1(cq, "WRITE after the refused closes"), 1, verbs.WCWrite, "WRITE from the MR whose PD refused to close")
	e.Placed(qa, cq, rem)
	if diff := DiffBytes(rem.Bytes()[1000:1512], data); diff != "" {
		e.Errorf("WRITE after the refused closes: %s", diff)
	}
	if err := mr2.Close(); err != nil {
		e.Errorf("close MR on PD 2: %v", err)
	}
	if err := pd2.Close(); err != nil {
		e.Errorf("close PD 2 after its MR: %v", err)
	}
}

const ruleBadDevice = "Open of an unknown device name fails with an error wrapping ErrNoDevice and returns no context"

func caseBadDevice(e *Env) {
	name := "conformance-no-such-device"
	c, err := e.Target.Provider.Open(name)
	if err == nil {
		e.Errorf("Open(%q) succeeded", name)
	} else if !errors.Is(err, verbs.ErrNoDevice) {
		e.Errorf("Open(%q): %v; want an error wrapping ErrNoDevice", name, err)
	}
	if c != nil {
		e.Errorf("Open(%q) returned a context with err = %v", name, err)
		if err == nil {
			if cerr := c.Close(); cerr != nil {
				e.Errorf("close: %v", cerr)
			}
		}
	}
	devs, err := e.Target.Provider.Devices()
	if err != nil {
		e.Errorf("Devices(): %v", err)
	}
	found := false
	for _, d := range devs {
		if d.Name == e.Target.DeviceA {
			found = true
			if d.Provider != e.Target.Provider.Name() {
				e.Errorf("device %q lists provider %q; the provider is named %q", d.Name, d.Provider, e.Target.Provider.Name())
			}
			if !d.Usable {
				e.Errorf("device %q is in use by the suite but not Usable (%s)", d.Name, d.Why)
			}
		}
	}
	if !found {
		e.Errorf("Devices() does not list %q: %v", e.Target.DeviceA, fmt.Sprint(devs))
	}
}
