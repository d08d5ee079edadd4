package rc

// ring is a fixed-size FIFO of wr_ids; it never allocates after newRing.
type ring struct {
	buf        []uint64
	head, size int
}

func newRing(n int) ring { return ring{buf: make([]uint64, n)} }

func (r *ring) len() int { return r.size }

func (r *ring) push(id uint64) {
	if r.size == len(r.buf) {
		// Credits bound the WRs in flight by the ring's size, so this
		// means a bug, not load.
		panic("rdma: send ring overflow")
	}
	r.buf[(r.head+r.size)%len(r.buf)] = id
	r.size++
}

func (r *ring) popFront() uint64 {
	id := r.buf[r.head]
	r.head = (r.head + 1) % len(r.buf)
	r.size--
	return id
}

func (r *ring) popBack() uint64 {
	r.size--
	return r.buf[(r.head+r.size)%len(r.buf)]
}
