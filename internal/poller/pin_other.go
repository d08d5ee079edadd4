//go:build !linux

package poller

import (
	"fmt"
	"runtime"

	"github.com/go-rdma/rdma/internal/verbs"
)

// maxCPU bounds CPU numbers; nothing can be pinned here.
const maxCPU = 1024

func allowedCPUs() ([]int, error) {
	return nil, fmt.Errorf("poller: %w: pinning pollers to CPUs needs sched_setaffinity (Linux), not %s", verbs.ErrNotSupported, runtime.GOOS)
}

func pinThread([]int) error { _, err := allowedCPUs(); return err }

// threadID is not available here.
func threadID() int { return 0 }
