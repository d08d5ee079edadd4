package fifo

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestFIFO: the queue keeps order across wrap-arounds, removes from the
// middle, and stops allocating once its array is big enough.
func TestFIFO(t *testing.T) {
	var q Queue[int]
	for i := range 5 {
		q.Push(i)
	}
	assert.Equal(t, 0, q.Pop())
	q.Remove(1) // 2
	assert.Equal(t, []int{1, 3, 4}, q.Items())
	assert.Equal(t, []int{1, 3, 4}, q.Take())
	assert.Equal(t, 0, q.Len())
	next, want := 0, 0
	allocs := testing.AllocsPerRun(100, func() {
		for range 3 {
			q.Push(next)
			next++
		}
		for range 3 {
			if got := q.Pop(); got != want {
				t.Fatalf("popped %d, want %d", got, want)
			}
			want++
		}
	})
	assert.Zero(t, allocs)
}
