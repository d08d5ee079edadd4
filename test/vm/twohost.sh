#!/bin/bash
# Guest job for the two-VM test: run the ibv test binary's two-host RC test
# in the role given as $1 (server or client). The client's Dial retries
# while the server VM boots (see TestVerbsTwoHostRC).
set -u
role=$1
export RDMA_TWOHOST_ROLE=$role
ulimit -l unlimited
timeout 300 ./ibv.test -test.v -test.count=1 -test.run '^TestVerbsTwoHostRC$'
