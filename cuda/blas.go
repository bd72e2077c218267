package cuda

/*
#include "atp_cuda.h"
*/
import "C"

import (
	"fmt"
	"sync"
)

// cuBLASLt enum values, checked against cublasLt.h / cublas_api.h of CUDA
// 11.8 (the Debian toolkit) and 12.6; unchanged between them.
const (
	cublasCompute32F         = 68 // CUBLAS_COMPUTE_32F
	cublasCompute32FFastTF32 = 77 // CUBLAS_COMPUTE_32F_FAST_TF32
	cublasOpN                = 0  // CUBLAS_OP_N
	cublasOpT                = 1  // CUBLAS_OP_T

	// cublasLtMatmulDescAttributes_t
	ltDescTransA          = 3  // int32
	ltDescTransB          = 4  // int32
	ltDescEpilogue        = 7  // uint32
	ltDescBiasPointer     = 8  // void*
	ltDescBiasBatchStride = 10 // int64
	ltDescAuxPointer      = 11 // void*
	ltDescAuxLD           = 12 // int64
	ltDescAuxBatchStride  = 13 // int64
	ltDescBiasDataType    = 26 // int32

	// cublasLtMatrixLayoutAttribute_t
	ltLayoutBatchCount  = 5 // int32
	ltLayoutBatchStride = 6 // int64

	// cublasLtMatmulPreferenceAttributes_t
	ltPrefMaxWorkspace = 1 // uint64
	ltPrefAlignA       = 5 // uint32
	ltPrefAlignB       = 6
	ltPrefAlignC       = 7
	ltPrefAlignD       = 8
)

// DefaultWorkspace is the cuBLASLt workspace NewBlas allocates when asked
// for 0 bytes: 32 MiB, NVIDIA's recommendation for Hopper.
const DefaultWorkspace = 32 << 20

// Blas is a cuBLASLt handle with its workspace and a cache of GEMM plans
// (descriptors and the algorithm the heuristics chose), one per shape,
// layout, type, epilogue and operand alignment.
//
// A Blas belongs to the context current when it was made. Its methods are
// safe for concurrent use, but all GEMMs share one workspace, so GEMMs
// running at the same time on different streams must use different Blas
// values.
type Blas struct {
	mu     sync.Mutex
	h      C.atp_lt_handle
	ws     DevicePtr
	wsSize int
	dev    string
	plans  map[planKey]*plan
}

// plan is a cached cuBLASLt problem.
type plan struct {
	desc      C.atp_lt_desc
	a, b, c   C.atp_lt_layout
	algo      C.atp_lt_algo
	bias, aux DevicePtr // the pointers last set on desc
}

// NewBlas loads cuBLASLt if needed, creates a handle and allocates a
// workspace of workspaceBytes (0: DefaultWorkspace) in the current context.
func NewBlas(workspaceBytes int) (*Blas, error) {
	if err := Init(); err != nil {
		return nil, err
	}
	if err := loadBlas(); err != nil {
		return nil, err
	}
	if workspaceBytes <= 0 {
		workspaceBytes = DefaultWorkspace
	}
	b := &Blas{wsSize: workspaceBytes, dev: currentDeviceName(), plans: make(map[planKey]*plan)}
	if err := checkBlas("cublasLtCreate on "+b.dev, BlasStatus(C.atp_ltCreate(&b.h))); err != nil {
		return nil, err
	}
	ws, err := Alloc(workspaceBytes)
	if err != nil {
		C.atp_ltDestroy(b.h)
		return nil, fmt.Errorf("cuda: cuBLASLt workspace: %w", err)
	}
	b.ws = ws
	return b, nil
}

// Plans returns how many GEMM plans are cached.
func (b *Blas) Plans() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.plans)
}

// Destroy frees the plans, the workspace and the handle. The context must
// be current, and no GEMM of this Blas may still be running (synchronise
// its streams first).
func (b *Blas) Destroy() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, pl := range b.plans {
		pl.destroy()
		delete(b.plans, k)
	}
	var first error
	if b.ws != 0 {
		first = Free(b.ws)
		b.ws = 0
	}
	if b.h != 0 {
		if err := checkBlas("cublasLtDestroy", BlasStatus(C.atp_ltDestroy(b.h))); err != nil && first == nil {
			first = err
		}
		b.h = 0
	}
	return first
}

func (pl *plan) destroy() {
	for _, l := range []C.atp_lt_layout{pl.a, pl.b, pl.c} {
		if l != 0 {
			C.atp_ltLayoutDestroy(l)
		}
	}
	if pl.desc != 0 {
		C.atp_ltDescDestroy(pl.desc)
	}
}

// Gemm queues C = alpha·op(A)·op(B) + beta·C (plus the epilogue) on stream s;
// see GemmParams for the row-major conventions. The first call for a new
// shape/layout/type/epilogue/alignment builds and caches a plan (which asks
// cuBLASLt's heuristics for an algorithm); later calls only launch. The
// compute type is fp32 (CUBLAS_COMPUTE_32F).
func (b *Blas) Gemm(s *Stream, p GemmParams) error {
	q, err := p.normalize()
	if err != nil {
		return err
	}
	g := q.lt()
	key := q.key(&g)

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.h == 0 {
		return gemmError(q, "Blas is destroyed")
	}
	pl, ok := b.plans[key]
	if !ok {
		if pl, err = b.newPlan(q, g); err != nil {
			return err
		}
		b.plans[key] = pl
	}
	if q.Bias != pl.bias {
		if err := checkBlas("set bias pointer", BlasStatus(C.atp_ltDescSetPtr(pl.desc, ltDescBiasPointer, C.CUdeviceptr(q.Bias)))); err != nil {
			return err
		}
		pl.bias = q.Bias
	}
	if q.Aux != pl.aux {
		if err := checkBlas("set aux pointer", BlasStatus(C.atp_ltDescSetPtr(pl.desc, ltDescAuxPointer, C.CUdeviceptr(q.Aux)))); err != nil {
			return err
		}
		pl.aux = q.Aux
	}
	st := BlasStatus(C.atp_ltMatmul(b.h, pl.desc, C.float(q.Alpha),
		C.CUdeviceptr(g.a.ptr), pl.a, C.CUdeviceptr(g.b.ptr), pl.b, C.float(q.Beta),
		C.CUdeviceptr(g.c.ptr), pl.c, &pl.algo, C.CUdeviceptr(b.ws), C.size_t(b.wsSize), s.handle()))
	if st != BlasSuccess {
		return b.matmulError(q, st)
	}
	return nil
}

// matmulError reports a failed cublasLtMatmul (q is a copy, so that only the
// error path moves it to the heap).
func (b *Blas) matmulError(q GemmParams, st BlasStatus) error {
	return &BlasError{Op: fmt.Sprintf("cublasLtMatmul(%v) on %s", &q, b.dev), Status: st}
}

// newPlan creates the descriptors of a problem and picks its algorithm.
func (b *Blas) newPlan(q GemmParams, g ltGemm) (_ *plan, err error) {
	pl := &plan{}
	defer func() {
		if err != nil {
			pl.destroy() // what was created before the failure
		}
	}()
	where := fmt.Sprintf("gemm %v on %s", &q, b.dev)
	try := func(what string, st C.atp_lt_status) error {
		if st != 0 {
			return &BlasError{Op: where + ": " + what, Status: BlasStatus(st)}
		}
		return nil
	}

	compute := C.int(cublasCompute32F)
	if q.FastTF32 && q.TypeA == Float32 {
		compute = cublasCompute32FFastTF32
	}
	if err := try("cublasLtMatmulDescCreate", C.atp_ltDescCreate(&pl.desc, compute, cudaR32F)); err != nil {
		return nil, err
	}
	op := func(t bool) C.int32_t {
		if t {
			return cublasOpT
		}
		return cublasOpN
	}
	if err := try("set transa", C.atp_ltDescSetI32(pl.desc, ltDescTransA, op(g.transA))); err != nil {
		return nil, err
	}
	if err := try("set transb", C.atp_ltDescSetI32(pl.desc, ltDescTransB, op(g.transB))); err != nil {
		return nil, err
	}
	if q.Epilogue != EpilogueNone {
		if err := try("set epilogue", C.atp_ltDescSetU32(pl.desc, ltDescEpilogue, C.uint32_t(q.Epilogue.lt()))); err != nil {
			return nil, err
		}
	}
	if q.Bias != 0 {
		// The heuristics read the pointer's alignment, so set it now.
		if err := try("set bias pointer", C.atp_ltDescSetPtr(pl.desc, ltDescBiasPointer, C.CUdeviceptr(q.Bias))); err != nil {
			return nil, err
		}
		pl.bias = q.Bias
		if q.BiasType != 0 {
			if err := try("set bias type", C.atp_ltDescSetI32(pl.desc, ltDescBiasDataType, C.int32_t(q.BiasType.cuda()))); err != nil {
				return nil, err
			}
		}
		// A batched GEMM reuses the same bias for every batch entry
		// (stride 0, cuBLASLt's default).
	}
	if q.Aux != 0 {
		if err := try("set aux pointer", C.atp_ltDescSetPtr(pl.desc, ltDescAuxPointer, C.CUdeviceptr(q.Aux))); err != nil {
			return nil, err
		}
		pl.aux = q.Aux
		if err := try("set aux ld", C.atp_ltDescSetI64(pl.desc, ltDescAuxLD, C.int64_t(q.AuxLD))); err != nil {
			return nil, err
		}
		if q.Batch > 1 {
			if err := try("set aux batch stride", C.atp_ltDescSetI64(pl.desc, ltDescAuxBatchStride, C.int64_t(q.AuxStride))); err != nil {
				return nil, err
			}
		}
	}

	layout := func(name string, m ltMatrix, out *C.atp_lt_layout) error {
		if err := try("cublasLtMatrixLayoutCreate("+name+")", C.atp_ltLayoutCreate(out, C.int(m.typ.cuda()), C.uint64_t(m.rows), C.uint64_t(m.cols), C.int64_t(m.ld))); err != nil {
			return err
		}
		if g.batch > 1 {
			if err := try("set batch count of "+name, C.atp_ltLayoutSetI32(*out, ltLayoutBatchCount, C.int32_t(g.batch))); err != nil {
				return err
			}
			if err := try("set batch stride of "+name, C.atp_ltLayoutSetI64(*out, ltLayoutBatchStride, C.int64_t(m.stride))); err != nil {
				return err
			}
		}
		return nil
	}
	// cuBLASLt's A is our B and its B our A (see GemmParams.lt).
	if err := layout("B", g.a, &pl.a); err != nil {
		return nil, err
	}
	if err := layout("A", g.b, &pl.b); err != nil {
		return nil, err
	}
	if err := layout("C", g.c, &pl.c); err != nil {
		return nil, err
	}

	var pref C.atp_lt_pref
	if err := try("cublasLtMatmulPreferenceCreate", C.atp_ltPrefCreate(&pref)); err != nil {
		return nil, err
	}
	defer C.atp_ltPrefDestroy(pref)
	key := q.key(&g)
	prefs := []struct {
		attr C.int
		v    uint32
	}{{ltPrefAlignA, key.alignA}, {ltPrefAlignB, key.alignB}, {ltPrefAlignC, key.alignC}, {ltPrefAlignD, key.alignC}}
	for _, pr := range prefs {
		if err := try("set alignment preference", C.atp_ltPrefSetU32(pref, pr.attr, C.uint32_t(pr.v))); err != nil {
			return nil, err
		}
	}
	if err := try("set workspace preference", C.atp_ltPrefSetU64(pref, ltPrefMaxWorkspace, C.uint64_t(b.wsSize))); err != nil {
		return nil, err
	}

	var res C.atp_lt_heuristic
	var n C.int
	if err := try("cublasLtMatmulAlgoGetHeuristic", C.atp_ltHeuristic(b.h, pl.desc, pl.a, pl.b, pl.c, pref, &res, &n)); err != nil {
		return nil, err
	}
	if n == 0 || res.state != 0 {
		return nil, fmt.Errorf("cuda: %s: cuBLASLt has no algorithm for this problem (alignments A %d, B %d, C %d bytes)",
			where, key.alignA, key.alignB, key.alignC)
	}
	pl.algo = res.algo
	return pl, nil
}
