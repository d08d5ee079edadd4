package verbs

import (
	"fmt"
	"sync"
)

// Lifetime is the open/closed state and child count that every provider
// object keeps, so that both providers close children first and refuse
// use after Close in the same way.
//
// Operations bracket their work with Enter/Exit (a read lock), so Close,
// which takes the write lock, never frees an object under a running call.
// Calls that wait for a long time must not hold it; they are woken by
// whatever Close tears down.
type Lifetime struct {
	mu       sync.RWMutex
	closed   bool
	children int
}

// Enter reports whether the object is open; if so the caller must Exit.
func (l *Lifetime) Enter() bool {
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return false
	}
	return true
}

// Exit ends an operation started by a successful Enter.
func (l *Lifetime) Exit() { l.mu.RUnlock() }

// Closed reports whether Close has succeeded.
func (l *Lifetime) Closed() bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.closed
}

// AddChild records a new child. It fails with ErrClosed on a closed
// parent.
func (l *Lifetime) AddChild() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	l.children++
	return nil
}

// DropChild records that a child was destroyed.
func (l *Lifetime) DropChild() {
	l.mu.Lock()
	l.children--
	l.mu.Unlock()
}

// Close runs destroy once, when there are no children. A second Close is
// a no-op returning nil; live children give ErrBusy and leave the object
// open. If destroy fails the object stays open.
func (l *Lifetime) Close(destroy func() error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	if l.children > 0 {
		return fmt.Errorf("%w: %d still open", ErrBusy, l.children)
	}
	if err := destroy(); err != nil {
		return err
	}
	l.closed = true
	return nil
}
