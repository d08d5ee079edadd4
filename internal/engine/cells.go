package engine

import (
	"errors"
	"sync"

	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/verbs"
)

// CellSize is the size of a cell.
const CellSize = 16

// Cell is CellSize bytes of registered memory, and the lkey of the page
// they are on: a connection's credit words.
type Cell struct {
	Mem  []byte
	Addr uint64
	LKey uint32
}

// Cells hands out the cells of an engine's endpoints, in pages of their
// own rather than from the buffer pool, so that an endpoint holds no pool
// buffer of the application's: each page is registered once for local
// access (a credit WRITE's source); what a peer may write gets a
// registration of its own.
type Cells struct {
	mu    sync.Mutex
	pages []cellPage
	free  []Cell
}

type cellPage struct {
	mem []byte
	mr  verbs.MR
}

// Get returns a zeroed cell, mapping and registering a page when none is
// free.
func (p *Cells) Get(pd verbs.PD) (Cell, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) == 0 {
		m, err := mem.Map(mem.PageSize)
		if err != nil {
			return Cell{}, err
		}
		mr, err := pd.RegMR(m, verbs.AccessLocalWrite)
		if err != nil {
			mem.Unmap(m)
			return Cell{}, err
		}
		p.pages = append(p.pages, cellPage{mem: m, mr: mr})
		for off := len(m) - CellSize; off >= 0; off -= CellSize {
			p.free = append(p.free, Cell{Mem: m[off : off+CellSize : off+CellSize], Addr: mr.Addr() + uint64(off), LKey: mr.LKey()})
		}
	}
	b := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	clear(b.Mem)
	return b, nil
}

// Put takes back a cell whose own registrations are closed.
func (p *Cells) Put(b Cell) {
	p.mu.Lock()
	p.free = append(p.free, b)
	p.mu.Unlock()
}

// close deregisters and unmaps the pages: the engine's endpoints are
// gone.
func (p *Cells) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, pg := range p.pages {
		errs = append(errs, pg.mr.Close(), mem.Unmap(pg.mem))
	}
	p.pages, p.free = nil, nil
	return errors.Join(errs...)
}
