package rdma_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/leak"
	"github.com/go-rdma/rdma/internal/testchild"
	"github.com/go-rdma/rdma/rdmatest"
)

func TestMain(m *testing.M) {
	// The roles the tests start this binary in, as a second process.
	testchild.Main(map[string]func() int{
		"dialer": dialerChild,
		"closer": closerChild,
		"many":   manyChild,
		"hold":   holdChild,
		"burst":  burstChild,
		"nolib":  noLibChild,
		"echo":   echoChild,
	})
	// A Buffer a test never releases fails the run (exit 99) and is
	// reported with the place that allocated it.
	goleak.VerifyTestMain(leak.Checked(m))
}

// eachProvider runs f as a subtest per provider: "soft" always, "verbs"
// where a usable device exists. Without one the verbs subtest skips,
// unless RDMA_TEST_REQUIRE_DEVICE=1 makes that a failure. The subtest
// names carry the provider, so the VM harness can count what ran on rxe.
func eachProvider(t *testing.T, f func(t *testing.T, opts []rdma.Option)) {
	t.Helper()
	for _, p := range []string{rdma.ProviderSoft, rdma.ProviderVerbs} {
		t.Run(p, func(t *testing.T) {
			if p == rdma.ProviderVerbs {
				requireDevice(t)
			}
			f(t, []rdma.Option{rdma.WithProvider(p)})
		})
	}
}

// requireDevice skips (or fails, under RDMA_TEST_REQUIRE_DEVICE=1) when
// no verbs device is usable.
func requireDevice(t *testing.T) {
	t.Helper()
	devs, err := rdma.Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.Provider == rdma.ProviderVerbs && d.Usable {
			return
		}
	}
	if os.Getenv("RDMA_TEST_REQUIRE_DEVICE") == "1" {
		t.Fatal("no usable verbs device and RDMA_TEST_REQUIRE_DEVICE=1")
	}
	t.Skip("no usable verbs device; ./test.sh runs these tests on rxe in a VM")
}

// dialerChild is the child of TestPeerKilled: it dials $RDMA_TEST_ADDR,
// sends three messages, says "ready" and waits to be killed.
func dialerChild() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := rdma.Dial(ctx, "rdma", os.Getenv("RDMA_TEST_ADDR"), rdma.WithProvider(os.Getenv("RDMA_TEST_PROVIDER")))
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	b, err := c.Alloc(4096)
	if err != nil {
		fmt.Println("alloc:", err)
		return 1
	}
	for i := 0; i < 3; i++ {
		if err := c.Send(b).Wait(ctx); err != nil {
			fmt.Println("send:", err)
			return 1
		}
	}
	fmt.Println("ready")
	<-ctx.Done() // killed long before this
	return 1
}

// engineOpts are the engine options of opts (rdmatest.Split), for
// OpenEngine.
func engineOpts(opts []rdma.Option) []rdma.EngineOption {
	e, _, _ := rdmatest.Split(opts)
	return e
}

// connOpts are the connection options of opts, for an Engine's Dial.
func connOpts(opts []rdma.Option) []rdma.ConnOption {
	_, c, _ := rdmatest.Split(opts)
	return c
}

// listenOpts are the listener and connection options of opts, for an
// Engine's Listen.
func listenOpts(opts []rdma.Option) []rdma.ListenOption {
	_, _, l := rdmatest.Split(opts)
	return l
}
