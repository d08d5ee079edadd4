// Package loglimit rate-limits repeated log records by key.
package loglimit

import (
	"sync"
	"time"
)

// Every is how often a repeated event (a device event of one type, a
// refused handshake of one peer and reason) is logged at most; the
// record says how many more came since the last one logged.
const Every = time.Second

// MaxKeys bounds the keys a Limiter tracks: a refused handshake's
// key names its peer and reason, so an attacker chooses how many there
// are.
const MaxKeys = 64

// Limiter rate-limits repeated log records by key. It tracks at most
// MaxKeys keys: past them, the keys not logged for Every are
// forgotten, and if none is, a record of a new key is held back. What
// forgotten keys held back, and the records held back so, are counted
// as others and reported with the next record logged: nothing goes
// uncounted, and the log takes at most MaxKeys records per Every.
type Limiter struct {
	mu     sync.Mutex
	last   map[string]*count
	others int
}

type count struct {
	at   time.Time // the last record logged
	more int       // records not logged since
}

// Allow reports whether a record of key is logged at now and, if so, how
// many of key were not logged since the last one, and how many of other
// keys were held back and not reported yet.
func (l *Limiter) Allow(key string, now time.Time) (ok bool, more, others int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.last[key]
	switch {
	case n == nil:
		if l.last == nil {
			l.last = map[string]*count{}
		}
		if len(l.last) >= MaxKeys {
			l.forget(now)
		}
		if len(l.last) >= MaxKeys {
			l.others++
			return false, 0, 0
		}
		l.last[key] = &count{at: now}
	case now.Sub(n.at) < Every:
		n.more++
		return false, 0, 0
	default:
		more = n.more
		n.at, n.more = now, 0
	}
	others, l.others = l.others, 0
	return true, more, others
}

// forget drops the keys not logged for Every, counting what they
// held back as others.
func (l *Limiter) forget(now time.Time) {
	for k, n := range l.last {
		if now.Sub(n.at) >= Every {
			l.others += n.more
			delete(l.last, k)
		}
	}
}
