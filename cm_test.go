package rdma_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
)

// cmAddrs are the two addresses of the VM's rxe devices.
func cmAddrs(t *testing.T) (ip0, ip1 string) {
	requireDevice(t)
	ip0, ip1 = os.Getenv("RDMA_VM_IP0"), os.Getenv("RDMA_VM_IP1")
	if ip0 == "" || ip1 == "" {
		if os.Getenv("RDMA_TEST_REQUIRE_DEVICE") == "1" {
			t.Fatal("RDMA_VM_IP0/RDMA_VM_IP1 unset")
		}
		t.Skip("rdma_cm tests run in the VM harness, which sets RDMA_VM_IP0 and RDMA_VM_IP1")
	}
	return ip0, ip1
}

// Rule: with WithRDMACM, Dial and Listen set up connections through
// rdma_cm, and the data path works as with go-rdma's own handshake.
func TestVerbsRDMACMConn(t *testing.T) {
	ip0, _ := cmAddrs(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ln, err := rdma.Listen("rdma", ip0+":0", rdma.WithRDMACM())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan *rdma.Conn, 1)
	go func() { c, _ := ln.Accept(ctx); acc <- c }()
	c, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), rdma.WithRDMACM())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := <-acc
	if s == nil {
		t.Fatal("nothing accepted")
	}
	defer s.Close()
	target, _ := s.Alloc(4096)
	defer target.Release()
	region, err := s.Expose(target, rdma.RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	// No control channel: pass the region in a message.
	if _, err := s.RecvRegion(ctx); !errors.Is(err, rdma.ErrNotSupported) {
		t.Errorf("RecvRegion on an rdma_cm connection: %v, want ErrNotSupported", err)
	}
	msg, _ := s.Alloc(64)
	defer msg.Release()
	enc, _ := region.MarshalBinary()
	copy(msg.Bytes(), enc)
	msg.SetLen(len(enc))
	r := c.Recv()
	wait(t, s.Send(msg))
	wait(t, r)
	var got rdma.RemoteRegion
	if err := got.UnmarshalBinary(r.Buffer().Bytes()); err != nil {
		t.Fatal(err)
	}
	r.Buffer().Release()
	src, _ := c.Alloc(4096)
	defer src.Release()
	copy(src.Bytes(), bytes.Repeat([]byte("cm"), 2048))
	wait(t, c.Write(src, got))
	// On iWARP a WRITE completes once it is sent, not once it is placed;
	// a SEND behind it is delivered after its data (RFC 5040's
	// ordering): the server compares once it has the SEND.
	placed := s.Recv()
	note, _ := c.Alloc(1)
	defer note.Release()
	wait(t, c.Send(note))
	wait(t, placed)
	placed.Buffer().Release()
	if !bytes.Equal(target.Bytes(), src.Bytes()) {
		t.Fatal("WRITE over an rdma_cm connection: data differs")
	}
	// The peer's disconnect fails pending receives with ErrPeerClosed.
	pending := s.Recv()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pending.Wait(ctx); !errors.Is(err, net.ErrClosed) {
		t.Errorf("receive after the peer's disconnect: %v, want net.ErrClosed", err)
	}
}

// startPeer runs one of rdmacm-utils' programs, bounded by ctx.
func startPeer(t *testing.T, ctx context.Context, name string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s (rdmacm-utils) is missing: %v", name, err)
	}
	if sb, err := exec.LookPath("stdbuf"); err == nil {
		args = append([]string{"-oL", "-eL", bin}, args...)
		bin = sb
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &out
}

// Rule: go-rdma's Dial connects to rdma_server from rdmacm-utils (a peer
// this project did not write) and exchanges its 16-byte messages.
func TestVerbsRDMACMToRdmaServer(t *testing.T) {
	ip0, _ := cmAddrs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	port := "7481"
	srv, out := startPeer(t, ctx, "rdma_server", "-s", ip0, "-p", port)
	var c *rdma.Conn
	var err error
	for i := 0; i < 100; i++ { // rdma_server needs a moment to listen
		c, err = rdma.Dial(ctx, "rdma", ip0+":"+port, rdma.WithRDMACM())
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // retry backoff, not synchronisation
	}
	if err != nil {
		t.Fatalf("dial rdma_server: %v\n%s", err, out)
	}
	msg, _ := c.Alloc(16)
	defer msg.Release()
	copy(msg.Bytes(), "hello rdma_srv!!")
	r := c.Recv()
	wait(t, c.Send(msg))
	wait(t, r)
	if r.Len() != 16 {
		t.Errorf("reply of %d bytes, want 16", r.Len())
	}
	r.Buffer().Release()
	c.Close()
	if err := srv.Wait(); err != nil {
		t.Fatalf("rdma_server: %v\n%s", err, out)
	}
	t.Logf("rdma_server said:\n%s", out)
}

// Rule: go-rdma's Listener accepts rdma_client from rdmacm-utils and
// answers its message.
func TestVerbsRDMACMFromRdmaClient(t *testing.T) {
	ip0, _ := cmAddrs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ln, err := rdma.Listen("rdma", ip0+":7482", rdma.WithRDMACM(), rdma.WithMaxMessage(64))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cli, out := startPeer(t, ctx, "rdma_client", "-s", ip0, "-p", "7482")
	s, err := ln.Accept(ctx)
	if err != nil {
		t.Fatalf("accept rdma_client: %v\n%s", err, out)
	}
	defer s.Close()
	r := s.Recv()
	// rdma_client sends the moment it is connected, and on siw its
	// message can wait unread in our socket until another segment comes
	// (settleIWARP): a zero-length READ of ours, every 2 s, brings one.
	// (Not sooner: the dialer must have read the MPA reply first.)
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for nudges := 0; !r.Resolved(); {
		select {
		case <-r.Done():
		case <-tick.C:
			if rdma.NudgeIWARP(s) {
				nudges++
				t.Logf("nudge %d: no message from rdma_client yet", nudges)
			}
		case <-ctx.Done():
			t.Fatalf("no message from rdma_client: %v\n%s", ctx.Err(), out)
		}
	}
	wait(t, r)
	if r.Len() != 16 {
		t.Errorf("rdma_client sent %d bytes, want 16", r.Len())
	}
	reply, _ := s.Alloc(16)
	defer reply.Release()
	copy(reply.Bytes(), r.Buffer().Bytes())
	r.Buffer().Release()
	// rdma_client tears its QP down the moment it has the reply, which
	// can cost our ACK: the client's exit code is the verdict.
	if err := s.Send(reply).Wait(ctx); err != nil {
		t.Logf("reply send: %v", err)
	}
	if err := cli.Wait(); err != nil {
		t.Fatalf("rdma_client: %v\n%s", err, out)
	}
	t.Logf("rdma_client said:\n%s", strings.TrimSpace(out.String()))
}

// Rule: an rdma_cm Dial that nothing answers fails with an error, and
// leaves nothing behind (it used to panic tearing the connection down).
func TestVerbsRDMACMRefused(t *testing.T) {
	ip0, _ := cmAddrs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 3 {
		c, err := rdma.Dial(ctx, "rdma", ip0+":7489", rdma.WithRDMACM())
		if err == nil {
			c.Close()
			t.Fatal("dial to a port nothing listens on succeeded")
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "dial" {
			t.Fatalf("dial: %v, want a *net.OpError of op dial", err)
		}
	}
}

// cmPair listens on ip with lopts and dials it with dopts, both through
// rdma_cm; it returns the dial's error, and on success both ends.
func cmPair(t *testing.T, ctx context.Context, ip string, lopts, dopts []rdma.Option) (c, s *rdma.Conn, err error) {
	t.Helper()
	ln, err := rdma.Listen("rdma", ip+":0", append(lopts, rdma.WithRDMACM())...)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	acc := make(chan *rdma.Conn, 1)
	go func() { s, _ := ln.Accept(ctx); acc <- s }()
	c, err = rdma.Dial(ctx, "rdma", ln.Addr().String(), append(dopts, rdma.WithRDMACM())...)
	if err != nil {
		return nil, nil, err
	}
	t.Cleanup(func() { c.Close() })
	s = <-acc
	require.NotNil(t, s, "nothing accepted")
	t.Cleanup(func() { s.Close() })
	return c, s, nil
}

// Rule: on rdma_cm set-ups too, the hello (in the private data of the
// connect and the accept) names the application protocol: a dialer and
// a listener of different protocols are refused at the dial, with an
// error that names both, and the same protocol connects.
func TestVerbsRDMACMProtocol(t *testing.T) {
	ip0, _ := cmAddrs(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kv2, kv3 := rdma.WithProtocol("kv/2"), rdma.WithProtocol("kv/3")
	_, _, err := cmPair(t, ctx, ip0, []rdma.Option{kv2}, []rdma.Option{kv3})
	require.ErrorIs(t, err, rdma.ErrRefused)
	// The listener's reason, quoted as the peer's text it is.
	assert.Contains(t, err.Error(), `\"kv/2\"`)
	assert.Contains(t, err.Error(), `\"kv/3\"`)
	_, _, err = cmPair(t, ctx, ip0, []rdma.Option{kv2}, nil)
	require.ErrorIs(t, err, rdma.ErrRefused, "a plain dialer to a kv/2 listener")
	assert.Contains(t, err.Error(), "plain async API")
	_, _, err = cmPair(t, ctx, ip0, nil, []rdma.Option{kv2})
	require.ErrorIs(t, err, rdma.ErrRefused, "a kv/2 dialer to a plain listener")

	c, s, err := cmPair(t, ctx, ip0, []rdma.Option{kv2}, []rdma.Option{kv2})
	require.NoError(t, err)
	b, err := c.Alloc(8)
	require.NoError(t, err)
	defer b.Release()
	r := s.Recv()
	require.NoError(t, c.Send(b).Wait(ctx))
	require.NoError(t, r.Wait(ctx))
	r.Buffer().Release()
}

// Rule: each end of an rdma_cm connection learns the largest message
// the other takes from its hello (it assumed its own before, so a
// larger SEND than the peer's receives failed the connection).
func TestVerbsRDMACMMaxMessage(t *testing.T) {
	ip0, _ := cmAddrs(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, s, err := cmPair(t, ctx, ip0, []rdma.Option{rdma.WithMaxMessage(4096)}, []rdma.Option{rdma.WithMaxMessage(256 << 10)})
	require.NoError(t, err)
	assert.Equal(t, 4096, c.MaxMessage(), "the dialer sends at most what the listener takes")
	assert.Equal(t, 256<<10, s.MaxMessage(), "the listener sends at most what the dialer takes")
	big, err := c.Alloc(8192)
	require.NoError(t, err)
	defer big.Release()
	assert.ErrorIs(t, c.Send(big).Wait(ctx), rdma.ErrInvalid, "a SEND larger than the peer takes fails at the call")
	assert.NoError(t, c.Err(), "and leaves the connection up")
}

// Rule: WithAcceptCheck works on rdma_cm set-ups: it sees the request's
// addresses before anything is made for the peer, and its refusal
// reaches the dialer as ErrRefused with the check's reason.
func TestVerbsRDMACMAcceptCheck(t *testing.T) {
	ip0, ip1 := cmAddrs(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seen := make(chan rdma.PeerInfo, 2)
	var refuse atomic.Bool
	refuse.Store(true)
	check := rdma.WithAcceptCheck(func(p rdma.PeerInfo) error {
		seen <- p
		if refuse.Load() {
			return errors.New("not on the list")
		}
		return nil
	})
	_, _, err := cmPair(t, ctx, ip0, []rdma.Option{check}, nil)
	require.ErrorIs(t, err, rdma.ErrRefused)
	assert.Contains(t, err.Error(), "not on the list")
	p := <-seen
	require.NotNil(t, p.RemoteAddr)
	require.NotNil(t, p.LocalAddr)
	// The dialer leaves from either end of the VM's pair, as routing picks.
	host, _, err := net.SplitHostPort(p.RemoteAddr.String())
	require.NoError(t, err)
	assert.Contains(t, []string{ip0, ip1}, host)
	assert.Contains(t, p.LocalAddr.String(), ip0, "the listener's address")
	assert.Nil(t, p.TLS)

	refuse.Store(false)
	_, _, err = cmPair(t, ctx, ip0, []rdma.Option{check}, nil)
	require.NoError(t, err)
	<-seen
}

// Rule: an rdma_cm connection has no credits, and each end says its
// receive window in the rdma_cm hello: a sender that keeps at most
// SendWindow messages unread by the peer's Recv never finds its receive
// queue empty, which on iWARP (no RNR retry) would end the connection.
func TestVerbsRDMACMWindow(t *testing.T) {
	ip0, _ := cmAddrs(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, s, err := cmPair(t, ctx, ip0, []rdma.Option{rdma.WithQueueDepth(64, 16)}, []rdma.Option{rdma.WithQueueDepth(64, 32)})
	require.NoError(t, err)
	assert.False(t, c.Credited())
	assert.False(t, s.Credited())
	assert.Equal(t, 15, s.RecvWindow(), "16 receives, re-posted 2 at a time")
	assert.Equal(t, s.RecvWindow(), c.SendWindow(), "the listener's window, from its hello")
	assert.Equal(t, c.RecvWindow(), s.SendWindow(), "the dialer's window, from its hello")
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()
	for round := range 3 {
		// A window of messages nobody takes yet, then all taken.
		fs := make([]*rdma.Future, c.SendWindow())
		for i := range fs {
			fs[i] = c.Send(b)
		}
		for i, f := range fs {
			require.NoError(t, f.Wait(ctx), "round %d, message %d", round, i)
		}
		for range fs {
			r := s.Recv()
			require.NoError(t, r.Wait(ctx))
			r.Buffer().Release()
		}
	}
	require.NoError(t, c.Err())
	require.NoError(t, s.Err())
}
