package poller

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/go-rdma/rdma/internal/verbs"
)

// affinity is the CPU set of OS thread tid, read from the kernel.
func affinity(t *testing.T, tid int) []int {
	t.Helper()
	var set unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(tid, &set))
	return setCPUs(&set)
}

// threadRecorder records the OS threads its Completions ran on.
type threadRecorder struct {
	tids chan int
}

func (r *threadRecorder) Completions(wc []verbs.WorkCompletion) {
	select {
	case r.tids <- threadID():
	default:
	}
}

// Rule: a poller with Config.CPUs runs on a thread whose affinity, read
// back from the kernel, is exactly that set, in every mode; its handler
// runs there; and the thread that started it is not pinned.
func TestPinnedThread(t *testing.T) {
	allowed, err := allowedCPUs()
	require.NoError(t, err)
	// The last allowed CPU alone: a strict subset of the process's set
	// whenever the machine has more than one CPU, so that the read-back
	// tells a pinned thread from an unpinned one.
	want := allowed[len(allowed)-1:]
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			ch := newFakeChan()
			cq := newFakeCQ(64, ch)
			rec := &threadRecorder{tids: make(chan int, 1)}
			p := mustNew(t, cq, ch, rec, Config{Mode: m, CPUs: want})
			tid := p.ThreadID()
			require.NotZero(t, tid, "a pinned poller has a thread")
			assert.Equal(t, want, affinity(t, tid), "the poller's thread's affinity")
			assert.Equal(t, want, p.Config().CPUs)
			assert.Equal(t, allowed, affinity(t, 0), "the caller's thread was pinned too")

			require.True(t, cq.push1(0))
			select {
			case got := <-rec.tids:
				assert.Equal(t, tid, got, "the handler ran on another thread than ThreadID")
			case <-p.Done():
				t.Fatalf("poller stopped: %v", p.Err())
			}
			require.NoError(t, p.Close())
			require.NoError(t, p.Err())
		})
	}
}

// Rule: the pinned thread is never handed to other goroutines: it exits
// with the poller. (The runtime never ends the process's main thread: a
// poller that started there leaves it parked for good, and the next one
// cannot start there.)
func TestPinnedThreadExits(t *testing.T) {
	allowed, err := allowedCPUs()
	require.NoError(t, err)
	for range 2 {
		p := mustNew(t, newFakeCQ(64, nil), nil, &threadRecorder{}, Config{Mode: Busy, CPUs: allowed[:1]})
		tid := p.ThreadID()
		task := fmt.Sprintf("/proc/self/task/%d", tid)
		_, err = os.Stat(task)
		require.NoError(t, err, "the poller's thread is one of the process's")
		require.NoError(t, p.Close())
		if tid == os.Getpid() {
			continue // the main thread: wedged, not ended
		}
		gone := spinUntil(func() bool {
			_, err := os.Stat(task)
			return errors.Is(err, os.ErrNotExist)
		})
		assert.True(t, gone, "the pinned thread %s outlived its poller", task)
		return
	}
	t.Fatal("both pollers ran on the main thread")
}

// Rule: New refuses a CPU the process may not run on, a CPU number out
// of range, and pinning without the thread lock, with ErrInvalid and a
// message that names the CPU and the allowed set.
func TestPinRefused(t *testing.T) {
	allowed, err := allowedCPUs()
	require.NoError(t, err)
	outside := 0 // the first CPU number the process may not use
	for slices.Contains(allowed, outside) {
		outside++
	}
	cq := newFakeCQ(64, nil)
	h := &threadRecorder{}
	_, err = New(cq, nil, h, Config{Mode: Busy, CPUs: []int{allowed[0], outside}})
	require.ErrorIs(t, err, verbs.ErrInvalid)
	assert.Contains(t, err.Error(), fmt.Sprintf("CPU %d ", outside))
	assert.Contains(t, err.Error(), "allowed: "+FormatCPUs(allowed))

	for _, cpus := range [][]int{{-1}, {maxCPU}, {0, maxCPU + 7}} {
		_, err = New(cq, nil, h, Config{Mode: Busy, CPUs: cpus})
		require.ErrorIs(t, err, verbs.ErrInvalid, "CPUs %v", cpus)
	}
	_, err = New(cq, nil, h, Config{Mode: Busy, Lock: LockNever, CPUs: allowed[:1]})
	require.ErrorIs(t, err, verbs.ErrInvalid, "pinning an unlocked poller")
}

// Rule: CheckCPUs sorts and deduplicates; an empty set is no pinning.
func TestCheckCPUs(t *testing.T) {
	allowed, err := allowedCPUs()
	require.NoError(t, err)
	got, err := CheckCPUs(nil)
	require.NoError(t, err)
	assert.Nil(t, got)
	rev := slices.Clone(allowed)
	slices.Reverse(rev)
	got, err = CheckCPUs(append(rev, allowed...))
	require.NoError(t, err)
	assert.Equal(t, allowed, got)
}

func TestFormatCPUs(t *testing.T) {
	for _, tc := range []struct {
		cpus []int
		want string
	}{
		{nil, ""},
		{[]int{0}, "0"},
		{[]int{0, 1}, "0-1"},
		{[]int{0, 1, 2, 3, 8, 10, 11}, "0-3,8,10-11"},
		{[]int{1, 3, 5}, "1,3,5"},
	} {
		assert.Equal(t, tc.want, FormatCPUs(tc.cpus), "%v", tc.cpus)
	}
}
