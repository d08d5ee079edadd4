package promrdma_test

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/metrics/promrdma"
	"github.com/go-rdma/rdma/rdmatest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// traffic sends messages from c to s until the test ends.
func traffic(t *testing.T, c, s *rdma.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	// flowing closes when the first message has arrived, so the caller's
	// first scrape sees a pool that has registered memory (registration
	// is lazy, and a loaded machine may not have run the sender yet).
	flowing := make(chan struct{})
	go func() {
		defer func() { done <- struct{}{} }()
		for n := 0; ctx.Err() == nil; n++ {
			r := s.Recv()
			if r.Wait(ctx) != nil {
				return
			}
			r.Buffer().Release()
			if n == 0 {
				close(flowing)
			}
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		b, err := c.Alloc(512)
		if !assert.NoError(t, err) {
			return
		}
		defer b.Release()
		for ctx.Err() == nil {
			if c.Send(b).Wait(ctx) != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done; <-done })
	select {
	case <-flowing:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "no message arrived in 10 s")
	}
}

// scrape reads /metrics the way Prometheus does and parses the text.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	// No Accept header: promhttp answers in the text format.
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// total sums the family's series whose labels include want.
func total(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	var v float64
	f := fams[name]
	if f == nil {
		return 0
	}
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, w := range want {
			if labels[k] != w {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			v += m.GetCounter().GetValue()
		case m.Gauge != nil:
			v += m.GetGauge().GetValue()
		}
	}
	return v
}

func serve(t *testing.T, c prometheus.Collector) string {
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

func TestCollectorScrape(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	traffic(t, c, s)
	url := serve(t, promrdma.NewCollector())
	soft := map[string]string{"provider": "soft"}
	sends := map[string]string{"provider": "soft", "op": "send"}

	first := scrape(t, url)
	for name, typ := range map[string]dto.MetricType{
		"rdma_connections":                     dto.MetricType_GAUGE,
		"rdma_operations_total":                dto.MetricType_COUNTER,
		"rdma_operation_bytes_total":           dto.MetricType_COUNTER,
		"rdma_received_messages_total":         dto.MetricType_COUNTER,
		"rdma_received_bytes_total":            dto.MetricType_COUNTER,
		"rdma_completions_total":               dto.MetricType_COUNTER,
		"rdma_completion_failures_total":       dto.MetricType_COUNTER,
		"rdma_credit_waits_total":              dto.MetricType_COUNTER,
		"rdma_credits_out":                     dto.MetricType_GAUGE,
		"rdma_srq_posted_receives":             dto.MetricType_GAUGE,
		"rdma_srq_refills_total":               dto.MetricType_COUNTER,
		"rdma_pool_registered_bytes":           dto.MetricType_GAUGE,
		"rdma_pool_in_use_bytes":               dto.MetricType_GAUGE,
		"rdma_poller_polls_total":              dto.MetricType_COUNTER,
		"rdma_completion_retry_exceeded_total": dto.MetricType_COUNTER,
		"rdma_queue_full_total":                dto.MetricType_COUNTER,
		"rdma_operation_latency_seconds":       dto.MetricType_HISTOGRAM,
		"rdma_connections_opened_total":        dto.MetricType_COUNTER,
		"rdma_connections_ended_total":         dto.MetricType_COUNTER,
		"rdma_handshake_failures_total":        dto.MetricType_COUNTER,
	} {
		f := first[name]
		if assert.NotNil(t, f, name) {
			assert.Equal(t, typ, f.GetType(), name)
			assert.Subset(t, labelNames(f), []string{"provider", "device", "port"}, name)
		}
	}
	assert.Equal(t, float64(2), total(first, "rdma_connections", soft), "the two ends of the pair")
	assert.Positive(t, total(first, "rdma_pool_registered_bytes", soft))
	assert.Nil(t, first["rdma_conn_operations_total"], "per-connection metrics are opt-in")
	assert.Nil(t, first["rdma_completion_failures_by_status_total"], "no completion failed: no status is exported")

	// The counters grow while the traffic runs: each scrape sees more
	// messages sent and received than the one before.
	sent, recvd := total(first, "rdma_operations_total", sends), total(first, "rdma_received_messages_total", soft)
	for range 3 {
		require.Eventually(t, func() bool {
			f := scrape(t, url)
			s, r := total(f, "rdma_operations_total", sends), total(f, "rdma_received_messages_total", soft)
			if s > sent && r > recvd {
				sent, recvd = s, r
				return true
			}
			return false
		}, 10*time.Second, 10*time.Millisecond)
	}
}

func TestCollectorConnections(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	traffic(t, c, s)
	url := serve(t, promrdma.NewCollector(promrdma.WithConnections()))
	client := map[string]string{"local": c.LocalAddr().String(), "remote": c.RemoteAddr().String(), "op": "send"}
	server := map[string]string{"local": s.LocalAddr().String(), "remote": s.RemoteAddr().String()}
	var sent, recvd float64
	for range 2 {
		require.Eventually(t, func() bool {
			f := scrape(t, url)
			sn, r := total(f, "rdma_conn_operations_total", client), total(f, "rdma_conn_received_messages_total", server)
			if sn > sent && r > recvd {
				sent, recvd = sn, r
				return true
			}
			return false
		}, 10*time.Second, 10*time.Millisecond)
	}
	f := scrape(t, url)
	require.NotNil(t, f["rdma_conn_credits_out"])
	assert.ElementsMatch(t, []string{"provider", "device", "port", "local", "remote"}, labelNames(f["rdma_conn_credits_out"]))
}

// TestCollectorClosed: the engine counters keep what a connection counted
// after it closes; only the connections gauge falls.
func TestCollectorClosed(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := c.Alloc(64)
	require.NoError(t, err)
	for range 5 {
		r := s.Recv()
		require.NoError(t, c.Send(b).Wait(ctx))
		require.NoError(t, r.Wait(ctx))
		require.NoError(t, r.Buffer().Release())
	}
	require.NoError(t, b.Release())
	url := serve(t, promrdma.NewCollector())
	soft := map[string]string{"provider": "soft"}
	sends := map[string]string{"provider": "soft", "op": "send"}
	before := scrape(t, url)
	require.GreaterOrEqual(t, total(before, "rdma_operations_total", sends), float64(5))
	require.Equal(t, float64(2), total(before, "rdma_connections", soft))

	require.NoError(t, c.Close())
	require.NoError(t, s.Close())
	after := scrape(t, url)
	assert.Zero(t, total(after, "rdma_connections", soft))
	assert.Equal(t, total(before, "rdma_operations_total", sends), total(after, "rdma_operations_total", sends))
	assert.Equal(t, total(before, "rdma_received_messages_total", soft), total(after, "rdma_received_messages_total", soft))
	assert.Zero(t, total(after, "rdma_credits_out", soft))
}

func labelNames(f *dto.MetricFamily) []string {
	var names []string
	for _, l := range f.GetMetric()[0].GetLabel() {
		names = append(names, l.GetName())
	}
	return names
}

// TestCollectorLatency: the latency histogram is the engines'
// rdma.LatencyHistogram: le bounds are rdma.LatencyBound's, counts are
// cumulative, and the count grows as the sampled operations complete.
func TestCollectorLatency(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	traffic(t, c, s)
	url := serve(t, promrdma.NewCollector())
	var h *dto.Histogram
	require.Eventually(t, func() bool {
		f := scrape(t, url)["rdma_operation_latency_seconds"]
		if f == nil || len(f.GetMetric()) == 0 {
			return false
		}
		h = f.GetMetric()[0].GetHistogram()
		return h.GetSampleCount() >= 2
	}, 20*time.Second, 10*time.Millisecond, "two sampled operations: %d sends", c.Stats().Sends)
	bs := h.GetBucket()
	require.Len(t, bs, rdma.LatencyBuckets, "a bucket per bound, and the open one")
	for i, b := range bs[:len(bs)-1] {
		assert.InEpsilon(t, rdma.LatencyBound(i).Seconds(), b.GetUpperBound(), 1e-9, "le of bucket %d", i)
		if i > 0 {
			assert.GreaterOrEqual(t, b.GetCumulativeCount(), bs[i-1].GetCumulativeCount(), "cumulative at %d", i)
		}
	}
	last := bs[len(bs)-1]
	assert.True(t, math.IsInf(last.GetUpperBound(), 1), "the open bucket is +Inf")
	assert.Equal(t, h.GetSampleCount(), last.GetCumulativeCount(), "+Inf holds every sample")
	assert.Positive(t, h.GetSampleSum(), "the exact sum of the sampled latencies")
	assert.Less(t, h.GetSampleSum()/float64(h.GetSampleCount()), 10.0, "a mean latency below 10 s")
}

// TestCollectorFailuresByStatus: a failed completion is exported under its
// side and libibverbs status, a status that never failed is not exported,
// and the connection it ended is counted by reason.
func TestCollectorFailuresByStatus(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dst, err := s.Alloc(64)
	require.NoError(t, err)
	defer dst.Release()
	r, err := s.Expose(dst, rdma.RemoteWrite)
	require.NoError(t, err)
	require.NoError(t, s.SendRegion(ctx, r))
	region, err := c.RecvRegion(ctx)
	require.NoError(t, err)
	region.RKey ^= 0x5a5a5a5a
	src, err := c.Alloc(64)
	require.NoError(t, err)
	defer src.Release()
	require.ErrorIs(t, c.Write(src, region).Wait(ctx), rdma.ErrRemoteAccess)

	url := serve(t, promrdma.NewCollector())
	var f map[string]*dto.MetricFamily
	require.Eventually(t, func() bool {
		f = scrape(t, url)
		return total(f, "rdma_connections_ended_total", map[string]string{"provider": "soft", "reason": "completion_failed"}) >= 1
	}, 10*time.Second, 10*time.Millisecond, "the failed connection counted by reason")
	assert.Equal(t, float64(1), total(f, "rdma_completion_failures_by_status_total", map[string]string{"provider": "soft", "side": "send", "status": "REM_ACCESS_ERR"}))
	fam := f["rdma_completion_failures_by_status_total"]
	require.NotNil(t, fam)
	for _, m := range fam.GetMetric() {
		assert.Positive(t, m.GetCounter().GetValue(), "a status that never failed is not exported: %v", m.GetLabel())
	}
	assert.Len(t, fam.GetMetric(), 1, "one status failed, on one side, of one engine")
	assert.Equal(t, float64(2), total(f, "rdma_connections_opened_total", map[string]string{"provider": "soft"}))
}

// TestCollectorQueueFull: posts refused at the send queue limit are
// rdma_queue_full_total.
func TestCollectorQueueFull(t *testing.T) {
	c, _ := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft), rdma.WithQueueDepth(32, 8), rdma.WithSendQueueLimit(64))
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()
	refused := 0
	for range 200 { // the peer never reads
		if f := c.Send(b); f.Resolved() && f.Err() != nil {
			require.ErrorIs(t, f.Err(), rdma.ErrQueueFull)
			refused++
		}
	}
	require.Positive(t, refused)
	f := scrape(t, serve(t, promrdma.NewCollector()))
	assert.Equal(t, float64(refused), total(f, "rdma_queue_full_total", map[string]string{"provider": "soft"}))
}
