package ud

import (
	"sync"
	"time"
)

// deadline is a read or write deadline, as net.Pipe keeps one: a channel
// that closes when the deadline passes, which blocked calls select on, so
// that setting a deadline affects calls already waiting.
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{} // closed when the deadline passes
	onPass func()        // called when it passes, after cancel closes; set before use
}

func newDeadline() *deadline { return &deadline{cancel: make(chan struct{})} }

// set sets the deadline to t; the zero time clears it.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer fired: wait for it to close cancel
	}
	d.timer = nil
	closed := isClosed(d.cancel)
	if t.IsZero() {
		if closed {
			d.cancel = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.cancel = make(chan struct{})
		}
		cancel := d.cancel
		d.timer = time.AfterFunc(dur, func() { close(cancel); d.passed() })
		return
	}
	if !closed {
		close(d.cancel)
		d.passed()
	}
}

// passed tells onPass that the deadline passed.
func (d *deadline) passed() {
	if d.onPass != nil {
		d.onPass()
	}
}

// wait is a channel closed once the deadline has passed.
func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

// stop stops the deadline's timer.
func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
