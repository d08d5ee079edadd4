package verbs

// SGE is a scatter/gather element: Length bytes of registered memory at
// virtual address Addr, checked against LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send-queue work request.
type SendWR struct {
	// ID comes back unchanged in the completion. Keep it an index into a
	// table of your own; never a pointer.
	ID     uint64
	Opcode Opcode
	Flags  SendFlags
	SGL    []SGE
	// Imm is the immediate value of SEND_WITH_IMM and WRITE_WITH_IMM, in
	// host order; providers carry it in network order on the wire.
	Imm uint32

	// RemoteAddr and RKey name the remote memory of WRITE, READ and the
	// atomics. Atomics need an 8-byte-aligned RemoteAddr.
	RemoteAddr uint64
	RKey       uint32

	// CompareAdd is the compare value of CAS and the addend of FAA; Swap
	// is the new value of CAS. An atomic has exactly one 8-byte SGE that
	// receives the old value.
	CompareAdd uint64
	Swap       uint64

	// UD only: the destination.
	AH         AH
	RemoteQPN  uint32
	RemoteQKey uint32
}

// RecvWR is a receive-queue work request.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// WorkCompletion reports the outcome of one work request. When Status is
// not WCSuccess only WRID, Status, QPN and VendorErr are valid.
//
// The layout is fixed: the verbs provider's C shim writes these structs
// directly, and its tests check every offset.
type WorkCompletion struct {
	WRID      uint64
	Status    WCStatus
	Opcode    WCOpcode
	VendorErr uint32
	ByteLen   uint32
	Imm       uint32 // host order; valid when Flags&WCWithImm != 0
	QPN       uint32
	SrcQP     uint32
	Flags     WCFlags
	PKeyIndex uint16
	SLID      uint16
	SL        uint8
	_         [3]byte
}

// Err is nil for a successful completion and a *WCError otherwise.
func (wc *WorkCompletion) Err() error {
	if wc.Status == WCSuccess {
		return nil
	}
	return &WCError{Status: wc.Status, Opcode: wc.Opcode, WRID: wc.WRID, VendorErr: wc.VendorErr, QPN: wc.QPN}
}
