// The C half of package dynlib: resolving a table of function pointers from
// a library that dynlib.Open opened. Included by the C files of the
// packages that load a library (cuda, comm/nccl, comm/nvshmem), each of
// which keeps its own table and list of symbols; their cgo preambles add
// -I${SRCDIR}/<path to internal/dynlib>. (The go command does not see a
// change to this file from those packages: after editing it, rebuild them
// with go build -a, or go clean -cache.)
#ifndef ASYNCTP_DYNLIB_H
#define ASYNCTP_DYNLIB_H

#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

// One slot of a function table: the symbols to try, in order (the first one
// found wins: a versioned name, then its fallbacks), the slot's offset in
// the table, and whether it may be missing.
typedef struct {
	const char *names[3];
	size_t offset;
	int optional;
} atp_dl_sym;

#define ATP_DL_NSYMS(a) ((int)(sizeof(a) / sizeof((a)[0])))

// atp_dl_resolve fills table (tableSize bytes, zeroed first) from the
// library handle lib with the n slots syms. used, when not NULL, receives
// for each slot the symbol it came from (NULL for a missing optional one).
// It returns 0, or -1 with *missing set to the first name of the first
// required slot that has none of its symbols.
static inline int atp_dl_resolve(void *lib, const atp_dl_sym *syms, int n, void *table, size_t tableSize,
                                 const char **used, const char **missing) {
	memset(table, 0, tableSize);
	for (int i = 0; i < n; i++) {
		void *p = NULL;
		const char *from = NULL;
		for (int j = 0; j < 3 && syms[i].names[j] != NULL; j++) {
			p = dlsym(lib, syms[i].names[j]);
			if (p != NULL) {
				from = syms[i].names[j];
				break;
			}
		}
		if (used != NULL) used[i] = from;
		if (p == NULL && !syms[i].optional) {
			*missing = syms[i].names[0];
			return -1;
		}
		// A data pointer to a function pointer: what dlsym's contract
		// (POSIX) guarantees to work.
		memcpy((char *)table + syms[i].offset, &p, sizeof p);
	}
	return 0;
}

#endif
