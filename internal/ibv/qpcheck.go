//go:build linux && (cgo || amd64 || arm64)

package ibv

import (
	"fmt"

	"github.com/go-rdma/rdma/internal/verbs"
)

// checkSend reports why w cannot be posted on q, before the device sees it.
func (q *qp) checkSend(w *verbs.SendWR) error {
	if !w.Opcode.Supports(q.typ) {
		return fmt.Errorf("%w: opcode %v is not supported on a %v QP", verbs.ErrInvalid, w.Opcode, q.typ)
	}
	if len(w.SGL) > q.cap.MaxSendSGE {
		return fmt.Errorf("%w: %d SGEs, the QP was granted %d", verbs.ErrInvalid, len(w.SGL), q.cap.MaxSendSGE)
	}
	if w.Flags&verbs.SendInline != 0 {
		n := 0
		for _, s := range w.SGL {
			n += int(s.Length)
		}
		if n > q.cap.MaxInlineData {
			return fmt.Errorf("%w: %d bytes inline, the QP was granted %d", verbs.ErrInvalid, n, q.cap.MaxInlineData)
		}
	}
	if w.Opcode.IsAtomic() {
		if len(w.SGL) != 1 || w.SGL[0].Length != 8 {
			return fmt.Errorf("%w: an atomic needs exactly one 8-byte SGE for the old value", verbs.ErrInvalid)
		}
		if w.RemoteAddr%8 != 0 {
			return fmt.Errorf("%w: atomic remote address %#x is not 8-byte aligned", verbs.ErrInvalid, w.RemoteAddr)
		}
	}
	if q.typ == verbs.UD {
		if a, ok := w.AH.(*ah); !ok || a == nil || a.pd.ctx != q.pd.ctx {
			return fmt.Errorf("%w: a UD send needs an address handle of this device", verbs.ErrInvalid)
		}
	}
	return nil
}

// sendable reports whether the send queue accepts posts in state s.
func sendable(s verbs.QPState) bool {
	return s == verbs.StateRTS || s == verbs.StateSQD || s == verbs.StateError || s == verbs.StateSQE
}
