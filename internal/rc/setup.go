package rc

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The QP's side of go-rdma's handshake, over the TCP connection that
// becomes the control channel: Prepare moves the new QP to INIT, posts
// its receives and describes it in this side's hello; once the hellos
// are exchanged (the API's dial and accept), Connect moves it to RTS
// towards the peer, and both sides send one ready byte, so neither sends
// before the other's receives are posted.

// Prepare moves the new QP to INIT, posts its receives, registers its
// credit word and returns the hello that describes it.
func (c *Conn) Prepare() (Hello, error) {
	eng, cfg := c.Eng, c.cfg
	access := verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic
	if cfg.UC {
		access = verbs.AccessRemoteWrite // UC carries no READ and no atomics
	}
	if err := c.QP.ToInit(verbs.InitAttr{Port: eng.Port.Port, Access: access}); err != nil {
		return Hello{}, err
	}
	if err := c.RQ.PostReceives(); err != nil {
		return Hello{}, err
	}
	if err := c.MakeCreditWord(); err != nil {
		return Hello{}, err
	}
	gid, err := eng.GIDFor(AddrIP(c.Ctl.Conn().LocalAddr()))
	if err != nil {
		return Hello{}, err
	}
	c.gidIndex = uint8(gid.Index)
	me := Hello{QPN: c.QP.QPN(), PSN: randPSN(), LID: eng.Port.LID, MTU: uint8(eng.Port.ActiveMTU), GID: gid.GID,
		RecvDepth: uint32(c.RecvCap()), MaxMsg: uint32(cfg.MaxMsg), RecvWindow: uint32(c.RecvWindow())}
	copy(me.Protocol[:], cfg.Protocol)
	if cfg.UC {
		me.Flags |= HelloUC
	}
	if mr := c.Grants.Word().MR(); mr != nil {
		me.CreditAddr, me.CreditRKey = mr.Addr(), mr.RKey()
	}
	if me.MTU == 0 {
		me.MTU = uint8(verbs.MTU1024)
	}
	copy(me.Provider[:], eng.Prov.Name())
	return me, nil
}

// Connect moves the QP to RTS towards peer, then both sides send one
// ready byte on the control channel (read through br), so neither sends
// before the other's receives are posted; release lifts the handshake's
// bounds, and reports false when its context ended first. Then the
// connection is up (Shell.Connected) and the control channel's reader
// starts.
func (c *Conn) Connect(br *bufio.Reader, me, peer *Hello, release func() bool) error {
	eng := c.Eng
	c.Peer = *peer
	// No credits yet: the first message asks for them (the send queue's ask).
	mtu := verbs.MTU(min(me.MTU, peer.MTU))
	rtr := verbs.RTRAttr{PathMTU: mtu, DestQPN: peer.QPN, RQPSN: peer.PSN,
		Dest: verbs.Address{Port: eng.Port.Port, LID: peer.LID, GID: peer.GID, SGIDIndex: c.gidIndex}}
	rts := verbs.RTSAttr{SQPSN: me.PSN}
	if !c.cfg.UC {
		// Acknowledgements, retries and RNR NAKs are RC's alone.
		rtr.MinRNRTimer = 12
		rts.Timeout, rts.RetryCount, rts.RNRRetry = 14, 7, 7
	}
	if err := c.QP.ToRTR(rtr); err != nil {
		return err
	}
	if err := c.QP.ToRTS(rts); err != nil {
		return err
	}
	var ready [1]byte
	if _, err := c.Ctl.Conn().Write(ready[:]); err != nil {
		return err
	}
	if _, err := io.ReadFull(br, ready[:]); err != nil {
		return HandshakeReadErr("ready", err, true)
	}
	if !release() {
		return fmt.Errorf("rdma: handshake with %v: %w", c.Remote, context.Canceled)
	}
	c.shell.Connected()
	go c.ReadControl(br)
	return nil
}

// AbortSetup tears down a connection whose set-up failed.
func (c *Conn) AbortSetup() {
	c.Ctl.End()
	c.Teardown()
}

// RecvCap is the credit cap this side announces in its hello: the most
// credits it can give the peer at once, its receive depth, or its SRQ's
// depth when that is smaller (every credit is backed by a posted
// receive).
func (c *Conn) RecvCap() int {
	if c.SRQ != nil {
		return min(c.cfg.RecvDepth, c.SRQ.Depth())
	}
	return c.cfg.RecvDepth
}

// RecvWindow is how many messages the peer may have sent that this
// side's application has not taken yet and still never find no receive.
func (c *Conn) RecvWindow() int { return RecvWindowFor(c.RecvCap(), c.cfg.RecvDepth) }

// RecvWindowFor is the receive window of a connection that keeps
// recvCap receives of a receive depth of depth, and returns them in
// batches (ReturnBatch).
func RecvWindowFor(recvCap, depth int) int { return max(0, recvCap-ReturnBatch(depth)+1) }

// AddrIP is a TCP address's IP, unmapped; the zero Addr for another
// kind of address.
func AddrIP(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

// randPSN is a random 24-bit packet sequence number to start from.
func randPSN() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint32(b[:]) & 0xffffff
}
