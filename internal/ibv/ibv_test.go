package ibv_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/verbs"
)

func TestMain(m *testing.M) {
	if os.Getenv("IBV_TEST_MEMLOCK_CHILD") == "1" {
		os.Exit(memlockChild())
	}
	goleak.VerifyTestMain(m)
}

// skipUnlessRequired skips with why, or fails when the environment says
// the device tests must run (RDMA_TEST_REQUIRE_DEVICE=1, as in the VM).
func skipUnlessRequired(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("RDMA_TEST_REQUIRE_DEVICE") == "1" {
		t.Fatalf("%s, and RDMA_TEST_REQUIRE_DEVICE=1", why)
	}
	t.Skip(why)
}

// usable returns the usable verbs devices, skipping the test when there
// are none unless RDMA_TEST_REQUIRE_DEVICE=1.
func usable(t *testing.T) []verbs.DeviceInfo {
	t.Helper()
	devs, err := ibv.Provider.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	var out []verbs.DeviceInfo
	for _, d := range devs {
		if d.Usable {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		skipUnlessRequired(t, fmt.Sprintf("no usable RDMA device (found %d); run ./test.sh for the rxe VM", len(devs)))
	}
	return out
}

// Rule: devices list with their ports, MTUs and typed GIDs; the listing
// agrees with what the opened device reports.
func TestVerbsDevices(t *testing.T) {
	for _, d := range usable(t) {
		ctx, err := ibv.Provider.Open(d.Name)
		if err != nil {
			t.Fatalf("open %s: %v", d.Name, err)
		}
		attr, err := ctx.QueryDevice()
		if err != nil || attr.MaxQPWR <= 0 || attr.MaxCQE <= 0 || attr.MaxSGE <= 0 {
			t.Errorf("%s: QueryDevice = %+v, %v", d.Name, attr, err)
		}
		if attr.NodeGUID != d.NodeGUID {
			t.Errorf("%s: node GUID %s from the device, %s from sysfs", d.Name, attr.NodeGUID, d.NodeGUID)
		}
		for _, p := range d.Ports {
			pa, err := ctx.QueryPort(p.Port)
			if err != nil || pa.State != p.State || pa.ActiveMTU != p.ActiveMTU || pa.LinkLayer != p.LinkLayer {
				t.Errorf("%s port %d: QueryPort = %+v, %v; listing %+v", d.Name, p.Port, pa, err, p)
			}
			for _, g := range p.GIDs {
				got, err := ctx.QueryGID(p.Port, g.Index)
				if err != nil || got != g.GID {
					t.Errorf("%s GID[%d] = %v, %v; sysfs says %v", d.Name, g.Index, got, err, g.GID)
				}
			}
			if p.LinkLayer == "Ethernet" && d.Transport != "iWARP" { // an iWARP GID holds the MAC
				g, err := verbs.SelectGID(p, true)
				if err != nil || g.Type != verbs.GIDTypeRoCEv2 || !g.GID.IP().Is4() {
					t.Errorf("%s: SelectGID = %+v, %v; want a RoCE v2 IPv4 GID", d.Name, g, err)
				}
			}
		}
		if _, err := ctx.QueryGID(1, 1<<20); err == nil {
			t.Errorf("%s: QueryGID of a huge index succeeded", d.Name)
		}
		if err := ctx.Close(); err != nil {
			t.Fatal(err)
		}
		if err := ctx.Close(); err != nil {
			t.Errorf("second Close = %v, want nil", err)
		}
		if _, err := ctx.AllocPD(); !errors.Is(err, verbs.ErrClosed) {
			t.Errorf("AllocPD on a closed context = %v, want ErrClosed", err)
		}
	}
}

// Rule: a bad device name is a clear error.
func TestOpenBadName(t *testing.T) {
	_, err := ibv.Provider.Open("nosuchdev9")
	if err == nil || !(errors.Is(err, verbs.ErrNoDevice) || errors.Is(err, verbs.ErrNotSupported)) {
		t.Fatalf("Open(nosuchdev9) = %v, want ErrNoDevice (or ErrNotSupported without cgo)", err)
	}
}

// Rule: a registration over RLIMIT_MEMLOCK fails with ErrMemlock and a
// message naming the limit and `ulimit -l`. Root bypasses the limit on
// rxe, so the check runs in a child as user nobody with an 8 MiB limit.
func TestVerbsMemlockMessage(t *testing.T) {
	usable(t)
	if os.Geteuid() != 0 {
		skipUnlessRequired(t, "needs root to start a child as another user")
	}
	for _, tool := range []string{"setpriv", "prlimit"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s (util-linux) is missing: %v", tool, err)
		}
	}
	// The child runs as nobody: give it a copy of this binary it can read.
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "memlock")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	bin := dir + "/ibv.test"
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "prlimit", "--memlock=8388608:8388608", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", bin)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "IBV_TEST_MEMLOCK_CHILD=1")
	out, err := cmd.CombinedOutput()
	t.Logf("child output:\n%s", out)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	if !strings.Contains(string(out), "MEMLOCK-OK") {
		t.Fatal("child did not confirm the memlock error")
	}
}

// memlockChild registers 64 MiB under an 8 MiB limit and checks the error.
func memlockChild() int {
	devs, _ := ibv.Provider.Devices()
	for _, d := range devs {
		if !d.Usable {
			continue
		}
		ctx, err := ibv.Provider.Open(d.Name)
		if err != nil {
			fmt.Println("open:", err)
			return 1
		}
		defer ctx.Close()
		pd, err := ctx.AllocPD()
		if err != nil {
			fmt.Println("alloc pd:", err)
			return 1
		}
		defer pd.Close()
		buf, err := mem.Map(64 << 20)
		if err != nil {
			fmt.Println("map:", err)
			return 1
		}
		defer mem.Unmap(buf)
		mr, err := pd.RegMR(buf, verbs.AccessLocalWrite)
		if err == nil {
			mr.Close()
			fmt.Println("registering 64 MiB under an 8 MiB memlock limit succeeded")
			return 1
		}
		fmt.Println("error:", err)
		msg := err.Error()
		if !errors.Is(err, verbs.ErrMemlock) || !strings.Contains(msg, "ulimit -l") || !strings.Contains(msg, "8192 KiB") {
			fmt.Println("want ErrMemlock naming `ulimit -l` and the 8192 KiB limit")
			return 1
		}
		fmt.Println("MEMLOCK-OK")
		return 0
	}
	fmt.Println("no usable device in the child")
	return 1
}

// hostInfo is what two hosts exchange over TCP to connect an RC QP pair.
type hostInfo struct {
	QPN, PSN, RKey uint32
	LID            uint16
	GID            verbs.GID
	Addr           uint64
	MTU            uint8
}

// Rule: an RC QP pair connects between two machines (or two devices) with
// the QP number, PSN, GID and LID exchanged out of band over TCP, and
// SEND and RDMA WRITE move data intact between them.
//
// RDMA_TWOHOST_ROLE=server|client with RDMA_VM_SELF_IP and RDMA_VM_PEER_IP
// runs one side (two VMs); without it, both sides run here across the
// first two usable devices.
func TestVerbsTwoHostRC(t *testing.T) {
	devs := usable(t)
	role := os.Getenv("RDMA_TWOHOST_ROLE")
	switch role {
	case "server":
		runHost(t, devs[0].Name, true, os.Getenv("RDMA_VM_SELF_IP")+":7471")
	case "client":
		runHost(t, devs[0].Name, false, os.Getenv("RDMA_VM_PEER_IP")+":7471")
	default:
		if len(devs) < 2 {
			skipUnlessRequired(t, "needs two devices or RDMA_TWOHOST_ROLE")
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		// Parallel subtests, so each side may t.Fatal on its own goroutine;
		// the group returns when both are done.
		t.Run("pair", func(t *testing.T) {
			t.Run("server", func(t *testing.T) {
				t.Parallel()
				runHostOn(t, devs[0].Name, true, ln, "")
			})
			t.Run("client", func(t *testing.T) {
				t.Parallel()
				runHostOn(t, devs[1].Name, false, nil, ln.Addr().String())
			})
		})
	}
}

func runHost(t *testing.T, dev string, server bool, addr string) {
	var ln net.Listener
	if server {
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			t.Fatal(err)
		}
	}
	runHostOn(t, dev, server, ln, addr)
}

func runHostOn(t *testing.T, dev string, server bool, ln net.Listener, addr string) {
	const size = 256 << 10
	ctx, err := ibv.Provider.Open(dev)
	must(t, err)
	defer closeOK(t, ctx)
	pd, err := ctx.AllocPD()
	must(t, err)
	defer closeOK(t, pd)
	cq, err := ctx.CreateCQ(64, nil)
	must(t, err)
	defer closeOK(t, cq)
	buf, err := mem.Map(size)
	must(t, err)
	defer mem.Unmap(buf)
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	must(t, err)
	defer closeOK(t, mr)
	qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	must(t, err)
	defer closeOK(t, qp)
	must(t, qp.ToInit(verbs.InitAttr{Port: 1, Access: verbs.AccessRemoteWrite}))

	port := ctx.Info().Ports[0]
	gid, err := verbs.SelectGID(port, true)
	must(t, err)
	me := hostInfo{QPN: qp.QPN(), PSN: 0x1234, RKey: mr.RKey(), LID: port.LID, GID: gid.GID, Addr: mr.Addr(), MTU: uint8(port.ActiveMTU)}

	var conn net.Conn
	if server {
		defer ln.Close()
		conn, err = ln.Accept()
	} else {
		deadline := time.Now().Add(60 * time.Second)
		for {
			conn, err = net.DialTimeout("tcp", addr, 2*time.Second)
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond) // retry backoff while the server VM boots
		}
	}
	must(t, err)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(120 * time.Second))
	must(t, binary.Write(conn, binary.BigEndian, me))
	var peer hostInfo
	must(t, binary.Read(conn, binary.BigEndian, &peer))
	t.Logf("%s: local QP %#x GID %v, peer QP %#x GID %v", dev, me.QPN, me.GID, peer.QPN, peer.GID)

	// The server receives; post before telling the client we are ready.
	if server {
		_, err := qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{{Addr: mr.Addr(), Length: 4096, LKey: mr.LKey()}}}})
		must(t, err)
	}
	must(t, qp.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU(min(me.MTU, peer.MTU)), DestQPN: peer.QPN, RQPSN: peer.PSN,
		Dest: verbs.Address{Port: 1, LID: peer.LID, GID: peer.GID, SGIDIndex: uint8(gid.Index)}, MinRNRTimer: 12}))
	must(t, qp.ToRTS(verbs.RTSAttr{SQPSN: me.PSN, Timeout: 14, RetryCount: 7, RNRRetry: 7}))
	var ready [1]byte
	if server {
		_, err = conn.Write(ready[:])
	} else {
		_, err = io.ReadFull(conn, ready[:])
	}
	must(t, err)

	if server {
		wc := waitWC(t, cq)
		if wc.Status != verbs.WCSuccess || wc.WRID != 1 || wc.ByteLen != 4096 {
			t.Fatalf("server receive: %+v", wc)
		}
		// The SEND came after the WRITE on the same RC QP, so the
		// written bytes are in place by the time the SEND arrives.
		want := pattern(size-4096, 7)
		if !bytes.Equal(buf[4096:], want) {
			t.Fatal("written data differs")
		}
		if !bytes.Equal(buf[:4096], pattern(4096, 3)) {
			t.Fatal("sent data differs")
		}
		_, err = conn.Write(ready[:])
		must(t, err)
		return
	}
	copy(buf[:4096], pattern(4096, 3))
	copy(buf[4096:], pattern(size-4096, 7))
	_, err = qp.PostSend([]verbs.SendWR{
		{ID: 10, Opcode: verbs.OpWrite, SGL: []verbs.SGE{{Addr: mr.Addr() + 4096, Length: size - 4096, LKey: mr.LKey()}}, RemoteAddr: peer.Addr + 4096, RKey: peer.RKey},
		{ID: 11, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{{Addr: mr.Addr(), Length: 4096, LKey: mr.LKey()}}},
	})
	must(t, err)
	if wc := waitWC(t, cq); wc.Status != verbs.WCSuccess || wc.WRID != 11 {
		t.Fatalf("client send: %+v (%v)", wc, wc.Err())
	}
	_, err = io.ReadFull(conn, ready[:])
	must(t, err)
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) ^ seed
	}
	return b
}

func waitWC(t *testing.T, cq verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	wc := make([]verbs.WorkCompletion, 1)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		n, err := cq.Poll(wc)
		must(t, err)
		if n == 1 {
			return wc[0]
		}
		time.Sleep(50 * time.Microsecond) // polling backoff
	}
	t.Fatal("no completion within 60 s")
	return verbs.WorkCompletion{}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func closeOK(t *testing.T, c interface{ Close() error }) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Errorf("Close %T: %v", c, err)
	}
}
