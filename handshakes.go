package rdma

import (
	"container/list"
	"context"
	"sync"
	"time"
)

// handshakes bounds the handshakes a Listener has made a queue pair for
// (maxHandshakes), and keeps those that idle from keeping a real client
// out. A live dialer finishes within a round trip of the listener's
// hello; one that says nothing more (a replayed hello, a dialer that
// died) would hold its slot until the handshake's bound. So while valid
// hellos wait for a slot, the handshake that has waited longest on its
// peer, once it has waited grace, is given up, one for each hello
// waiting; and the waiting hellos get slots in the order they came.
type handshakes struct {
	grace time.Duration

	mu       sync.Mutex
	free     int
	idle     list.List // *handshake waiting on its peer, longest first
	queue    list.List // chan struct{} of the hellos waiting for a slot, first first
	evicting int       // handshakes given up whose slot is not free yet
	timer    *time.Timer
}

// handshake is one handshake holding a slot.
type handshake struct {
	hs      *handshakes
	e       *list.Element // in hs.idle while it waits on its peer
	since   time.Time     // when it began to wait on its peer
	cut     func()        // ends its wait
	evicted bool
}

// busyGrace is how long a handshake may wait on its peer while other
// hellos wait for its slot (at most half the handshake's bound): a live
// dialer needs a round trip and two transitions of its queue pair,
// milliseconds even on a loaded host.
const busyGrace = time.Second

func newHandshakes(setup time.Duration) *handshakes {
	return &handshakes{grace: min(busyGrace, setup/2), free: maxHandshakes}
}

// acquire waits for a slot, or for ctx to end.
func (hs *handshakes) acquire(ctx context.Context) (*handshake, error) {
	hs.mu.Lock()
	if hs.free > 0 && hs.queue.Len() == 0 {
		hs.free--
		hs.mu.Unlock()
		return &handshake{hs: hs}, nil
	}
	got := make(chan struct{}, 1)
	e := hs.queue.PushBack(got)
	hs.evictLocked(time.Now())
	hs.mu.Unlock()
	select {
	case <-got:
		return &handshake{hs: hs}, nil
	case <-ctx.Done():
	}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	select {
	case <-got: // handed a slot as ctx ended: it goes to the next
		hs.handOnLocked()
	default:
		hs.queue.Remove(e)
	}
	return nil, ctx.Err()
}

// waiting marks h as waiting on its peer from now; cut ends the wait,
// should the slot be needed.
func (h *handshake) waiting(cut func()) {
	hs := h.hs
	hs.mu.Lock()
	defer hs.mu.Unlock()
	h.since, h.cut = time.Now(), cut
	h.e = hs.idle.PushBack(h)
	hs.evictLocked(h.since)
}

// release frees h's slot for the next hello; it reports whether h was
// given up for it.
func (h *handshake) release() (evicted bool) {
	hs := h.hs
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if h.e != nil {
		hs.idle.Remove(h.e)
		h.e = nil
	}
	if h.evicted {
		hs.evicting--
	}
	hs.handOnLocked()
	return h.evicted
}

// handOnLocked gives a free slot to the hello that has waited longest.
func (hs *handshakes) handOnLocked() {
	if f := hs.queue.Front(); f != nil {
		hs.queue.Remove(f)
		f.Value.(chan struct{}) <- struct{}{}
	} else {
		hs.free++
	}
	hs.evictLocked(time.Now())
}

// evictLocked gives up, for each hello waiting for a slot, a handshake
// that has waited grace on its peer; if the longest waiting has not yet,
// a timer looks again when it has.
func (hs *handshakes) evictLocked(now time.Time) {
	for hs.queue.Len() > hs.evicting {
		f := hs.idle.Front()
		if f == nil {
			return // every slot is at work on this side: a release hands it on
		}
		h := f.Value.(*handshake)
		if left := h.since.Add(hs.grace).Sub(now); left > 0 {
			if hs.timer == nil {
				hs.timer = time.AfterFunc(left, hs.recheck)
			} else {
				hs.timer.Reset(left)
			}
			return
		}
		hs.idle.Remove(f)
		h.e, h.evicted = nil, true
		hs.evicting++
		h.cut()
	}
}

func (hs *handshakes) recheck() {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	hs.evictLocked(time.Now())
}

// stop stops the timer, once no hello waits any more (Close).
func (hs *handshakes) stop() {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.timer != nil {
		hs.timer.Stop()
	}
}
