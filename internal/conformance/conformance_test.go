package conformance

import (
	"os"
	"sort"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/verbs"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// entry is one provider the suite runs against; target returns the
// devices to use or skips.
type entry struct {
	name   string
	target func(t *testing.T) Target
}

// entries are registered by the per-provider files (verbs_test.go,
// soft_test.go).
var entries []entry

func register(name string, target func(t *testing.T) Target) {
	entries = append(entries, entry{name, target})
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
}

// requireDevice reports whether RDMA_TEST_REQUIRE_DEVICE=1: then a missing
// device is a failure, not a skip.
func requireDevice() bool { return os.Getenv("RDMA_TEST_REQUIRE_DEVICE") == "1" }

// TestConformance runs the whole suite against every registered provider.
// RDMA_TEST_PROVIDERS="soft" (comma-separated) limits the providers.
func TestConformance(t *testing.T) {
	if len(entries) == 0 {
		t.Fatal("no provider entry is compiled into the conformance tests")
	}
	only := os.Getenv("RDMA_TEST_PROVIDERS")
	for _, en := range entries {
		if only != "" && !strings.Contains(","+only+",", ","+en.name+",") {
			continue
		}
		t.Run(en.name, func(t *testing.T) {
			before := mem.Mapped()
			tg := en.target(t)
			Run(t, tg)
			if n := mem.Mapped(); n != before {
				t.Errorf("provider %s: mem.Mapped() went from %d to %d", en.name, before, n)
			}
		})
	}
}

// pickDevices chooses A and B among the usable devices of p: the first two,
// or the first one twice. The environment variable named by env, if set to
// "a,b" (or "a"), overrides. With no usable device it skips, or fails under
// RDMA_TEST_REQUIRE_DEVICE=1.
func pickDevices(t *testing.T, p verbs.Provider, env string) (string, string) {
	t.Helper()
	skip := func(format string, args ...any) {
		t.Helper()
		if requireDevice() {
			t.Fatalf("RDMA_TEST_REQUIRE_DEVICE=1 but "+format, args...)
		}
		t.Skipf(format, args...)
	}
	if s := os.Getenv(env); s != "" {
		a, b, ok := strings.Cut(s, ",")
		if !ok {
			b = a
		}
		return a, b
	}
	devs, err := p.Devices()
	if err != nil {
		skip("provider %s: Devices(): %v", p.Name(), err)
	}
	var usable, why []string
	for _, d := range devs {
		if d.Usable {
			usable = append(usable, d.Name)
		} else {
			why = append(why, d.Name+": "+d.Why)
		}
	}
	switch len(usable) {
	case 0:
		skip("provider %s has no usable device (%d listed: %s)", p.Name(), len(devs), strings.Join(why, "; "))
		return "", ""
	case 1:
		return usable[0], usable[0]
	}
	return usable[0], usable[1]
}
