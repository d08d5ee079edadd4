package ibv

import (
	"fmt"
	"net/netip"
	"syscall"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Connection management through rdma_cm (librdmacm): the second way to
// connect RC QPs on the verbs provider, next to exchanging QP numbers
// and GIDs over TCP. The QP stays a go-rdma QP created on a device the
// caller opened with Provider.Open; rdma_cm only finds the route, carries
// the connection handshake and supplies the QP attributes.
//
// Active side:
//
//	id, _ := CMDial(ctx, "", "10.0.0.1:7471") // resolves address and route
//	dev, _ := Provider.Open(id.Device())      // the device the route uses
//	... create PD, CQ and an RC QP on dev ...
//	id.ModifyQP(qp, verbs.StateInit)          // optional: post receives first
//	id.Connect(ctx, qp, CMParams{})           // INIT, RTR, RTS, established
//
// Passive side:
//
//	ln, _ := CMListen("10.0.0.1:7471", 16)
//	req, _ := ln.Accept(ctx)                  // one CONNECT_REQUEST
//	dev, _ := Provider.Open(req.Device())
//	... create the QP, req.ModifyQP(qp, verbs.StateInit), post receives ...
//	req.Accept(ctx, qp, CMParams{})           // INIT, RTR, RTS, accept, ESTABLISHED
//
// Either side ends with Disconnect, WaitDisconnect and Close. Each CMID
// and each CMListener has its own rdma_cm event channel, read without
// blocking an OS thread; every wait is bounded by its context.

// CMParams are the connection parameters of Connect and Accept.
type CMParams struct {
	// ResponderResources is how many RDMA READs and atomics the peer may
	// have in flight to us. 0 means min(16, the device's limit). On
	// Accept it is also capped by what the peer asked for.
	ResponderResources uint8
	// InitiatorDepth is how many RDMA READs and atomics we may have in
	// flight to the peer. 0 means min(16, the device's limit). On Accept
	// it is also capped by the peer's responder resources.
	InitiatorDepth uint8
	// RetryCount is the transport retry count (Connect only; the
	// passive side takes the active side's). 0 means 7.
	RetryCount uint8
	// RNRRetryCount is the RNR retry count; 7 retries for ever. 0 means 7.
	RNRRetryCount uint8
	// PrivateData is sent to the peer with the request (Connect, at most
	// CMMaxConnectData bytes) or the reply (Accept, at most
	// CMMaxAcceptData bytes). It is copied.
	PrivateData []byte
}

// Limits of private data on InfiniBand and RoCE in rdma_cm's TCP port
// space. The peer receives the data padded with zeros to the full size.
const (
	CMMaxConnectData = 56
	CMMaxAcceptData  = 196
	CMMaxRejectData  = 148
)

// CMAddr is an IP address and port in rdma_cm's TCP port space.
type CMAddr struct{ netip.AddrPort }

// Network is "rdma_cm".
func (CMAddr) Network() string { return "rdma_cm" }

// CMRequest is one connection request taken by CMListener.Accept. Its
// CMID is the new connection: open Device(), create the QP there, then
// Accept or Reject it, and Close it in every case.
type CMRequest struct {
	*CMID
	// ResponderResources and InitiatorDepth are the most Accept may
	// grant, from this side's view: the peer's initiator depth and the
	// peer's responder resources. Accept never grants more.
	ResponderResources uint8
	InitiatorDepth     uint8
}

// rdma_cm event types (enum rdma_cm_event_type).
const (
	cmAddrResolved   = 0
	cmAddrError      = 1
	cmRouteResolved  = 2
	cmRouteError     = 3
	cmConnectRequest = 4
	cmConnectResp    = 5
	cmConnectError   = 6
	cmUnreachable    = 7
	cmRejected       = 8
	cmEstablished    = 9
	cmDisconnected   = 10
	cmDeviceRemoval  = 11
	cmMulticastJoin  = 12
	cmMulticastError = 13
	cmAddrChange     = 14
	cmTimewaitExit   = 15
)

// CMEventError is an rdma_cm event that ended an operation: the address
// or route could not be resolved, the peer rejected or never answered,
// or the device went away. errors.Is matches syscall.ECONNREFUSED for a
// rejection, syscall.ECONNRESET for a disconnect during setup,
// verbs.ErrNoDevice for a device removal, and the errno rdma_cm reports
// (e.g. syscall.ETIMEDOUT) otherwise.
type CMEventError struct {
	Op     string // "resolve address", "resolve route", "connect", "accept", ...
	Event  string // e.g. "RDMA_CM_EVENT_REJECTED"
	Status int    // a negative errno, or for REJECTED the transport's reject reason
	// PrivateData is what the peer sent with its rejection, if anything.
	PrivateData []byte

	event int
}

func (e *CMEventError) Error() string {
	switch {
	case e.event == cmRejected:
		return fmt.Sprintf("ibv: rdma_cm %s: connection rejected by the peer (%s, reject reason %d)", e.Op, e.Event, e.Status)
	case e.Status < 0:
		return fmt.Sprintf("ibv: rdma_cm %s: %s: %v", e.Op, e.Event, syscall.Errno(-e.Status))
	case e.Status > 0:
		return fmt.Sprintf("ibv: rdma_cm %s: %s (status %d)", e.Op, e.Event, e.Status)
	}
	return fmt.Sprintf("ibv: rdma_cm %s: %s", e.Op, e.Event)
}

func (e *CMEventError) Unwrap() []error {
	var out []error
	switch e.event {
	case cmRejected:
		out = append(out, syscall.ECONNREFUSED)
	case cmDisconnected:
		out = append(out, syscall.ECONNRESET)
	case cmDeviceRemoval:
		out = append(out, verbs.ErrNoDevice)
	}
	if e.Status < 0 && e.event != cmRejected {
		out = append(out, syscall.Errno(-e.Status))
	}
	return out
}
