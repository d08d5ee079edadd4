package soft

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/verbs"
)

// TestClosedMRKeysRefused: a QP remembers the last MR its inline copies and
// its responder found (keyCache); once that MR is closed its keys are
// refused all the same, the lkey at the post and the rkey with
// REM_ACCESS_ERR, and the closed region is not written.
func TestClosedMRKeysRefused(t *testing.T) {
	transports(t, func(t *testing.T) {
		a, b := pair(t, verbs.RC, connOpt{})
		src, err := a.pd.RegMR(mapMem(t, 4096), allAccess)
		require.NoError(t, err)
		dstBuf := mapMem(t, 4096)
		dst, err := b.pd.RegMR(dstBuf, allAccess)
		require.NoError(t, err)
		write := func(id uint64, from verbs.SGE) (int, error) {
			return a.qp.PostSend([]verbs.SendWR{{ID: id, Opcode: verbs.OpWrite, Flags: verbs.SendInline | verbs.SendSignaled,
				SGL: []verbs.SGE{from}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}})
		}
		srcSGE := verbs.SGE{Addr: src.Addr(), Length: 32, LKey: src.LKey()}

		// Twice through each key: the second finds them in the caches.
		fill(src.Bytes()[:32], 1)
		for id := uint64(1); id <= 2; id++ {
			_, err = write(id, srcSGE)
			require.NoError(t, err)
			require.Equal(t, id, pollOK(t, a.scq).WRID)
		}
		require.Equal(t, src.Bytes()[:32], dstBuf[:32])

		require.NoError(t, src.Close())
		n, err := write(3, srcSGE)
		require.ErrorIs(t, err, verbs.ErrInvalid, "inline WRITE from a closed MR's lkey")
		require.Zero(t, n)

		want := bytes.Clone(dstBuf[:32])
		require.NoError(t, dst.Close())
		fill(a.buf[:32], 7)
		_, err = write(4, a.sge(0, 32))
		require.NoError(t, err)
		wc := poll(t, a.scq, 1)[0]
		require.Equal(t, uint64(4), wc.WRID)
		require.Equal(t, verbs.WCRemAccessErr, wc.Status, "WRITE to a closed MR's rkey: %+v", wc)
		require.Equal(t, want, dstBuf[:32], "a closed region was written")
	})
}
