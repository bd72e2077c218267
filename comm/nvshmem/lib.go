package nvshmem

/*
#cgo CFLAGS: -I${SRCDIR}/../../cuda/nvshmem -I${SRCDIR}/../../internal/dynlib
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "atp_loader.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/asynctp/asynctp/internal/dynlib"
	"github.com/asynctp/asynctp/internal/nativebuild"
)

// EnvLibrary names the environment variable that gives the path of the
// transport's native library (LibraryFile).
const EnvLibrary = "ASYNCTP_LIBNVSHMEM"

// LibraryFile is the name of the native library that cuda/nvshmem/build.sh
// builds into the repository's build folder.
const LibraryFile = "libasynctp_nvshmem.so"

// buildHint says how to get the library.
const buildHint = "build it on a machine with nvcc and NVSHMEM (the GPU machine) with `bash cuda/nvshmem/build.sh`"

// libSpec is the library as the loader's errors name it.
var libSpec = dynlib.Spec{Package: "nvshmem", Env: EnvLibrary, Hint: buildHint}

// abi is ATP_NV_ABI of the header this package was compiled with.
const abi = C.ATP_NV_ABI

// Version is an NVSHMEM version.
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Library is the loaded native library: where it is, and the NVSHMEM it was
// built against (its headers; the host library it loads is the one next to
// them, through the rpath the build gives it).
type Library struct {
	Path    string
	NVSHMEM Version
	// BF16Reduce: NVSHMEM has bfloat16 reductions, so bf16 all-reduce and
	// reduce-scatter can run on NVSHMEM teams.
	BF16Reduce bool
	// ReduceScatter: NVSHMEM has nvshmemx_*_reducescatter_on_stream
	// (otherwise a team reduce-scatter is a reduce of every part).
	ReduceScatter bool
	uidBytes      int
}

func (l Library) String() string {
	return fmt.Sprintf("%s (NVSHMEM %v headers)", l.Path, l.NVSHMEM)
}

// loaded keeps the installed library, once one loaded, and the failures.
var loaded dynlib.Cache[Library]

// installed is set once a table is installed: the trampolines may be called.
var installed atomic.Bool

// FindLibrary returns the path of the native library: $ASYNCTP_LIBNVSHMEM
// if set (fromEnv; not checked here, the loader reports what is wrong with
// it), else LibraryFile next to the executable, else in the build folder of
// the repository (the first folder above the working directory that holds
// go.mod). The error names the variable, every place it looked and how to
// build the library.
func FindLibrary() (path string, fromEnv bool, err error) {
	if p := os.Getenv(EnvLibrary); p != "" {
		return p, true, nil
	}
	p, tried := nativebuild.Find(LibraryFile)
	if p != "" {
		return p, false, nil
	}
	return "", false, fmt.Errorf("nvshmem: %s not found: $%s is not set, and it is not at %s, nor %s; %s, or set %s to its path",
		LibraryFile, EnvLibrary, tried[0], tried[1], buildHint, EnvLibrary)
}

// Load opens the native library (see FindLibrary), checks that every entry
// point is there and that it was built from this version of atp_nvshmem.h,
// and returns what it loaded, for the caller to log. The first library that
// loads is kept for the life of the process; a failure is remembered per
// path. New and NewDeviceMemory call Load.
//
// A missing library gives "nvshmem: cannot load <path> (named by
// ASYNCTP_LIBNVSHMEM; build it ... with `bash cuda/nvshmem/build.sh`):
// <dlerror>", or FindLibrary's error when the variable is not set.
func Load() (Library, error) {
	return loaded.Load(FindLibrary, install)
}

// install opens path, installs its table and reads what it was built with.
func install(path string, fromEnv bool) (Library, error) {
	l, err := openLibrary(path, fromEnv)
	if err != nil {
		return Library{}, err
	}
	if missing := C.atpg_resolve(l.Handle, 1); missing != nil { // checked by openLibrary: cannot fail
		l.Close()
		return Library{}, l.MissingSymbol(C.GoString(missing), "a "+LibraryFile+" of this version of the repository")
	}
	if v := int(C.atpg_abi()); v != abi {
		return Library{}, fmt.Errorf("nvshmem: %s was built from atp_nvshmem.h ABI %d, this program expects ABI %d: rebuild it (`bash cuda/nvshmem/build.sh`) from this version of the repository",
			path, v, abi)
	}
	installed.Store(true)
	var major, minor, patch, caps, uid, xp C.int
	C.atpg_info(&major, &minor, &patch, &caps, &uid, &xp)
	if int(xp) != int(unsafe.Sizeof(C.atp_nv_xparams{})) {
		return Library{}, fmt.Errorf("nvshmem: %s has a %d-byte atp_nv_xparams, this program %d: rebuild it", path, int(xp), unsafe.Sizeof(C.atp_nv_xparams{}))
	}
	if C.ATP_NV_MAXP != maxGroup || C.ATP_NV_MAXS != maxSend || C.ATP_NV_MAXR != maxRecv {
		return Library{}, fmt.Errorf("nvshmem: atp_nvshmem.h limits (%d, %d, %d) differ from the package's (%d, %d, %d)",
			C.ATP_NV_MAXP, C.ATP_NV_MAXS, C.ATP_NV_MAXR, maxGroup, maxSend, maxRecv)
	}
	return Library{
		Path:          path,
		NVSHMEM:       Version{int(major), int(minor), int(patch)},
		BF16Reduce:    caps&C.ATP_NV_CAP_BF16_REDUCE != 0,
		ReduceScatter: caps&C.ATP_NV_CAP_REDUCESCATTER != 0,
		uidBytes:      int(uid),
	}, nil
}

// openLibrary dlopens path and checks that every entry point is there,
// without installing the table (tests use it to check the loader and its
// errors without touching the package state).
func openLibrary(path string, fromEnv bool) (*dynlib.Library, error) {
	l, err := dynlib.Open(libSpec, []string{path}, fromEnv)
	if err != nil {
		return nil, err
	}
	if missing := C.atpg_resolve(l.Handle, 0); missing != nil {
		l.Close()
		return nil, l.MissingSymbol(C.GoString(missing), "a "+LibraryFile+" of this version of the repository, built with `bash cuda/nvshmem/build.sh`")
	}
	return l, nil
}
