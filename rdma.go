package rdma

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	ieng "github.com/go-rdma/rdma/internal/engine"
	"github.com/go-rdma/rdma/internal/rc"

	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/internal/poller"
	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/soft"
	"github.com/go-rdma/rdma/internal/sysfs"
	"github.com/go-rdma/rdma/internal/verbs"
)

var (
	// ErrNotSupported: the build, provider or device cannot do this.
	ErrNotSupported = verbs.ErrNotSupported
	// ErrClosed: the connection, listener or object is closed. It wraps
	// net.ErrClosed.
	ErrClosed = verbs.ErrClosed
	// ErrInvalid: an argument breaks the rule in the method's doc.
	ErrInvalid = verbs.ErrInvalid
	// ErrNoDevice: no RDMA device of that name, or no usable one.
	ErrNoDevice = verbs.ErrNoDevice
	// ErrMemlock: registering memory hit RLIMIT_MEMLOCK (`ulimit -l`).
	ErrMemlock = verbs.ErrMemlock

	// Completion errors; a *CompletionError matches the one for its
	// status.
	ErrRemoteAccess  = verbs.ErrRemoteAccess     // the peer refused the access: rkey, bounds or rights (REM_ACCESS_ERR)
	ErrRNRRetry      = verbs.ErrRNRRetryExceeded // the peer had no receive posted, retries exhausted (RNR_RETRY_EXC_ERR)
	ErrFlushed       = verbs.ErrFlushed          // the queue pair went to its error state before the work ran (WR_FLUSH_ERR)
	ErrRetryExceeded = verbs.ErrRetryExceeded    // the peer did not answer, transport retries exhausted (RETRY_EXC_ERR)
	ErrRemoteOp      = verbs.ErrRemoteOp         // the peer failed to carry the operation out (REM_OP_ERR)

	// ErrBufferReleased: the Buffer was released already; it cannot be
	// used or released again.
	ErrBufferReleased = pool.ErrReleased
	// ErrPoolLimit: a buffer would take the engine's pool past its limit
	// (WithPoolLimit).
	ErrPoolLimit = pool.ErrLimit
)

// Provider names.
const (
	ProviderAuto  = "auto"
	ProviderVerbs = "verbs"
	ProviderSoft  = "soft"
)

type config struct {
	provider       string
	device         string
	port           uint8
	pollMode       PollMode
	sqDepth        int // send WRs in flight per connection
	sqLimit        int // send WRs issued and not completed per connection; 0: by the send depth (WithSendQueueLimit)
	rqDepth        int // credits per connection: its messages in flight to this side
	maxMsg         int // largest SEND a connection accepts
	slabSize       int
	maxPool        int64
	sharedRecvs    int           // receives an engine's SRQ keeps posted at most; 0: by size (srqDepth)
	setup          time.Duration // bound on the handshake
	maxExpose      int           // bytes a peer may RequestRegion in total
	regionLife     time.Duration // longest life of a region granted to RequestRegion
	cm             bool          // set connections up through rdma_cm
	transport      Transport     // RC or UC (WithTransport); TCP on a connection that fell back
	fallback       bool          // the TCP fallback is allowed (WithTCPFallback)
	threadLock     poller.ThreadLock
	cpus           []int         // pollers' CPUs, sorted, no duplicates (poller.CheckCPUs)
	spin           time.Duration // Adaptive pollers' spin; 0: the provider's default
	handler        RecvHandler   // messages go to it instead of Recv
	handlerPool    HandlerPool   // runs the handler instead of the engine's workers
	handlerWorkers int           // RecvHandler calls an engine runs at once; 0: 4 × GOMAXPROCS
	log            *slog.Logger  // lifecycle and device events; nil: none
	protocol       string        // the application protocol named in the hello (WithProtocol)

	// Who may connect (WithTLS, WithAcceptCheck).
	tls         *tls.Config          // the handshake and control channel over TLS; nil: plain TCP
	acceptCheck func(PeerInfo) error // a Listener's check of each peer

	// WithQueueDepth was given: a PacketConn takes its depths, else
	// defaults of its own.
	depthSet bool
}

func defaultConfig() config {
	c := config{
		provider:   os.Getenv("RDMA_PROVIDER"),
		port:       1,
		sqDepth:    128,
		rqDepth:    64,
		maxMsg:     64 << 10,
		setup:      defaultHandshakeTimeout,
		maxExpose:  64 << 20,
		regionLife: 10 * time.Minute,
	}
	if c.provider == "" {
		c.provider = ProviderAuto
	}
	return c
}

// WithProvider chooses the provider: "auto" (verbs where a usable device
// exists, the build has cgo and libibverbs loads at run time, else soft),
// "verbs" or "soft". The default is $RDMA_PROVIDER, or "auto".
func WithProvider(name string) EngineOption {
	return engineOpt(func(c *config) error {
		switch name {
		case ProviderAuto, ProviderVerbs, ProviderSoft:
			c.provider = name
			return nil
		}
		return fmt.Errorf("rdma: %w: provider %q (want auto, verbs or soft)", ErrInvalid, name)
	})
}

// WithDevice names the device to use; the default is chosen by the local
// address of the connection, else the first usable device.
func WithDevice(name string) EngineOption {
	return engineOpt(func(c *config) error { c.device = name; return nil })
}

// WithPort chooses the device port (default 1).
func WithPort(port int) EngineOption {
	return engineOpt(func(c *config) error {
		if port < 1 || port > 255 {
			return fmt.Errorf("rdma: %w: port %d (want 1..255)", ErrInvalid, port)
		}
		c.port = uint8(port)
		return nil
	})
}

// WithPollMode sets how this connection's or listener's pollers wait:
// PollAdaptive (the default), PollBusy or PollEvent. It is an engine
// setting: connections with different modes use different engines.
func WithPollMode(m PollMode) EngineOption {
	return engineOpt(func(c *config) error {
		switch m {
		case PollAdaptive, PollBusy, PollEvent:
			c.pollMode = m
			return nil
		}
		return fmt.Errorf("rdma: %w: poll mode %v", ErrInvalid, m)
	})
}

// WithPollSpin sets how long an Adaptive poller keeps polling an empty
// CQ before it parks on the completion channel. The default is what a
// park and wake of the provider's channel costs, so that spinning never
// wastes more than twice the best choice made in hindsight: for verbs (an
// fd waited for through the netpoller) 50 µs, or, where the poller
// measures its wake-ups to cost more (rxe in an emulated machine), twice
// what they cost, up to 200 µs; 10 µs for soft (a Go channel). Longer
// spins lower latency when completions come at longer gaps, at the price
// of a core. A spin given here is used as given.
func WithPollSpin(d time.Duration) EngineOption {
	return engineOpt(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("rdma: %w: poll spin %v (want > 0)", ErrInvalid, d)
		}
		c.spin = d
		return nil
	})
}

// softSpin is the soft provider's default Adaptive spin. Measured on 2
// cores: against 50 µs it took the stream between two
// processes from 0.62-0.69× to 0.75× of TCP loopback with one connection,
// and left the 8 B ping-pong over soft's TCP transport at 14.4-14.8 µs;
// 2 µs gained a little more throughput but cost 11 µs of latency there.
const softSpin = 10 * time.Microsecond

// pollSpin is the Adaptive spin for provider prov.
func (c *config) pollSpin(prov string) time.Duration {
	switch {
	case c.spin > 0:
		return c.spin
	case prov == ProviderSoft:
		return softSpin
	}
	return 0 // the poller's own: DefaultSpin, longer where its wakes cost more
}

// WithPollerThreadLock locks every completion poller to its own OS
// thread (true) or none (false). Without it Busy pollers are locked
// (runtime.LockOSThread) and Adaptive and Event pollers, which park
// through the netpoller, run on ordinary goroutines: a locked goroutine
// hands its P to another thread and back at every park and yield, which
// on a 2-core machine costs about 15 µs per completion handed to a
// waiter and halved the stream's throughput (docs/poller.md). Lock
// them where the thread must be pinned (CPU affinity, a per-thread
// provider resource).
func WithPollerThreadLock(locked bool) EngineOption {
	return engineOpt(func(c *config) error {
		c.threadLock = poller.LockNever
		if locked {
			c.threadLock = poller.LockAlways
		}
		return nil
	})
}

// WithPollerCPUs pins the threads of the engine's completion pollers to
// this set of CPUs (sched_setaffinity; Linux only, else ErrNotSupported),
// as busy polling on isolated cores wants. An engine has one poller per
// CQ (a new CQ, twice the size of the last, when the others are full),
// and all of its pollers are pinned to the whole set; give engines of
// their own (OpenEngine) disjoint sets to keep their pollers apart.
// Pinning locks the pollers to their threads, whatever the mode
// (WithPollerThreadLock(false) with CPUs is invalid): an Adaptive or
// Event poller then pays a thread hand-off at every park
// (docs/poller.md). Every CPU must be one the process may run on; otherwise the
// option fails with ErrInvalid, naming the CPU and the allowed set. No
// CPUs, the default, means no pinning. It is an engine setting: engines
// with different sets are different engines. With
// WithPollMode(PollBusy), a Future.Wait polls the CQ from the waiting
// goroutine's thread, which is not pinned.
func WithPollerCPUs(cpus ...int) EngineOption {
	return engineOpt(func(c *config) error {
		set, err := poller.CheckCPUs(cpus)
		if err != nil {
			return fmt.Errorf("rdma: %w", err)
		}
		c.cpus = set
		return nil
	})
}

// WithQueueDepth sets how many operations a connection keeps in flight
// (its send queue, default 128) and how many messages its peer may have
// in flight to it (its credits, default 64): receives of the engine's
// shared receive queue that the connection may hold at once, taken
// messages included (see WithSharedReceives). Connections set up through
// rdma_cm post that many receives of their own. A PacketConn takes them
// as its datagrams in flight (default 128) and its receives posted
// (default 256), which is also how many datagrams may wait for ReadFrom.
func WithQueueDepth(send, recv int) ConnOption {
	return connOpt(func(c *config) error {
		if send < 1 || send > 16384 || recv < 1 || recv > 16384 {
			return fmt.Errorf("rdma: %w: queue depth %d/%d (want 1..16384)", ErrInvalid, send, recv)
		}
		c.sqDepth, c.rqDepth, c.depthSet = send, recv, true
		return nil
	})
}

// WithMaxMessage sets the largest message Send may carry to this side
// (the size of each posted receive buffer). Default 64 KiB.
func WithMaxMessage(n int) ConnOption {
	return connOpt(func(c *config) error {
		if n < 64 || n > 1<<30 {
			return fmt.Errorf("rdma: %w: max message %d (want 64 B..1 GiB)", ErrInvalid, n)
		}
		c.maxMsg = n
		return nil
	})
}

// MaxSharedReceives bounds WithSharedReceives: the receives one shared
// receive queue may post.
const MaxSharedReceives = ieng.MaxSharedReceives

// WithSharedReceives bounds the receives an engine's shared receive
// queue keeps posted for the messages of all its connections. It is an
// engine setting; the device's max_srq_wr bounds it too. By default an
// SRQ holds up to 64 MiB of receives: 1,024 of the default 64 KiB, 16,384
// of 4 KiB, and at least 256. Receives are posted as credits are given,
// so the memory of posted receives follows the aggregate message rate:
// at most n times WithMaxMessage per message size an engine serves,
// whatever the number of connections. Past it, senders wait for credits,
// in turn, and the credits that connections hold and do not use are
// recalled for them. A posted receive cannot be taken back: when the
// load falls, fewer are posted again as messages use them.
func WithSharedReceives(n int) EngineOption {
	return engineOpt(func(c *config) error {
		if n < 1 || n > MaxSharedReceives {
			return fmt.Errorf("rdma: %w: shared receives %d (want 1..%d)", ErrInvalid, n, MaxSharedReceives)
		}
		c.sharedRecvs = n
		return nil
	})
}

// WithPoolLimit bounds the registered memory of the buffer pool.
func WithPoolLimit(bytes int64) EngineOption {
	return engineOpt(func(c *config) error {
		if bytes < 0 {
			return fmt.Errorf("rdma: %w: pool limit %d", ErrInvalid, bytes)
		}
		c.maxPool = bytes
		return nil
	})
}

// WithRegionLimit bounds the memory a peer may obtain with RequestRegion
// in total (default 64 MiB; 0 refuses every request).
func WithRegionLimit(bytes int) ConnOption {
	return connOpt(func(c *config) error {
		if bytes < 0 {
			return fmt.Errorf("rdma: %w: region limit %d", ErrInvalid, bytes)
		}
		c.maxExpose = bytes
		return nil
	})
}

// WithRegionLifetime sets the longest life of a region this side grants
// to the peer's RequestRegion (default 10 minutes); a request may ask for
// less (RegionLifetime). When it ends the region is revoked in order
// (Conn.Revoke) and the peer's accesses to it fail with
// ErrRegionRevoked.
func WithRegionLifetime(d time.Duration) ConnOption {
	return connOpt(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("rdma: %w: region lifetime %v (want > 0)", ErrInvalid, d)
		}
		c.regionLife = d
		return nil
	})
}

// defaultHandshakeTimeout is the handshake's bound without
// WithHandshakeTimeout.
const defaultHandshakeTimeout = 10 * time.Second

// WithHandshakeTimeout bounds go-rdma's handshake (default 10 s): on a
// Listener, the time an accepted socket has to send a valid hello and
// finish setting its connection up; on Dial, the time the listener has
// to answer (the dial's context may end it sooner). A dial it ends fails
// with a *net.OpError whose Timeout() is true, matching
// os.ErrDeadlineExceeded. A socket that says
// nothing costs the listener a goroutine and a file descriptor until
// then, and nothing else: the queue pair and its receives are made only
// after a valid hello.
func WithHandshakeTimeout(d time.Duration) ConnOption {
	return connOpt(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("rdma: %w: handshake timeout %v (want > 0)", ErrInvalid, d)
		}
		c.setup = d
		return nil
	})
}

// providers are the verbs providers in the order Devices lists them.
func providers() []verbs.Provider {
	return []verbs.Provider{ibv.Provider, soft.Provider}
}

// Devices lists the RDMA devices of every provider: real devices through
// libibverbs, then the soft provider's soft0. It reads sysfs and opens
// devices only to learn whether they are usable; on a machine without
// RDMA devices it lists soft0 alone and returns no error.
func Devices() ([]Device, error) {
	var all []Device
	for _, p := range providers() {
		devs, err := p.Devices()
		if err != nil {
			return nil, err
		}
		for _, d := range devs {
			all = append(all, deviceFrom(d))
		}
	}
	return all, nil
}

// chooseProvider resolves "auto" and checks that the choice can work. It
// returns the verbs devices it listed, so the caller need not list again.
func chooseProvider(name, device string) (verbs.Provider, []verbs.DeviceInfo, error) {
	switch name {
	case ProviderSoft:
		return soft.Provider, nil, nil
	case ProviderVerbs, ProviderAuto:
		// Listing from sysfs is cheap; opening every device is not (it
		// takes most of a second on an emulated machine). Opening the
		// chosen device is the real test.
		devs, err := verbsDevices()
		if err != nil && name == ProviderVerbs {
			return nil, nil, err
		}
		for _, d := range devs {
			if d.Usable && (device == "" || d.Name == device) {
				return ibv.Provider, devs, nil
			}
		}
		if name == ProviderAuto && (device == "" || device == "soft0") {
			return soft.Provider, nil, nil
		}
		if lib := ibv.Available(); lib != nil {
			// No device is usable because libibverbs is missing: say
			// so, matching ErrNotSupported as well.
			what := fmt.Sprintf("provider %q", name)
			if device != "" {
				what += fmt.Sprintf(", device %q", device)
			}
			return nil, nil, fmt.Errorf("rdma: %s: %w: %w", what, ErrNoDevice, lib)
		}
		why := fmt.Sprintf("%d devices listed, none usable", len(devs))
		for _, d := range devs {
			if device == "" || d.Name == device {
				why += fmt.Sprintf("; %s: %s", d.Name, d.Why)
			}
		}
		if device != "" {
			why = fmt.Sprintf("device %q: %s", device, why)
		}
		return nil, nil, fmt.Errorf("rdma: provider %q: %w: %s", name, ErrNoDevice, why)
	}
	return nil, nil, fmt.Errorf("rdma: %w: provider %q (want auto, verbs or soft)", ErrInvalid, name)
}

// verbsDevices lists the verbs devices from sysfs, with whether each is
// usable. The list is kept for devicesTTL: reading it costs most of a
// second on an emulated machine, and every Dial and Listen that picks a
// device needs it.
func verbsDevices() ([]verbs.DeviceInfo, error) {
	devList.mu.Lock()
	defer devList.mu.Unlock()
	if devList.at.IsZero() || time.Since(devList.at) > devicesTTL {
		devs, err := sysfs.Devices()
		var lib error
		if len(devs) > 0 {
			// A device is usable only if libibverbs loads; without
			// devices there is no need to load it.
			lib = ibv.Available()
		}
		for i, d := range devs {
			devs[i].Usable = lib == nil && sysfs.Openable(d)
			if !devs[i].Usable {
				devs[i].Why = "no ACTIVE port or no uverbs device"
				if lib != nil {
					devs[i].Why = lib.Error()
				}
			}
		}
		devList.devs, devList.err, devList.at = devs, err, time.Now()
	}
	return slices.Clone(devList.devs), devList.err
}

const devicesTTL = 10 * time.Second

var devList struct {
	mu   sync.Mutex
	at   time.Time
	devs []verbs.DeviceInfo
	err  error
}

// The errors a peer's words become; their wire protocol is internal/rc's.

// ErrPeerClosed means the peer ended the connection and said so: it
// closed it (Close), or its side failed (or called Abort) and told this
// side, and then the error's text quotes the peer's reason. After the
// peer's Close, the connection's Err, its pending operations and those
// issued later all fail with one error, "rdma: peer ADDR: peer closed
// the connection", whatever completions the close flushed. It wraps
// net.ErrClosed. A peer that went away without saying so is ErrPeerLost.
var ErrPeerClosed = rc.ErrPeerClosed

// ErrPeerLost means the peer went away without ending the connection:
// its process was killed or crashed, its host or the network went down,
// its control socket was reset or ended without the close handshake, or
// the transport gave up on it (RETRY_EXC_ERR, or its queue pair failed
// under ours). The error keeps the first symptom in its chain (the
// socket's error, the *CompletionError). It wraps net.ErrClosed, like
// ErrPeerClosed, but does not match ErrPeerClosed: code that treats the
// peer's close as the normal end of a conversation must not treat a
// crash as one. (The stream package reports both as "connection reset
// by peer" when they come before the stream's own close.) Connections
// set up through rdma_cm cannot tell the two apart: the peer's
// disconnect is ErrPeerClosed, however its process ended.
var ErrPeerLost = rc.ErrPeerLost

// ErrVersion means the peer speaks another version of the handshake.
var ErrVersion = rc.ErrVersion

// ErrNotRDMA means the peer did not answer with a go-rdma handshake.
var ErrNotRDMA = rc.ErrNotRDMA

// ErrRefused means the peer refused the connection; the error says why.
var ErrRefused = rc.ErrRefused

// ErrProtocol means the peer broke go-rdma's control protocol: a
// malformed frame, or more outstanding requests than it may have. The
// connection is cut off.
var ErrProtocol = rc.ErrProtocol
