package verbs

import "fmt"

// The numeric values of the enums below equal libibverbs' values so the
// verbs provider converts them without tables; the soft provider uses them
// as they are.

// QPType is the transport service of a queue pair.
type QPType uint8

const (
	RC QPType = 2 // reliable connected
	UC QPType = 3 // unreliable connected
	UD QPType = 4 // unreliable datagram
)

func (t QPType) String() string {
	switch t {
	case RC:
		return "RC"
	case UC:
		return "UC"
	case UD:
		return "UD"
	}
	return fmt.Sprintf("QPType(%d)", uint8(t))
}

// QPState is the state of a queue pair.
type QPState uint8

const (
	StateReset QPState = iota
	StateInit
	StateRTR
	StateRTS
	StateSQD
	StateSQE
	StateError
)

var qpStateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

func (s QPState) String() string {
	if int(s) < len(qpStateNames) {
		return qpStateNames[s]
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// Access is a set of memory-region access rights.
type Access uint32

const (
	AccessLocalWrite   Access = 1 << 0
	AccessRemoteWrite  Access = 1 << 1
	AccessRemoteRead   Access = 1 << 2
	AccessRemoteAtomic Access = 1 << 3

	// accessKnown is every flag this package defines.
	accessKnown = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
)

// Validate reports the rule of the verbs specification that a would
// break: REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE.
func (a Access) Validate() error {
	if a&^accessKnown != 0 {
		return fmt.Errorf("%w: unknown access flags %#x", ErrInvalid, uint32(a&^accessKnown))
	}
	if a&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && a&AccessLocalWrite == 0 {
		return fmt.Errorf("%w: access %v: REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE", ErrInvalid, a)
	}
	return nil
}

func (a Access) String() string {
	if a == 0 {
		return "none"
	}
	s := ""
	for _, f := range []struct {
		bit  Access
		name string
	}{{AccessLocalWrite, "LOCAL_WRITE"}, {AccessRemoteWrite, "REMOTE_WRITE"}, {AccessRemoteRead, "REMOTE_READ"}, {AccessRemoteAtomic, "REMOTE_ATOMIC"}} {
		if a&f.bit != 0 {
			if s != "" {
				s += "|"
			}
			s += f.name
		}
	}
	if rest := a &^ accessKnown; rest != 0 {
		if s != "" {
			s += "|"
		}
		s += fmt.Sprintf("%#x", uint32(rest))
	}
	return s
}

// Opcode is the operation of a send work request.
type Opcode uint8

const (
	OpWrite        Opcode = 0
	OpWriteWithImm Opcode = 1
	OpSend         Opcode = 2
	OpSendWithImm  Opcode = 3
	OpRead         Opcode = 4
	OpCompareSwap  Opcode = 5
	OpFetchAdd     Opcode = 6
)

var opcodeNames = [...]string{"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM", "RDMA_READ", "ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD"}

func (o Opcode) String() string {
	if int(o) < len(opcodeNames) {
		return opcodeNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// Supports reports whether a queue pair of type t can carry opcode o:
// UC has no READ and no atomics, UD has only the two sends.
func (o Opcode) Supports(t QPType) bool {
	switch o {
	case OpSend, OpSendWithImm:
		return t == RC || t == UC || t == UD
	case OpWrite, OpWriteWithImm:
		return t == RC || t == UC
	case OpRead, OpCompareSwap, OpFetchAdd:
		return t == RC
	}
	return false
}

// IsAtomic reports whether o is CAS or FAA.
func (o Opcode) IsAtomic() bool { return o == OpCompareSwap || o == OpFetchAdd }

// SendFlags modify a send work request.
type SendFlags uint32

const (
	SendFence     SendFlags = 1 << 0 // wait for earlier READs and atomics
	SendSignaled  SendFlags = 1 << 1 // generate a completion on success
	SendSolicited SendFlags = 1 << 2 // wake a peer armed for solicited events
	SendInline    SendFlags = 1 << 3 // copy the data at post time
)

// WCStatus is the status of a work completion. Its String is the name
// libibverbs gives (IBV_WC_*), so logs read the same on every provider.
type WCStatus uint32

const (
	WCSuccess WCStatus = iota
	WCLocLenErr
	WCLocQPOpErr
	WCLocEECOpErr
	WCLocProtErr
	WCWRFlushErr
	WCMWBindErr
	WCBadRespErr
	WCLocAccessErr
	WCRemInvReqErr
	WCRemAccessErr
	WCRemOpErr
	WCRetryExcErr
	WCRNRRetryExcErr
	WCLocRDDViolErr
	WCRemInvRdReqErr
	WCRemAbortErr
	WCInvEECNErr
	WCInvEECStateErr
	WCFatalErr
	WCRespTimeoutErr
	WCGeneralErr
)

var wcStatusNames = [...]string{
	"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR",
	"WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR",
	"REM_ACCESS_ERR", "REM_OP_ERR", "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR",
	"REM_INV_RD_REQ_ERR", "REM_ABORT_ERR", "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR",
	"RESP_TIMEOUT_ERR", "GENERAL_ERR",
}

func (s WCStatus) String() string {
	if int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("WCStatus(%d)", uint32(s))
}

// WCOpcode is the operation a work completion reports. Receive opcodes
// have bit 7 set, so (op & WCRecv) != 0 tests for a receive.
type WCOpcode uint32

const (
	WCSend             WCOpcode = 0
	WCWrite            WCOpcode = 1
	WCRead             WCOpcode = 2
	WCCompareSwap      WCOpcode = 3
	WCFetchAdd         WCOpcode = 4
	WCRecv             WCOpcode = 1 << 7
	WCRecvWriteWithImm WCOpcode = WCRecv + 1
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCWrite:
		return "RDMA_WRITE"
	case WCRead:
		return "RDMA_READ"
	case WCCompareSwap:
		return "COMP_SWAP"
	case WCFetchAdd:
		return "FETCH_ADD"
	case WCRecv:
		return "RECV"
	case WCRecvWriteWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", uint32(o))
}

// WCOpcodeOf is the completion opcode a successful send WR of opcode o
// reports on the sender's CQ.
func WCOpcodeOf(o Opcode) WCOpcode {
	switch o {
	case OpWrite, OpWriteWithImm:
		return WCWrite
	case OpRead:
		return WCRead
	case OpCompareSwap:
		return WCCompareSwap
	case OpFetchAdd:
		return WCFetchAdd
	}
	return WCSend
}

// WCFlags describe a work completion. Test them with &, never ==.
type WCFlags uint32

const (
	WCWithGRH WCFlags = 1 << 0 // a UD receive: a 40-byte GRH precedes the data
	WCWithImm WCFlags = 1 << 1 // Imm is valid
)

// MTU is an InfiniBand path MTU enum (1 = 256 bytes ... 5 = 4096 bytes).
type MTU uint8

const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes is the MTU in bytes, or 0 if m is not a valid MTU.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

func (m MTU) String() string {
	if b := m.Bytes(); b != 0 {
		return fmt.Sprint(b)
	}
	return fmt.Sprintf("MTU(%d)", uint8(m))
}

// MTUFromBytes is the largest IB MTU not above n bytes, or 0 if n < 256.
func MTUFromBytes(n int) MTU {
	for m := MTU4096; m >= MTU256; m-- {
		if m.Bytes() <= n {
			return m
		}
	}
	return 0
}

// PortState is the logical state of a port.
type PortState uint8

const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

var portStateNames = [...]string{"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"}

func (s PortState) String() string {
	if int(s) < len(portStateNames) {
		return portStateNames[s]
	}
	return fmt.Sprintf("PortState(%d)", uint8(s))
}

// GRHSize is the size of the global route header in front of every UD
// receive.
const GRHSize = 40
