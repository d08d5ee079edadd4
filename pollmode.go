package rdma

import (
	"fmt"

	"github.com/go-rdma/rdma/internal/poller"
)

// PollMode is how an engine's completion pollers wait for completions.
// docs/guide.md has a table of what each mode costs on few and on many
// cores.
type PollMode uint8

const (
	// PollAdaptive, the default, spins for a short while after the last
	// completion (WithPollSpin), then parks on the CQ's completion
	// channel through Go's netpoller. It spins only while no goroutine
	// waits for a CPU.
	PollAdaptive PollMode = iota
	// PollBusy spins on the CQ from a locked OS thread, and Future.Wait
	// polls the CQ from the waiting goroutine (run to completion): the
	// lowest latency at queue depth 1 when the waiter has a core to
	// itself. Once a Wait has polled, the poller stands by until a
	// goroutine waits without polling (a Wait that could not, a select
	// on Done) or, when no Wait has polled for a millisecond, a look at
	// the CQ finds completions. When goroutines outnumber cores,
	// pollers and waiters step back to PollAdaptive's behaviour
	// (docs/guide.md has what that costs).
	PollBusy
	// PollEvent never spins: it parks on the completion channel whenever
	// the CQ is empty. The least CPU, the most latency.
	PollEvent
)

// String is the mode's name, as ParsePollMode takes it.
func (m PollMode) String() string {
	switch m {
	case PollAdaptive:
		return "adaptive"
	case PollBusy:
		return "busy"
	case PollEvent:
		return "event"
	}
	return fmt.Sprintf("PollMode(%d)", uint8(m))
}

// ParsePollMode is the mode named s: "adaptive", "busy" or "event". Any
// other name is an error matching ErrInvalid.
func ParsePollMode(s string) (PollMode, error) {
	for _, m := range []PollMode{PollAdaptive, PollBusy, PollEvent} {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("rdma: %w: unknown poll mode %q (want adaptive, busy or event)", ErrInvalid, s)
}

// poller is the internal poller's mode for m, which must be valid.
func (m PollMode) poller() poller.Mode {
	switch m {
	case PollBusy:
		return poller.Busy
	case PollEvent:
		return poller.Event
	}
	return poller.Adaptive
}
