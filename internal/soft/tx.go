package soft

// txBatch is what a QP's worker has staged for one connection: the frames
// of consecutive WRs, written with one writev when the send queue has no
// more runnable WRs, the next WR goes elsewhere, or the batch is full.
// Payloads are written straight from registered memory (small pieces
// are copied next to their header); the MRs are held until written.
//
// Only the goroutine running the send queue (pumpLocked) touches it, and
// it is empty whenever no one does.
type txBatch struct {
	c      *conn
	small  []byte   // headers, inline data, small payload pieces
	segs   [][]byte // the batch in order: slices of small and of registered memory
	mrs    []*mr    // held until written
	cut    int      // small[cut:] is not in segs yet
	bytes  int
	n      int    // WRs staged
	first  uint64 // index of the first
	epoch  uint64 // the QP's epoch and rewind count when it was begun
	rewind uint64
}

const (
	txMaxBytes = ioChunk // a batch is written once this much is staged
	txMaxWR    = 64
	txSmall    = 8 << 10
	txSegs     = 192
	txMRs      = 128
)

func (t *txBatch) init() {
	if t.small == nil {
		t.small = make([]byte, 0, txSmall)
		t.segs = make([][]byte, 0, txSegs)
		t.mrs = make([]*mr, 0, txMRs)
	}
}

// stage adds the frame of the WR at slot s (header h, payload the
// resolved w or the inline data) and takes over w's MR references. The
// batch has room for any WR (see full).
func (t *txBatch) stage(h *header, s *sendSlot, w *sgl) {
	n := len(t.small)
	t.small = t.small[:n+hdrSize]
	h.encode((*[hdrSize]byte)(t.small[n:]))
	t.bytes += hdrSize
	if h.length > 0 {
		if s.isInline {
			t.small = append(t.small, s.inline...)
		} else {
			for _, b := range w.bufs {
				if len(b) < smallCopy && len(t.small)+len(b) <= cap(t.small) {
					t.small = append(t.small, b...)
					continue
				}
				if t.cut < len(t.small) {
					t.segs = append(t.segs, t.small[t.cut:])
				}
				t.segs = append(t.segs, b)
				t.cut = len(t.small)
			}
		}
		t.bytes += int(h.length)
	}
	t.mrs = append(t.mrs, w.mrs...)
	clear(w.mrs)
	clear(w.bufs)
	w.mrs, w.bufs, w.n = w.mrs[:0], w.bufs[:0], 0
	t.n++
}

// full reports whether the batch should be written before another WR is
// staged: it is large enough, or another WR of the largest kind might
// not fit.
func (t *txBatch) full() bool {
	return t.n >= txMaxWR || t.bytes >= txMaxBytes ||
		len(t.small)+hdrSize+maxInline > cap(t.small) ||
		len(t.segs)+2*maxSGE+2 > cap(t.segs) ||
		len(t.mrs)+maxSGE > cap(t.mrs)
}

// finish returns the segments to write.
func (t *txBatch) finish() [][]byte {
	if t.cut < len(t.small) {
		t.segs = append(t.segs, t.small[t.cut:])
		t.cut = len(t.small)
	}
	return t.segs
}

// drop empties the batch and releases its MRs.
func (t *txBatch) drop() {
	for i, m := range t.mrs {
		m.refs.release()
		t.mrs[i] = nil
	}
	clear(t.segs)
	t.mrs, t.segs, t.small = t.mrs[:0], t.segs[:0], t.small[:0]
	t.c, t.cut, t.bytes, t.n = nil, 0, 0, 0
}
