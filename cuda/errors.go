package cuda

import (
	"errors"
	"fmt"
)

// Result is a CUresult, the status every driver API call returns. It is an
// error, so errors.Is(err, cuda.ErrOutOfMemory) works on the errors of this
// package.
type Result int

// The CUresult values the package and its callers test for (cuda.h).
const (
	Success              Result = 0
	ErrInvalidValue      Result = 1
	ErrOutOfMemory       Result = 2
	ErrNotInitialized    Result = 3
	ErrDeinitialized     Result = 4
	ErrStubLibrary       Result = 34
	ErrNoDevice          Result = 100
	ErrInvalidDevice     Result = 101
	ErrInvalidImage      Result = 200
	ErrInvalidContext    Result = 201
	ErrNoBinaryForGPU    Result = 209
	ErrInvalidPTX        Result = 218
	ErrUnsupportedPTX    Result = 222
	ErrInvalidHandle     Result = 400
	ErrNotFound          Result = 500
	ErrNotReady          Result = 600
	ErrIllegalAddress    Result = 700
	ErrLaunchOutOfRes    Result = 701
	ErrLaunchTimeout     Result = 702
	ErrMisalignedAddress Result = 716
	ErrLaunchFailed      Result = 719
	ErrNotPermitted      Result = 800
	ErrNotSupported      Result = 801
	ErrUnknown           Result = 999
)

// fallbackResults names the common results when the driver cannot be asked
// (cuGetErrorName needs the library).
var fallbackResults = map[Result][2]string{
	Success:              {"CUDA_SUCCESS", "no error"},
	ErrInvalidValue:      {"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	ErrOutOfMemory:       {"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	ErrNotInitialized:    {"CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	ErrDeinitialized:     {"CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
	ErrStubLibrary:       {"CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
	ErrNoDevice:          {"CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	ErrInvalidDevice:     {"CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	ErrInvalidImage:      {"CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
	ErrInvalidContext:    {"CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	ErrNoBinaryForGPU:    {"CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
	ErrInvalidPTX:        {"CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
	ErrUnsupportedPTX:    {"CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain."},
	ErrInvalidHandle:     {"CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	ErrNotFound:          {"CUDA_ERROR_NOT_FOUND", "named symbol not found"},
	ErrNotReady:          {"CUDA_ERROR_NOT_READY", "device not ready"},
	ErrIllegalAddress:    {"CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
	ErrLaunchOutOfRes:    {"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
	ErrLaunchTimeout:     {"CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
	ErrMisalignedAddress: {"CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
	ErrLaunchFailed:      {"CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
	ErrNotPermitted:      {"CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
	ErrNotSupported:      {"CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
	ErrUnknown:           {"CUDA_ERROR_UNKNOWN", "unknown error"},
}

// resultText looks a result up in the loaded driver; it is replaced when
// the driver loads.
var resultText = func(Result) (name, desc string, ok bool) { return "", "", false }

// Name is the CUresult's enum name, e.g. "CUDA_ERROR_OUT_OF_MEMORY".
func (r Result) Name() string {
	n, _ := r.text()
	return n
}

func (r Result) text() (name, desc string) {
	if n, d, ok := resultText(r); ok {
		return n, d
	}
	if t, ok := fallbackResults[r]; ok {
		return t[0], t[1]
	}
	return fmt.Sprintf("CUresult(%d)", int(r)), "unrecognized CUDA result"
}

// Error is the name and the driver's description:
// "CUDA_ERROR_OUT_OF_MEMORY: out of memory".
func (r Result) Error() string {
	n, d := r.text()
	if d == "" {
		return n
	}
	return n + ": " + d
}

// Error is a failed driver call: what was attempted, and the result.
// Its text reads "cuda: <Op>: <NAME>: <description>", e.g.
// "cuda: cuMemAlloc(1073741824 bytes) on cuda:0: CUDA_ERROR_OUT_OF_MEMORY: out of memory".
type Error struct {
	Op     string // the call and its arguments, e.g. "cuMemAlloc(64 bytes) on cuda:0"
	Result Result
	Hint   string // optional advice appended to the text
}

func (e *Error) Error() string {
	s := "cuda: " + e.Op + ": " + e.Result.Error()
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

// Unwrap returns the Result, for errors.Is.
func (e *Error) Unwrap() error { return e.Result }

// newError wraps a failed result; it adds advice for the mistakes that have
// one cause in practice.
func newError(op string, r Result) error {
	e := &Error{Op: op, Result: r}
	switch r {
	case ErrInvalidContext:
		e.Hint = "no context is current on this OS thread: lock the goroutine (runtime.LockOSThread) and call Context.Bind, or use OnDevice or a Worker"
	case ErrNoBinaryForGPU:
		e.Hint = "the image has no code for this GPU's architecture and no PTX to JIT-compile"
	}
	return e
}

// IsNotReady reports whether err is CUDA_ERROR_NOT_READY (the answer of a
// query on unfinished work).
func IsNotReady(err error) bool { return errors.Is(err, ErrNotReady) }

// BlasStatus is a cublasStatus_t.
type BlasStatus int

// The cublasStatus_t values (cublas_api.h).
const (
	BlasSuccess         BlasStatus = 0
	BlasNotInitialized  BlasStatus = 1
	BlasAllocFailed     BlasStatus = 3
	BlasInvalidValue    BlasStatus = 7
	BlasArchMismatch    BlasStatus = 8
	BlasMappingError    BlasStatus = 11
	BlasExecutionFailed BlasStatus = 13
	BlasInternalError   BlasStatus = 14
	BlasNotSupported    BlasStatus = 15
	BlasLicenseError    BlasStatus = 16
)

var fallbackBlas = map[BlasStatus]string{
	BlasSuccess:         "CUBLAS_STATUS_SUCCESS",
	BlasNotInitialized:  "CUBLAS_STATUS_NOT_INITIALIZED",
	BlasAllocFailed:     "CUBLAS_STATUS_ALLOC_FAILED",
	BlasInvalidValue:    "CUBLAS_STATUS_INVALID_VALUE",
	BlasArchMismatch:    "CUBLAS_STATUS_ARCH_MISMATCH",
	BlasMappingError:    "CUBLAS_STATUS_MAPPING_ERROR",
	BlasExecutionFailed: "CUBLAS_STATUS_EXECUTION_FAILED",
	BlasInternalError:   "CUBLAS_STATUS_INTERNAL_ERROR",
	BlasNotSupported:    "CUBLAS_STATUS_NOT_SUPPORTED",
	BlasLicenseError:    "CUBLAS_STATUS_LICENSE_ERROR",
}

// blasStatusText looks a status up in the loaded cuBLASLt.
var blasStatusText = func(BlasStatus) (name, desc string, ok bool) { return "", "", false }

// Name is the status's enum name, e.g. "CUBLAS_STATUS_NOT_SUPPORTED".
func (s BlasStatus) Name() string {
	n, _ := s.text()
	return n
}

func (s BlasStatus) text() (name, desc string) {
	if n, d, ok := blasStatusText(s); ok {
		return n, d
	}
	if n, ok := fallbackBlas[s]; ok {
		return n, ""
	}
	return fmt.Sprintf("cublasStatus(%d)", int(s)), ""
}

func (s BlasStatus) Error() string {
	n, d := s.text()
	if d == "" {
		return n
	}
	return n + ": " + d
}

// BlasError is a failed cuBLASLt call: "cuda: <Op>: <NAME>: <description>".
type BlasError struct {
	Op     string
	Status BlasStatus
}

func (e *BlasError) Error() string { return "cuda: " + e.Op + ": " + e.Status.Error() }

// Unwrap returns the status, for errors.Is.
func (e *BlasError) Unwrap() error { return e.Status }

func checkBlas(op string, s BlasStatus) error {
	if s == BlasSuccess {
		return nil
	}
	return &BlasError{Op: op, Status: s}
}
