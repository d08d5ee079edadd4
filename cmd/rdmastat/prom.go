package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-rdma/rdma"
)

// errNoPromRDMA is a Prometheus endpoint without go-rdma's families.
var errNoPromRDMA = errors.New("no rdma_connections metric (does the process register promrdma.NewCollector?)")

// fetchProm reads the Prometheus text exposition at url, as
// metrics/promrdma's collector writes it, into the engines' counters.
func fetchProm(ctx context.Context, client *http.Client, url string) (sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return sample{}, fmt.Errorf("endpoint: %w", err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := client.Do(req)
	if err != nil {
		return sample{}, fmt.Errorf("reading the counters: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return sample{}, fmt.Errorf("reading the counters: %s: %s", url, resp.Status)
	}
	engines, err := parseProm(resp.Body)
	if err != nil {
		return sample{}, fmt.Errorf("%s is not a Prometheus text endpoint: %w", url, err)
	}
	if engines == nil {
		return sample{}, fmt.Errorf("%s: %w", url, errNoPromRDMA)
	}
	return sample{at: time.Now(), engines: engines, connsHint: "promrdma.NewCollector(promrdma.WithConnections())"}, nil
}

// promSample is one line of the text format: a series and its value.
type promSample struct {
	name   string
	labels map[string]string
	value  float64
}

// parsePromLine parses a sample line: name, optional {labels}, value, an
// optional timestamp.
func parsePromLine(line string) (promSample, error) {
	s := promSample{labels: map[string]string{}}
	i := 0
	for i < len(line) && isNameChar(line[i], i == 0) {
		i++
	}
	if i == 0 {
		return s, fmt.Errorf("no metric name in %q", line)
	}
	s.name, line = line[:i], line[i:]
	if strings.HasPrefix(line, "{") {
		line = line[1:]
		for {
			line = strings.TrimLeft(line, " ")
			if strings.HasPrefix(line, "}") {
				line = line[1:]
				break
			}
			j := 0
			for j < len(line) && isNameChar(line[j], j == 0) {
				j++
			}
			if j == 0 || !strings.HasPrefix(line[j:], `="`) {
				return s, fmt.Errorf("bad label in %s{%s", s.name, line)
			}
			key := line[:j]
			line = line[j+2:]
			var v strings.Builder
			for {
				if line == "" {
					return s, fmt.Errorf("unterminated label value in %s", s.name)
				}
				c := line[0]
				line = line[1:]
				if c == '"' {
					break
				}
				if c == '\\' && line != "" {
					c, line = line[0], line[1:]
					if c == 'n' {
						c = '\n'
					}
				}
				v.WriteByte(c)
			}
			s.labels[key] = v.String()
			line = strings.TrimLeft(line, " ")
			if strings.HasPrefix(line, ",") {
				line = line[1:]
			} else if !strings.HasPrefix(line, "}") {
				return s, fmt.Errorf("bad labels of %s", s.name)
			}
		}
	}
	f := strings.Fields(line)
	if len(f) < 1 || len(f) > 2 {
		return s, fmt.Errorf("bad value of %s: %q", s.name, line)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return s, fmt.Errorf("bad value of %s: %w", s.name, err)
	}
	s.value = v
	return s, nil
}

func isNameChar(c byte, first bool) bool {
	return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || !first && '0' <= c && c <= '9'
}

// promEngine is an engine being gathered from the exposition.
type promEngine struct {
	es    rdma.EngineStats
	conns map[connKey]*rdma.ConnEntry
	order []connKey
	srqs  map[int]*rdma.SRQStats
	sizes []int
	found bool // rdma_connections named it
}

// parseProm gathers the families rdmastat shows from a text exposition:
// the engines (by provider, device and port), their totals, SRQs and
// pool, and each connection's counters when the collector exports them
// (rdma_conn_*). Other families are skipped. It returns nil engines when
// no rdma_connections family is there.
func parseProm(r io.Reader) ([]rdma.EngineStats, error) {
	engines := map[string]*promEngine{}
	var order []string
	engine := func(l map[string]string) *promEngine {
		key := l["provider"] + "\xff" + l["device"] + "\xff" + l["port"]
		e := engines[key]
		if e == nil {
			port, _ := strconv.Atoi(l["port"])
			e = &promEngine{conns: map[connKey]*rdma.ConnEntry{}, srqs: map[int]*rdma.SRQStats{}}
			e.es.Provider, e.es.Device, e.es.Port = l["provider"], l["device"], uint8(port)
			engines[key] = e
			order = append(order, key)
		}
		return e
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parsePromLine(line)
		if err != nil {
			return nil, err
		}
		name, ok := strings.CutPrefix(s.name, "rdma_")
		if !ok {
			continue
		}
		e := engine(s.labels)
		switch {
		case name == "connections":
			e.es.Conns += int(s.value)
			e.found = true
		case strings.HasPrefix(name, "conn_"):
			k := connKey{s.labels["local"], s.labels["remote"]}
			c := e.conns[k]
			if c == nil {
				c = &rdma.ConnEntry{Local: k.local, Remote: k.remote}
				e.conns[k] = c
				e.order = append(e.order, k)
			}
			setConnStat(&c.Stats, name[len("conn_"):], s)
		case strings.HasPrefix(name, "srq_"):
			size, _ := strconv.Atoi(s.labels["message_size"])
			q := e.srqs[size]
			if q == nil {
				q = &rdma.SRQStats{MessageSize: size}
				e.srqs[size] = q
				e.sizes = append(e.sizes, size)
			}
			switch name {
			case "srq_posted_receives":
				q.Posted += int64(s.value)
			case "srq_depth":
				q.Depth += int(s.value)
			}
		case name == "pool_in_use_bytes":
			e.es.Pool.BytesInUse += int64(s.value)
		case name == "pool_registered_bytes":
			e.es.Pool.BytesRegistered += int64(s.value)
		default:
			// The engine's counters cover its closed connections too:
			// they are Total here, and Closed stays zero.
			setConnStat(&e.es.Total, name, s)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var out []rdma.EngineStats
	for _, key := range order {
		e := engines[key]
		if !e.found {
			continue
		}
		decumulate(&e.es.Total.Latency)
		for _, k := range e.order {
			c := e.conns[k]
			decumulate(&c.Stats.Latency)
			e.es.Connections = append(e.es.Connections, *c)
		}
		for _, size := range e.sizes {
			e.es.SharedReceives = append(e.es.SharedReceives, *e.srqs[size])
		}
		out = append(out, e.es)
	}
	return out, nil
}

// setConnStat sets the counter of cs a family of rdma.ConnStats names
// (without its prefix, rdma_ or rdma_conn_). The latency buckets are
// left cumulative, as the exposition has them: decumulate makes them
// counts once all are in.
func setConnStat(cs *rdma.ConnStats, name string, s promSample) {
	v := uint64(max(s.value, 0))
	switch name {
	case "operations_total":
		switch s.labels["op"] {
		case "send":
			cs.Sends += v
		case "write":
			cs.Writes += v
		case "read":
			cs.Reads += v
		case "atomic":
			cs.Atomics += v
		}
	case "operation_bytes_total":
		switch s.labels["op"] {
		case "send":
			cs.SendBytes += v
		case "write":
			cs.WriteBytes += v
		case "read":
			cs.ReadBytes += v
		}
	case "received_messages_total":
		cs.Recvs += v
	case "received_bytes_total":
		cs.RecvBytes += v
	case "completions_total":
		cs.Completions += v
	case "completion_failures_total":
		cs.Failed += v
	case "completion_failures_by_status_total":
		if s.labels["side"] == "recv" { // the send side's sum is completion_failures_total
			cs.RecvFailed += v
		}
	case "credit_waits_total":
		cs.CreditWaits += v
	case "queue_waits_total":
		cs.QueueWaits += v
	case "queue_full_total":
		cs.QueueFull += v
	case "credits_out":
		cs.CreditsOut += int64(s.value)
	case "operation_latency_seconds_bucket":
		le, err := strconv.ParseFloat(s.labels["le"], 64)
		if err != nil {
			return
		}
		if i := latencyBucket(le); i >= 0 {
			cs.Latency.Buckets[i] += v
		}
	case "operation_latency_seconds_sum":
		cs.Latency.Sum += time.Duration(s.value * float64(time.Second))
	}
}

// latencyBucket is the index of the rdma.LatencyHistogram bucket whose
// bound is le seconds (+Inf for the open one), or -1.
func latencyBucket(le float64) int {
	if math.IsInf(le, 1) {
		return rdma.LatencyBuckets - 1
	}
	for i := range rdma.LatencyBuckets - 1 {
		if b := rdma.LatencyBound(i).Seconds(); math.Abs(b-le) <= b*1e-6 {
			return i
		}
	}
	return -1
}

// decumulate turns the cumulative bucket counts of an exposition into
// counts per bucket.
func decumulate(h *rdma.LatencyHistogram) {
	for i := len(h.Buckets) - 1; i > 0; i-- {
		h.Buckets[i] -= min(h.Buckets[i-1], h.Buckets[i])
	}
}
