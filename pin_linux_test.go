package rdma_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/poller"
	"github.com/go-rdma/rdma/rdmatest"
)

// threadCPUs is the CPU set of OS thread tid (0: the caller's), read
// from the kernel.
func threadCPUs(t *testing.T, tid int) []int {
	t.Helper()
	var set unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(tid, &set))
	var cpus []int
	for c := range len(set) * 64 {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus
}

// Rule: WithPollerCPUs pins the threads of both sides' pollers to the
// set given, in every poll mode, read back from the kernel.
func TestPollerCPUs(t *testing.T) {
	allowed := threadCPUs(t, 0)
	want := allowed[len(allowed)-1:] // a strict subset on a multi-CPU machine
	for _, m := range []rdma.PollMode{rdma.PollAdaptive, rdma.PollBusy, rdma.PollEvent} {
		t.Run(m.String(), func(t *testing.T) {
			c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft), rdma.WithPollMode(m), rdma.WithPollerCPUs(want...))
			for _, conn := range []*rdma.Conn{c, s} {
				tid := rdma.ConnPollerThread(conn)
				require.NotZero(t, tid)
				assert.Equal(t, want, threadCPUs(t, tid))
				assert.Equal(t, want, rdma.ConnPollerConfig(conn).CPUs)
			}
			testSendRecv(t, []rdma.Option{rdma.WithProvider(rdma.ProviderSoft), rdma.WithPollMode(m), rdma.WithPollerCPUs(want...)})
		})
	}
}

// Rule: every poller of an engine, one per CQ, is pinned to the whole
// set.
func TestPollerCPUsEveryCQ(t *testing.T) {
	allowed := threadCPUs(t, 0)
	want := allowed[len(allowed)-1:]
	// A connection of 4096+4096 entries fills the first CQ, so the
	// engine's two ends of one connection need two CQs.
	e, err := rdma.OpenEngine(rdma.WithProvider(rdma.ProviderSoft), rdma.WithPollerCPUs(want...))
	require.NoError(t, err)
	defer e.Close()
	ln, err := e.Listen("rdma", "127.0.0.1:0", rdma.WithQueueDepth(4096, 4096), rdma.WithMaxMessage(64))
	require.NoError(t, err)
	defer ln.Close()
	rdmatest.Connect(t, ln, func(ctx context.Context, address string) (*rdma.Conn, error) {
		return e.Dial(ctx, "rdma", address, rdma.WithQueueDepth(4096, 4096), rdma.WithMaxMessage(64))
	})

	tids := rdma.EnginePollerThreads(e)
	require.GreaterOrEqual(t, len(tids), 2, "the engine made one CQ")
	for _, tid := range tids {
		require.NotZero(t, tid)
		assert.Equal(t, want, threadCPUs(t, tid), "poller thread %d", tid)
	}
	assert.Len(t, slices.Compact(slices.Sorted(slices.Values(tids))), len(tids), "pollers share a thread")
}

// Rule: the CPU set is part of the engine's key: the package-level Dial
// and Listen make one engine per set (an Engine's connections cannot
// ask for another set: TestOptionKinds).
func TestPollerCPUsEngineKey(t *testing.T) {
	allowed := threadCPUs(t, 0)
	if len(allowed) < 2 {
		t.Skip("needs two CPUs")
	}
	dialOn := func(cpu int) *rdma.Conn {
		opts := []rdma.Option{rdma.WithProvider(rdma.ProviderSoft), rdma.WithPollerCPUs(cpu)}
		ln, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
		require.NoError(t, err)
		defer ln.Close()
		c, _ := rdmatest.Connect(t, ln, func(ctx context.Context, address string) (*rdma.Conn, error) {
			return rdma.Dial(ctx, "rdma", address, opts...)
		})
		return c
	}
	a, b := dialOn(allowed[0]), dialOn(allowed[1])
	assert.Equal(t, allowed[:1], threadCPUs(t, rdma.ConnPollerThread(a)))
	assert.Equal(t, allowed[1:2], threadCPUs(t, rdma.ConnPollerThread(b)))
}

// Rule: a CPU the process may not run on is refused by the option, so
// by OpenEngine, Dial and Listen, with ErrInvalid naming the CPU and the
// allowed set; so is pinning without the thread lock.
func TestPollerCPUsRefused(t *testing.T) {
	allowed := threadCPUs(t, 0)
	outside := 0
	for slices.Contains(allowed, outside) {
		outside++
	}
	bad := rdma.WithPollerCPUs(allowed[0], outside)
	_, err := rdma.OpenEngine(rdma.WithProvider(rdma.ProviderSoft), bad)
	require.ErrorIs(t, err, rdma.ErrInvalid)
	assert.Contains(t, err.Error(), fmt.Sprintf("CPU %d ", outside))
	assert.Contains(t, err.Error(), "allowed: "+poller.FormatCPUs(allowed))
	_, err = rdma.Listen("rdma", "127.0.0.1:0", rdma.WithProvider(rdma.ProviderSoft), bad)
	require.ErrorIs(t, err, rdma.ErrInvalid)
	_, err = rdma.Dial(context.Background(), "rdma", "127.0.0.1:1", rdma.WithProvider(rdma.ProviderSoft), bad)
	require.ErrorIs(t, err, rdma.ErrInvalid)
	_, err = rdma.OpenEngine(rdma.WithProvider(rdma.ProviderSoft), rdma.WithPollerCPUs(-1))
	require.ErrorIs(t, err, rdma.ErrInvalid)
	_, err = rdma.OpenEngine(rdma.WithProvider(rdma.ProviderSoft), rdma.WithPollerCPUs(allowed[0]), rdma.WithPollerThreadLock(false))
	require.ErrorIs(t, err, rdma.ErrInvalid)
}
