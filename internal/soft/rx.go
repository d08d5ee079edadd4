package soft

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"time"
)

// rx reads a connection's byte stream: headers through a small read-ahead
// buffer, payloads straight into their target memory. Where the platform
// has a scatter read (Linux), the system call that reads the end of a
// payload reads what follows it (the next header, usually) into the
// buffer too, so that a stream of large messages costs about one read per
// message and copies at most readAhead bytes of each payload twice.
//
// Before rx would wait for data it calls idle, which writes the responses
// the reader has queued: acknowledgements go out when the reader has
// caught up with its peer, many in one write.
type rx struct {
	nc   net.Conn
	sr   *scatterReader // nil: plain reads
	buf  []byte
	r, w int
	// idle is called, on the reader's goroutine, before a read that
	// may wait; pending says whether it has anything to do.
	idle    func()
	pending func() bool
	// heard is when a read last brought bytes, in Unix ns: the peer's
	// process is alive (qp.peerHeard).
	heard atomic.Int64
}

func (x *rx) buffered() int { return x.w - x.r }

// readAhead is how much a payload read takes beyond the payload.
const readAhead = 1 << 10

// errAgain: the read would wait and idle has work to do first.
var errAgain = errors.New("soft: read would block")

// read reads once into a, and ahead into the buffer's free space when
// the platform allows; it returns how many bytes went into a. The buffer
// must be empty when a is not.
func (x *rx) read(a []byte) (int, error) {
	idled := false
	for {
		var n int
		var err error
		var ahead []byte
		var w0 int
		if len(a) > 0 {
			// Read ahead enough for the next headers, not so much of
			// the next payload that copying it out costs more than
			// the read it saves.
			x.r, x.w = 0, 0
			ahead = x.buf[:min(len(x.buf), readAhead)]
		} else {
			if x.r == x.w {
				x.r, x.w = 0, 0
			} else if x.r > 0 {
				x.w = copy(x.buf, x.buf[x.r:x.w])
				x.r = 0
			}
			ahead = x.buf[x.w:]
			w0 = x.w
		}
		if x.sr != nil {
			n, err = x.sr.readv(a, ahead, !idled && x.pending())
			if err == errAgain {
				x.idle()
				idled = true
				continue
			}
		} else {
			if !idled && x.pending() {
				x.idle()
				idled = true
			}
			if len(a) > 0 {
				n, err = x.nc.Read(a)
			} else {
				n, err = x.nc.Read(ahead)
				x.w += n
				n = 0
			}
		}
		if n > len(a) {
			x.w += n - len(a)
			n = len(a)
		}
		if n > 0 || x.w > w0 {
			x.heard.Store(time.Now().UnixNano())
			return n, nil // an error will come again
		}
		if err != nil {
			return 0, err
		}
	}
}

// need makes at least n bytes (n <= len(buf)) buffered.
func (x *rx) need(n int) error {
	for x.w-x.r < n {
		if _, err := x.read(nil); err != nil {
			if err == io.EOF && x.w > x.r {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// next consumes n buffered bytes.
func (x *rx) next(n int) []byte {
	b := x.buf[x.r : x.r+n]
	x.r += n
	return b
}

// readFull fills p: from the buffer first, then from the connection.
func (x *rx) readFull(p []byte) error {
	k := copy(p, x.buf[x.r:x.w])
	x.r += k
	p = p[k:]
	for len(p) > 0 {
		if len(p) < len(x.buf)/2 && x.sr == nil {
			// Small rest without scatter reads: one read into the
			// buffer serves it and what follows.
			if err := x.need(1); err != nil {
				return eofMid(err)
			}
			k := copy(p, x.buf[x.r:x.w])
			x.r += k
			p = p[k:]
			continue
		}
		n, err := x.read(p)
		if err != nil {
			return eofMid(err)
		}
		p = p[n:]
	}
	return nil
}

// discard skips n bytes.
func (x *rx) discard(n uint64) error {
	for n > 0 {
		if x.r == x.w {
			if _, err := x.read(nil); err != nil {
				return eofMid(err)
			}
		}
		k := min(uint64(x.w-x.r), n)
		x.r += int(k)
		n -= k
	}
	return nil
}

func eofMid(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
