package dynlib

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// atp_dl_open opens path, or returns NULL with dlerror's text in err.
static void *atp_dl_open(const char *path, char *err, size_t errlen) {
	dlerror(); // clear
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL && errlen > 0) {
		const char *e = dlerror();
		if (e == NULL) e = "unknown dlopen error";
		strncpy(err, e, errlen - 1);
		err[errlen - 1] = 0;
	}
	return h;
}
*/
import "C"

import (
	"fmt"
	"os"
	"unsafe"
)

// Spec is how a package speaks of a library in its errors: the package
// ("cuda"), the environment variable that overrides the library's path
// ("ASYNCTP_LIBCUDA"), and where the library comes from ("it comes with
// the NVIDIA driver").
type Spec struct {
	Package, Env, Hint string
}

// Library is an opened shared object.
type Library struct {
	// Path is the path it was opened from, as given to dlopen.
	Path string
	// Handle is dlopen's handle, for the package's C resolver
	// (atp_dl_resolve).
	Handle unsafe.Pointer
	spec   Spec
}

// Candidates is where a library is looked for: $env alone when it is set
// (fromEnv), else the defaults in order.
func Candidates(env string, defaults ...string) (paths []string, fromEnv bool) {
	if p := os.Getenv(env); p != "" {
		return []string{p}, true
	}
	return defaults, false
}

// dlerrLen bounds the dlerror text copied back from C.
const dlerrLen = 1024

// Open opens the first of paths that loads (fromEnv: paths is what s.Env
// named). Its error is about the first path (the plain soname, whose
// dlerror says the most; later fallbacks only add "No such file"):
//
//	<pkg>: cannot load <path> (set <ENV> to its path; <hint>): <dlerror>
//	<pkg>: cannot load <path> (named by <ENV>; <hint>): <dlerror>
func Open(s Spec, paths []string, fromEnv bool) (*Library, error) {
	if len(paths) == 0 {
		return nil, fmt.Errorf("%s: no path to load the library from (set %s to its path; %s)", s.Package, s.Env, s.Hint)
	}
	buf := (*C.char)(C.malloc(dlerrLen))
	defer C.free(unsafe.Pointer(buf))
	var first string
	for i, p := range paths {
		cp := C.CString(p)
		h := C.atp_dl_open(cp, buf, dlerrLen)
		C.free(unsafe.Pointer(cp))
		if h != nil {
			return &Library{Path: p, Handle: h, spec: s}, nil
		}
		if i == 0 {
			first = C.GoString(buf)
		}
	}
	return nil, openError(s, paths[0], fromEnv, first)
}

// openError is the error of a library that dlopen could not open (Open's).
func openError(s Spec, path string, fromEnv bool, dlerror string) error {
	if fromEnv {
		return fmt.Errorf("%s: cannot load %s (named by %s; %s): %s", s.Package, path, s.Env, s.Hint, dlerror)
	}
	return fmt.Errorf("%s: cannot load %s (set %s to its path; %s): %s", s.Package, path, s.Env, s.Hint, dlerror)
}

// MissingSymbol is the error of a library that opened but lacks the
// symbol sym (atp_dl_resolve's missing); expected says what the library
// should have been ("NCCL 2.18.0 or newer"):
//
//	<pkg>: <path> has no symbol <sym> (expected <expected>; set <ENV> to another file)
func (l *Library) MissingSymbol(sym, expected string) error {
	return fmt.Errorf("%s: %s has no symbol %s (expected %s; set %s to another file)", l.spec.Package, l.Path, sym, expected, l.spec.Env)
}

// Close closes the library (dlclose). The tables resolved from it must not
// be called after.
func (l *Library) Close() {
	if l != nil && l.Handle != nil {
		C.dlclose(l.Handle)
		l.Handle = nil
	}
}
