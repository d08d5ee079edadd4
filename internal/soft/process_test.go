package soft

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/testchild"
	"github.com/go-rdma/rdma/internal/verbs"
)

// The tests below re-execute the test binary as a second process, a peer
// on the other side of the loopback TCP transport (see childRoles): "qp"
// serves one RC QP with a 4 MiB MR and $SOFT_TEST_RECVS receives posted;
// "sink" is a plain TCP sink for the baseline benchmark.

const childMR = 4 << 20

// endpoint is what two sides exchange out of band to connect a QP.
type endpoint struct {
	LID  uint16
	GID  string
	QPN  uint32
	Addr uint64
	RKey uint32
	Len  int
	Port int // sink: TCP port
}

// childRoles are the roles of the child processes, for TestMain.
func childRoles() map[string]func() int {
	return map[string]func() int{
		"qp":   childRole(func() error { return childQP(envInt("SOFT_TEST_RECVS")) }),
		"sink": childRole(func() error { return childSink(envInt("SOFT_TEST_SIZE"), max(envInt("SOFT_TEST_ROUND"), 1)) }),
	}
}

// childRole makes f a role: its error, said on stderr, is exit code 1.
func childRole(f func() error) func() int {
	return func() int {
		if err := f(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		return 0
	}
}

// envInt is $name as a number, 0 if unset.
func envInt(name string) int {
	n, _ := strconv.Atoi(os.Getenv(name))
	return n
}

func childQP(nrecv int) error {
	ctx, err := Provider.Open(DeviceName)
	if err != nil {
		return err
	}
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		return err
	}
	defer pd.Close()
	cq, err := ctx.CreateCQ(4096, nil)
	if err != nil {
		return err
	}
	defer cq.Close()
	buf, err := mem.Map(childMR)
	if err != nil {
		return err
	}
	defer mem.Unmap(buf)
	mr, err := pd.RegMR(buf, allAccess)
	if err != nil {
		return err
	}
	defer mr.Close()
	qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 1024, MaxRecvSGE: 1}})
	if err != nil {
		return err
	}
	defer qp.Close()
	p := ctx.Info().Ports[0]
	me := endpoint{LID: p.LID, GID: p.GIDs[0].GID.String(), QPN: qp.QPN(), Addr: mr.Addr(), RKey: mr.RKey(), Len: mr.Len()}
	if err := json.NewEncoder(os.Stdout).Encode(me); err != nil {
		return err
	}
	in := bufio.NewReader(os.Stdin)
	var peer endpoint
	if err := json.NewDecoder(in).Decode(&peer); err != nil {
		return err
	}
	if err := qp.ToInit(verbs.InitAttr{Port: 1, Access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic}); err != nil {
		return err
	}
	for i := range nrecv {
		if _, err := qp.PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{{Addr: mr.Addr() + uint64(i%64)*4096, Length: 4096, LKey: mr.LKey()}}}}); err != nil {
			return err
		}
	}
	dest := verbs.Address{Port: 1, LID: peer.LID, GID: verbs.GIDFromIP(netip.MustParseAddr(peer.GID))}
	if err := qp.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU4096, DestQPN: peer.QPN, Dest: dest, MaxDestRdAtomic: 16, MinRNRTimer: 1}); err != nil {
		return err
	}
	if err := qp.ToRTS(verbs.RTSAttr{Timeout: 14, RetryCount: 7, RNRRetry: 7, MaxRdAtomic: 16}); err != nil {
		return err
	}
	fmt.Println("ready")
	// Serve until the parent closes stdin (or kills us).
	io.Copy(io.Discard, in)
	return nil
}

// child is a peer process and the endpoint it said it has.
type child struct {
	*testchild.Child
	ep endpoint
}

// startChild starts role with env, on the TCP transport whatever this
// process's, and reads the endpoint it prints first.
func startChild(t testing.TB, role string, env ...string) *child {
	t.Helper()
	c := &child{Child: testchild.Start(context.Background(), t, role, append(env, EnvTransport+"=")...)}
	require.NoError(t, json.Unmarshal([]byte(c.ReadLine(t)), &c.ep), "child %q: its endpoint", role)
	return c
}

// connect brings s's QP to RTS against the child's and the child's
// against s.
func (c *child) connect(t testing.TB, s *side, co connOpt) {
	t.Helper()
	p := s.ctx.Info().Ports[0]
	require.NoError(t, json.NewEncoder(c.Stdin()).Encode(endpoint{LID: p.LID, GID: p.GIDs[0].GID.String(), QPN: s.qp.QPN()}))
	c.Expect(t, "ready")
	must(t, s.qp.ToInit(verbs.InitAttr{Port: 1}))
	dest := verbs.Address{Port: 1, LID: c.ep.LID, GID: verbs.GIDFromIP(netip.MustParseAddr(c.ep.GID)), HopLimit: 64}
	must(t, s.qp.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU4096, DestQPN: c.ep.QPN, Dest: dest, MaxDestRdAtomic: 16}))
	if co.timeout == 0 {
		co.timeout, co.retry = 14, 7
	}
	must(t, s.qp.ToRTS(verbs.RTSAttr{Timeout: co.timeout, RetryCount: co.retry, RNRRetry: co.rnrRetry, MaxRdAtomic: 16}))
}

func TestCrossProcess(t *testing.T) {
	c := startChild(t, "qp", "SOFT_TEST_RECVS=16")
	s := newSide(t, sideOpt{size: childMR})
	c.connect(t, s, connOpt{rnrRetry: 7})
	// WRITE 1 MiB, READ it back into another place, compare.
	fill(s.buf[:1<<20], 3)
	s.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s.sge(0, 1<<20)}, RemoteAddr: c.ep.Addr + 12345, RKey: c.ep.RKey},
		verbs.SendWR{ID: 2, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s.sge(2<<20, 1<<20)}, RemoteAddr: c.ep.Addr + 12345, RKey: c.ep.RKey})
	wcs := poll(t, s.scq, 2)
	if wcs[0].Status != 0 || wcs[1].Status != 0 || wcs[1].ByteLen != 1<<20 {
		t.Fatalf("%+v", wcs)
	}
	if !bytes.Equal(s.buf[:1<<20], s.buf[2<<20:3<<20]) {
		t.Fatal("READ returned other data than was written")
	}
	// Atomics are served by the child's provider.
	for i := range 50 {
		s.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpFetchAdd, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s.sge(8, 8)}, RemoteAddr: c.ep.Addr + 3<<20, RKey: c.ep.RKey, CompareAdd: 2})
	}
	for i, wc := range poll(t, s.scq, 50) {
		if wc.Status != 0 || wc.WRID != uint64(i) {
			t.Fatalf("%+v", wc)
		}
	}
	if got := binary.NativeEndian.Uint64(s.buf[8:]); got != 98 {
		t.Fatalf("last FAA returned %d, want 98", got)
	}
	// SENDs into the child's receives, some inline.
	for i := range 16 {
		fl := verbs.SendSignaled
		if i%2 == 0 {
			fl |= verbs.SendInline
		}
		s.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpSend, Flags: fl, SGL: []verbs.SGE{s.sge(0, 100)}})
	}
	for _, wc := range poll(t, s.scq, 16) {
		if wc.Status != 0 {
			t.Fatalf("%+v", wc)
		}
	}
	// Bad rkey across processes: remote access error.
	s.post(verbs.SendWR{ID: 99, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s.sge(0, 8)}, RemoteAddr: c.ep.Addr, RKey: c.ep.RKey + 1})
	if wc := poll(t, s.scq, 1)[0]; wc.Status != verbs.WCRemAccessErr {
		t.Fatalf("%+v", wc)
	}
}

// checkAllFail checks that every one of the n WRs completed, the ones
// after the first failure with WR_FLUSH_ERR, and at least one failed.
func checkAllFail(t *testing.T, s *side, n int, start time.Time, limit time.Duration) {
	t.Helper()
	wcs := poll(t, s.scq, n)
	failed := -1
	for i, wc := range wcs {
		if wc.WRID != uint64(i) {
			t.Fatalf("completion %d has wr_id %d", i, wc.WRID)
		}
		switch {
		case failed < 0 && wc.Status == verbs.WCSuccess:
		case failed < 0:
			failed = i
			if wc.Status != verbs.WCRetryExcErr {
				t.Fatalf("first failure %+v", wc)
			}
		case wc.Status != verbs.WCWRFlushErr:
			t.Fatalf("after the failure: %+v", wc)
		}
	}
	if failed < 0 {
		t.Fatal("no WR failed")
	}
	if d := time.Since(start); d > limit {
		t.Fatalf("the WRs took %v to fail, more than %v", d, limit)
	}
	waitState(t, s.qp, verbs.StateError)
	t.Logf("%d of %d WRs completed before the failure; QP error: %v", failed, n, QPError(s.qp))
}

func TestPeerKilled(t *testing.T) {
	t.Run("in flight", func(t *testing.T) {
		c := startChild(t, "qp")
		s := newSide(t, sideOpt{size: childMR, caps: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 4, MaxSendSGE: 1}})
		c.connect(t, s, connOpt{})
		s.post(verbs.SendWR{ID: 0, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s.sge(0, 8)}, RemoteAddr: c.ep.Addr, RKey: c.ep.RKey})
		pollOK(t, s.scq) // connected
		for i := range 3 {
			s.postRecv(uint64(500+i), s.sge(0, 64)) // receives wait too
		}
		const n = 64
		for i := range n {
			op := verbs.OpWrite
			if i%4 == 3 {
				op = verbs.OpRead
			}
			s.post(verbs.SendWR{ID: uint64(i), Opcode: op, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s.sge(0, 256<<10)}, RemoteAddr: c.ep.Addr, RKey: c.ep.RKey})
		}
		start := time.Now()
		c.Signal(t, syscall.SIGKILL)
		checkAllFail(t, s, n, start, 10*time.Second)
		for i, wc := range poll(t, s.rcq, 3) {
			if wc.WRID != uint64(500+i) || wc.Status != verbs.WCWRFlushErr {
				t.Fatalf("receive %+v", wc)
			}
		}
	})
	t.Run("waiting on RNR", func(t *testing.T) {
		c := startChild(t, "qp")
		s := newSide(t, sideOpt{})
		c.connect(t, s, connOpt{rnrRetry: 7})
		for i := range 8 {
			s.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s.sge(0, 64)}})
		}
		runtimeYield(20) // let the first RNR NAKs come back; not required
		start := time.Now()
		c.Signal(t, syscall.SIGKILL)
		checkAllFail(t, s, 8, start, 10*time.Second)
	})
}

// TestPeerStopped: a peer that stops answering (a stopped process, a host
// gone without a reset) fails the outstanding WRs after the QP's timeout.
func TestPeerStopped(t *testing.T) {
	c := startChild(t, "qp")
	s := newSide(t, sideOpt{})
	c.connect(t, s, connOpt{timeout: 10, retry: 1}) // 4 ms × 2: the 2 s floor
	s.post(verbs.SendWR{ID: 0, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s.sge(0, 64)}, RemoteAddr: c.ep.Addr, RKey: c.ep.RKey})
	pollOK(t, s.scq)
	c.Signal(t, syscall.SIGSTOP)
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(c.Pid(), &ws, syscall.WUNTRACED, nil); err != nil || !ws.Stopped() {
		t.Fatalf("child not stopped: %v %v", ws, err)
	}
	// Once seen (1 run in 3 of two packages' tests at once under -race):
	// all four READs answered. Say whether the child was still stopped.
	t.Cleanup(func() {
		if t.Failed() {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.Pid()))
			t.Logf("child's /proc stat after the failure (state T: stopped): %q %v", stat, err)
		}
	})
	start := time.Now()
	for i := range 4 {
		s.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s.sge(0, 64)}, RemoteAddr: c.ep.Addr, RKey: c.ep.RKey})
	}
	checkAllFail(t, s, 4, start, 5*time.Second)
	if wc := s.qp; QPError(wc) == nil || !strings.Contains(QPError(wc).Error(), "no response") {
		t.Fatalf("QP error %v", QPError(wc))
	}
}

// TestPeerSlow: a peer that stalls for longer than the hardware timeout
// go-rdma asks for (timeout 14, retry 7: 0.54 s), as a process on an
// emulated CPU does, but answers in the end, fails nothing. On the rxe
// VM's emulated CPU such a stall once failed both sides of rdmacat's
// soft connection with RETRY_EXC_ERR; soft's timeout now has a 2 s floor.
func TestPeerSlow(t *testing.T) {
	c := startChild(t, "qp")
	s := newSide(t, sideOpt{})
	c.connect(t, s, connOpt{timeout: 14, retry: 7})
	s.post(verbs.SendWR{ID: 0, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s.sge(0, 64)}, RemoteAddr: c.ep.Addr, RKey: c.ep.RKey})
	pollOK(t, s.scq) // the transport's connection is up
	c.Signal(t, syscall.SIGSTOP)
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(c.Pid(), &ws, syscall.WUNTRACED, nil); err != nil || !ws.Stopped() {
		t.Fatalf("child not stopped: %v %v", ws, err)
	}
	s.post(verbs.SendWR{ID: 1, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s.sge(0, 64)}, RemoteAddr: c.ep.Addr, RKey: c.ep.RKey})
	// The stall itself, not a wait for an event: the peer is stopped for
	// about twice the hardware timeout before it answers.
	time.Sleep(time.Second)
	c.Signal(t, syscall.SIGCONT)
	if wc := pollOK(t, s.scq); wc.WRID != 1 {
		t.Fatalf("completion %+v", wc)
	}
}

// childSink reads size-byte messages from one TCP connection until EOF,
// answering one byte after every m: the raw Go TCP baseline of the
// cross-process benchmark.
func childSink(size, m int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	if err := json.NewEncoder(os.Stdout).Encode(endpoint{Port: ln.Addr().(*net.TCPAddr).Port}); err != nil {
		return err
	}
	nc, err := ln.Accept()
	if err != nil {
		return err
	}
	defer nc.Close()
	buf := make([]byte, size)
	for i := 1; ; i++ {
		if _, err := io.ReadFull(nc, buf); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if i%m == 0 {
			if _, err := nc.Write([]byte{1}); err != nil {
				return err
			}
		}
	}
}
