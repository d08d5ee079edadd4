// Package fifo is a first-in first-out queue that reuses its array.
package fifo

// Queue is a first-in first-out queue that reuses its array. A slice
// popped at the front (q = q[1:]) loses the room before it, so a queue
// that stays short, as the Recvs of a request-response loop, allocated
// on every append. The zero Queue is empty.
type Queue[T any] struct {
	s    []T
	head int // s[head:] is queued
}

// Len is how many are queued.
func (q *Queue[T]) Len() int { return len(q.s) - q.head }

// Push queues v.
func (q *Queue[T]) Push(v T) {
	if q.head > 0 && len(q.s) == cap(q.s) {
		n := copy(q.s, q.s[q.head:])
		clear(q.s[n:])
		q.s, q.head = q.s[:n], 0
	}
	q.s = append(q.s, v)
}

// Pop takes the oldest; the queue must not be empty.
func (q *Queue[T]) Pop() T {
	v := q.s[q.head]
	var zero T
	q.s[q.head] = zero
	q.head++
	if q.head == len(q.s) {
		q.s, q.head = q.s[:0], 0
	}
	return v
}

// Items is what is queued, oldest first, until the next change.
func (q *Queue[T]) Items() []T { return q.s[q.head:] }

// Take empties the queue and returns what it held, oldest first.
func (q *Queue[T]) Take() []T {
	v := q.s[q.head:]
	*q = Queue[T]{}
	return v
}

// Remove takes out the i-th oldest.
func (q *Queue[T]) Remove(i int) {
	i += q.head
	copy(q.s[i:], q.s[i+1:])
	var zero T
	q.s[len(q.s)-1] = zero
	q.s = q.s[:len(q.s)-1]
	if q.head == len(q.s) {
		q.s, q.head = q.s[:0], 0
	}
}
