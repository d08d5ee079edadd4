//go:build rdmaheaders

// list.h against rdma-core's headers.
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "entries.h"

#define V(name, ours, real) {#name, (uint64_t)(uintptr_t)(real)},
const abicheck_entry abicheck_real[] = {
#include "list.h"
};
const int abicheck_real_n = sizeof(abicheck_real) / sizeof(abicheck_real[0]);
