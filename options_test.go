package rdma_test

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/go-rdma/rdma"
)

// Rule: the compiler tells the kinds of options apart. OpenEngine takes
// only engine options, an Engine's Dial only connection options, its
// Listen connection and listener options; the package-level Dial and
// Listen take them all. An engine option given to an Engine's Dial once
// failed only at run time, and given to the package-level Dial it
// silently opened another engine.
func TestOptionKinds(t *testing.T) {
	engine, conn, listen, option := reflect.TypeFor[rdma.EngineOption](), reflect.TypeFor[rdma.ConnOption](),
		reflect.TypeFor[rdma.ListenOption](), reflect.TypeFor[rdma.Option]()
	assert.False(t, engine.Implements(conn), "an engine option is a connection option")
	assert.False(t, engine.Implements(listen), "an engine option is a listener option")
	assert.False(t, conn.Implements(engine), "a connection option is an engine option")
	assert.False(t, listen.Implements(conn), "a listener option is a connection option")
	assert.True(t, conn.Implements(listen), "Engine.Listen takes connection options")
	for _, k := range []reflect.Type{engine, conn, listen} {
		assert.True(t, k.Implements(option), "%v is an Option", k)
	}
	logger := reflect.TypeFor[rdma.LoggerOption]()
	assert.True(t, logger.Implements(engine) && logger.Implements(conn), "WithLogger goes to engines and connections")

	kinds := map[reflect.Type][]any{
		engine: {rdma.WithProvider, rdma.WithDevice, rdma.WithPort, rdma.WithPollMode, rdma.WithPollSpin,
			rdma.WithPollerThreadLock, rdma.WithPollerCPUs, rdma.WithSharedReceives, rdma.WithPoolLimit, rdma.WithHandlerWorkers},
		conn: {rdma.WithQueueDepth, rdma.WithMaxMessage, rdma.WithRegionLimit, rdma.WithRegionLifetime, rdma.WithHandshakeTimeout,
			rdma.WithSendQueueLimit, rdma.WithRDMACM, rdma.WithTLS, rdma.WithProtocol, rdma.WithRecvHandler, rdma.WithHandlerPool},
		listen: {rdma.WithAcceptCheck},
		logger: {rdma.WithLogger},
	}
	for want, fns := range kinds {
		for _, fn := range fns {
			ft := reflect.TypeOf(fn)
			assert.Equal(t, want, ft.Out(0), "%v returns", ft)
		}
	}
	var opts []rdma.ListenOption
	opts = append(opts, rdma.WithQueueDepth(8, 8), rdma.WithAcceptCheck(func(rdma.PeerInfo) error { return nil }))
	assert.Len(t, opts, 2)
}
