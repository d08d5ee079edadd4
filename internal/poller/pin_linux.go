package poller

import (
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/go-rdma/rdma/internal/verbs"
)

// maxCPU bounds the CPU numbers a poller may be pinned to: the size of
// the fixed cpu_set_t that sched_setaffinity takes here (1024 CPUs).
const maxCPU = len(unix.CPUSet{}) * 64

// allowedCPUs is the set of CPUs the calling thread may run on: the
// process's, unless the caller pinned its own thread.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("poller: sched_getaffinity: %w", err)
	}
	return setCPUs(&set), nil
}

func setCPUs(set *unix.CPUSet) []int {
	var cpus []int
	for cpu := range maxCPU {
		if set.IsSet(cpu) {
			cpus = append(cpus, cpu)
		}
	}
	return cpus
}

// pinThread pins the calling thread, which the caller has locked, to
// cpus, and reads the mask back: sched_setaffinity silently drops the
// CPUs a cpuset does not allow as long as one is left, and a poller must
// not run anywhere but where it was asked to.
func pinThread(cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("poller: %w: pinning to CPUs %v: sched_setaffinity: %v", verbs.ErrInvalid, cpus, err)
	}
	var got unix.CPUSet
	if err := unix.SchedGetaffinity(0, &got); err != nil {
		return fmt.Errorf("poller: pinning to CPUs %v: sched_getaffinity: %w", cpus, err)
	}
	if g := setCPUs(&got); !slices.Equal(g, cpus) {
		return fmt.Errorf("poller: %w: pinned to CPUs %v, the kernel left %v", verbs.ErrInvalid, cpus, g)
	}
	return nil
}

// threadID is the OS thread the caller runs on.
func threadID() int { return unix.Gettid() }
