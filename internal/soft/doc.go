// Package soft is the software RDMA provider: the verbs of internal/verbs
// in pure Go, for machines without an RDMA device. It builds without cgo
// and passes the same conformance suite (internal/conformance) as the
// libibverbs provider.
//
// # Device and addressing
//
// A process has one device, "soft0", with one port (1): ACTIVE, link
// layer Ethernet, MTU 4096, and one RoCE v2 GID, the IPv4-mapped address
// of the provider's TCP listener. The port's LID is the listener's TCP
// port. The listener starts when the first Context opens and stops when
// the last one closes; it listens on 127.0.0.1 on a free port, or on
// RDMA_SOFT_ADDR=ip:port (another host must reach exactly that address).
// Peers are named as on RoCE, by GID and LID, which the soft provider
// reads as IP and TCP port; QPs are connected with the usual
// RESET→INIT→RTR→RTS transitions and PSNs.
//
// QPs of one process talk in-process: a WRITE is one copy from the
// requester's registered memory into the responder's. QPs in other
// processes or hosts talk over TCP (see the wire format in wire.go);
// RDMA_SOFT_TRANSPORT=tcp sends in-process traffic over loopback TCP too,
// to test that path.
//
// # Semantics
//
// Registration, keys and access checks are as on hardware: lkeys and
// rkeys are random 32-bit values; every SGE is checked against its lkey,
// range, PD and LOCAL_WRITE, and every remote access against the rkey,
// the range, the MR's and the QP's remote rights. RC, UC and UD QPs,
// SRQs, address handles, the completion channel and async events behave
// as on hardware, including their errors: RNR retries and
// RNR_RETRY_EXC_ERR, REM_ACCESS_ERR moving both RC QPs to ERR, flushes
// with WR_FLUSH_ERR, CQ overrun (the QPs on the CQ go to ERR, the Context
// reports EVENT_CQ_ERR, and the CQ never grows), the one-shot SRQ limit
// event (checked as each receive is taken, as rxe does), posts refused in
// the wrong state, and partial chains. A UD receive starts with the 40-byte
// GRH rxe writes: between IPv4 addresses, bytes 20..39 are the IPv4
// header (verbs.ParseGRH reads both forms), else an IPv6 header; it
// carries the source and destination addresses. Multicast (AttachMcast,
// an AH to a multicast GID, RemoteQPN verbs.MulticastQPN) reaches the
// attached UD QPs of this process only, whatever the transport: 1024
// groups, 64 QPs a group. Atomics use sync/atomic on
// the target word, so they are atomic against every other atomic on it,
// from any QP or process, and against the owner's own sync/atomic use of
// the word; they operate in host byte order, as rxe does.
//
// VendorErr of a failed completion says what the provider saw (see the
// VendorErr constants), and QPError tells why a QP entered ERR.
//
// # Who does the work, and what it costs
//
// One-sided operations (WRITE, READ, atomics) are served by the soft
// provider, never by the target's application code, but unlike an RDMA
// NIC the provider spends CPU on the target: across processes the
// target's connection goroutines read each WRITE from the socket into
// registered memory and write each READ response out, and in-process the
// requester's goroutine does the copy. Nothing here is kernel bypass;
// numbers measured on soft are software numbers.
//
// PostSend runs in-process work at once, in the caller's goroutine, and
// writes small WRs (up to 16 KiB) to a connected peer itself, as a TCP
// Write would; it leaves the rest (large WRs, the first WR to a peer,
// which dials, RNR retries) and the timing of outstanding WRs to a per-QP
// worker goroutine. A large in-process WR goes to the worker too when the
// caller pipelines: it posts while completions of its earlier large WRs
// are still unpolled, so it has work of its own to do while the worker
// copies (a caller that waits for each completion copies itself, and
// saves the worker's wake-up). A completion may therefore already be in
// the CQ when PostSend returns; as on hardware, nothing may rely on
// either order.
//
// A provider sends its requests to a peer on up to four TCP connections,
// a QP on the one its QPN picks, dialed when first needed; responses go
// back on the connection of the request. Whoever runs the send queue
// writes the frames of all the WRs it finds runnable with one writev (up
// to 1 MiB), straight from registered memory. Each connection has a
// reader goroutine, which reads headers through a small buffer and
// payloads straight into their target memory (on Linux with readv, so
// that the read of a payload also takes the next header), and writes the
// ACKs it owes, coalesced, when it has caught up with the stream; a
// writer goroutine sends READ responses. The completion channel is a
// verbs.DirectChannel: the events of the completions a reader produces
// go, at the end of the frame, to the channel's direct handler in the
// reader's goroutine (the poller takes them there, without waking its
// own goroutine first); other events go to GetEvent. A goroutine that
// busy-polls a CQ with only runtime.Gosched between polls can keep the
// Go scheduler from polling the network, which delays those goroutines
// by up to 10 ms; poll briefly, then wait on the completion channel.
//
// # Failures
//
// A malformed or truncated frame, a wrong version, or a frame for an
// unknown QP never panics and never allocates by a length it was told:
// payloads go straight into registered memory after their target has
// been checked, or are skipped. The connection is closed, and every RC
// and UC QP connected to that peer goes to ERR with an error that says
// what was wrong; a request for an unknown QP is answered with a NAK that
// moves the requester to ERR. A peer of another wire version is refused
// at connect with a *VersionError. A peer that disappears fails every
// outstanding WR, sends and receives, of the QPs connected to it: at once
// when its connection drops (a killed process), or after the QP's timeout
// (4.096 µs·2^Timeout per try, RetryCount+1 tries, bounded to
// [2 s, 4 s], so that a slow peer does not trip it)
// when it stops answering; a connection that stalls in the
// middle of a frame for 5 s is dropped.
//
// # Performance
//
// WRITE and SEND allocate nothing per operation, in-process and over
// TCP. Figures are in README.md.
package soft
