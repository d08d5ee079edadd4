#!/bin/bash
# Guest job for the two-VM tests, in the role given as $1 (server or
# client): the ibv two-host RC test on rxe, then the async API between
# the two hosts on rxe and on the soft provider's TCP transport. Each
# client retries while the server side starts.
set -u
export RDMA_TWOHOST_ROLE=$1
ulimit -l unlimited
rc=0
timeout 300 ./ibv.test -test.v -test.count=1 -test.run '^TestVerbsTwoHostRC$' || rc=1
timeout 300 ./root.test -test.v -test.count=1 -test.run '^TestTwoHost(Soft|Verbs)$' || rc=1
exit $rc
