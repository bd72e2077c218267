// Package cuda binds the CUDA driver API and cuBLASLt, loading both at run
// time, so that the project builds, and its tests run (skipping the GPU
// ones), on machines without a GPU or a CUDA toolkit.
//
// # Loading
//
// Nothing CUDA is linked: the cgo layer includes no CUDA header (it declares
// the few types it needs itself) and links only -ldl. The first call that
// needs the driver opens libcuda.so.1 (internal/dynlib, the loader every
// native library of the project goes through), looks up every function
// the package uses with dlsym into an explicit table of function pointers
// (atp_cuda.c), and fails with an error naming the library, the symbol and
// the variable that overrides the path if one is missing, rather than
// crashing later. Versioned entry points are
// named explicitly (cuMemAlloc_v2, cuStreamDestroy_v2,
// cuStreamWaitValue64_v2, ...), as CUDA's headers would pick them; a few
// fall back to an older symbol (cuEventElapsedTime_v2, new in CUDA 12.8, to
// cuEventElapsedTime). cuBLASLt is loaded the same way by NewBlas:
// libcublasLt.so.13, then libcublasLt.so.12, by soname and then under
// $CUDA_HOME/lib64 and /usr/local/cuda/lib64. Each library is loaded once
// per process; a failure is remembered and returned by every later call.
//
// Environment:
//
//	ASYNCTP_LIBCUDA      path of libcuda to load instead of libcuda.so.1
//	ASYNCTP_LIBCUBLASLT  path of cuBLASLt to load instead of searching
//
// Init loads the driver and runs cuInit; DriverVersion needs only the
// library. Without a driver, Init's error reads
// "cuda: cannot load libcuda.so.1 (set ASYNCTP_LIBCUDA to its path; ...): <dlerror>";
// with a driver but no GPU, "cuda: cuInit: CUDA_ERROR_NO_DEVICE: ...".
//
// # Contexts and threads
//
// The package uses each device's primary context (Device.PrimaryContext),
// the one the CUDA runtime, cuBLASLt, NCCL and NVSHMEM use too. CUDA keeps
// the current context per OS thread, and Go moves goroutines between
// threads, so a goroutine that calls CUDA must be locked to its thread with
// runtime.LockOSThread and call Context.Bind on it, and stay locked. The
// helpers do this: OnDevice(ordinal, fn) runs fn locked and bound on the
// calling goroutine; a Worker is a goroutine that owns a device and runs the
// functions given to Do on its locked thread. Calls made on a thread where
// no context is current fail with CUDA_ERROR_INVALID_CONTEXT, and the error
// says why.
//
// # Memory, streams, kernels
//
// Device memory is a DevicePtr from Alloc. Streams from NewStream are
// non-blocking: they do not synchronise with the legacy default stream that
// the copies and memsets without the Async suffix (CopyHtoD, Upload,
// MemsetD32, ...) use, and those return before they are complete (except
// device-to-host copies). Synchronise a stream before a synchronous copy
// reads its results, call Context.Synchronize before stream work uses what
// synchronous copies wrote, or, simplest, use the Async variants on the
// stream that does the work. StreamWaitValue64/WriteValue64 order streams
// through a flag in device memory. Kernels come from images loaded with LoadModule (a
// cubin, fatbin or PTX) and run with Launch, which copies its arguments
// into C memory for cuLaunchKernel.
//
// # Errors
//
// Driver errors are *Error values reading
// "cuda: <call and arguments>: <CUresult name>: <description>", e.g.
// "cuda: cuMemAlloc(1073741824 bytes) on cuda:0: CUDA_ERROR_OUT_OF_MEMORY: out of memory".
// They unwrap to a Result, so errors.Is(err, cuda.ErrOutOfMemory) works.
// cuBLASLt errors are *BlasError values unwrapping to a BlasStatus.
//
// # GEMM
//
// Blas.Gemm computes C = alpha·op(A)·op(B) + beta·C on row-major matrices
// (optionally batched and with a bias or GELU epilogue) with fp32 compute,
// by handing cuBLASLt the column-major transposed problem; see GemmParams.
//
// # Tests
//
// Tests that need a GPU skip, saying why, when the driver or a device is
// missing; the pure-Go ones (argument packing, error text, library paths,
// the row-major mapping) run everywhere. To run the GPU tests on a machine
// that has a GPU but no Go:
//
//	go test -c -o build/cuda.test ./cuda   # on the dev machine
//	./build/cuda.test -test.v              # on the GPU machine
//	./build/cuda.test -test.run '^$' -test.bench Gemm -test.benchtime 20x
package cuda
