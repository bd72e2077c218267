package nccl

/*
#cgo CFLAGS: -I${SRCDIR}/../../internal/dynlib
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "atp_nccl.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/asynctp/asynctp/internal/dynlib"
)

// EnvLibNCCL names the environment variable that gives the path of the NCCL
// library to load instead of libnccl.so.2.
const EnvLibNCCL = "ASYNCTP_LIBNCCL"

// DefaultLibrary is the soname loaded when EnvLibNCCL is not set (found by
// the dynamic loader's search path).
const DefaultLibrary = "libnccl.so.2"

// MinVersion is the oldest NCCL this package runs on: ncclCommSplit and
// non-blocking communicators (ncclConfig_t.blocking) are needed, 2.18.
var MinVersion = Version{2, 18, 0}

// libSpec is NCCL as the loader's errors name it.
var libSpec = dynlib.Spec{Package: "nccl", Env: EnvLibNCCL, Hint: "it comes with the NCCL package or PyTorch's nvidia-nccl wheel"}

// Version is an NCCL release.
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Code is the version as NCCL_VERSION_CODE encodes it (22803 for 2.28.3).
func (v Version) Code() int {
	if v.Major <= 2 && v.Minor <= 8 {
		return v.Major*1000 + v.Minor*100 + v.Patch
	}
	return v.Major*10000 + v.Minor*100 + v.Patch
}

// Less reports whether v is older than o.
func (v Version) Less(o Version) bool {
	if v.Major != o.Major {
		return v.Major < o.Major
	}
	if v.Minor != o.Minor {
		return v.Minor < o.Minor
	}
	return v.Patch < o.Patch
}

// decodeVersion reads ncclGetVersion's code: X*10000 + Y*100 + Z since 2.9,
// X*1000 + Y*100 + Z before (NCCL_VERSION in nccl.h).
func decodeVersion(code int) Version {
	if code >= 10000 {
		return Version{code / 10000, code % 10000 / 100, code % 100}
	}
	return Version{code / 1000, code % 1000 / 100, code % 100}
}

// Library is the loaded NCCL: where it came from and its version. Its
// String is the line to log at start-up.
type Library struct {
	Path    string // as given to dlopen
	Version Version
}

func (l Library) String() string { return fmt.Sprintf("NCCL %v (%s)", l.Version, l.Path) }

// loaded keeps the installed library, once one loaded, and the failures.
var loaded dynlib.Cache[Library]

// installed is set once a table is installed: the trampolines may be called.
var installed atomic.Bool

// libraryPath is the library to load: the override if set, else the soname.
func libraryPath() (path string, fromEnv bool) {
	if p := os.Getenv(EnvLibNCCL); p != "" {
		return p, true
	}
	return DefaultLibrary, false
}

// Load opens the NCCL library (EnvLibNCCL, else libnccl.so.2), checks that
// every entry point the package uses is there and that the version is at
// least MinVersion, and returns what it loaded, for the caller to log. The
// first library that loads is kept for the life of the process (later calls
// return it whatever the environment says); a failure is remembered per
// path. New calls Load.
//
// A missing library gives "nccl: cannot load libnccl.so.2 (set
// ASYNCTP_LIBNCCL to its path; it comes with the NCCL package or PyTorch's
// nvidia-nccl wheel): <dlerror>".
func Load() (Library, error) {
	return loaded.Load(func() (string, bool, error) {
		path, fromEnv := libraryPath()
		return path, fromEnv, nil
	}, install)
}

// install opens path, installs its table and reads its version.
func install(path string, fromEnv bool) (Library, error) {
	l, err := openLibrary(path, fromEnv)
	if err != nil {
		return Library{}, err
	}
	var missing *C.char
	if C.atp_nccl_resolve(l.Handle, 1, &missing) != 0 { // checked by openLibrary: cannot fail
		l.Close()
		return Library{}, l.MissingSymbol(C.GoString(missing), fmt.Sprintf("NCCL %v or newer", MinVersion))
	}
	installed.Store(true)
	var code C.int
	if r := Result(C.atp_ncclGetVersion(&code)); r != Success {
		return Library{}, fmt.Errorf("nccl: %s: ncclGetVersion: %s", path, r.Name())
	}
	v := decodeVersion(int(code))
	if v.Less(MinVersion) {
		return Library{}, fmt.Errorf("nccl: %s is NCCL %v; this package needs %v or newer (ncclCommSplit, non-blocking communicators); set %s to a newer libnccl.so.2",
			path, v, MinVersion, EnvLibNCCL)
	}
	return Library{Path: path, Version: v}, nil
}

// openLibrary dlopens path and checks that every entry point is there,
// without installing the table (tests use it to check the loader and its
// errors without touching the package state).
func openLibrary(path string, fromEnv bool) (*dynlib.Library, error) {
	l, err := dynlib.Open(libSpec, []string{path}, fromEnv)
	if err != nil {
		return nil, err
	}
	var missing *C.char
	if C.atp_nccl_resolve(l.Handle, 0, &missing) != 0 {
		l.Close()
		return nil, l.MissingSymbol(C.GoString(missing), fmt.Sprintf("NCCL %v or newer", MinVersion))
	}
	return l, nil
}

// Result is an ncclResult_t.
type Result int

// The ncclResult_t values (nccl.h 2.28.3; Timeout is new in later releases).
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7
	Timeout            Result = 8
)

var resultNames = map[Result]string{
	Success: "ncclSuccess", UnhandledCudaError: "ncclUnhandledCudaError", SystemError: "ncclSystemError",
	InternalError: "ncclInternalError", InvalidArgument: "ncclInvalidArgument", InvalidUsage: "ncclInvalidUsage",
	RemoteError: "ncclRemoteError", InProgress: "ncclInProgress", Timeout: "ncclTimeout",
}

// Name is the enum's name ("ncclRemoteError").
func (r Result) Name() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("ncclResult(%d)", int(r))
}

// Error is the name and, once a library is loaded, its description.
func (r Result) Error() string {
	if !installed.Load() {
		return r.Name()
	}
	return r.Name() + ": " + C.GoString(C.atp_ncclGetErrorString(C.atp_ncclResult(r)))
}

// Error is a failed NCCL call: which call, its result, and NCCL's last error
// message (ncclGetLastError), which often says more (which peer, which
// transport). It unwraps to its Result.
type Error struct {
	Call   string // "ncclAllReduce(...)", "ncclCommInitRankConfig"
	Result Result
	Last   string // ncclGetLastError, "" if NCCL said nothing
}

func (e *Error) Error() string {
	s := "nccl: " + e.Call + ": " + e.Result.Error()
	if e.Last != "" {
		s += " (NCCL's last error: " + e.Last + ")"
	}
	return s
}

func (e *Error) Unwrap() error { return e.Result }

// newError builds the error of a failed call (the library is installed).
func newError(call string, r Result) *Error {
	return &Error{Call: call, Result: r, Last: lastError()}
}

// lastError is ncclGetLastError's message.
func lastError() string {
	return C.GoString(C.atp_ncclGetLastError(0))
}

// uniqueID makes a new ncclUniqueId (rank 0 of a world does this).
func uniqueID() ([]byte, error) {
	var id C.atp_ncclUniqueId
	if r := Result(C.atp_ncclGetUniqueId(&id)); r != Success {
		return nil, newError("ncclGetUniqueId", r)
	}
	return C.GoBytes(unsafe.Pointer(&id), C.ATP_NCCL_UNIQUE_ID_BYTES), nil
}
