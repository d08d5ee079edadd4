package rdma_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/go-rdma/rdma"
)

func TestMain(m *testing.M) {
	if role := os.Getenv("RDMA_TEST_CHILD"); role != "" {
		os.Exit(child(role))
	}
	goleak.VerifyTestMain(m)
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

// child runs a role in a child process (see TestPeerKilled).
func child(role string) int {
	switch role {
	default:
		return 2
	}
}
