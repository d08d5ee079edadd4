package rc

import "errors"

// The regions the peer revoked, as the send queue refuses accesses to
// them: under postMu, checked as each chain is posted (postable).

// maxRevokedKeys bounds the revoked rkeys a connection remembers, to
// refuse accesses to them locally.
const maxRevokedKeys = 1024

// Revoke refuses accesses to rkey from now on: the peer revoked it, or
// this side released it.
func (q *SendQueue) Revoke(rkey uint32) {
	q.postMu.Lock()
	q.addRevokedLocked(rkey)
	q.unlockPost()
}

// addRevokedLocked records a revoked rkey. Caller holds postMu.
func (q *SendQueue) addRevokedLocked(rkey uint32) {
	if q.revoked == nil {
		q.revoked = map[uint32]struct{}{}
	}
	if _, ok := q.revoked[rkey]; ok {
		return
	}
	if len(q.revokedFIFO) >= maxRevokedKeys {
		delete(q.revoked, q.revokedFIFO[0])
		q.revokedFIFO = q.revokedFIFO[1:]
	}
	q.revoked[rkey] = struct{}{}
	q.revokedFIFO = append(q.revokedFIFO, rkey)
}

// ForgetRevoked: the peer hands out rkey again (the device reused it for
// new memory), so accesses to it are good again.
func (q *SendQueue) ForgetRevoked(rkey uint32) {
	q.postMu.Lock()
	if _, ok := q.revoked[rkey]; ok {
		delete(q.revoked, rkey)
		for i, k := range q.revokedFIFO {
			if k == rkey {
				q.revokedFIFO = append(q.revokedFIFO[:i], q.revokedFIFO[i+1:]...)
				break
			}
		}
	}
	q.unlockPost()
}

// isRevoked reports whether the peer revoked rkey. Caller holds postMu.
func (q *SendQueue) isRevoked(rkey uint32) bool {
	if len(q.revoked) == 0 {
		return false
	}
	_, ok := q.revoked[rkey]
	return ok
}

// ErrRegionRevoked: the region's owner revoked it (or its lifetime
// ended); this side posts no access to it any more.
var ErrRegionRevoked = errors.New("remote region revoked by its owner")
