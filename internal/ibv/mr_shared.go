//go:build linux && (cgo || amd64 || arm64)

package ibv

import (
	"fmt"
	"syscall"
	"unsafe"

	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/verbs"
)

// pd is an ibv_pd.
type pd struct {
	lt  verbs.Lifetime
	ctx *devContext
	h   pdHandle
}

func (c *devContext) AllocPD() (verbs.PD, error) {
	if err := c.lt.AddChild(); err != nil {
		return nil, err
	}
	h, err := c.h.allocPD()
	if err != nil {
		c.lt.DropChild()
		return nil, errnoErr("ibv_alloc_pd", err)
	}
	return &pd{ctx: c, h: h}, nil
}

func (p *pd) Close() error {
	return p.lt.Close(func() error {
		if err := p.h.dealloc(); err != nil {
			return errnoErr("ibv_dealloc_pd", err)
		}
		p.ctx.lt.DropChild()
		return nil
	})
}

// mr is an ibv_mr over memory from internal/mem.
type mr struct {
	lt     verbs.Lifetime
	pd     *pd
	h      mrHandle
	buf    []byte
	access verbs.Access
	// Copied at registration: the C struct is freed by Close.
	lkey, rkey uint32
}

func (p *pd) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("ibv: register memory: %w: zero-length region", verbs.ErrInvalid)
	}
	if err := mem.Check(buf); err != nil {
		return nil, fmt.Errorf("ibv: register %d bytes: %w: %v", len(buf), verbs.ErrInvalid, err)
	}
	if err := access.Validate(); err != nil {
		return nil, fmt.Errorf("ibv: register memory: %w", err)
	}
	if max := p.ctx.attr.MaxMRSize; max != 0 && uint64(len(buf)) > max {
		return nil, fmt.Errorf("ibv: register %d bytes: %w: the device's max_mr_size is %d", len(buf), verbs.ErrInvalid, max)
	}
	if err := p.lt.AddChild(); err != nil {
		return nil, err
	}
	// buf is mapped off the Go heap (mem.Check): the device may keep
	// its address.
	h, err := p.h.regMR(buf, access)
	if err != nil {
		p.lt.DropChild()
		if err == syscall.ENOMEM || err == syscall.EPERM {
			return nil, memlockError(len(buf), err)
		}
		return nil, errnoErr(fmt.Sprintf("ibv_reg_mr %d bytes", len(buf)), err)
	}
	lkey, rkey := h.keys()
	return &mr{pd: p, h: h, buf: buf, access: access, lkey: lkey, rkey: rkey}, nil
}

func (m *mr) LKey() uint32         { return m.lkey }
func (m *mr) RKey() uint32         { return m.rkey }
func (m *mr) Addr() uint64         { return uint64(uintptr(unsafe.Pointer(&m.buf[0]))) }
func (m *mr) Len() int             { return len(m.buf) }
func (m *mr) Bytes() []byte        { return m.buf }
func (m *mr) Access() verbs.Access { return m.access }

func (m *mr) Close() error {
	return m.lt.Close(func() error {
		if err := m.h.dereg(); err != nil {
			return errnoErr("ibv_dereg_mr", err)
		}
		m.pd.lt.DropChild()
		return nil
	})
}
