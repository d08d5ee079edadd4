package main

import (
	"context"
	"fmt"
	"time"

	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/soft"
	"github.com/go-rdma/rdma/internal/verbs"
)

func pickProvider(name string) (verbs.Provider, error) {
	switch name {
	case "soft":
		return soft.Provider, nil
	case "verbs":
		return ibv.Provider, nil
	}
	if devs, err := ibv.Provider.Devices(); err == nil {
		for _, d := range devs {
			if d.Usable {
				return ibv.Provider, nil
			}
		}
	}
	return soft.Provider, nil
}

// rawDevice is what a side of the raw path uses of its device.
type rawDevice struct {
	attr verbs.DeviceAttr
	info verbs.DeviceInfo
	port verbs.PortInfo
	gid  verbs.GIDEntry
}

// open opens the device and makes the side's PD, completion channel
// (-e) and CQ; on an error the caller closes s.
func (s *rawSide) open() (d rawDevice, err error) {
	p := s.p
	prov, err := pickProvider(p.provider)
	if err != nil {
		return d, err
	}
	if s.ctx, err = prov.Open(p.device); err != nil {
		return d, err
	}
	if d.attr, err = s.ctx.QueryDevice(); err != nil {
		return d, err
	}
	d.info = s.ctx.Info()
	if p.ibPort < 1 || p.ibPort > len(d.info.Ports) {
		return d, fmt.Errorf("-i %d: %s has %d ports", p.ibPort, d.info.Name, len(d.info.Ports))
	}
	d.port = d.info.Ports[p.ibPort-1]
	d.gid, err = verbs.SelectGID(d.port, true)
	if p.gidIndex >= 0 {
		d.gid, err = verbs.GIDEntry{}, fmt.Errorf("-x %d: no such GID", p.gidIndex)
		for _, g := range d.port.GIDs {
			if g.Index == p.gidIndex {
				d.gid, err = g, nil
			}
		}
	}
	if err != nil {
		return d, err
	}
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		return d, err
	}
	if p.events {
		if s.ch, err = s.ctx.CreateCompChannel(); err != nil {
			return d, fmt.Errorf("-e: create completion channel: %w", err)
		}
	}
	if s.cq, err = s.ctx.CreateCQ((p.txDepth+p.rxDepth)*p.qps+64, s.ch); err != nil {
		return d, err
	}
	if s.ch != nil && p.wrapChannel != nil {
		s.ch = p.wrapChannel(s.ch)
	}
	return d, nil
}

func setupRaw(ctx context.Context, p *params, o *oob) (s *rawSide, err error) {
	s = &rawSide{p: p, run: ctx, wc: make([]verbs.WorkCompletion, 128)}
	side := s // the returns below set s to nil
	defer func() {
		if err != nil {
			side.close()
		}
	}()
	d, err := s.open()
	if err != nil {
		return nil, err
	}
	attr, info, port, gid := d.attr, d.info, d.port, d.gid
	for range p.qps {
		qp, err := s.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: s.cq, RecvCQ: s.cq,
			Cap: verbs.QPCap{MaxSendWR: p.txDepth + 16, MaxRecvWR: p.rxDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: p.inline}})
		if err != nil {
			if p.inline > 0 {
				return nil, fmt.Errorf("-I %d: create QP with %d bytes of inline data: %w", p.inline, p.inline, err)
			}
			return nil, err
		}
		if p.wrapQP != nil {
			qp = p.wrapQP(qp)
		}
		s.qps = append(s.qps, &rawQP{qp: qp})
		if got := qp.Cap().MaxInlineData; got < p.inline {
			return nil, fmt.Errorf("-I %d: %s grants only %d bytes of inline data per WR", p.inline, info.Name, got)
		}
	}
	s.half = (p.maxSize() + 63) &^ 63
	if s.buf, err = mem.Map(2 * s.half); err != nil {
		return nil, err
	}
	acc := verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	if s.mr, err = s.pd.RegMR(s.buf, acc); err != nil {
		return nil, err
	}
	// Both sides must agree on the number of QPs before they exchange
	// one record per QP.
	var peerQPs uint32
	if err = o.exchange(uint32(p.qps), &peerQPs); err != nil {
		return nil, err
	}
	if int(peerQPs) != p.qps {
		return nil, fmt.Errorf("-q %d: the peer runs -q %d", p.qps, peerQPs)
	}
	me := make([]peerInfo, p.qps)
	for i, q := range s.qps {
		if err = q.qp.ToInit(verbs.InitAttr{Port: uint8(p.ibPort), Access: acc}); err != nil {
			return nil, err
		}
		me[i] = peerInfo{QPN: q.qp.QPN(), PSN: uint32(time.Now().UnixNano()+int64(i)) & 0xffffff, LID: port.LID,
			MTU: uint16(port.ActiveMTU), GID: gid.GID, Addr: s.mr.Addr(), RKey: s.mr.RKey(), Len: uint32(len(s.buf))}
	}
	peers := make([]peerInfo, p.qps)
	if err = o.exchange(me, peers); err != nil {
		return nil, err
	}
	rd := uint8(max(1, min(attr.MaxQPRdAtom, 16)))
	for i, q := range s.qps {
		q.peer = peers[i]
		mtu := min(verbs.MTU(q.peer.MTU), port.ActiveMTU)
		if err = q.qp.ToRTR(verbs.RTRAttr{PathMTU: mtu, DestQPN: q.peer.QPN, RQPSN: q.peer.PSN,
			Dest:            verbs.Address{Port: uint8(p.ibPort), LID: q.peer.LID, GID: q.peer.GID, SGIDIndex: uint8(gid.Index), HopLimit: 64},
			MaxDestRdAtomic: rd, MinRNRTimer: 1}); err != nil {
			return nil, err
		}
		if err = q.qp.ToRTS(verbs.RTSAttr{SQPSN: me[i].PSN, Timeout: 14, RetryCount: 7, RNRRetry: 7, MaxRdAtomic: rd}); err != nil {
			return nil, err
		}
	}
	s.recvs = make([]verbs.RecvWR, p.rxDepth)
	s.rsge = make([]verbs.SGE, p.rxDepth)
	return s, nil
}
