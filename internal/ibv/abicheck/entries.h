// The table format shared by real.c and ours.c: each file expands list.h
// against one set of declarations.
#include <stddef.h>
#include <stdint.h>

typedef struct {
	const char *name;
	uint64_t value;
} abicheck_entry;

#define S(type, name) {"sizeof " #name, sizeof(type)},
#define F(type, name, field) {"offsetof " #name "." #field, offsetof(type, field)},
#define E(name, field) {"to end " #name "." #field, sizeof(struct name) - offsetof(struct name, field)},
#define C(name) {#name, (uint64_t)(name)},
