package ud

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Datagram is one datagram of a batch: N bytes of Buf at Off, memory of
// the engine's pool, to To.
type Datagram struct {
	Buf    *pool.Buffer
	Off, N int
	To     *Addr
}

// SendBatch posts ds in one chain of WRs (one doorbell), without copies:
// each buffer is referenced until its datagram has left, and done is told
// once, when the last has, with the first error and the bytes sent. The
// peers are found and the room taken first, bounded by the write
// deadline; an error then means nothing was posted and done is not told.
// A batch holds at most the send depth.
func (e *Endpoint) SendBatch(ds []Datagram, done SendDone) error {
	if len(ds) > len(e.sends) {
		return fmt.Errorf("%w: a batch of %d datagrams; the send depth is %d", verbs.ErrInvalid, len(ds), len(e.sends))
	}
	dl := e.wdl.wait()
	ps := make([]dest, len(ds))
	for i, d := range ds {
		if d.Buf.Pool() != e.eng.Pool {
			return fmt.Errorf("%w: datagram %d: a buffer of another engine's pool", verbs.ErrInvalid, i)
		}
		p, err := e.routeTo(d.N, d.To, dl)
		if err != nil {
			return fmt.Errorf("datagram %d: %w", i, err)
		}
		ps[i] = p
	}
	if len(ds) == 0 {
		done.SendDone(nil, 0)
		return nil
	}
	// What was taken, given back on an error before the post.
	rooms, refs := 0, 0
	var ahs []*ahRef
	undo := func() {
		for range rooms {
			e.room <- struct{}{}
		}
		for _, d := range ds[:refs] {
			d.Buf.Unref()
		}
		for _, ah := range ahs {
			ah.release()
		}
	}
	for range ds {
		if err := e.takeRoom(dl); err != nil {
			undo()
			return err
		}
		rooms++
	}
	for _, d := range ds {
		if err := d.Buf.Ref(); err != nil {
			undo()
			return err
		}
		refs++
	}
	for _, p := range ps {
		ah, err := p.ah()
		if err != nil {
			undo()
			return err
		}
		ahs = append(ahs, ah)
	}
	b := &batchDone{done: done}
	b.left.Store(int32(len(ds)))
	e.smu.Lock()
	if err := e.endErr(); err != nil {
		e.smu.Unlock()
		undo()
		return err
	}
	e.bwr, e.bsge = e.bwr[:0], e.bsge[:0]
	slots := make([]uint32, len(ds))
	for i, d := range ds {
		j := e.sfree[len(e.sfree)-1]
		e.sfree = e.sfree[:len(e.sfree)-1]
		slots[i] = j
		e.sends[j] = sendSlot{pb: d.Buf, ah: ahs[i], n: d.N, done: b}
		e.bsge = append(e.bsge, verbs.SGE{Addr: d.Buf.Addr() + uint64(d.Off), Length: uint32(d.N), LKey: d.Buf.LKey()})
	}
	for i, d := range ds {
		wr := ps[i].wr(e.slot.Base()|uint64(slots[i]), e.bsge[i:i+1], ahs[i])
		if d.N == 0 {
			wr.SGL = nil
		}
		e.bwr = append(e.bwr, wr)
	}
	e.posted.Add(int64(len(ds)))
	k, err := e.qp.PostSend(e.bwr)
	clear(e.bwr)
	if err == nil {
		e.smu.Unlock()
		e.st.sent.Add(uint64(len(ds)))
		if e.kick != nil {
			e.kick.Kick()
		}
		return nil
	}
	// The first k went; the rest never will.
	for i := k; i < len(ds); i++ {
		e.sends[slots[i]] = sendSlot{}
		e.sfree = append(e.sfree, slots[i])
	}
	e.posted.Add(-int64(len(ds) - k))
	e.smu.Unlock()
	e.st.sent.Add(uint64(k))
	for i := k; i < len(ds); i++ {
		e.room <- struct{}{}
		ds[i].Buf.Unref()
		ahs[i].release()
	}
	err = fmt.Errorf("rdma: post UD sends: %d of %d posted: %w", k, len(ds), err)
	if k == 0 {
		return err
	}
	b.fail(err)
	b.finish(len(ds)-k, 0)
	return nil
}

// batchDone is the SendDone of a batch's datagrams: it tells the batch's
// own done once, when the last has left.
type batchDone struct {
	left atomic.Int32
	n    atomic.Int64
	mu   sync.Mutex
	err  error // the first; under mu
	done SendDone
}

func (b *batchDone) fail(err error) {
	b.mu.Lock()
	if b.err == nil {
		b.err = err
	}
	b.mu.Unlock()
}

// SendDone counts one datagram of the batch.
func (b *batchDone) SendDone(err error, n int) {
	if err != nil {
		b.fail(err)
	}
	b.finish(1, n)
}

// finish counts k datagrams of n bytes as done, and tells done when they
// were the last.
func (b *batchDone) finish(k, n int) {
	b.n.Add(int64(n))
	if b.left.Add(-int32(k)) == 0 {
		b.mu.Lock()
		err := b.err
		b.mu.Unlock()
		b.done.SendDone(err, int(b.n.Load()))
	}
}
