//go:build !linux || (!cgo && !amd64 && !arm64)

package ibv

import (
	"context"
	"fmt"
	"net"

	"github.com/go-rdma/rdma/internal/verbs"
)

var errNoCM = fmt.Errorf("ibv: rdma_cm: %w: this build has no librdmacm support (not Linux, or built without cgo on a platform the purego binding does not cover)", verbs.ErrNotSupported)

// CMAvailable fails with verbs.ErrNotSupported: this build has no
// rdma_cm support.
func CMAvailable() error { return errNoCM }

// CMID is one rdma_cm connection end. This build cannot make one.
type CMID struct{}

// CMListener listens for rdma_cm connection requests. This build cannot
// make one.
type CMListener struct{}

// CMListen fails with verbs.ErrNotSupported in this build.
func CMListen(addr string, backlog int) (*CMListener, error) { return nil, errNoCM }

// CMDial fails with verbs.ErrNotSupported in this build.
func CMDial(ctx context.Context, laddr, raddr string) (*CMID, error) { return nil, errNoCM }

func (l *CMListener) Addr() net.Addr                                 { return CMAddr{} }
func (l *CMListener) Accept(ctx context.Context) (*CMRequest, error) { return nil, errNoCM }
func (l *CMListener) Close() error                                   { return nil }

func (c *CMID) Device() string                                            { return "" }
func (c *CMID) Port() uint8                                               { return 0 }
func (c *CMID) LocalAddr() net.Addr                                       { return CMAddr{} }
func (c *CMID) RemoteAddr() net.Addr                                      { return CMAddr{} }
func (c *CMID) PrivateData() []byte                                       { return nil }
func (c *CMID) ReadDepth() int                                            { return 0 }
func (c *CMID) ModifyQP(q verbs.QP, state verbs.QPState) error            { return errNoCM }
func (c *CMID) Connect(ctx context.Context, q verbs.QP, p CMParams) error { return errNoCM }
func (c *CMID) Accept(ctx context.Context, q verbs.QP, p CMParams) error  { return errNoCM }
func (c *CMID) Reject(privateData []byte) error                           { return errNoCM }
func (c *CMID) Disconnect() error                                         { return errNoCM }
func (c *CMID) WaitDisconnect(ctx context.Context) error                  { return errNoCM }
func (c *CMID) Close() error                                              { return nil }
