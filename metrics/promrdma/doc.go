// Package promrdma exports go-rdma's counters (rdma.AllStats) as
// Prometheus metrics. It is a module of its own so that programs that use
// go-rdma without Prometheus do not depend on client_golang.
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(promrdma.NewCollector())
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// Every scrape reads the counters of every open engine of the process.
// Engine metrics carry the labels provider, device and port; engines with
// the same three (two OpenEngine calls on one port) are summed, as a
// query over them would sum them anyway.
//
// Engine metrics (namespace "rdma"):
//
//	rdma_connections                         gauge    open connections
//	rdma_operations_total{op}                counter  op: send, write, read, atomic
//	rdma_operation_bytes_total{op}           counter  op: send, write, read
//	rdma_received_messages_total             counter
//	rdma_received_bytes_total                counter
//	rdma_completions_total                   counter  send-side, succeeded
//	rdma_completion_failures_total           counter  error status, flushes included
//	rdma_completion_retry_exceeded_total{status} counter status: retry, rnr_retry
//	rdma_completion_failures_by_status_total{side,status} counter side: send, recv;
//	                                                  status: libibverbs' name, REM_ACCESS_ERR ...
//	rdma_credit_waits_total                  counter  waited for the peer's credits
//	rdma_queue_waits_total                   counter  waited for send-queue room
//	rdma_queue_full_total                    counter  posts refused with ErrQueueFull
//	rdma_credits_out                         gauge    credits given, not used yet
//	rdma_credit_writes_total                 counter  credits given back in band (RDMA WRITEs)
//	rdma_control_frames_total                counter  frames sent on the control channel
//	rdma_doorbells_total                     counter  chains posted to the send queue
//	rdma_operation_latency_seconds           histogram one operation in 64, issue to completion
//	rdma_connections_opened_total            counter
//	rdma_connections_ended_total{reason}     counter  reason: closed_local, closed_peer, peer_gone,
//	                                                  completion_failed, protocol_failed, aborted, other
//	rdma_handshake_failures_total{reason}    counter  reason: refused, timed_out, other
//	rdma_srq_posted_receives{message_size}   gauge    and rdma_srq_depth, _granted_credits,
//	                                                  _held_receives, _waiting_connections
//	rdma_srq_refills_total{message_size,cause} counter cause: event, poll, grant, retry
//	rdma_srq_withdrawn_receives_total{message_size} counter receives taken back as the load fell
//	rdma_pool_registered_bytes               gauge    and _in_use_bytes, _slabs, _buffers_in_use
//	rdma_pool_registrations_total            counter  and _deregistrations_total
//	rdma_poller_polls_total                  counter  and the other rdma.PollerStats counters;
//	rdma_poller_max_batch                    gauge
//
// The engine counters cover the closed connections too
// (rdma.EngineStats.Total plus Closed), so they never fall as connections
// come and go; rdma_credits_out is the open connections'.
//
// rdma_operation_latency_seconds is rdma.LatencyHistogram: one
// send-side operation in rdma.LatencySample (64) is timed, from the call
// that issued it to its completion, so _count is the number of operations
// sampled, not issued, and _sum is their exact total. Its buckets' le are
// rdma.LatencyBound's, 1.024 µs·2^i up to 4.29 s, then +Inf; a quantile
// is histogram_quantile over its rate:
//
//	histogram_quantile(0.99, sum by (le) (rate(rdma_operation_latency_seconds_bucket[5m])))
//
// rdma_completion_failures_by_status_total has a series for a side and
// status only once a completion failed with it (the engine's stays, as
// its counters cover closed connections). A series appears at its first
// failure, so rate() and increase() miss that one; alert on the
// series' presence, or on rdma_completion_failures_total, which is always
// exported.
//
// Per-connection metrics, rdma_conn_* with the connection metrics above
// and the labels local and remote added, are off by default: a label set
// per connection is one time series per connection and counter, too many
// for an engine with thousands of connections. WithConnections turns
// them on.
package promrdma
