//go:build linux && cgo

package ibv_test

import (
	"os"
	"testing"

	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/internal/verbs"
)

// BenchmarkPollEmpty is the cost of one cgo poll of an empty CQ: the
// floor of every spinning loop (docs/history/performance.md). Run it on rxe in
// the VM: RDMA_TEST_REQUIRE_DEVICE=1 go test -run '^$' -bench PollEmpty.
func BenchmarkPollEmpty(b *testing.B) {
	devs, err := ibv.Provider.Devices()
	if err != nil {
		b.Fatal(err)
	}
	name := ""
	for _, d := range devs {
		if d.Usable {
			name = d.Name
			break
		}
	}
	if name == "" {
		if os.Getenv("RDMA_TEST_REQUIRE_DEVICE") == "1" {
			b.Fatal("no usable RDMA device and RDMA_TEST_REQUIRE_DEVICE=1")
		}
		b.Skip("no usable RDMA device; run it on rxe in the VM")
	}
	ctx, err := ibv.Provider.Open(name)
	if err != nil {
		b.Fatal(err)
	}
	defer ctx.Close()
	cq, err := ctx.CreateCQ(64, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer cq.Close()
	wc := make([]verbs.WorkCompletion, 64)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if n, err := cq.Poll(wc); n != 0 || err != nil {
			b.Fatal(n, err)
		}
	}
}
