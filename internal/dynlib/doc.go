// Package dynlib is the one loader of the native libraries asynctp opens
// at run time (go-nvml's pattern: open, resolve, close): libcuda and
// cuBLASLt (package cuda), NCCL (comm/nccl) and the NVSHMEM transport's
// own library (comm/nvshmem). The binaries build and their tests run
// without any of them; a library that is absent or incomplete gives an
// error naming it and the environment variable that overrides its path.
//
// Open opens a library (the first of its candidate paths that loads) and
// Close closes it. Resolving its entry points is C: each package keeps its
// table of function pointers and the list of the symbols that fill it
// (atp_dl_sym, versioned names first, optional slots marked) in its own C
// file, and fills it with atp_dl_resolve of dynlib.h (the package's cgo
// preamble adds -I${SRCDIR}/<path to here>); the Go side turns a missing
// symbol into MissingSymbol's error. Cache keeps the library a package
// installed for the life of the process and remembers the failures.
//
// The errors, one style for every library:
//
//	<pkg>: cannot load <path> (set <ENV> to its path; <hint>): <dlerror>
//	<pkg>: cannot load <path> (named by <ENV>; <hint>): <dlerror>
//	<pkg>: <path> has no symbol <sym> (expected <what>; set <ENV> to another file)
package dynlib
