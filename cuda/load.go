package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/../internal/dynlib
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "atp_cuda.h"
*/
import "C"

import (
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/asynctp/asynctp/internal/dynlib"
)

// Environment variables that override where the libraries are looked for.
const (
	// EnvLibCUDA names the driver library to load instead of libcuda.so.1.
	EnvLibCUDA = "ASYNCTP_LIBCUDA"
	// EnvLibCublasLt names the cuBLASLt library to load instead of
	// searching for libcublasLt.so.13 and libcublasLt.so.12.
	EnvLibCublasLt = "ASYNCTP_LIBCUBLASLT"
)

// The two libraries, as the errors name them.
var (
	driverSpec = dynlib.Spec{Package: "cuda", Env: EnvLibCUDA, Hint: "it comes with the NVIDIA driver"}
	blasSpec   = dynlib.Spec{Package: "cuda", Env: EnvLibCublasLt, Hint: "it comes with the CUDA toolkit or the nvidia-cublas wheel"}
)

// driverPaths is where libcuda is looked for.
func driverPaths() ([]string, bool) {
	return dynlib.Candidates(EnvLibCUDA, "libcuda.so.1")
}

// blasPaths is where cuBLASLt is looked for: the sonames first (the dynamic
// loader's search path), then the toolkit's lib64 under $CUDA_HOME and
// /usr/local/cuda, newest major version first.
func blasPaths() ([]string, bool) {
	names := []string{"libcublasLt.so.13", "libcublasLt.so.12"}
	var dirs []string
	if h := os.Getenv("CUDA_HOME"); h != "" {
		dirs = append(dirs, filepath.Join(h, "lib64"))
	}
	if len(dirs) == 0 || dirs[0] != "/usr/local/cuda/lib64" {
		dirs = append(dirs, "/usr/local/cuda/lib64")
	}
	paths := append([]string(nil), names...)
	for _, d := range dirs {
		for _, n := range names {
			paths = append(paths, filepath.Join(d, n))
		}
	}
	return dynlib.Candidates(EnvLibCublasLt, paths...)
}

// resolveDriver checks every libcuda symbol in l; with install it makes
// l's table the one the package calls.
func resolveDriver(l *dynlib.Library, install bool) error {
	var missing *C.char
	if C.atp_cu_resolve(l.Handle, cbool(install), &missing) != 0 {
		return l.MissingSymbol(C.GoString(missing), "the NVIDIA driver's libcuda.so.1, new enough")
	}
	return nil
}

// resolveBlas is resolveDriver for cuBLASLt.
func resolveBlas(l *dynlib.Library, install bool) error {
	var missing *C.char
	if C.atp_lt_resolve(l.Handle, cbool(install), &missing) != 0 {
		return l.MissingSymbol(C.GoString(missing), "cuBLASLt 12 or 13")
	}
	return nil
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// openDriver opens libcuda and checks its symbols without installing them
// (tests use it to check the loader without touching the package state).
func openDriver() (*dynlib.Library, error) {
	paths, fromEnv := driverPaths()
	l, err := dynlib.Open(driverSpec, paths, fromEnv)
	if err != nil {
		return nil, err
	}
	if err := resolveDriver(l, false); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// openBlas is openDriver for cuBLASLt.
func openBlas() (*dynlib.Library, error) {
	paths, fromEnv := blasPaths()
	l, err := dynlib.Open(blasSpec, paths, fromEnv)
	if err != nil {
		return nil, err
	}
	if err := resolveBlas(l, false); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

var driver struct {
	loadOnce sync.Once
	lib      *dynlib.Library
	loadErr  error

	initOnce sync.Once
	initErr  error
}

// loadDriver opens libcuda and installs its table, once per process; the
// error, if any, is kept and returned to every later call.
func loadDriver() error {
	driver.loadOnce.Do(func() {
		l, err := openDriver()
		if err == nil {
			err = resolveDriver(l, true)
		}
		if err != nil {
			driver.loadErr = err
			return
		}
		driver.lib = l
		resultText = driverResultText
	})
	return driver.loadErr
}

// Init loads the driver library and initialises CUDA (cuInit). It runs once
// per process; later calls return the first outcome. Every function of the
// package that needs the driver calls it, so calling it first is only a
// way to learn early whether a GPU is usable.
func Init() error {
	driver.initOnce.Do(func() {
		if err := loadDriver(); err != nil {
			driver.initErr = err
			return
		}
		if r := Result(C.atp_cuInit(0)); r != Success {
			driver.initErr = newError("cuInit", r)
		}
	})
	return driver.initErr
}

// DriverLibrary returns the path libcuda was loaded from and, for each
// table slot that was filled from a versioned or fallback symbol, that
// symbol's name (for diagnostics). It loads the library if needed.
func DriverLibrary() (path string, symbols []string, err error) {
	if err := loadDriver(); err != nil {
		return "", nil, err
	}
	for i := 0; ; i++ {
		s := C.atp_cu_symbol_name(C.int(i))
		if s == nil {
			// An unresolved optional slot also reads NULL; the driver
			// table's optional slots (cuCtxGetExecAffinity,
			// cuTensorMapEncodeTiled) are its last, so NULL marks the end
			// of what was resolved.
			break
		}
		symbols = append(symbols, C.GoString(s))
	}
	return driver.lib.Path, symbols, nil
}

var blas struct {
	once sync.Once
	lib  *dynlib.Library
	err  error
}

// loadBlas opens cuBLASLt and installs its table, once per process.
func loadBlas() error {
	blas.once.Do(func() {
		l, err := openBlas()
		if err == nil {
			err = resolveBlas(l, true)
		}
		if err != nil {
			blas.err = err
			return
		}
		blas.lib = l
		blasStatusText = ltStatusText
	})
	return blas.err
}

// BlasLibrary returns the path cuBLASLt was loaded from and its version
// (cublasLtGetVersion, e.g. 130000 + ...), loading it if needed. It needs no
// GPU.
func BlasLibrary() (path string, version int, err error) {
	if err := loadBlas(); err != nil {
		return "", 0, err
	}
	return blas.lib.Path, int(C.atp_ltGetVersion()), nil
}

// driverResultText asks libcuda for a CUresult's name and description.
func driverResultText(r Result) (name, desc string, ok bool) {
	var n, d *C.char
	if C.atp_cuGetErrorName(C.CUresult(r), &n) != 0 || n == nil {
		return "", "", false
	}
	name = C.GoString(n)
	if C.atp_cuGetErrorString(C.CUresult(r), &d) == 0 && d != nil {
		desc = C.GoString(d)
	}
	return name, desc, true
}

// ltStatusText asks cuBLASLt for a status's name and description.
func ltStatusText(s BlasStatus) (name, desc string, ok bool) {
	n := C.atp_ltStatusName(C.atp_lt_status(s))
	if n == nil {
		return "", "", false
	}
	name = C.GoString(n)
	if d := C.atp_ltStatusString(C.atp_lt_status(s)); d != nil {
		desc = C.GoString(d)
	}
	// cuBLASLt answers unknown codes with a placeholder name.
	if !strings.HasPrefix(name, "CUBLAS_STATUS_") {
		return "", "", false
	}
	return name, desc, true
}
