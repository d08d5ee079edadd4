package pool_test

import (
	"strconv"
	"testing"

	"github.com/go-rdma/rdma/internal/pool"
)

func benchPool(b *testing.B) *pool.Pool {
	p, err := pool.New(newFakeReg(), pool.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	return p
}

// BenchmarkGetRelease is the steady state: a recycled buffer per Get.
func BenchmarkGetRelease(b *testing.B) {
	for _, n := range []int{64, 4096, 64 << 10, 8 << 20} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			p := benchPool(b)
			mustRelease(b, mustGet(b, p, n))
			b.ReportAllocs()
			for b.Loop() {
				buf, err := p.Get(n)
				if err != nil {
					b.Fatal(err)
				}
				buf.Release()
			}
		})
	}
}

// BenchmarkOperation is what one posted operation costs the pool: Get,
// Ref at post, Release by the owner, Unref at completion.
func BenchmarkOperation(b *testing.B) {
	p := benchPool(b)
	mustRelease(b, mustGet(b, p, 4096))
	b.ReportAllocs()
	for b.Loop() {
		buf, _ := p.Get(4096)
		buf.Ref()
		buf.Release()
		buf.Unref()
	}
}

func BenchmarkGetReleaseParallel(b *testing.B) {
	p := benchPool(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			buf, err := p.Get(4096)
			if err != nil {
				b.Error(err)
				return
			}
			buf.Release()
		}
	})
}
