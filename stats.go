package rdma

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"

	ieng "github.com/go-rdma/rdma/internal/engine"
	"github.com/go-rdma/rdma/internal/rc"
)

// ConnStats are a connection's counters since it was made. Each field is
// read atomically; the set is not one snapshot. Counting costs an atomic
// add or two per operation, on counters of the connection's own, and
// two more and a clock read per LatencySample operations.
type ConnStats struct {
	Sends      uint64 // SEND and SEND_WITH_IMM issued
	SendBytes  uint64
	Writes     uint64 // RDMA WRITE and WRITE_WITH_IMM issued
	WriteBytes uint64
	Reads      uint64 // RDMA READ issued
	ReadBytes  uint64
	Atomics    uint64 // CompareAndSwap and FetchAdd issued
	Recvs      uint64 // messages received (WRITE_WITH_IMM notices included)
	RecvBytes  uint64

	Completions uint64 // send-side completions that succeeded
	// Failed counts send-side completions with an error status, flushes
	// included but for those of an orderly close (Close, or the peer's);
	// SendFailures splits them by status (indexed by CompletionStatus,
	// its StatusSuccess entry is zero), so that their sum is Failed.
	// RetryExceeded and RNRRetryExceeded are two of its entries,
	// SendFailures[StatusRetryExcErr] and [StatusRNRRetryExcErr].
	Failed           uint64
	SendFailures     [CompletionStatuses]uint64
	RetryExceeded    uint64
	RNRRetryExceeded uint64
	// RecvFailed counts receive completions with an error status, with
	// the same exception for an orderly close, and RecvFailures splits
	// them by status as SendFailures does.
	RecvFailed   uint64
	RecvFailures [CompletionStatuses]uint64

	// CreditWaits counts operations that waited for the peer's
	// credits, QueueWaits those that waited for room in the send queue.
	CreditWaits uint64
	QueueWaits  uint64
	// QueueFull counts the posts (an operation, or a Batch) refused with
	// ErrQueueFull: past WithSendQueueLimit.
	QueueFull uint64
	// CreditsOut is what the peer may still send here: credits given and
	// not used yet.
	CreditsOut int64
	// CreditWrites counts the RDMA WRITEs that told the peer of credits
	// given back (in band), ControlFrames the frames sent on the control
	// channel (set-up, regions, credit asks and answers, close). Credits
	// ride the first: a connection in steady use sends no frames.
	CreditWrites  uint64
	ControlFrames uint64
	// Doorbells counts the chains of operations posted to the send
	// queue, one provider call (on a kernel device, one system call)
	// each: operations of goroutines that post at once share one.
	Doorbells uint64
	// Latency is the histogram of the latencies of one send-side
	// operation in LatencySample, from issue to completion.
	Latency LatencyHistogram
}

// Stats reads the connection's counters.
func (c *Conn) Stats() ConnStats {
	if c.tcp != nil {
		return ConnStats{} // no operation ever runs
	}
	s, q := c.rc.Counters.Load(), c.rc.SQ.Counts()
	msgs, bytes := c.rc.RQ.Counts()
	cs := ConnStats{
		Sends: s.Sends, SendBytes: s.SendBytes,
		Writes: s.Writes, WriteBytes: s.WriteBytes,
		Reads: s.Reads, ReadBytes: s.ReadBytes,
		Atomics: s.Atomics,
		Recvs:   msgs, RecvBytes: bytes,
		Completions: s.Completions,
		CreditWaits: q.CreditWaits, QueueWaits: q.QueueWaits,
		QueueFull:    q.QueueFull,
		CreditsOut:   c.rc.Grants.Out(),
		Latency:      LatencyHistogram{Buckets: s.Latency, Sum: time.Duration(s.LatencySum)},
		CreditWrites: q.CreditWrites, ControlFrames: c.rc.Ctl.Frames(), Doorbells: q.Doorbells,
	}
	for i := range s.SendFail {
		cs.SendFailures[i] = s.SendFail[i]
		cs.Failed += cs.SendFailures[i]
		cs.RecvFailures[i] = s.RecvFail[i]
		cs.RecvFailed += cs.RecvFailures[i]
	}
	cs.RetryExceeded = cs.SendFailures[StatusRetryExcErr]
	cs.RNRRetryExceeded = cs.SendFailures[StatusRNRRetryExcErr]
	return cs
}

// EngineStats describe an engine: its connections and the sums of their
// counters, its shared receive queues, its buffer pool and its pollers.
type EngineStats struct {
	Provider string
	Device   string
	Port     uint8
	Conns    int
	// Total sums the counters of the open connections.
	Total ConnStats
	// Closed sums the counters of the connections closed since the
	// engine opened (CreditsOut is zero): Total plus Closed only grows,
	// where Total alone falls when a connection closes.
	Closed ConnStats
	// Connections has the counters of each open connection (none in
	// the expvar export unless PublishExpvar was given
	// ExpvarConnections).
	Connections []ConnEntry `json:",omitempty"`
	// SharedReceives has one entry per message size the engine serves.
	SharedReceives []SRQStats
	Pool           PoolStats
	// Pollers sums the counters of the engine's pollers (MaxBatch is the
	// largest of theirs).
	Pollers PollerStats
	// Lifecycle counts the engine's connections as they came up and
	// ended, and its handshakes that failed.
	Lifecycle LifecycleStats
}

// LifecycleStats count an engine's connections since it opened: each
// connection once when it comes up (Opened) and once when it ends, under
// one of the other counters but the Handshake ones. A connection ends
// once its first error or Close; Opened minus the ends is the
// connections open or closing. Handshakes that failed are counted on
// the side that saw them fail, the dialer or the listener, and open no
// connection.
type LifecycleStats struct {
	Opened uint64 // connections that came up
	// ClosedLocal and ClosedPeer count orderly closes: by Close here,
	// or by the peer's.
	ClosedLocal uint64
	ClosedPeer  uint64
	// PeerGone counts the connections whose peer went away (ErrPeerLost:
	// it died, or tore its side down without an orderly close) or
	// aborted (ErrPeerClosed with the peer's reason).
	PeerGone uint64
	// The failures of this side: a failed completion (see ConnStats
	// SendFailures and RecvFailures), the peer cut off for breaking the
	// protocol (ErrProtocol), an Abort (or the engine closed under the
	// connection), and any other (the port went down, a poller failed).
	CompletionFailed uint64
	ProtocolFailed   uint64
	Aborted          uint64
	OtherFailed      uint64
	// HandshakeRefused counts handshakes refused (ErrRefused: by the
	// listener's accept check, TLS or its load, or the peer's),
	// HandshakeTimedOut those that did not finish within their bound or
	// context, HandshakeFailed the others (a peer that is no go-rdma
	// endpoint, speaks another version, or went away).
	HandshakeRefused  uint64
	HandshakeTimedOut uint64
	HandshakeFailed   uint64
}

// lifeCounters are the engine-level atomics behind LifecycleStats.
type lifeCounters struct {
	opened, closedLocal, closedPeer, peerGone              atomic.Uint64
	completionFailed, protocolFailed, aborted, otherFailed atomic.Uint64
	handshakeRefused, handshakeTimedOut, handshakeFailed   atomic.Uint64
}

func (l *lifeCounters) stats() LifecycleStats {
	return LifecycleStats{
		Opened: l.opened.Load(), ClosedLocal: l.closedLocal.Load(), ClosedPeer: l.closedPeer.Load(),
		PeerGone: l.peerGone.Load(), CompletionFailed: l.completionFailed.Load(),
		ProtocolFailed: l.protocolFailed.Load(), Aborted: l.aborted.Load(), OtherFailed: l.otherFailed.Load(),
		HandshakeRefused: l.handshakeRefused.Load(), HandshakeTimedOut: l.handshakeTimedOut.Load(),
		HandshakeFailed: l.handshakeFailed.Load(),
	}
}

// ended counts how a connection that came up ended, with its first
// error; it runs once per connection, as logEnded does, and classifies
// the same way: an orderly close whatever its first error was.
func (l *lifeCounters) ended(c *conn, err error) {
	var ce *CompletionError
	switch {
	case !c.rc.Life.Up():
		// A handshake that failed: dial or the listener counts it.
	case c.rc.Life.Orderly() && c.rc.Life.CloseHeard():
		l.closedPeer.Add(1)
	case c.rc.Life.Orderly():
		l.closedLocal.Add(1)
	case errors.Is(err, ErrPeerClosed), errors.Is(err, ErrPeerLost):
		l.peerGone.Add(1)
	case errors.Is(err, ErrProtocol):
		l.protocolFailed.Add(1)
	case errors.As(err, &ce):
		l.completionFailed.Add(1)
	case errors.Is(err, ErrClosed):
		l.aborted.Add(1)
	default:
		l.otherFailed.Add(1)
	}
}

// handshake counts a handshake that failed with err.
func (l *lifeCounters) handshake(err error) {
	switch {
	case errors.Is(err, ErrRefused):
		l.handshakeRefused.Add(1)
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		l.handshakeTimedOut.Add(1)
	default:
		l.handshakeFailed.Add(1)
	}
}

// PoolStats describe an engine's buffer pool: the registered memory it
// holds and what of it is in use.
type PoolStats struct {
	// Slabs is the number of registered mappings: size-class slabs,
	// large buffers in use and cached large buffers.
	Slabs int
	// BytesRegistered is their total size: the memory pinned for the
	// device (see WithPoolLimit).
	BytesRegistered int64
	// BuffersInUse counts the buffers that hold a reference, either the
	// owner's or an operation's.
	BuffersInUse int
	// BytesInUse is the capacity of those buffers (size class, or the
	// page-rounded size of a large buffer).
	BytesInUse int64
	// Registrations and Deregistrations count memory registrations and
	// their ends over the pool's life.
	Registrations   uint64
	Deregistrations uint64
}

// PollerStats count what an engine's completion pollers did. How they
// split between spinning and parking shows what the poll mode costs:
// docs/guide.md explains the modes.
type PollerStats struct {
	Polls       uint64 // polls of a CQ
	EmptyPolls  uint64 // polls that found nothing
	Completions uint64 // completions handled
	MaxBatch    uint64 // the most completions one poll returned
	Yields      uint64 // yields of the CPU while spinning
	// SpinsDenied counts the times an Adaptive poller found as many
	// pollers spinning as the process allows (GOMAXPROCS/2, at least 1)
	// and parked without spinning.
	SpinsDenied uint64
	// SpinsCut counts the spins a poller ended early because goroutines
	// were waiting for a CPU.
	SpinsCut uint64
	Arms     uint64 // requests for a completion event
	// Repolled counts completions found by the poll between asking for
	// an event and parking.
	Repolled uint64
	Parks    uint64 // waits for a completion event
	Events   uint64 // completion events taken
	Wakeups  uint64 // waits ended without an event (a kick or a close)
	Kicks    uint64 // wake-ups of a parked poller for new work
	// KicksSkipped counts the kicks that left a parked Adaptive poller
	// parked because it could not have spun.
	KicksSkipped uint64
	// Direct counts completions handled in the provider's goroutine that
	// raised their event rather than by a woken poller (the soft
	// provider's connection readers; also in Completions).
	Direct uint64
	// With PollBusy, a Future.Wait polls the CQ itself ("drives" it).
	Drives   uint64 // Waits that polled the CQ
	Driven   uint64 // completions those Waits polled (also in Completions)
	Standbys uint64 // times a poller stood by while a Wait polled
	// Looks counts a standing-by poller's looks at its CQ, every
	// millisecond once no Wait has polled for one (also in Polls).
	Looks uint64
	// DrivesCut counts the Waits that stopped polling before their
	// future resolved because goroutines were waiting for a CPU.
	DrivesCut uint64
	// Backlogs counts the times a PollBusy engine found goroutines
	// queued for CPUs and behaved as PollAdaptive for a millisecond.
	Backlogs uint64
	// LongSpins counts the PollAdaptive spins longer than 50 µs: without
	// WithPollSpin a poller on verbs spins for twice what its wake-ups
	// have lately cost, up to 200 µs (docs/poller.md).
	LongSpins uint64
}

// ConnEntry is one connection's counters, with its addresses.
type ConnEntry struct {
	Local  string
	Remote string
	Stats  ConnStats
}

// SRQStats describe one shared receive queue of an engine.
type SRQStats struct {
	MessageSize int   // bytes per receive
	Depth       int   // the most receives it posts
	Posted      int64 // receives posted now
	Granted     int64 // credits given and not used yet, over all connections
	Held        int64 // messages received and not taken yet, or whose credits are not back
	Waiting     int   // connections waiting for credits
	// Withdrawn counts receives taken back as the load fell (their
	// buffers go back to the pool), by the queue itself or by Trim.
	Withdrawn uint64
	// Refills counts refills by what started them, indexed by
	// RefillEvent, RefillPoll, RefillGrant and RefillRetry.
	Refills [RefillCauses]uint64
}

// The indexes of SRQStats.Refills: what started a refill.
const (
	RefillEvent  = ieng.RefillEvent  // the SRQ limit event
	RefillPoll   = ieng.RefillPoll   // the check after a poll
	RefillGrant  = ieng.RefillGrant  // a grant or a waiting connection found too few receives posted
	RefillRetry  = ieng.RefillRetry  // the retry after the pool limit cut a refill short
	RefillCauses = ieng.RefillCauses // the number of causes, the length of Refills
)

// closedStats keeps the counters of an engine's closed connections.
// Its lock makes a connection's move from the open ones to Closed one
// step for stats: counted in neither, a total would dip, and a monitoring
// system reads a dip in a counter as a reset.
type closedStats struct {
	mu sync.Mutex
	st ConnStats
}

// retire takes a closing connection out of the engine's slots and adds
// its counters to Closed.
func (e *engine) retire(c *conn) {
	e.retired.mu.Lock()
	defer e.retired.mu.Unlock()
	e.RemoveEndpoint(c.rc.Slot)
	cs := c.api.Stats()
	cs.CreditsOut = 0 // a gauge: nothing is given out by a closed connection
	e.retired.st.add(cs)
}

// stats reads the engine's counters, each connection's too when conns
// is set.
func (e *engine) stats(conns bool) EngineStats {
	st := EngineStats{Provider: e.Prov.Name(), Device: e.Name(), Port: e.Port.Port, Pool: PoolStats(e.Pool.Stats())}
	e.retired.mu.Lock()
	for _, ep := range e.Endpoints() {
		rcc, ok := ep.(*rc.Conn)
		if !ok {
			continue // a PacketConn's: its counters are its own (PacketStats)
		}
		c := (*conn)(rcc.Shell().(*shell))
		cs := c.api.Stats()
		st.Conns++
		st.Total.add(cs)
		if conns {
			st.Connections = append(st.Connections, ConnEntry{Local: addrString(c.local), Remote: addrString(c.rc.Remote), Stats: cs})
		}
	}
	st.Closed = e.retired.st
	e.retired.mu.Unlock()
	st.Lifecycle = e.lifecycle.stats()
	for _, s := range e.SRQs() {
		st.SharedReceives = append(st.SharedReceives, SRQStats(s.Stats()))
	}
	for _, u := range e.Units() {
		st.Pollers.add(PollerStats(u.P.Stats()))
	}
	return st
}

func (t *PollerStats) add(s PollerStats) {
	t.Polls += s.Polls
	t.EmptyPolls += s.EmptyPolls
	t.Completions += s.Completions
	t.MaxBatch = max(t.MaxBatch, s.MaxBatch)
	t.Yields += s.Yields
	t.SpinsDenied += s.SpinsDenied
	t.SpinsCut += s.SpinsCut
	t.Arms += s.Arms
	t.Repolled += s.Repolled
	t.Parks += s.Parks
	t.Events += s.Events
	t.Wakeups += s.Wakeups
	t.Kicks += s.Kicks
	t.KicksSkipped += s.KicksSkipped
	t.Direct += s.Direct
	t.Drives += s.Drives
	t.Driven += s.Driven
	t.Standbys += s.Standbys
	t.Looks += s.Looks
	t.DrivesCut += s.DrivesCut
	t.Backlogs += s.Backlogs
	t.LongSpins += s.LongSpins
}

func (t *ConnStats) add(s ConnStats) {
	t.Sends += s.Sends
	t.SendBytes += s.SendBytes
	t.Writes += s.Writes
	t.WriteBytes += s.WriteBytes
	t.Reads += s.Reads
	t.ReadBytes += s.ReadBytes
	t.Atomics += s.Atomics
	t.Recvs += s.Recvs
	t.RecvBytes += s.RecvBytes
	t.Completions += s.Completions
	t.Failed += s.Failed
	t.RecvFailed += s.RecvFailed
	for i := range t.SendFailures {
		t.SendFailures[i] += s.SendFailures[i]
		t.RecvFailures[i] += s.RecvFailures[i]
	}
	t.RetryExceeded += s.RetryExceeded
	t.RNRRetryExceeded += s.RNRRetryExceeded
	t.CreditWaits += s.CreditWaits
	t.QueueWaits += s.QueueWaits
	t.QueueFull += s.QueueFull
	t.CreditsOut += s.CreditsOut
	t.CreditWrites += s.CreditWrites
	t.ControlFrames += s.ControlFrames
	t.Doorbells += s.Doorbells
	t.Latency.add(s.Latency)
}

// Stats reads the engine's counters.
func (x *Engine) Stats() EngineStats { return x.e.stats(true) }

// live is every open engine, for Engines and expvar.
var live struct {
	mu sync.Mutex
	m  map[*engine]struct{}
}

func (e *engine) register() {
	live.mu.Lock()
	if live.m == nil {
		live.m = map[*engine]struct{}{}
	}
	live.m[e] = struct{}{}
	live.mu.Unlock()
}

func (e *engine) unregister() {
	live.mu.Lock()
	delete(live.m, e)
	live.mu.Unlock()
}

// AllStats reads the counters of every open engine of the process: the
// shared ones of the package-level Dial and Listen and those of
// OpenEngine.
func AllStats() []EngineStats { return allStats(true) }

// allStats is AllStats, with each connection's counters when conns is
// set.
func allStats(conns bool) []EngineStats {
	live.mu.Lock()
	engs := make([]*engine, 0, len(live.m))
	for e := range live.m {
		engs = append(engs, e)
	}
	live.mu.Unlock()
	out := make([]EngineStats, 0, len(engs))
	for _, e := range engs {
		out = append(out, e.stats(conns))
	}
	return out
}

func addrString(a interface{ String() string }) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// The counters by status of rc.Counters are ConnStats' by
// CompletionStatus: the compiler checks that their lengths agree.
var _ [CompletionStatuses]uint64 = rc.CounterValues{}.SendFail
