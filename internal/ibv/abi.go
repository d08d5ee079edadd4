//go:build linux && (amd64 || arm64)

//lint:file-ignore U1000 every field keeps its C place; some are only read by C, and the cgo build uses them only in abi_cgo.go's layout checks.

package ibv

import "unsafe"

// The Go mirror of the part of abi.h the purego binding reads and writes
// (the *_purego.go files): the same structs, field by
// field, for the two 64-bit little-endian targets purego calls C on.
// The cgo build checks every size and offset below against abi.h at
// compile time (abi_cgo.go), and abi.h is checked against rdma-core's
// headers (internal/ibv/abicheck), so the three agree.

// ibvSendWR is struct ibv_send_wr. wr is the union of its rdma, atomic
// and ud members (wrRDMA, wrAtomic, wrUD); the memory-window and TSO
// union after qpType is never set.
type ibvSendWR struct {
	wrID      uint64
	next      uintptr
	sgList    uintptr
	numSGE    int32
	opcode    uint32
	sendFlags uint32
	imm       uint32 // big endian
	wr        [4]uint64
	qpType    uint32
	_         uint32
	_         [6]uint64
}

type wrRDMA struct {
	remoteAddr uint64
	rkey       uint32
}

type wrAtomic struct {
	remoteAddr uint64
	compareAdd uint64
	swap       uint64
	rkey       uint32
}

type wrUD struct {
	ah         uintptr
	remoteQPN  uint32
	remoteQKey uint32
}

// ibvRecvWR is struct ibv_recv_wr.
type ibvRecvWR struct {
	wrID   uint64
	next   uintptr
	sgList uintptr
	numSGE int32
	_      int32
}

// ibvWC is struct ibv_wc.
type ibvWC struct {
	wrID         uint64
	status       uint32
	opcode       uint32
	vendorErr    uint32
	byteLen      uint32
	imm          uint32 // big endian
	qpNum        uint32
	srcQP        uint32
	wcFlags      uint32
	pkeyIndex    uint16
	slid         uint16
	sl           uint8
	dlidPathBits uint8
}

// ibvDeviceAttr is struct ibv_device_attr.
type ibvDeviceAttr struct {
	fwVer                 [64]byte
	nodeGUID              [8]byte // big endian
	sysImageGUID          [8]byte // big endian
	maxMRSize             uint64
	pageSizeCap           uint64
	vendorID              uint32
	vendorPartID          uint32
	hwVer                 uint32
	maxQP                 int32
	maxQPWR               int32
	deviceCapFlags        uint32
	maxSGE                int32
	maxSGERd              int32
	maxCQ                 int32
	maxCQE                int32
	maxMR                 int32
	maxPD                 int32
	maxQPRdAtom           int32
	maxEERdAtom           int32
	maxResRdAtom          int32
	maxQPInitRdAtom       int32
	maxEEInitRdAtom       int32
	atomicCap             uint32
	maxEE                 int32
	maxRDD                int32
	maxMW                 int32
	maxRawIPv6QP          int32
	maxRawEthyQP          int32
	maxMcastGrp           int32
	maxMcastQPAttach      int32
	maxTotalMcastQPAttach int32
	maxAH                 int32
	maxFMR                int32
	maxMapPerFMR          int32
	maxSRQ                int32
	maxSRQWR              int32
	maxSRQSGE             int32
	maxPKeys              uint16
	localCAAckDelay       uint8
	physPortCnt           uint8
}

// ibvPortAttr is struct ibv_port_attr.
type ibvPortAttr struct {
	state         uint32
	maxMTU        uint32
	activeMTU     uint32
	gidTblLen     int32
	portCapFlags  uint32
	maxMsgSz      uint32
	badPKeyCntr   uint32
	qkeyViolCntr  uint32
	pkeyTblLen    uint16
	lid           uint16
	smLID         uint16
	lmc           uint8
	maxVLNum      uint8
	smSL          uint8
	subnetTimeout uint8
	initTypeReply uint8
	activeWidth   uint8
	activeSpeed   uint8
	physState     uint8
	linkLayer     uint8
	flags         uint8
	portCapFlags2 uint16
}

// ibvQPCap is struct ibv_qp_cap.
type ibvQPCap struct {
	maxSendWR     uint32
	maxRecvWR     uint32
	maxSendSGE    uint32
	maxRecvSGE    uint32
	maxInlineData uint32
}

// ibvQPInitAttr is struct ibv_qp_init_attr.
type ibvQPInitAttr struct {
	qpContext uintptr
	sendCQ    uintptr
	recvCQ    uintptr
	srq       uintptr
	cap       ibvQPCap
	qpType    uint32
	sqSigAll  int32
}

// ibvAHAttr is struct ibv_ah_attr with its struct ibv_global_route.
type ibvAHAttr struct {
	dgid         [2]uint64 // union ibv_gid, 8-byte aligned as in C
	flowLabel    uint32
	sgidIndex    uint8
	hopLimit     uint8
	trafficClass uint8
	dlid         uint16
	sl           uint8
	srcPathBits  uint8
	staticRate   uint8
	isGlobal     uint8
	portNum      uint8
}

// ibvQPAttr is struct ibv_qp_attr.
type ibvQPAttr struct {
	qpState          uint32
	curQPState       uint32
	pathMTU          uint32
	pathMigState     uint32
	qkey             uint32
	rqPSN            uint32
	sqPSN            uint32
	destQPNum        uint32
	qpAccessFlags    uint32
	cap              ibvQPCap
	ahAttr           ibvAHAttr
	altAHAttr        ibvAHAttr
	pkeyIndex        uint16
	altPKeyIndex     uint16
	enSQDAsyncNotify uint8
	sqDraining       uint8
	maxRdAtomic      uint8
	maxDestRdAtomic  uint8
	minRNRTimer      uint8
	portNum          uint8
	timeout          uint8
	retryCnt         uint8
	rnrRetry         uint8
	altPortNum       uint8
	altTimeout       uint8
	rateLimit        uint32
}

// ibvSRQAttr is struct ibv_srq_attr, ibvSRQInitAttr struct
// ibv_srq_init_attr.
type ibvSRQAttr struct {
	maxWR    uint32
	maxSGE   uint32
	srqLimit uint32
}

type ibvSRQInitAttr struct {
	srqContext uintptr
	attr       ibvSRQAttr
}

// ibvAsyncEvent is struct ibv_async_event: element is the union of the
// CQ, QP, SRQ and WQ pointers and the port number.
type ibvAsyncEvent struct {
	element   uintptr
	eventType uint32
}

// rdmaConnParam is struct rdma_conn_param.
type rdmaConnParam struct {
	privateData        uintptr
	privateDataLen     uint8
	responderResources uint8
	initiatorDepth     uint8
	flowControl        uint8
	retryCount         uint8 // ignored when accepting
	rnrRetryCount      uint8
	srq                uint8
	qpNum              uint32
}

// rdmaCMEvent is the head of struct rdma_cm_event that the binding
// reads: param is the union's conn member. The union's ud member is
// longer, so the struct is too; librdmacm allocates events, the binding
// only reads them in place.
type rdmaCMEvent struct {
	id       uintptr
	listenID uintptr
	event    uint32
	status   int32
	conn     rdmaConnParam
}

// Offsets into the objects libibverbs hands back, which the binding
// reads in place.
const (
	offContextOps     = 8 // struct ibv_context.ops
	offContextAsyncFD = offContextOps + 32*8 + 4
	// abi_compat follows the context's pthread_mutex_t, whose size
	// differs between amd64 and arm64.
	offContextABICompat = offContextOps + 32*8 + 16 + sizeofPthreadMutex
	sizeofContext       = offContextABICompat + 8

	// The hot-path ops, by their offset in struct ibv_context.
	offOpPollCQ      = offContextOps + 11*8
	offOpReqNotifyCQ = offContextOps + 12*8
	offOpPostSRQRecv = offContextOps + 20*8
	offOpPostSend    = offContextOps + 25*8
	offOpPostRecv    = offContextOps + 26*8

	// struct verbs_context around an extended context: query_port and
	// sz, relative to the struct ibv_context at its end.
	offVerbsQueryPort = -(8 + 37*8 + 8 + 8)
	offVerbsSz        = -8
	sizeofVerbsFromQP = -offVerbsQueryPort + sizeofContext

	offCompChannelFD = 8  // struct ibv_comp_channel.fd
	offCQCQE         = 28 // struct ibv_cq.cqe
	offQPNum         = 52 // struct ibv_qp.qp_num
	offSRQContext    = 8  // struct ibv_srq.srq_context
	offMRLKey        = 36 // struct ibv_mr.lkey
	offMRRKey        = 40 // struct ibv_mr.rkey

	offContextDevice = 0 // struct ibv_context.device

	// struct rdma_event_channel.fd and the fields of struct rdma_cm_id
	// the binding reads: verbs, the source and destination socket
	// addresses of route.addr, port_num.
	offCMChannelFD = 0
	offCMIDVerbs   = 0
	offCMIDSrcAddr = 32
	offCMIDDstAddr = 160
	offCMIDPortNum = 348

	// struct sockaddr_in and struct sockaddr_in6 (family, then the port
	// in network order, in both), in a struct sockaddr_storage.
	sizeofSockaddrStorage = 128
	offSinPort            = 2
	offSinAddr            = 4
	offSin6Port           = 2
	offSin6Addr           = 8
	offSin6ScopeID        = 24
	afInet                = 2
	afInet6               = 10

	// enum values of abi.h the binding uses. Those the shared logic
	// uses too are in the shared files: the ibvQP* attribute mask bits
	// (qp_shared.go) and ibvLinkLayerEthernet (ibv_shared.go).
	ibvLinkLayerIB = 1
	rdmaPSTCP      = 0x0106
	ibvSRQLimit    = 1 << 1
	ibvQPSErr      = 6
	ibvWCWithImm   = 1 << 1
	ibvWCGRH       = 1 << 0

	ibvWROpRDMAWrite      = 0
	ibvWROpRDMAWriteImm   = 1
	ibvWROpRDMARead       = 4
	ibvWROpAtomicCmpSwp   = 5
	ibvWROpAtomicFetchAdd = 6
	ibvEventQPFatal       = 1
	ibvEventQPReqErr      = 2
	ibvEventQPAccessErr   = 3
	ibvEventCommEst       = 4
	ibvEventSQDrained     = 5
	ibvEventPathMig       = 6
	ibvEventPathMigErr    = 7
	ibvEventPortActive    = 9
	ibvEventPortErr       = 10
	ibvEventLIDChange     = 11
	ibvEventPKeyChange    = 12
	ibvEventSMChange      = 13
	ibvEventSRQErr        = 14
	ibvEventSRQLimit      = 15
	ibvEventQPLastWQE     = 16
	ibvEventClientReReg   = 17
	ibvEventGIDChange     = 18
)

// abiIsExtended is abi_compat of a context inside a struct
// verbs_context (GORDMA_VERBS_ABI_IS_EXTENDED).
const abiIsExtended = ^uintptr(0)

// at returns a pointer of type *T to the C memory at p+off, which the
// caller knows holds a T (a field of a libibverbs object or of scratch
// memory mapped off the Go heap).
func at[T any](p uintptr, off int) *T {
	a := p + uintptr(off)
	return *(**T)(unsafe.Pointer(&a))
}
