// Loading and trampolines for package cuda; see atp_cuda.h.

#define _GNU_SOURCE
#include "atp_cuda.h"

#include "dynlib.h" // defines: atp_dl_sym (a table slot), atp_dl_resolve (fills a table with dlsym)

#include <stdlib.h>
#include <string.h>

#define CU(member, ...) {{__VA_ARGS__}, offsetof(atp_cu_api, member), 0}
#define CU_OPT(member, ...) {{__VA_ARGS__}, offsetof(atp_cu_api, member), 1}

// The driver symbols. CUDA's headers #define most API names to a versioned
// symbol (cuMemAlloc -> cuMemAlloc_v2, ...); the unversioned symbols still
// exported by libcuda are the old ABI kept for old binaries (32-bit sizes,
// different semantics), so the versioned names are spelled out here. Checked
// against cuda.h of CUDA 11.8 and the exports of libcuda 535.
static const atp_dl_sym cu_syms[] = {
	CU(cuGetErrorName, "cuGetErrorName"),
	CU(cuGetErrorString, "cuGetErrorString"),
	CU(cuInit, "cuInit"),
	CU(cuDriverGetVersion, "cuDriverGetVersion"),
	CU(cuDeviceGetCount, "cuDeviceGetCount"),
	CU(cuDeviceGet, "cuDeviceGet"),
	CU(cuDeviceGetName, "cuDeviceGetName"),
	CU(cuDeviceGetAttribute, "cuDeviceGetAttribute"),
	CU(cuDeviceTotalMem, "cuDeviceTotalMem_v2"),
	CU(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
	CU(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
	CU(cuCtxSetCurrent, "cuCtxSetCurrent"),
	CU(cuCtxGetCurrent, "cuCtxGetCurrent"),
	CU(cuCtxGetDevice, "cuCtxGetDevice"),
	CU(cuCtxSynchronize, "cuCtxSynchronize"),
	CU(cuCtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange"),
	CU(cuMemGetInfo, "cuMemGetInfo_v2"),
	CU(cuMemAlloc, "cuMemAlloc_v2"),
	CU(cuMemFree, "cuMemFree_v2"),
	CU(cuMemAllocHost, "cuMemAllocHost_v2"),
	CU(cuMemFreeHost, "cuMemFreeHost"),
	CU(cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
	CU(cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
	CU(cuMemcpyDtoD, "cuMemcpyDtoD_v2"),
	CU(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
	CU(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
	CU(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
	CU(cuMemsetD8, "cuMemsetD8_v2"),
	CU(cuMemsetD16, "cuMemsetD16_v2"),
	CU(cuMemsetD32, "cuMemsetD32_v2"),
	CU(cuMemsetD8Async, "cuMemsetD8Async"),
	CU(cuMemsetD16Async, "cuMemsetD16Async"),
	CU(cuMemsetD32Async, "cuMemsetD32Async"),
	CU(cuStreamCreate, "cuStreamCreate"),
	CU(cuStreamCreateWithPriority, "cuStreamCreateWithPriority"),
	CU(cuStreamDestroy, "cuStreamDestroy_v2"),
	CU(cuStreamSynchronize, "cuStreamSynchronize"),
	CU(cuStreamQuery, "cuStreamQuery"),
	CU(cuStreamWaitEvent, "cuStreamWaitEvent"),
	// The _v2 stream memory operations (CUDA >= 11.7) are enabled on every
	// platform; the unversioned ones need the nvidia module parameter
	// NVreg_EnableStreamMemOPs=1. CUDA 12 and 13 headers map the plain
	// names to _v2. Fall back to the old symbol for very old drivers.
	CU(cuStreamWaitValue32, "cuStreamWaitValue32_v2", "cuStreamWaitValue32"),
	CU(cuStreamWriteValue32, "cuStreamWriteValue32_v2", "cuStreamWriteValue32"),
	CU(cuStreamWaitValue64, "cuStreamWaitValue64_v2", "cuStreamWaitValue64"),
	CU(cuStreamWriteValue64, "cuStreamWriteValue64_v2", "cuStreamWriteValue64"),
	CU(cuEventCreate, "cuEventCreate"),
	CU(cuEventDestroy, "cuEventDestroy_v2"),
	CU(cuEventRecord, "cuEventRecord"),
	CU(cuEventSynchronize, "cuEventSynchronize"),
	CU(cuEventQuery, "cuEventQuery"),
	// cuEventElapsedTime_v2 appeared in CUDA 12.8 (same signature).
	CU(cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
	CU(cuModuleLoadDataEx, "cuModuleLoadDataEx"),
	CU(cuModuleUnload, "cuModuleUnload"),
	CU(cuModuleGetFunction, "cuModuleGetFunction"),
	CU(cuModuleGetGlobal, "cuModuleGetGlobal_v2"),
	CU(cuLaunchKernel, "cuLaunchKernel"),
	CU(cuFuncSetAttribute, "cuFuncSetAttribute"),
	CU(cuFuncGetAttribute, "cuFuncGetAttribute"),
	// The optional slots come last, so that DriverLibrary's walk ends at
	// the first one missing. The context's SM limit (CUDA 11.4).
	CU_OPT(cuCtxGetExecAffinity, "cuCtxGetExecAffinity"),
	// TMA descriptors (CUDA 12.0). Optional: older drivers load, and the GEMM
	// engine says what is missing.
	CU_OPT(cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled"),
};

#define LT(member, name) {{name}, offsetof(atp_lt_api, member), 0}
#define LT_OPT(member, name) {{name}, offsetof(atp_lt_api, member), 1}

// The cuBLASLt symbols (unversioned in cuBLASLt 11 to 13).
static const atp_dl_sym lt_syms[] = {
	LT(cublasLtCreate, "cublasLtCreate"),
	LT(cublasLtDestroy, "cublasLtDestroy"),
	LT(cublasLtGetVersion, "cublasLtGetVersion"),
	LT_OPT(cublasLtGetStatusName, "cublasLtGetStatusName"),
	LT_OPT(cublasLtGetStatusString, "cublasLtGetStatusString"),
	LT(cublasLtMatmulDescCreate, "cublasLtMatmulDescCreate"),
	LT(cublasLtMatmulDescDestroy, "cublasLtMatmulDescDestroy"),
	LT(cublasLtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute"),
	LT(cublasLtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate"),
	LT(cublasLtMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy"),
	LT(cublasLtMatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute"),
	LT(cublasLtMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate"),
	LT(cublasLtMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy"),
	LT(cublasLtMatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute"),
	LT(cublasLtMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic"),
	LT(cublasLtMatmul, "cublasLtMatmul"),
};

#define NSYMS(a) ATP_DL_NSYMS(a)

static atp_cu_api cu;                     // the installed driver table
static atp_lt_api lt;                     // the installed cuBLASLt table
static const char *cu_used[NSYMS(cu_syms)]; // the symbol each slot came from
static const char *lt_used[NSYMS(lt_syms)];

int atp_cu_resolve(void *lib, int install, const char **missing) {
	atp_cu_api t;
	const char *used[NSYMS(cu_syms)];
	if (atp_dl_resolve(lib, cu_syms, NSYMS(cu_syms), &t, sizeof t, used, missing) != 0) return -1;
	if (install) {
		cu = t;
		memcpy(cu_used, used, sizeof used);
	}
	return 0;
}

int atp_lt_resolve(void *lib, int install, const char **missing) {
	atp_lt_api t;
	const char *used[NSYMS(lt_syms)];
	if (atp_dl_resolve(lib, lt_syms, NSYMS(lt_syms), &t, sizeof t, used, missing) != 0) return -1;
	if (install) {
		lt = t;
		memcpy(lt_used, used, sizeof used);
	}
	return 0;
}

const char *atp_cu_symbol_name(int i) { return i >= 0 && i < NSYMS(cu_syms) ? cu_used[i] : NULL; }
const char *atp_lt_symbol_name(int i) { return i >= 0 && i < NSYMS(lt_syms) ? lt_used[i] : NULL; }

// ---- driver trampolines -------------------------------------------------------

#define CUDA_ERROR_NOT_INITIALIZED 3
#define CALL(f, ...) (cu.f != NULL ? cu.f(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)

CUresult atp_cuGetErrorName(CUresult r, const char **s) { return CALL(cuGetErrorName, r, s); }
CUresult atp_cuGetErrorString(CUresult r, const char **s) { return CALL(cuGetErrorString, r, s); }
CUresult atp_cuInit(unsigned int flags) { return CALL(cuInit, flags); }
CUresult atp_cuDriverGetVersion(int *v) { return CALL(cuDriverGetVersion, v); }
CUresult atp_cuDeviceGetCount(int *n) { return CALL(cuDeviceGetCount, n); }
CUresult atp_cuDeviceGet(CUdevice *d, int ordinal) { return CALL(cuDeviceGet, d, ordinal); }
CUresult atp_cuDeviceGetName(char *name, int len, CUdevice d) { return CALL(cuDeviceGetName, name, len, d); }
CUresult atp_cuDeviceGetAttribute(int *v, int attr, CUdevice d) { return CALL(cuDeviceGetAttribute, v, attr, d); }
CUresult atp_cuDeviceTotalMem(size_t *bytes, CUdevice d) { return CALL(cuDeviceTotalMem, bytes, d); }
CUresult atp_cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { return CALL(cuDevicePrimaryCtxRetain, c, d); }
CUresult atp_cuDevicePrimaryCtxRelease(CUdevice d) { return CALL(cuDevicePrimaryCtxRelease, d); }
CUresult atp_cuCtxSetCurrent(CUcontext c) { return CALL(cuCtxSetCurrent, c); }
CUresult atp_cuCtxGetCurrent(CUcontext *c) { return CALL(cuCtxGetCurrent, c); }
CUresult atp_cuCtxGetDevice(CUdevice *d) { return CALL(cuCtxGetDevice, d); }
CUresult atp_cuCtxSynchronize(void) { return cu.cuCtxSynchronize != NULL ? cu.cuCtxSynchronize() : CUDA_ERROR_NOT_INITIALIZED; }
CUresult atp_cuCtxGetStreamPriorityRange(int *least, int *greatest) { return CALL(cuCtxGetStreamPriorityRange, least, greatest); }
CUresult atp_cuMemGetInfo(size_t *free_, size_t *total) { return CALL(cuMemGetInfo, free_, total); }
CUresult atp_cuMemAlloc(CUdeviceptr *p, size_t n) { return CALL(cuMemAlloc, p, n); }
CUresult atp_cuMemFree(CUdeviceptr p) { return CALL(cuMemFree, p); }
CUresult atp_cuMemAllocHost(void **p, size_t n) { return CALL(cuMemAllocHost, p, n); }
CUresult atp_cuMemFreeHost(void *p) { return CALL(cuMemFreeHost, p); }
CUresult atp_cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) { return CALL(cuMemcpyHtoD, dst, src, n); }
CUresult atp_cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n) { return CALL(cuMemcpyDtoH, dst, src, n); }
CUresult atp_cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n) { return CALL(cuMemcpyDtoD, dst, src, n); }
CUresult atp_cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s) { return CALL(cuMemcpyHtoDAsync, dst, src, n, s); }
CUresult atp_cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s) { return CALL(cuMemcpyDtoHAsync, dst, src, n, s); }
CUresult atp_cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { return CALL(cuMemcpyDtoDAsync, dst, src, n, s); }
CUresult atp_cuMemsetD8(CUdeviceptr p, unsigned char v, size_t n) { return CALL(cuMemsetD8, p, v, n); }
CUresult atp_cuMemsetD16(CUdeviceptr p, unsigned short v, size_t n) { return CALL(cuMemsetD16, p, v, n); }
CUresult atp_cuMemsetD32(CUdeviceptr p, unsigned int v, size_t n) { return CALL(cuMemsetD32, p, v, n); }
CUresult atp_cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s) { return CALL(cuMemsetD8Async, p, v, n, s); }
CUresult atp_cuMemsetD16Async(CUdeviceptr p, unsigned short v, size_t n, CUstream s) { return CALL(cuMemsetD16Async, p, v, n, s); }
CUresult atp_cuMemsetD32Async(CUdeviceptr p, unsigned int v, size_t n, CUstream s) { return CALL(cuMemsetD32Async, p, v, n, s); }
CUresult atp_cuStreamCreate(CUstream *s, unsigned int flags) { return CALL(cuStreamCreate, s, flags); }
CUresult atp_cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority) { return CALL(cuStreamCreateWithPriority, s, flags, priority); }
CUresult atp_cuStreamDestroy(CUstream s) { return CALL(cuStreamDestroy, s); }
CUresult atp_cuStreamSynchronize(CUstream s) { return CALL(cuStreamSynchronize, s); }
CUresult atp_cuStreamQuery(CUstream s) { return CALL(cuStreamQuery, s); }
CUresult atp_cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) { return CALL(cuStreamWaitEvent, s, e, flags); }
CUresult atp_cuStreamWaitValue32(CUstream s, CUdeviceptr addr, uint32_t v, unsigned int flags) { return CALL(cuStreamWaitValue32, s, addr, v, flags); }
CUresult atp_cuStreamWriteValue32(CUstream s, CUdeviceptr addr, uint32_t v, unsigned int flags) { return CALL(cuStreamWriteValue32, s, addr, v, flags); }
CUresult atp_cuStreamWaitValue64(CUstream s, CUdeviceptr addr, uint64_t v, unsigned int flags) { return CALL(cuStreamWaitValue64, s, addr, v, flags); }
CUresult atp_cuStreamWriteValue64(CUstream s, CUdeviceptr addr, uint64_t v, unsigned int flags) { return CALL(cuStreamWriteValue64, s, addr, v, flags); }
CUresult atp_cuEventCreate(CUevent *e, unsigned int flags) { return CALL(cuEventCreate, e, flags); }
CUresult atp_cuEventDestroy(CUevent e) { return CALL(cuEventDestroy, e); }
CUresult atp_cuEventRecord(CUevent e, CUstream s) { return CALL(cuEventRecord, e, s); }
CUresult atp_cuEventSynchronize(CUevent e) { return CALL(cuEventSynchronize, e); }
CUresult atp_cuEventQuery(CUevent e) { return CALL(cuEventQuery, e); }
CUresult atp_cuEventElapsedTime(float *ms, CUevent start, CUevent end) { return CALL(cuEventElapsedTime, ms, start, end); }
CUresult atp_cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) { return CALL(cuModuleGetFunction, f, m, name); }
CUresult atp_cuModuleGetGlobal(CUdeviceptr *p, size_t *bytes, CUmodule m, const char *name) { return CALL(cuModuleGetGlobal, p, bytes, m, name); }
CUresult atp_cuModuleUnload(CUmodule m) { return CALL(cuModuleUnload, m); }
CUresult atp_cuFuncSetAttribute(CUfunction f, int attr, int v) { return CALL(cuFuncSetAttribute, f, attr, v); }
CUresult atp_cuFuncGetAttribute(int *v, int attr, CUfunction f) { return CALL(cuFuncGetAttribute, v, attr, f); }

CUresult atp_ctx_sm_count(unsigned *n) {
	if (cu.cuCtxGetExecAffinity == NULL) return 500; // CUDA_ERROR_NOT_FOUND
	struct {
		int type;     // CUexecAffinityType: 0 is CU_EXEC_AFFINITY_TYPE_SM_COUNT
		unsigned val; // CUexecAffinitySmCount
	} p = {0, 0};
	CUresult r = cu.cuCtxGetExecAffinity(&p, 0);
	*n = p.val;
	return r;
}

int atp_has_tensormap(void) { return cu.cuTensorMapEncodeTiled != NULL; }

CUresult atp_tensormap_encode_tiled(void *out, int dtype, uint32_t rank, CUdeviceptr addr,
                                    const uint64_t *dims, const uint64_t *strides,
                                    const uint32_t *box, const uint32_t *elemStrides,
                                    int interleave, int swizzle, int l2promo, int oobFill) {
	if (cu.cuTensorMapEncodeTiled == NULL) return 500; // CUDA_ERROR_NOT_FOUND
	_Alignas(64) unsigned char tm[128];
	memset(tm, 0, sizeof tm);
	CUresult r = cu.cuTensorMapEncodeTiled(tm, dtype, rank, (void *)(uintptr_t)addr, dims, strides,
	                                       box, elemStrides, interleave, swizzle, l2promo, oobFill);
	if (r == 0) memcpy(out, tm, sizeof tm);
	return r;
}

// CUjit_option values (cuda.h, CUDA 11.8 and later).
#define ATP_CU_JIT_ERROR_LOG_BUFFER 5
#define ATP_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6

CUresult atp_module_load(CUmodule *m, const void *image, size_t imageLen, char *log, size_t logLen) {
	if (cu.cuModuleLoadDataEx == NULL) return CUDA_ERROR_NOT_INITIALIZED;
	char *copy = malloc(imageLen + 1);
	if (copy == NULL) return 2; // CUDA_ERROR_OUT_OF_MEMORY
	memcpy(copy, image, imageLen);
	copy[imageLen] = 0;
	char *jitlog = NULL;
	if (logLen > 0) {
		jitlog = calloc(logLen, 1);
	}
	int opts[2] = {ATP_CU_JIT_ERROR_LOG_BUFFER, ATP_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void *vals[2] = {jitlog, (void *)(uintptr_t)logLen};
	CUresult r = cu.cuModuleLoadDataEx(m, copy, jitlog != NULL ? 2 : 0, opts, vals);
	if (jitlog != NULL) {
		memcpy(log, jitlog, logLen);
		log[logLen - 1] = 0;
		free(jitlog);
	}
	free(copy);
	return r;
}

CUresult atp_launch(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                    unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                    CUstream s, const void *blob, size_t blobLen, const uint32_t *offs, int nargs) {
	enum { STACK_BYTES = 1024, STACK_ARGS = 64 };
	_Alignas(16) unsigned char sbuf[STACK_BYTES];
	void *sparams[STACK_ARGS];
	if (cu.cuLaunchKernel == NULL) return CUDA_ERROR_NOT_INITIALIZED;
	unsigned char *buf = blobLen <= STACK_BYTES ? sbuf : malloc(blobLen);
	void **params = nargs <= STACK_ARGS ? sparams : malloc(sizeof(void *) * (size_t)nargs);
	CUresult r = 2; // CUDA_ERROR_OUT_OF_MEMORY
	if (buf != NULL && params != NULL) {
		if (blobLen > 0) memcpy(buf, blob, blobLen);
		for (int i = 0; i < nargs; i++) params[i] = buf + offs[i];
		r = cu.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, nargs > 0 ? params : NULL, NULL);
	}
	if (buf != sbuf) free(buf);
	if (params != sparams) free(params);
	return r;
}

// ---- cuBLASLt trampolines -------------------------------------------------------

#define CUBLAS_STATUS_NOT_INITIALIZED 1
#define LTCALL(f, ...) (lt.f != NULL ? lt.f(__VA_ARGS__) : CUBLAS_STATUS_NOT_INITIALIZED)

atp_lt_status atp_ltCreate(atp_lt_handle *h) { return LTCALL(cublasLtCreate, h); }
atp_lt_status atp_ltDestroy(atp_lt_handle h) { return LTCALL(cublasLtDestroy, h); }
size_t atp_ltGetVersion(void) { return lt.cublasLtGetVersion != NULL ? lt.cublasLtGetVersion() : 0; }
const char *atp_ltStatusName(atp_lt_status s) { return lt.cublasLtGetStatusName != NULL ? lt.cublasLtGetStatusName(s) : NULL; }
const char *atp_ltStatusString(atp_lt_status s) { return lt.cublasLtGetStatusString != NULL ? lt.cublasLtGetStatusString(s) : NULL; }
atp_lt_status atp_ltDescCreate(atp_lt_desc *d, int computeType, int scaleType) { return LTCALL(cublasLtMatmulDescCreate, d, computeType, scaleType); }
atp_lt_status atp_ltDescDestroy(atp_lt_desc d) { return LTCALL(cublasLtMatmulDescDestroy, d); }
atp_lt_status atp_ltDescSetI32(atp_lt_desc d, int attr, int32_t v) { return LTCALL(cublasLtMatmulDescSetAttribute, d, attr, &v, sizeof v); }
atp_lt_status atp_ltDescSetU32(atp_lt_desc d, int attr, uint32_t v) { return LTCALL(cublasLtMatmulDescSetAttribute, d, attr, &v, sizeof v); }
atp_lt_status atp_ltDescSetI64(atp_lt_desc d, int attr, int64_t v) { return LTCALL(cublasLtMatmulDescSetAttribute, d, attr, &v, sizeof v); }
atp_lt_status atp_ltDescSetPtr(atp_lt_desc d, int attr, CUdeviceptr v) {
	void *p = (void *)(uintptr_t)v;
	return LTCALL(cublasLtMatmulDescSetAttribute, d, attr, &p, sizeof p);
}
atp_lt_status atp_ltLayoutCreate(atp_lt_layout *l, int type, uint64_t rows, uint64_t cols, int64_t ld) { return LTCALL(cublasLtMatrixLayoutCreate, l, type, rows, cols, ld); }
atp_lt_status atp_ltLayoutDestroy(atp_lt_layout l) { return LTCALL(cublasLtMatrixLayoutDestroy, l); }
atp_lt_status atp_ltLayoutSetI32(atp_lt_layout l, int attr, int32_t v) { return LTCALL(cublasLtMatrixLayoutSetAttribute, l, attr, &v, sizeof v); }
atp_lt_status atp_ltLayoutSetI64(atp_lt_layout l, int attr, int64_t v) { return LTCALL(cublasLtMatrixLayoutSetAttribute, l, attr, &v, sizeof v); }
atp_lt_status atp_ltPrefCreate(atp_lt_pref *p) { return LTCALL(cublasLtMatmulPreferenceCreate, p); }
atp_lt_status atp_ltPrefDestroy(atp_lt_pref p) { return LTCALL(cublasLtMatmulPreferenceDestroy, p); }
atp_lt_status atp_ltPrefSetU32(atp_lt_pref p, int attr, uint32_t v) { return LTCALL(cublasLtMatmulPreferenceSetAttribute, p, attr, &v, sizeof v); }
atp_lt_status atp_ltPrefSetU64(atp_lt_pref p, int attr, uint64_t v) { return LTCALL(cublasLtMatmulPreferenceSetAttribute, p, attr, &v, sizeof v); }

atp_lt_status atp_ltHeuristic(atp_lt_handle h, atp_lt_desc d, atp_lt_layout a, atp_lt_layout b,
                              atp_lt_layout c, atp_lt_pref p, atp_lt_heuristic *out, int *count) {
	return LTCALL(cublasLtMatmulAlgoGetHeuristic, h, d, a, b, c, c, p, 1, out, count);
}

atp_lt_status atp_ltMatmul(atp_lt_handle h, atp_lt_desc d, float alpha, CUdeviceptr a,
                           atp_lt_layout al, CUdeviceptr b, atp_lt_layout bl, float beta,
                           CUdeviceptr c, atp_lt_layout cl, const atp_lt_algo *algo,
                           CUdeviceptr ws, size_t wsSize, CUstream s) {
	// alpha and beta live on this C stack frame: cuBLASLt reads host
	// scalars (CUBLASLT_POINTER_MODE_HOST) before it returns.
	void *pc = (void *)(uintptr_t)c;
	return LTCALL(cublasLtMatmul, h, d, &alpha, (const void *)(uintptr_t)a, al,
	              (const void *)(uintptr_t)b, bl, &beta, pc, cl, pc, cl, algo,
	              (void *)(uintptr_t)ws, wsSize, s);
}
