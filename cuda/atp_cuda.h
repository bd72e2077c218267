// The C half of package cuda: the tables of function pointers that are
// filled from libcuda.so.1 and libcublasLt.so.{13,12} with dlsym when the
// package loads them, and the trampolines Go calls (cgo cannot call a C
// function pointer directly).
//
// This header deliberately does not include cuda.h or cublasLt.h: the package
// must build with nothing but gcc. It declares the few types the driver API
// and cuBLASLt use, with the same size and calling convention:
//   - CUresult, CUdevice and the cuBLASLt status are C ints;
//   - CUdeviceptr is an unsigned long long;
//   - every opaque handle (CUcontext, CUstream, CUevent, CUmodule,
//     CUfunction, cublasLt handles and descriptors) is a pointer-sized
//     integer (uintptr_t). A pointer and a uintptr_t are passed the same way
//     by the x86-64 and AArch64 C ABIs, and keeping them integers means the
//     Go side never holds a foreign pointer in a pointer-typed value.
// Enum values used by the Go side are written there, each with the header it
// was checked against.
#ifndef ASYNCTP_CUDA_H
#define ASYNCTP_CUDA_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef uintptr_t CUcontext;
typedef uintptr_t CUstream;
typedef uintptr_t CUevent;
typedef uintptr_t CUmodule;
typedef uintptr_t CUfunction;

// ---- libcuda (driver API) --------------------------------------------------

// The functions resolved from libcuda. The member names are the API names;
// the symbol each is read from (often a versioned _v2 name) is listed in
// atp_cuda.c.
typedef struct {
	CUresult (*cuGetErrorName)(CUresult, const char **);
	CUresult (*cuGetErrorString)(CUresult, const char **);
	CUresult (*cuInit)(unsigned int);
	CUresult (*cuDriverGetVersion)(int *);
	CUresult (*cuDeviceGetCount)(int *);
	CUresult (*cuDeviceGet)(CUdevice *, int);
	CUresult (*cuDeviceGetName)(char *, int, CUdevice);
	CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
	CUresult (*cuDeviceTotalMem)(size_t *, CUdevice);
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
	CUresult (*cuCtxSetCurrent)(CUcontext);
	CUresult (*cuCtxGetCurrent)(CUcontext *);
	CUresult (*cuCtxGetDevice)(CUdevice *);
	CUresult (*cuCtxSynchronize)(void);
	CUresult (*cuCtxGetStreamPriorityRange)(int *, int *);
	CUresult (*cuMemGetInfo)(size_t *, size_t *);
	CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
	CUresult (*cuMemFree)(CUdeviceptr);
	CUresult (*cuMemAllocHost)(void **, size_t);
	CUresult (*cuMemFreeHost)(void *);
	CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
	CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
	CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
	CUresult (*cuMemsetD16)(CUdeviceptr, unsigned short, size_t);
	CUresult (*cuMemsetD32)(CUdeviceptr, unsigned int, size_t);
	CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
	CUresult (*cuMemsetD16Async)(CUdeviceptr, unsigned short, size_t, CUstream);
	CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
	CUresult (*cuStreamCreate)(CUstream *, unsigned int);
	CUresult (*cuStreamCreateWithPriority)(CUstream *, unsigned int, int);
	CUresult (*cuStreamDestroy)(CUstream);
	CUresult (*cuStreamSynchronize)(CUstream);
	CUresult (*cuStreamQuery)(CUstream);
	CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned int);
	CUresult (*cuStreamWaitValue32)(CUstream, CUdeviceptr, uint32_t, unsigned int);
	CUresult (*cuStreamWriteValue32)(CUstream, CUdeviceptr, uint32_t, unsigned int);
	CUresult (*cuStreamWaitValue64)(CUstream, CUdeviceptr, uint64_t, unsigned int);
	CUresult (*cuStreamWriteValue64)(CUstream, CUdeviceptr, uint64_t, unsigned int);
	CUresult (*cuEventCreate)(CUevent *, unsigned int);
	CUresult (*cuEventDestroy)(CUevent);
	CUresult (*cuEventRecord)(CUevent, CUstream);
	CUresult (*cuEventSynchronize)(CUevent);
	CUresult (*cuEventQuery)(CUevent);
	CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
	CUresult (*cuModuleLoadDataEx)(CUmodule *, const void *, unsigned int, int *, void **);
	CUresult (*cuModuleUnload)(CUmodule);
	CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*cuModuleGetGlobal)(CUdeviceptr *, size_t *, CUmodule, const char *);
	CUresult (*cuLaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int,
	                           unsigned int, unsigned int, unsigned int, unsigned int,
	                           CUstream, void **, void **);
	CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
	CUresult (*cuFuncGetAttribute)(int *, int, CUfunction);
	// Optional (CUDA 11.4 and later drivers): the context's SM limit under
	// MPS (CUexecAffinityParam: an int type and an unsigned count).
	CUresult (*cuCtxGetExecAffinity)(void *, int);
	// Optional (CUDA 12.0 and later drivers); last in the table. The enums
	// are C ints, the CUtensorMap 128 bytes aligned to 64.
	CUresult (*cuTensorMapEncodeTiled)(void *, int, uint32_t, void *, const uint64_t *,
	                                   const uint64_t *, const uint32_t *, const uint32_t *,
	                                   int, int, int, int);
} atp_cu_api;

// ---- libcublasLt ------------------------------------------------------------

typedef int atp_lt_status;
typedef uintptr_t atp_lt_handle;     // cublasLtHandle_t
typedef uintptr_t atp_lt_desc;       // cublasLtMatmulDesc_t
typedef uintptr_t atp_lt_layout;     // cublasLtMatrixLayout_t
typedef uintptr_t atp_lt_pref;       // cublasLtMatmulPreference_t

// cublasLtMatmulAlgo_t: 64 opaque bytes.
typedef struct {
	uint64_t data[8];
} atp_lt_algo;

// cublasLtMatmulHeuristicResult_t (96 bytes; same layout in cuBLASLt 11.8
// and 12.6).
typedef struct {
	atp_lt_algo algo;
	size_t workspaceSize;
	atp_lt_status state;
	float wavesCount;
	int reserved[4];
} atp_lt_heuristic;

typedef struct {
	atp_lt_status (*cublasLtCreate)(atp_lt_handle *);
	atp_lt_status (*cublasLtDestroy)(atp_lt_handle);
	size_t (*cublasLtGetVersion)(void);
	const char *(*cublasLtGetStatusName)(atp_lt_status);   // optional
	const char *(*cublasLtGetStatusString)(atp_lt_status); // optional
	atp_lt_status (*cublasLtMatmulDescCreate)(atp_lt_desc *, int, int);
	atp_lt_status (*cublasLtMatmulDescDestroy)(atp_lt_desc);
	atp_lt_status (*cublasLtMatmulDescSetAttribute)(atp_lt_desc, int, const void *, size_t);
	atp_lt_status (*cublasLtMatrixLayoutCreate)(atp_lt_layout *, int, uint64_t, uint64_t, int64_t);
	atp_lt_status (*cublasLtMatrixLayoutDestroy)(atp_lt_layout);
	atp_lt_status (*cublasLtMatrixLayoutSetAttribute)(atp_lt_layout, int, const void *, size_t);
	atp_lt_status (*cublasLtMatmulPreferenceCreate)(atp_lt_pref *);
	atp_lt_status (*cublasLtMatmulPreferenceDestroy)(atp_lt_pref);
	atp_lt_status (*cublasLtMatmulPreferenceSetAttribute)(atp_lt_pref, int, const void *, size_t);
	atp_lt_status (*cublasLtMatmulAlgoGetHeuristic)(atp_lt_handle, atp_lt_desc, atp_lt_layout,
	                                                atp_lt_layout, atp_lt_layout, atp_lt_layout,
	                                                atp_lt_pref, int, atp_lt_heuristic *, int *);
	atp_lt_status (*cublasLtMatmul)(atp_lt_handle, atp_lt_desc, const void *, const void *,
	                                atp_lt_layout, const void *, atp_lt_layout, const void *,
	                                const void *, atp_lt_layout, void *, atp_lt_layout,
	                                const atp_lt_algo *, void *, size_t, CUstream);
} atp_lt_api;

// ---- loading ----------------------------------------------------------------

// The libraries are opened and closed by internal/dynlib (dynlib.Open).
// atp_cu_resolve / atp_lt_resolve look up every symbol of the table in lib
// (atp_dl_resolve of internal/dynlib/dynlib.h).
// A required symbol that is missing makes them return -1 with *missing set
// to the (static) name looked for; nothing is installed then. With install
// != 0 and every required symbol found, the table becomes the one the
// trampolines call. An optional symbol that is missing stays NULL, and its
// trampoline returns an error instead of crashing.
int atp_cu_resolve(void *lib, int install, const char **missing);
int atp_lt_resolve(void *lib, int install, const char **missing);

// atp_cu_symbol_name / atp_lt_symbol_name return the symbol the i-th table
// slot was filled from after a successful install (NULL past the end or if
// unresolved), for diagnostics.
const char *atp_cu_symbol_name(int i);
const char *atp_lt_symbol_name(int i);

// ---- trampolines: libcuda ---------------------------------------------------
// Each calls through the installed table; if the table slot is empty they
// return CUDA_ERROR_NOT_INITIALIZED (3).

CUresult atp_cuGetErrorName(CUresult r, const char **s);
CUresult atp_cuGetErrorString(CUresult r, const char **s);
CUresult atp_cuInit(unsigned int flags);
CUresult atp_cuDriverGetVersion(int *v);
CUresult atp_cuDeviceGetCount(int *n);
CUresult atp_cuDeviceGet(CUdevice *d, int ordinal);
CUresult atp_cuDeviceGetName(char *name, int len, CUdevice d);
CUresult atp_cuDeviceGetAttribute(int *v, int attr, CUdevice d);
CUresult atp_cuDeviceTotalMem(size_t *bytes, CUdevice d);
CUresult atp_cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d);
CUresult atp_cuDevicePrimaryCtxRelease(CUdevice d);
CUresult atp_cuCtxSetCurrent(CUcontext c);
CUresult atp_cuCtxGetCurrent(CUcontext *c);
CUresult atp_cuCtxGetDevice(CUdevice *d);
CUresult atp_cuCtxSynchronize(void);
CUresult atp_cuCtxGetStreamPriorityRange(int *least, int *greatest);
CUresult atp_cuMemGetInfo(size_t *free_, size_t *total);
CUresult atp_cuMemAlloc(CUdeviceptr *p, size_t n);
CUresult atp_cuMemFree(CUdeviceptr p);
CUresult atp_cuMemAllocHost(void **p, size_t n);
CUresult atp_cuMemFreeHost(void *p);
CUresult atp_cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n);
CUresult atp_cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n);
CUresult atp_cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult atp_cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s);
CUresult atp_cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s);
CUresult atp_cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult atp_cuMemsetD8(CUdeviceptr p, unsigned char v, size_t n);
CUresult atp_cuMemsetD16(CUdeviceptr p, unsigned short v, size_t n);
CUresult atp_cuMemsetD32(CUdeviceptr p, unsigned int v, size_t n);
CUresult atp_cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s);
CUresult atp_cuMemsetD16Async(CUdeviceptr p, unsigned short v, size_t n, CUstream s);
CUresult atp_cuMemsetD32Async(CUdeviceptr p, unsigned int v, size_t n, CUstream s);
CUresult atp_cuStreamCreate(CUstream *s, unsigned int flags);
CUresult atp_cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority);
CUresult atp_cuStreamDestroy(CUstream s);
CUresult atp_cuStreamSynchronize(CUstream s);
CUresult atp_cuStreamQuery(CUstream s);
CUresult atp_cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags);
CUresult atp_cuStreamWaitValue32(CUstream s, CUdeviceptr addr, uint32_t v, unsigned int flags);
CUresult atp_cuStreamWriteValue32(CUstream s, CUdeviceptr addr, uint32_t v, unsigned int flags);
CUresult atp_cuStreamWaitValue64(CUstream s, CUdeviceptr addr, uint64_t v, unsigned int flags);
CUresult atp_cuStreamWriteValue64(CUstream s, CUdeviceptr addr, uint64_t v, unsigned int flags);
CUresult atp_cuEventCreate(CUevent *e, unsigned int flags);
CUresult atp_cuEventDestroy(CUevent e);
CUresult atp_cuEventRecord(CUevent e, CUstream s);
CUresult atp_cuEventSynchronize(CUevent e);
CUresult atp_cuEventQuery(CUevent e);
CUresult atp_cuEventElapsedTime(float *ms, CUevent start, CUevent end);
CUresult atp_cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name);
CUresult atp_cuModuleGetGlobal(CUdeviceptr *p, size_t *bytes, CUmodule m, const char *name);
CUresult atp_cuModuleUnload(CUmodule m);
CUresult atp_cuFuncSetAttribute(CUfunction f, int attr, int v);
CUresult atp_cuFuncGetAttribute(int *v, int attr, CUfunction f);

// atp_ctx_sm_count stores in *n the number of SMs the current context may
// use (cuCtxGetExecAffinity, CU_EXEC_AFFINITY_TYPE_SM_COUNT: under MPS,
// the client's share); 500 (CUDA_ERROR_NOT_FOUND) without the symbol.
CUresult atp_ctx_sm_count(unsigned *n);

// atp_has_tensormap reports whether the driver has cuTensorMapEncodeTiled.
int atp_has_tensormap(void);
// atp_tensormap_encode_tiled encodes a CUtensorMap into out (128 bytes) with
// cuTensorMapEncodeTiled, through a 64-byte aligned copy; it returns
// CUDA_ERROR_NOT_FOUND (500) when the driver lacks the function.
CUresult atp_tensormap_encode_tiled(void *out, int dtype, uint32_t rank, CUdeviceptr addr,
                                    const uint64_t *dims, const uint64_t *strides,
                                    const uint32_t *box, const uint32_t *elemStrides,
                                    int interleave, int swizzle, int l2promo, int oobFill);

// atp_module_load copies image into C memory (adding a terminating NUL, which
// PTX text needs) and loads it with cuModuleLoadDataEx, asking the JIT for its
// error log, which is copied into log (logLen bytes, NUL-terminated).
CUresult atp_module_load(CUmodule *m, const void *image, size_t imageLen, char *log, size_t logLen);

// atp_launch copies the packed argument bytes blob (argument i at offset
// offs[i]) into C memory, builds the kernelParams array pointing into that
// copy and calls cuLaunchKernel. Nothing passed in is kept after it returns.
CUresult atp_launch(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                    unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                    CUstream s, const void *blob, size_t blobLen, const uint32_t *offs, int nargs);

// ---- trampolines: cuBLASLt ----------------------------------------------------
// They return CUBLAS_STATUS_NOT_INITIALIZED (1) if the table slot is empty.

atp_lt_status atp_ltCreate(atp_lt_handle *h);
atp_lt_status atp_ltDestroy(atp_lt_handle h);
size_t atp_ltGetVersion(void);
const char *atp_ltStatusName(atp_lt_status s);   // NULL if unavailable
const char *atp_ltStatusString(atp_lt_status s); // NULL if unavailable
atp_lt_status atp_ltDescCreate(atp_lt_desc *d, int computeType, int scaleType);
atp_lt_status atp_ltDescDestroy(atp_lt_desc d);
atp_lt_status atp_ltDescSetI32(atp_lt_desc d, int attr, int32_t v);
atp_lt_status atp_ltDescSetU32(atp_lt_desc d, int attr, uint32_t v);
atp_lt_status atp_ltDescSetI64(atp_lt_desc d, int attr, int64_t v);
atp_lt_status atp_ltDescSetPtr(atp_lt_desc d, int attr, CUdeviceptr v);
atp_lt_status atp_ltLayoutCreate(atp_lt_layout *l, int type, uint64_t rows, uint64_t cols, int64_t ld);
atp_lt_status atp_ltLayoutDestroy(atp_lt_layout l);
atp_lt_status atp_ltLayoutSetI32(atp_lt_layout l, int attr, int32_t v);
atp_lt_status atp_ltLayoutSetI64(atp_lt_layout l, int attr, int64_t v);
atp_lt_status atp_ltPrefCreate(atp_lt_pref *p);
atp_lt_status atp_ltPrefDestroy(atp_lt_pref p);
atp_lt_status atp_ltPrefSetU32(atp_lt_pref p, int attr, uint32_t v);
atp_lt_status atp_ltPrefSetU64(atp_lt_pref p, int attr, uint64_t v);
atp_lt_status atp_ltHeuristic(atp_lt_handle h, atp_lt_desc d, atp_lt_layout a, atp_lt_layout b,
                              atp_lt_layout c, atp_lt_pref p, atp_lt_heuristic *out, int *count);
// D = C: the result is written over C, with C's layout.
atp_lt_status atp_ltMatmul(atp_lt_handle h, atp_lt_desc d, float alpha, CUdeviceptr a,
                           atp_lt_layout al, CUdeviceptr b, atp_lt_layout bl, float beta,
                           CUdeviceptr c, atp_lt_layout cl, const atp_lt_algo *algo,
                           CUdeviceptr ws, size_t wsSize, CUstream s);

#endif
