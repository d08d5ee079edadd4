package rc

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	ieng "github.com/go-rdma/rdma/internal/engine"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Credits in band.
//
// A receiver gives credits back as its application takes messages
// (Grants); it tells the sender by an RDMA WRITE of the total it has
// given over the connection's life into the sender's credit word, as
// FaRM and NCCL do, so no credit return crosses the control channel or
// wakes a goroutine on either side. The word is 4 bytes of the sender's
// registered memory behind an rkey of its own, exactly that range with
// remote write, announced in the hello. The total is a 32-bit counter
// that wraps: what a word adds is its difference to the total the sender
// saw last, and a word older than that (a WRITE that was overtaken)
// adds nothing.
//
// A WRITE wakes no one, so the sender reads its word when it is short of
// credits, before it asks. Only a sender that still waits after reading
// it asks on the control channel, with the total it saw; the receiver
// answers the ask with a frame carrying its total as soon as that is
// beyond what the sender saw, at once if it already is (a WRITE in
// flight). So a sender that holds credits never waits, and a sender
// that waits learns of its credits within one frame. Giving back unused
// credits and recalls stay on the control channel: they come after a
// second idle, or when connections wait.
//
// One credit WRITE is in flight at a time, signaled, in a send queue
// slot of its own beyond the send depth: its completion posts the next
// when the total moved meanwhile, so the WRITEs of a burst of grants
// collapse into one or two.

// The layout of a connection's credit buffer: the word the peer writes,
// and the total this side last wrote to the peer's, the WRITE's source.
const (
	creditWordIn  = 0
	creditWordOut = 8
)

// CreditWord is a connection's side of the in-band credits: the
// grants add to its total (Give), the send queue posts its WRITE and
// reads the word the peer writes, under its postMu.
type CreditWord struct {
	buf ieng.Cell // registered memory for both words
	mr  verbs.MR  // the 4 bytes at creditWordIn, for the peer to write

	// The credits given over the connection's life; the
	// total of the WRITE in flight; whether one is; an ask left to
	// answer in a frame, and the total its sender had seen.
	total   atomic.Uint32
	written atomic.Uint32
	writing atomic.Bool
	askOpen atomic.Bool
	askSeen atomic.Uint32
	// The WRITE's request, kept here (one is in flight at a time) so
	// that posting it allocates nothing: the provider's PostSend is an
	// interface call, and arrays passed to it escape.
	wr  [1]verbs.SendWR
	sge [1]verbs.SGE
}

// Register registers the credit word in a cell of cells, on pd.
func (w *CreditWord) Register(cells *ieng.Cells, pd verbs.PD) error {
	b, err := cells.Get(pd)
	if err != nil {
		return fmt.Errorf("rdma: credit word: %w", err)
	}
	mr, err := pd.RegMR(b.Mem[creditWordIn:creditWordIn+4], verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		cells.Put(b)
		return fmt.Errorf("rdma: register the credit word: %w", err)
	}
	w.buf, w.mr = b, mr
	return nil
}

// MR is the registration of the word the peer writes, for the hello;
// nil when there is none.
func (w *CreditWord) MR() verbs.MR { return w.mr }

// Close deregisters the word and gives its cell back to cells. The
// send queue detached it first (DetachCreditWord): no WRITE of either
// side's can touch it any more.
func (w *CreditWord) Close(mr verbs.MR, cells *ieng.Cells) error {
	err := mr.Close()
	cells.Put(w.buf)
	return err
}

// detach takes the registration away from the send queue's looks.
// Caller holds the send queue's postMu.
func (w *CreditWord) detach() verbs.MR {
	mr := w.mr
	w.mr = nil
	return mr
}

// word returns the uint32 at off of the credit buffer.
func (w *CreditWord) word(off int) *uint32 {
	return (*uint32)(unsafe.Pointer(&w.buf.Mem[off]))
}

// Give adds n to the credits given over the connection's life.
func (w *CreditWord) Give(n int) { w.total.Add(uint32(n)) }

// Total is the credits given over the connection's life.
func (w *CreditWord) Total() uint32 { return w.total.Load() }

// OpenAsk records the peer's ask, which a frame answers (AnswerAsk), and
// the total the peer had seen when it asked.
func (w *CreditWord) OpenAsk(seen uint32) {
	w.askSeen.Store(seen)
	w.askOpen.Store(true)
}

// AskOpen reports whether an ask waits for its answer in a frame.
func (w *CreditWord) AskOpen() bool { return w.askOpen.Load() }

// AnswerAsk closes the open ask when total t is beyond what the asking
// peer saw, and reports whether it did: the frame with t answers it.
func (w *CreditWord) AnswerAsk(t uint32) bool {
	if !w.askOpen.Load() || t == w.askSeen.Load() {
		return false
	}
	w.askOpen.Store(false)
	return true
}

// StartWrite reports whether the caller is to post a WRITE: none was in
// flight. The WRITE's completion calls WriteDone.
func (w *CreditWord) StartWrite() bool { return !w.writing.Swap(true) }

// WriteDone ends the WRITE in flight, and reports whether the caller is
// to post the next: the total moved since.
func (w *CreditWord) WriteDone() bool {
	w.writing.Store(false)
	return w.total.Load() != w.written.Load() && !w.writing.Swap(true)
}

// request is the credit WRITE of wr_id id: the total given so far, put
// in the outgoing word now, into the peer's credit word, inline when the
// QP carries 4 bytes inline. It is kept in w (one is in flight at a
// time), so that posting it allocates nothing. The caller holds postMu,
// and the buffer is registered (mr).
func (w *CreditWord) request(id uint64, inline int, peer *Hello) []verbs.SendWR {
	t := w.total.Load()
	w.written.Store(t)
	atomic.StoreUint32(w.word(creditWordOut), t)
	w.sge[0] = verbs.SGE{Addr: w.buf.Addr + creditWordOut, Length: 4, LKey: w.buf.LKey}
	flags := verbs.SendSignaled
	if inline >= 4 {
		flags |= verbs.SendInline
	}
	w.wr[0] = verbs.SendWR{ID: id, Opcode: verbs.OpWrite, Flags: flags, SGL: w.sge[:],
		RemoteAddr: peer.CreditAddr, RKey: peer.CreditRKey}
	return w.wr[:]
}
