package verbs

import (
	"context"
	"strconv"
)

// Provider is one implementation of the verbs: "verbs" (libibverbs) or
// "soft" (pure Go).
type Provider interface {
	// Name is "verbs" or "soft".
	Name() string
	// Devices lists the devices this provider sees. An empty list and a
	// nil error mean there are none.
	Devices() ([]DeviceInfo, error)
	// Open opens the named device, or the first usable one when name is
	// "". An unknown name gives an error wrapping ErrNoDevice.
	Open(name string) (Context, error)
}

// Context is an open device.
type Context interface {
	Info() DeviceInfo
	QueryDevice() (DeviceAttr, error)
	QueryPort(port uint8) (PortAttr, error)
	QueryGID(port uint8, index int) (GID, error)

	AllocPD() (PD, error)
	// CreateCompChannel makes a completion channel that CQs can report
	// events to.
	CreateCompChannel() (CompChannel, error)
	// CreateCQ makes a CQ with room for at least cqe completions. ch may
	// be nil; then the CQ can only be polled.
	CreateCQ(cqe int, ch CompChannel) (CQ, error)
	// AsyncEvent waits for the next asynchronous event of the device (QP
	// fatal, CQ error, port change, ...) or for ctx to end.
	AsyncEvent(ctx context.Context) (AsyncEvent, error)

	// Close fails with ErrBusy while PDs, CQs or channels are open.
	Close() error
}

// PD is a protection domain.
type PD interface {
	// RegMR registers buf, which must be memory mapped off the Go heap
	// (internal/mem), with the given rights. Zero-length buffers are
	// refused. Hitting RLIMIT_MEMLOCK gives an error wrapping ErrMemlock
	// that names the limit and `ulimit -l`.
	RegMR(buf []byte, access Access) (MR, error)
	CreateQP(attr QPInit) (QP, error)
	CreateSRQ(attr SRQInit) (SRQ, error)
	// CreateAH makes an address handle for UD sends to dest.
	CreateAH(dest Address) (AH, error)
	// Close fails with ErrBusy while MRs, QPs, SRQs or AHs are open.
	Close() error
}

// MR is a registered memory region.
type MR interface {
	LKey() uint32
	RKey() uint32
	// Addr is the virtual address of the first byte, as SGEs and remote
	// peers name it.
	Addr() uint64
	Len() int
	// Bytes is the registered memory itself.
	Bytes() []byte
	Access() Access
	Close() error
}

// CompChannel delivers "this CQ has a completion" events. An event is not
// a completion: it says poll. The sequence that loses nothing is
// GetEvent, AckEvents, ReqNotify, then poll until empty.
type CompChannel interface {
	// GetEvent waits, without blocking an OS thread, for the next event
	// and returns the CQ it belongs to. It returns ctx.Err() when ctx
	// ends and an error wrapping ErrClosed after Close.
	GetEvent(ctx context.Context) (CQ, error)
	// Close fails with ErrBusy while CQs use the channel.
	Close() error
}

// DirectChannel is a CompChannel that can hand its events to a function
// instead of its waiter (GetEvent). Where the provider produces a
// completion in a goroutine of its own (the soft provider's connection
// readers), it calls f there, at a point where it holds none of its
// locks, and the completion skips the hand-off to the waiter's goroutine.
// f receives the CQ of the event, which counts as taken and acknowledged:
// f polls the CQ, re-arms it (ReqNotify) and polls it again, as a woken
// waiter does. Events the provider produces elsewhere still go to
// GetEvent. SetDirect(nil) removes f.
type DirectChannel interface {
	CompChannel
	SetDirect(f func(CQ))
}

// CQ is a completion queue.
type CQ interface {
	// Poll fills wc with up to len(wc) completions and returns how many.
	Poll(wc []WorkCompletion) (int, error)
	// ReqNotify arms the CQ: the next completion (the next solicited
	// one, if solicitedOnly) sends one event to the channel.
	ReqNotify(solicitedOnly bool) error
	// AckEvents acknowledges n events taken with GetEvent. Close acks
	// what is left, so it never hangs.
	AckEvents(n int)
	// Len is the number of completions the CQ can hold, as granted.
	Len() int
	// Close fails with ErrBusy while QPs use the CQ.
	Close() error
}

// SpinPoller is a CQ that can spin in the provider: PollSpin polls up to
// spins times, returning at the first poll that finds completions. It
// replaces spins calls of Poll by one, which matters where a call into
// the provider is costly (cgo). Spinning loops use it when the CQ has it.
type SpinPoller interface {
	PollSpin(wc []WorkCompletion, spins int) (int, error)
}

// PollSpin polls cq up to spins times through SpinPoller if cq has it,
// else with Poll, and returns at the first poll that finds completions.
func PollSpin(cq CQ, wc []WorkCompletion, spins int) (int, error) {
	if sp, ok := cq.(SpinPoller); ok {
		return sp.PollSpin(wc, spins)
	}
	for i := 0; ; i++ {
		n, err := cq.Poll(wc)
		if n > 0 || err != nil || i+1 >= spins {
			return n, err
		}
	}
}

// QPCap are the queue sizes of a QP. CreateQP takes them as a request;
// QP.Cap returns what the provider granted, which may be more.
type QPCap struct {
	MaxSendWR     int
	MaxRecvWR     int
	MaxSendSGE    int
	MaxRecvSGE    int
	MaxInlineData int
}

// QPInit are the creation attributes of a QP.
type QPInit struct {
	Type   QPType
	SendCQ CQ
	RecvCQ CQ
	SRQ    SRQ // optional; then receives come from the SRQ
	Cap    QPCap
	// SignalAll makes every send WR signaled, whatever its flags.
	SignalAll bool
}

// Address names a destination port: on RoCE by GID, on InfiniBand by LID
// (and GID when routed).
type Address struct {
	Port      uint8 // local port
	LID       uint16
	GID       GID // when non-zero the route is global (always on RoCE)
	SGIDIndex uint8
	HopLimit  uint8
	SL        uint8
}

// InitAttr moves a QP from RESET to INIT.
type InitAttr struct {
	Port      uint8
	PKeyIndex uint16
	Access    Access // remote rights granted to the peer (RC, UC)
	QKey      uint32 // UD only
}

// RTRAttr moves a QP from INIT to RTR (ready to receive).
type RTRAttr struct {
	PathMTU         MTU
	DestQPN         uint32
	RQPSN           uint32 // the peer's first send PSN
	Dest            Address
	MaxDestRdAtomic uint8 // READs/atomics the peer may have in flight to us
	MinRNRTimer     uint8 // IB encoding; 1 is 0.01 ms, 0 is 655 ms
}

// RTSAttr moves a QP from RTR to RTS (ready to send).
type RTSAttr struct {
	SQPSN       uint32
	Timeout     uint8 // 4.096 µs * 2^Timeout; 0 waits for ever
	RetryCount  uint8 // 0..7
	RNRRetry    uint8 // 0..6, 7 retries for ever
	MaxRdAtomic uint8
}

// QP is a queue pair.
type QP interface {
	QPN() uint32
	Type() QPType
	Cap() QPCap
	State() (QPState, error)

	ToInit(InitAttr) error
	ToRTR(RTRAttr) error
	ToRTS(RTSAttr) error
	// ToError moves the QP to ERR: every outstanding WR completes with
	// WR_FLUSH_ERR.
	ToError() error
	ToReset() error

	// PostSend posts a whole chain at once. See PostError.
	PostSend(wrs []SendWR) (int, error)
	// PostRecv posts a chain of receives. A QP attached to an SRQ
	// refuses it.
	PostRecv(wrs []RecvWR) (int, error)

	// AttachMcast makes this UD QP a member of the multicast group gid
	// (ibv_attach_mcast): a datagram sent to the group, through an AH
	// whose GID is gid and with RemoteQPN MulticastQPN, reaches every
	// QP attached to it whose Q_Key it carries, in RTR or RTS; its GRH
	// names the group as the destination. lid is the group's multicast
	// LID on InfiniBand, 0 on RoCE. Attaching an attached QP again is
	// no error. A QP of another type or a GID that is not a multicast
	// address (GID.IsMulticast) gives ErrInvalid; a device without
	// multicast ErrNotSupported naming FeatureMulticast. Close detaches
	// the QP from every group.
	AttachMcast(gid GID, lid uint16) error
	// DetachMcast ends what AttachMcast began; detaching from a group
	// the QP is not attached to gives ErrInvalid.
	DetachMcast(gid GID, lid uint16) error
	Close() error
}

// SRQInit are the creation attributes of a shared receive queue.
type SRQInit struct {
	MaxWR  int
	MaxSGE int
}

// SRQ is a shared receive queue.
type SRQ interface {
	PostRecv(wrs []RecvWR) (int, error)
	// MaxWR is the granted depth.
	MaxWR() int
	// SetLimit arms the low watermark (ibv_modify_srq with
	// IBV_SRQ_LIMIT) so the consumer can refill before the SRQ runs dry
	// and senders hit RNR: when taking a receive leaves fewer than limit
	// posted, the context's AsyncEvent reports one EventSRQLimitReached
	// naming this SRQ and the limit is disarmed. The event is one-shot;
	// the consumer refills and arms again. Arming replaces a limit
	// already armed, 0 disarms, and limit must be in [0, MaxWR()), else
	// the error wraps ErrInvalid.
	//
	// Arm while at least limit receives are posted: when fewer are, some
	// devices report at once and others (rxe, soft) only when the next
	// receive is taken.
	SetLimit(limit int) error
	Close() error
}

// AH is an address handle for UD sends.
type AH interface {
	Close() error
}

// AsyncEventType is the kind of an asynchronous event.
type AsyncEventType uint32

// Values equal libibverbs' enum ibv_event_type.
const (
	EventCQErr            AsyncEventType = 0
	EventQPFatal          AsyncEventType = 1
	EventQPReqErr         AsyncEventType = 2
	EventQPAccessErr      AsyncEventType = 3
	EventCommEst          AsyncEventType = 4
	EventSQDrained        AsyncEventType = 5
	EventPathMig          AsyncEventType = 6
	EventPathMigErr       AsyncEventType = 7
	EventDeviceFatal      AsyncEventType = 8
	EventPortActive       AsyncEventType = 9
	EventPortErr          AsyncEventType = 10
	EventLIDChange        AsyncEventType = 11
	EventPKeyChange       AsyncEventType = 12
	EventSMChange         AsyncEventType = 13
	EventSRQErr           AsyncEventType = 14
	EventSRQLimitReached  AsyncEventType = 15
	EventQPLastWQEReached AsyncEventType = 16
	EventClientReregister AsyncEventType = 17
	EventGIDChange        AsyncEventType = 18
)

var asyncEventNames = [...]string{"CQ_ERR", "QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR", "COMM_EST", "SQ_DRAINED", "PATH_MIG", "PATH_MIG_ERR", "DEVICE_FATAL", "PORT_ACTIVE", "PORT_ERR", "LID_CHANGE", "PKEY_CHANGE", "SM_CHANGE", "SRQ_ERR", "SRQ_LIMIT_REACHED", "QP_LAST_WQE_REACHED", "CLIENT_REREGISTER", "GID_CHANGE"}

func (t AsyncEventType) String() string {
	if int(t) < len(asyncEventNames) {
		return asyncEventNames[t]
	}
	return "AsyncEventType(" + strconv.Itoa(int(t)) + ")"
}

// AsyncEvent is one asynchronous event. QPN is set for QP events, Port
// for port events and SRQ for SRQ events (EventSRQErr,
// EventSRQLimitReached).
type AsyncEvent struct {
	Type AsyncEventType
	QPN  uint32
	Port uint8
	// SRQ is the SRQ as CreateSRQ returned it, so it compares equal
	// with ==. An SRQ has no number outside XRC, hence the object
	// rather than a number like QPN. It may be nil when the SRQ was
	// closed before the event was read.
	SRQ SRQ
}
