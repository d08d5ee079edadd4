package promrdma

import (
	"fmt"
	"strconv"

	"github.com/go-rdma/rdma"
	"github.com/prometheus/client_golang/prometheus"
)

// metric is one metric family: its description and its type.
type metric struct {
	name string
	desc *prometheus.Desc
	typ  prometheus.ValueType
	max  bool // series with the same labels make their maximum, not their sum
	hist bool // a histogram (typ unused): series with the same labels add their buckets
}

var (
	engineLabels = []string{"provider", "device", "port"}
	connLabels   = append(engineLabels[:3:3], "local", "remote")
)

// registered is every metric made by newMetric, for Describe.
var registered []metric

func newMetric(subsystem, name, help string, typ prometheus.ValueType, labels []string, extra ...string) metric {
	m := describe(subsystem, name, help, labels, extra)
	m.typ = typ
	registered = append(registered, m)
	return m
}

// newHistogram is newMetric for a histogram family.
func newHistogram(subsystem, name, help string, labels []string) metric {
	m := describe(subsystem, name, help, labels, nil)
	m.hist = true
	registered = append(registered, m)
	return m
}

func describe(subsystem, name, help string, labels, extra []string) metric {
	full := prometheus.BuildFQName(namespace, subsystem, name)
	return metric{name: full, desc: prometheus.NewDesc(full, help, append(labels[:len(labels):len(labels)], extra...), nil)}
}

func allDescs() []metric { return registered }

const (
	counter = prometheus.CounterValue
	gauge   = prometheus.GaugeValue
)

// connSet is the metrics of rdma.ConnStats: once for engine totals and
// once (subsystem "conn") for each connection.
type connSet struct {
	ops, opBytes                       metric
	recvs, recvBytes                   metric
	completions, failures              metric
	retryExceeded                      metric
	byStatus                           metric
	creditWaits, queueWaits, queueFull metric
	creditsOut                         metric
	creditWrites, controlFrames        metric
	doorbells                          metric
	latency                            metric
}

// latencyHelp is the help of the latency histograms: what they count,
// and that their _sum is exact.
var latencyHelp = fmt.Sprintf("Latency of one send-side operation in %d (rdma.LatencySample), from issue to completion, of those that succeeded; _count and _sum are of the sampled operations, _sum exact. Bucket i holds latencies below 1.024us*2^i.", rdma.LatencySample)

func newConnSet(subsystem string, labels []string) connSet {
	return connSet{
		latency:       newHistogram(subsystem, "operation_latency_seconds", latencyHelp, labels),
		ops:           newMetric(subsystem, "operations_total", "Operations issued, by kind.", counter, labels, "op"),
		opBytes:       newMetric(subsystem, "operation_bytes_total", "Bytes of the operations issued, by kind.", counter, labels, "op"),
		recvs:         newMetric(subsystem, "received_messages_total", "Messages received (WRITE_WITH_IMM notices included).", counter, labels),
		recvBytes:     newMetric(subsystem, "received_bytes_total", "Bytes of the messages received.", counter, labels),
		completions:   newMetric(subsystem, "completions_total", "Send-side completions that succeeded.", counter, labels),
		failures:      newMetric(subsystem, "completion_failures_total", "Completions with an error status, flushes included.", counter, labels),
		retryExceeded: newMetric(subsystem, "completion_retry_exceeded_total", "Failed completions that exhausted the transport (retry) or receiver-not-ready (rnr_retry) retries.", counter, labels, "status"),
		creditWaits:   newMetric(subsystem, "credit_waits_total", "Operations that waited for the peer's credits.", counter, labels),
		queueWaits:    newMetric(subsystem, "queue_waits_total", "Operations that waited for room in the send queue.", counter, labels),
		queueFull:     newMetric(subsystem, "queue_full_total", "Posts refused with ErrQueueFull: past WithSendQueueLimit.", counter, labels),
		byStatus:      newMetric(subsystem, "completion_failures_by_status_total", "Failed completions by side (send, recv) and libibverbs status, flushes of an orderly close excepted.", counter, labels, "side", "status"),
		creditsOut:    newMetric(subsystem, "credits_out", "Credits given to the peer and not used yet.", gauge, labels),
		creditWrites:  newMetric(subsystem, "credit_writes_total", "RDMA WRITEs that told the peer of credits given back (in band).", counter, labels),
		controlFrames: newMetric(subsystem, "control_frames_total", "Frames sent on the control channel (set-up, regions, credit asks and answers, close).", counter, labels),
		doorbells:     newMetric(subsystem, "doorbells_total", "Chains of operations posted to the send queue, one provider call each.", counter, labels),
	}
}

var engineMetrics = struct {
	connections metric
	conn        connSet
}{
	connections: newMetric("", "connections", "Open connections.", gauge, engineLabels),
	conn:        newConnSet("", engineLabels),
}

var connMetrics = newConnSet("conn", connLabels)

func addConn(s *sums, m *connSet, cs rdma.ConnStats, labels []string) {
	op := func(d metric, v uint64, kind string) {
		s.add(d, float64(v), append(labels[:len(labels):len(labels)], kind)...)
	}
	op(m.ops, cs.Sends, "send")
	op(m.ops, cs.Writes, "write")
	op(m.ops, cs.Reads, "read")
	op(m.ops, cs.Atomics, "atomic")
	op(m.opBytes, cs.SendBytes, "send")
	op(m.opBytes, cs.WriteBytes, "write")
	op(m.opBytes, cs.ReadBytes, "read")
	s.add(m.recvs, float64(cs.Recvs), labels...)
	s.add(m.recvBytes, float64(cs.RecvBytes), labels...)
	s.add(m.completions, float64(cs.Completions), labels...)
	s.add(m.failures, float64(cs.Failed), labels...)
	op(m.retryExceeded, cs.RetryExceeded, "retry")
	op(m.retryExceeded, cs.RNRRetryExceeded, "rnr_retry")
	s.add(m.creditWaits, float64(cs.CreditWaits), labels...)
	s.add(m.queueWaits, float64(cs.QueueWaits), labels...)
	s.add(m.queueFull, float64(cs.QueueFull), labels...)
	s.add(m.creditsOut, float64(cs.CreditsOut), labels...)
	s.add(m.creditWrites, float64(cs.CreditWrites), labels...)
	s.add(m.controlFrames, float64(cs.ControlFrames), labels...)
	s.add(m.doorbells, float64(cs.Doorbells), labels...)
	s.addHist(m.latency, cs.Latency, labels...)
	for _, side := range []struct {
		name string
		n    *[rdma.CompletionStatuses]uint64
	}{{"send", &cs.SendFailures}, {"recv", &cs.RecvFailures}} {
		// A status is exported once it has happened: at zero, every status
		// of both sides would be dozens of series per engine that say
		// nothing.
		for st, n := range side.n {
			if rdma.CompletionStatus(st) == rdma.StatusSuccess || n == 0 {
				continue
			}
			s.add(m.byStatus, float64(n), append(labels[:len(labels):len(labels)], side.name, rdma.CompletionStatus(st).String())...)
		}
	}
}

// lifecycleCounter is one counter of rdma.LifecycleStats, with its
// label value.
type lifecycleCounter struct {
	reason string
	get    func(rdma.LifecycleStats) uint64
}

var lifecycleMetrics = struct {
	opened, ended, handshakes metric
}{
	opened:     newMetric("", "connections_opened_total", "Connections that came up.", counter, engineLabels),
	ended:      newMetric("", "connections_ended_total", "Connections that ended, by how: closed_local, closed_peer (orderly closes), peer_gone, completion_failed, protocol_failed, aborted, other.", counter, engineLabels, "reason"),
	handshakes: newMetric("", "handshake_failures_total", "Handshakes that failed, by why: refused, timed_out, other.", counter, engineLabels, "reason"),
}

var endedReasons = []lifecycleCounter{
	{"closed_local", func(l rdma.LifecycleStats) uint64 { return l.ClosedLocal }},
	{"closed_peer", func(l rdma.LifecycleStats) uint64 { return l.ClosedPeer }},
	{"peer_gone", func(l rdma.LifecycleStats) uint64 { return l.PeerGone }},
	{"completion_failed", func(l rdma.LifecycleStats) uint64 { return l.CompletionFailed }},
	{"protocol_failed", func(l rdma.LifecycleStats) uint64 { return l.ProtocolFailed }},
	{"aborted", func(l rdma.LifecycleStats) uint64 { return l.Aborted }},
	{"other", func(l rdma.LifecycleStats) uint64 { return l.OtherFailed }},
}

var handshakeReasons = []lifecycleCounter{
	{"refused", func(l rdma.LifecycleStats) uint64 { return l.HandshakeRefused }},
	{"timed_out", func(l rdma.LifecycleStats) uint64 { return l.HandshakeTimedOut }},
	{"other", func(l rdma.LifecycleStats) uint64 { return l.HandshakeFailed }},
}

func addLifecycle(s *sums, l rdma.LifecycleStats, eng []string) {
	s.add(lifecycleMetrics.opened, float64(l.Opened), eng...)
	for _, r := range endedReasons {
		s.add(lifecycleMetrics.ended, float64(r.get(l)), append(eng[:3:3], r.reason)...)
	}
	for _, r := range handshakeReasons {
		s.add(lifecycleMetrics.handshakes, float64(r.get(l)), append(eng[:3:3], r.reason)...)
	}
}

var srqMetrics = struct {
	posted, depth, granted, held, waiting, refills, withdrawn metric
}{
	posted:    newMetric("srq", "posted_receives", "Receives posted on the shared receive queue now.", gauge, engineLabels, "message_size"),
	depth:     newMetric("srq", "depth", "The most receives the shared receive queue posts.", gauge, engineLabels, "message_size"),
	granted:   newMetric("srq", "granted_credits", "Credits given and not used yet, over all connections.", gauge, engineLabels, "message_size"),
	held:      newMetric("srq", "held_receives", "Messages received and not taken yet, or whose credits are not back.", gauge, engineLabels, "message_size"),
	waiting:   newMetric("srq", "waiting_connections", "Connections waiting for credits.", gauge, engineLabels, "message_size"),
	refills:   newMetric("srq", "refills_total", "Refills of the shared receive queue, by what started them.", counter, engineLabels, "message_size", "cause"),
	withdrawn: newMetric("srq", "withdrawn_receives_total", "Receives taken back as the load fell, by the queue itself or by Engine.Trim.", counter, engineLabels, "message_size"),
}

// refillCauses names the indexes of rdma.SRQStats.Refills (rdma.RefillEvent,
// rdma.RefillPoll, rdma.RefillGrant, rdma.RefillRetry).
var refillCauses = []string{"event", "poll", "grant", "retry"}

func addSRQs(s *sums, srqs []rdma.SRQStats, eng []string) {
	for _, q := range srqs {
		l := append(eng[:3:3], strconv.Itoa(q.MessageSize))
		s.add(srqMetrics.posted, float64(q.Posted), l...)
		s.add(srqMetrics.depth, float64(q.Depth), l...)
		s.add(srqMetrics.granted, float64(q.Granted), l...)
		s.add(srqMetrics.held, float64(q.Held), l...)
		s.add(srqMetrics.waiting, float64(q.Waiting), l...)
		s.add(srqMetrics.withdrawn, float64(q.Withdrawn), l...)
		for i, n := range q.Refills {
			cause := strconv.Itoa(i) // a cause newer than this package
			if i < len(refillCauses) {
				cause = refillCauses[i]
			}
			s.add(srqMetrics.refills, float64(n), append(l[:4:4], cause)...)
		}
	}
}

var poolMetrics = struct {
	slabs, registered, buffers, inUse, regs, deregs metric
}{
	slabs:      newMetric("pool", "slabs", "Registered mappings of the buffer pool.", gauge, engineLabels),
	registered: newMetric("pool", "registered_bytes", "Bytes of memory the buffer pool has registered.", gauge, engineLabels),
	buffers:    newMetric("pool", "buffers_in_use", "Buffers that hold a reference, the owner's or an operation's.", gauge, engineLabels),
	inUse:      newMetric("pool", "in_use_bytes", "Capacity of the buffers in use.", gauge, engineLabels),
	regs:       newMetric("pool", "registrations_total", "Memory registrations of the buffer pool.", counter, engineLabels),
	deregs:     newMetric("pool", "deregistrations_total", "Memory deregistrations of the buffer pool.", counter, engineLabels),
}

func addPool(s *sums, es rdma.EngineStats, eng []string) {
	p := es.Pool
	s.add(poolMetrics.slabs, float64(p.Slabs), eng...)
	s.add(poolMetrics.registered, float64(p.BytesRegistered), eng...)
	s.add(poolMetrics.buffers, float64(p.BuffersInUse), eng...)
	s.add(poolMetrics.inUse, float64(p.BytesInUse), eng...)
	s.add(poolMetrics.regs, float64(p.Registrations), eng...)
	s.add(poolMetrics.deregs, float64(p.Deregistrations), eng...)
}

// pollerCounter is one counter of rdma.PollerStats.
type pollerCounter struct {
	m   metric
	get func(rdma.EngineStats) uint64
}

var pollerCounters = []pollerCounter{
	{newMetric("poller", "polls_total", "CQ polls.", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.Polls }},
	{newMetric("poller", "empty_polls_total", "CQ polls that found nothing.", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.EmptyPolls }},
	{newMetric("poller", "completions_total", "Completions handed to the handlers.", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.Completions }},
	{newMetric("poller", "yields_total", "Yields while spinning.", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.Yields }},
	{newMetric("poller", "spins_denied_total", "Parks without spinning because enough pollers spun.", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.SpinsDenied }},
	{newMetric("poller", "spins_cut_total", "Spins ended early because goroutines waited for a P.", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.SpinsCut }},
	{newMetric("poller", "arms_total", "Completion notifications requested.", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.Arms }},
	{newMetric("poller", "repolled_total", "Completions found by the poll between arming and parking.", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.Repolled }},
	{newMetric("poller", "parks_total", "Waits on the completion channel.", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.Parks }},
	{newMetric("poller", "events_total", "Events taken from the completion channel.", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.Events }},
	{newMetric("poller", "wakeups_total", "Waits that ended without an event.", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.Wakeups }},
	{newMetric("poller", "kicks_total", "Kicks that found a poller parked.", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.Kicks }},
	{newMetric("poller", "kicks_skipped_total", "Kicks that left a parked poller parked.", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.KicksSkipped }},
	{newMetric("poller", "direct_total", "Completions handled where their event was raised, without waking a poller (also in completions_total).", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.Direct }},
	{newMetric("poller", "drives_total", "Drive calls that drove (busy mode).", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.Drives }},
	{newMetric("poller", "driven_total", "Completions a driver polled (busy mode; also in completions_total).", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.Driven }},
	{newMetric("poller", "standbys_total", "Times a poller blocked while a driver drove (busy mode).", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.Standbys }},
	{newMetric("poller", "looks_total", "Times a standing-by poller looked at its CQ while nobody drove (busy mode).", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.Looks }},
	{newMetric("poller", "long_spins_total", "Adaptive spins longer than the default 50 µs, as the poller's wake-ups have lately cost more (up to 200 µs).", counter, engineLabels), func(e rdma.EngineStats) uint64 { return e.Pollers.LongSpins }},
}

// pollerMaxBatch is a maximum: engines that share their labels make the
// largest of theirs, not the sum.
var pollerMaxBatch = func() metric {
	m := newMetric("poller", "max_batch", "Largest batch of completions one poll found.", gauge, engineLabels)
	m.max = true
	return m
}()

func addPollers(s *sums, es rdma.EngineStats, eng []string) {
	for _, c := range pollerCounters {
		s.add(c.m, float64(c.get(es)), eng...)
	}
	s.add(pollerMaxBatch, float64(es.Pollers.MaxBatch), eng...)
}
