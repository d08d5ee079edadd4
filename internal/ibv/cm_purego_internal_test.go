//go:build linux && !cgo && (amd64 || arm64)

package ibv

import (
	"net/netip"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// Rule: the socket addresses the purego binding builds for librdmacm
// read back as the same address and port from where librdmacm keeps
// them in an rdma_cm_id (route.addr), for IPv4 and for IPv6 with its
// scope. No device is needed: the id is memory laid out as abi.go says.
func TestPuregoSockaddrRoundTrip(t *testing.T) {
	id, err := mapScratch(offCMIDPortNum + 8)
	require.NoError(t, err)
	defer unmapScratch(id)
	h := cmHandles{id: uintptr(unsafe.Pointer(&id[0]))}
	for _, s := range []string{"10.99.2.1:7471", "[fe80::1%7]:0", "[2001:db8::5]:65535", "0.0.0.0:0"} {
		a := netip.MustParseAddrPort(s)
		for _, peer := range []bool{false, true} {
			var ss sockaddrStorage
			fillSockaddr(&ss, a)
			off := offCMIDSrcAddr
			if peer {
				off = offCMIDDstAddr
			}
			copy(id[off:off+sizeofSockaddrStorage], ss.bytes())
			got := h.sockAddr(peer).AddrPort
			// The zone is carried as a scope id, which sockAddr does
			// not turn back into a name.
			require.Equal(t, a.Addr().WithZone(""), got.Addr(), "%s (peer %v)", s, peer)
			require.Equal(t, a.Port(), got.Port(), "%s (peer %v)", s, peer)
			if a.Addr().Zone() != "" {
				require.EqualValues(t, 7, *at[uint32](h.id, off+offSin6ScopeID))
			}
		}
	}
}
