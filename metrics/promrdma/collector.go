package promrdma

import (
	"strconv"
	"strings"

	"github.com/go-rdma/rdma"
	"github.com/prometheus/client_golang/prometheus"
)

const namespace = "rdma"

// Collector is a prometheus.Collector of rdma.AllStats.
type Collector struct {
	conns bool
	// stats reads the counters; rdma.AllStats but for tests.
	stats func() []rdma.EngineStats
	descs []*prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// Option configures a Collector.
type Option func(*Collector)

// WithConnections adds the per-connection metrics (rdma_conn_*, labels
// local and remote): one series per connection and counter, so only for
// processes with few connections.
func WithConnections() Option { return func(c *Collector) { c.conns = true } }

// NewCollector returns a collector of the counters of every open engine
// of the process.
func NewCollector(opts ...Option) *Collector {
	c := &Collector{stats: rdma.AllStats}
	for _, o := range opts {
		o(c)
	}
	for _, d := range allDescs() {
		if !c.conns && strings.HasPrefix(d.name, namespace+"_conn_") {
			continue
		}
		c.descs = append(c.descs, d.desc)
	}
	return c
}

// Describe sends the descriptions of every metric the collector emits.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect reads the counters and sends them as constant metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	var s sums
	for _, es := range c.stats() {
		eng := []string{es.Provider, es.Device, strconv.Itoa(int(es.Port))}
		s.add(engineMetrics.connections, float64(es.Conns), eng...)
		// Closed keeps what closed connections counted, so the engine's
		// counters never fall; its CreditsOut is zero, leaving the gauge
		// the open connections'.
		addConn(&s, &engineMetrics.conn, es.Total, eng)
		addConn(&s, &engineMetrics.conn, es.Closed, eng)
		if c.conns {
			for _, ce := range es.Connections {
				addConn(&s, &connMetrics, ce.Stats, append(eng[:3:3], ce.Local, ce.Remote))
			}
		}
		addLifecycle(&s, es.Lifecycle, eng)
		addSRQs(&s, es.SharedReceives, eng)
		addPool(&s, es, eng)
		addPollers(&s, es, eng)
	}
	s.emit(ch)
}

// sums adds up the values of series with the same name and labels, so
// that engines (or connections) that share their labels make one series
// instead of a duplicate the registry refuses.
type sums struct {
	order []string
	m     map[string]*sum
}

type sum struct {
	d      metric
	labels []string
	v      float64
	h      rdma.LatencyHistogram // of a histogram
}

// at is the series of d with labels, made at its first use.
func (s *sums) at(d metric, labels []string) (x *sum, made bool) {
	key := d.name + "\xff" + strings.Join(labels, "\xff")
	if s.m == nil {
		s.m = map[string]*sum{}
	}
	if x, ok := s.m[key]; ok {
		return x, false
	}
	x = &sum{d: d, labels: append([]string(nil), labels...)}
	s.m[key] = x
	s.order = append(s.order, key)
	return x, true
}

func (s *sums) add(d metric, v float64, labels ...string) {
	x, made := s.at(d, labels)
	switch {
	case made:
		x.v = v
	case d.max:
		x.v = max(x.v, v)
	default:
		x.v += v
	}
}

func (s *sums) addHist(d metric, h rdma.LatencyHistogram, labels ...string) {
	x, _ := s.at(d, labels)
	for i, n := range h.Buckets {
		x.h.Buckets[i] += n
	}
	x.h.Sum += h.Sum
}

func (s *sums) emit(ch chan<- prometheus.Metric) {
	for _, k := range s.order {
		x := s.m[k]
		if x.d.hist {
			ch <- histogram(x.d.desc, x.h, x.labels)
			continue
		}
		ch <- prometheus.MustNewConstMetric(x.d.desc, x.d.typ, x.v, x.labels...)
	}
}

// histogram is h as a Prometheus histogram: bucket i's bound, in
// seconds, is its le (rdma's bounds exclude the latencies equal to
// them; at a nanosecond's resolution that is 1 ns below), the open
// bucket is +Inf, and the sum is exact.
func histogram(d *prometheus.Desc, h rdma.LatencyHistogram, labels []string) prometheus.Metric {
	buckets := make(map[float64]uint64, rdma.LatencyBuckets-1)
	var cum uint64
	for i := range rdma.LatencyBuckets - 1 {
		cum += h.Buckets[i]
		buckets[rdma.LatencyBound(i).Seconds()] = cum
	}
	return prometheus.MustNewConstHistogram(d, h.Count(), h.Sum.Seconds(), buckets, labels...)
}
