package rdma

import (
	"fmt"
	"runtime"

	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Batch collects operations and posts them in one call: one WR chain and
// one doorbell, with only the last WR signaled. It is the fast path for
// data movers. A Batch is reusable: Post empties it. It is not safe for
// concurrent use.
type Batch struct {
	c    *conn
	wrs  []verbs.SendWR
	sges []verbs.SGE
	ops  []rc.Op
	err  error
}

// NewBatch returns an empty batch for c.
func (c *Conn) NewBatch() *Batch { return &Batch{c: c.conn} }

// Len is the number of operations in the batch.
func (b *Batch) Len() int { return len(b.wrs) }

// Send adds a SEND of src.
func (b *Batch) Send(src Local) { b.addSend(verbs.OpSend, src, 0) }

// SendWithImm adds a SEND of src with an immediate value.
func (b *Batch) SendWithImm(src Local, imm uint32) { b.addSend(verbs.OpSendWithImm, src, imm) }

// Write adds a WRITE of src to dst.
func (b *Batch) Write(src Local, dst RemoteRegion) { b.addRDMA(rc.OpWrite, verbs.OpWrite, src, dst, 0) }

// WriteWithImm adds a WRITE_WITH_IMM of src to dst.
func (b *Batch) WriteWithImm(src Local, dst RemoteRegion, imm uint32) {
	b.addRDMA(rc.OpWrite, verbs.OpWriteWithImm, src, dst, imm)
}

// Read adds a READ from src into dst.
func (b *Batch) Read(dst Local, src RemoteRegion) { b.addRDMA(rc.OpRead, verbs.OpRead, dst, src, 0) }

func (b *Batch) addSend(opc verbs.Opcode, src Local, imm uint32) {
	if b.err != nil {
		return
	}
	var o rc.Op
	var wr verbs.SendWR
	err := b.c.sendRequest(&o, &wr, opc, src, imm)
	b.add(err, o, wr)
	runtime.KeepAlive(src) // add took the reference: the handle may go now
}

func (b *Batch) addRDMA(kind rc.OpKind, opc verbs.Opcode, l Local, r RemoteRegion, imm uint32) {
	if b.err != nil {
		return
	}
	var o rc.Op
	var wr verbs.SendWR
	err := b.c.rdmaRequest(&o, &wr, kind, opc, l, r, imm)
	b.add(err, o, wr)
	runtime.KeepAlive(l) // add took the reference: the handle may go now
}

// add records one operation; the first error poisons the batch until
// Post reports it.
func (b *Batch) add(err error, o rc.Op, wr verbs.SendWR) {
	if err == nil && len(b.wrs) >= b.c.cfg.sqDepth {
		err = fmt.Errorf("rdma: conn %v: batch of more than %d operations (the send queue depth): %w", b.c.rc.Remote, b.c.cfg.sqDepth, ErrInvalid)
	}
	if err == nil {
		err = b.c.hold(&o)
	}
	if err != nil {
		b.err = err
		return
	}
	b.ops = append(b.ops, o)
	b.sges = append(b.sges, verbs.SGE{Addr: o.Buf.Addr() + uint64(o.Off), Length: uint32(o.N), LKey: o.Buf.LKey()})
	b.wrs = append(b.wrs, wr)
}

// Post posts the batch as one chain and empties it. The future resolves
// when the last operation completes, which covers all of them, or with
// the first failure. An empty batch resolves at once. A batch goes out
// whole or not at all: one with more messages (SEND, SEND_WITH_IMM,
// WRITE_WITH_IMM) than the peer takes at once (its receive depth, see
// WithQueueDepth) fails with ErrInvalid, and one past the room left
// under the connection's WithSendQueueLimit fails with ErrQueueFull,
// both at once and holding no buffer.
//
// A batch within the peer's cap is delivered, however many connections
// share the peer's receive queue: it waits for its messages' credits
// all at once, in turn with the other connections that wait. The peer
// keeps the receives it frees for the first connection in line until
// it can give that one's whole batch, and recalls the credits others
// hold and cannot use; a connection whose batch waits gives back the
// credits it holds and asks again for all of them, so no batch holds
// part of its credits while waiting for the rest.
func (b *Batch) Post() *Future {
	c := b.c
	defer b.reset()
	if b.err != nil {
		b.unhold()
		return newResolved(b.err)
	}
	n := len(b.wrs)
	if n == 0 {
		return newResolved(nil)
	}
	if need, most := rc.NeedCredits(b.wrs), c.rc.SQ.CreditCap(); need > most {
		// The chain would wait for credits for ever, and all behind it.
		b.unhold()
		return newResolved(fmt.Errorf("rdma: conn %v: batch of %d messages: %w: the peer takes at most %d at once (its receive depth)", c.rc.Remote, need, ErrInvalid, most))
	}
	f := &Future{drv: c.rc.Drv}
	total := 0
	for i := range b.wrs {
		b.ops[i].Fut = (*opFuture)(f)
		total += b.ops[i].N
		c.rc.Counters.Issued(b.wrs[i].Opcode, b.ops[i].N)
		b.wrs[i].SGL = b.sges[i : i+1]
		if b.ops[i].N == 0 {
			b.wrs[i].SGL = nil
		}
	}
	// The last WR is signaled and its future reports the batch's bytes.
	b.ops[n-1].Signaled = true
	b.ops[n-1].N = total
	b.wrs[n-1].Flags |= verbs.SendSignaled
	err := c.rc.SQ.SubmitChain(b.wrs, b.ops)
	if err != nil {
		f.resolve(err, 0, 0, false, nil, 0)
	}
	return f
}

// unhold drops the references add took.
func (b *Batch) unhold() {
	for i := range b.ops {
		b.ops[i].DropBuf()
	}
}

func (b *Batch) reset() {
	clear(b.wrs)
	clear(b.ops)
	b.wrs, b.sges, b.ops, b.err = b.wrs[:0], b.sges[:0], b.ops[:0], nil
}
