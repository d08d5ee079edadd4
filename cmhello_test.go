package rdma

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/internal/rc"
)

// TestCMHello: the rdma_cm hello round-trips in the private data (padded
// with zeros, as rdma_cm delivers it), a peer that sent none speaks the
// plain async API with our settings and says no window, a hello of
// before the window says none either, and a bad one is refused.
func TestCMHello(t *testing.T) {
	pad := func(b []byte) []byte { return append(b, make([]byte, ibv.CMMaxConnectData-len(b))...) }
	me := cmHelloFor(config{maxMsg: 4096, protocol: "kv/2", rqDepth: 32})
	assert.Equal(t, uint32(29), me.recvWindow, "32 receives, re-posted 4 at a time")
	got, err := parseCMHello(pad(me.marshal()))
	require.NoError(t, err)
	assert.Equal(t, me, got)
	got, err = parseCMHello(me.marshal()[:cmHelloSize-4])
	require.NoError(t, err, "a hello of v0.1's layout, unpadded (iWARP)")
	assert.Equal(t, cmHello{maxMsg: 4096, protocol: "kv/2"}, got)

	peer, err := learnCMHello(config{maxMsg: 1 << 16, protocol: "kv/2"}, pad(me.marshal()), true)
	require.NoError(t, err)
	assert.Equal(t, uint32(4096), peer.maxMsg, "the peer's largest message, not ours")
	assert.Equal(t, uint32(29), peer.recvWindow)

	peer, err = learnCMHello(config{maxMsg: 1 << 16}, make([]byte, ibv.CMMaxConnectData), false)
	require.NoError(t, err, "no hello: the plain async API")
	assert.Equal(t, cmHello{maxMsg: 1 << 16}, peer)
	_, err = learnCMHello(config{maxMsg: 1 << 16, protocol: "kv/2"}, nil, true)
	assert.ErrorIs(t, err, ErrRefused, "we speak a protocol, the peer sent no hello")

	_, err = learnCMHello(config{maxMsg: 1 << 16, protocol: "kv/3"}, pad(me.marshal()), false)
	require.ErrorIs(t, err, ErrRefused)
	assert.Contains(t, err.Error(), `"kv/2"`)
	assert.Contains(t, err.Error(), `"kv/3"`)

	old := pad(me.marshal())
	old[2] = rc.Version - 1
	_, err = parseCMHello(old)
	assert.ErrorIs(t, err, ErrVersion)
	zero := pad(cmHello{protocol: "kv/2"}.marshal())
	_, err = parseCMHello(zero)
	assert.ErrorIs(t, err, ErrInvalid, "a largest message of 0")
	bad := pad(me.marshal())
	bad[9] = ' '
	_, err = parseCMHello(bad)
	assert.ErrorIs(t, err, ErrInvalid, "a protocol name with a space")
}

// TestCMHelloSettle: a listener's accept names the byte its dialer READs
// to settle an iWARP connection (settleIWARP), within an accept's
// private data; a hello without it names none, and a flag without the
// bytes after it is ignored.
func TestCMHelloSettle(t *testing.T) {
	acc := cmHelloFor(config{maxMsg: 4096, rqDepth: 32})
	acc.settle = RemoteRegion{Addr: 0x1122334455667788, Len: 1, RKey: 0xa1b2c3d4}
	b := acc.marshal()
	require.LessOrEqual(t, len(b), ibv.CMMaxAcceptData)
	got, err := parseCMHello(append(b, make([]byte, ibv.CMMaxAcceptData-len(b))...))
	require.NoError(t, err)
	assert.Equal(t, acc, got)

	b[3] &^= cmFlagSettle
	got, err = parseCMHello(b)
	require.NoError(t, err)
	assert.Zero(t, got.settle, "no flag: no byte")
	b[3] |= cmFlagSettle
	got, err = parseCMHello(b[:cmHelloSize])
	require.NoError(t, err)
	assert.Zero(t, got.settle, "the flag without the byte's address")

	plain := cmHelloFor(config{maxMsg: 4096}).marshal()
	assert.Len(t, plain, cmHelloSize, "a connect request has no room for more on RoCE")
	got, err = parseCMHello(append(plain, make([]byte, ibv.CMMaxConnectData-len(plain))...))
	require.NoError(t, err)
	assert.Zero(t, got.settle)
}

// TestCMHelloGoFirst: a dialer on iWARP says it sends a go before
// anything else (awaitGo), in a connect request's private data, beside
// the rest of its hello; a hello without the flag says it does not.
func TestCMHelloGoFirst(t *testing.T) {
	dial := cmHelloFor(config{maxMsg: 4096, rqDepth: 32, protocol: "kv/2"})
	dial.goFirst = true
	b := dial.marshal()
	require.Len(t, b, cmHelloSize, "no more than a connect request carries on RoCE")
	got, err := parseCMHello(append(b, make([]byte, ibv.CMMaxConnectData-len(b))...))
	require.NoError(t, err)
	assert.Equal(t, dial, got)

	b[3] &^= cmFlagGoFirst
	got, err = parseCMHello(b)
	require.NoError(t, err)
	assert.False(t, got.goFirst)
}

// TestCMReject: a listener's reason reaches the dialer as ErrRefused,
// cut to what a reject carries; another reject stays rdma_cm's error.
func TestCMReject(t *testing.T) {
	why := fmt.Errorf("rdma: %w: the dialer speaks %s", ErrRefused, strings.Repeat("x", 300))
	data := cmRejectData(why)
	assert.Len(t, data, ibv.CMMaxRejectData)
	assert.True(t, strings.HasPrefix(string(data), cmRejectPrefix+"the dialer speaks x"), "%q", data)

	err := cmRefused(&ibv.CMEventError{Op: "connect", PrivateData: append([]byte(cmRejectPrefix+"no"), 0, 0)})
	require.ErrorIs(t, err, ErrRefused)
	assert.Equal(t, "rdma: "+ErrRefused.Error()+`: the listener says: "no"`, err.Error())
	// The listener's text is quoted: it cannot forge lines of a log.
	err = cmRefused(&ibv.CMEventError{Op: "connect", PrivateData: []byte(cmRejectPrefix + "no\nrdma: forged\r\x1b[2K")})
	assert.Equal(t, "rdma: "+ErrRefused.Error()+`: the listener says: "no\nrdma: forged\r\x1b[2K"`, err.Error())
	other := &ibv.CMEventError{Op: "connect"}
	assert.True(t, errors.Is(cmRefused(other), other))
}
