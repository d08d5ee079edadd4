//go:build rdmaheaders

// list.h against ../abi.h (abi.h here links to it).
// abi.h is a link to ../abi.h: the go command hashes only the headers
// of the package directory, so a change to a header outside it would not
// rebuild this file.
#include "abi.h"

#include "entries.h"

#define V(name, ours, real) {#name, (uint64_t)(uintptr_t)(ours)},
const abicheck_entry abicheck_ours[] = {
#include "list.h"
};
const int abicheck_ours_n = sizeof(abicheck_ours) / sizeof(abicheck_ours[0]);
