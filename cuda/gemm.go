package cuda

import (
	"fmt"
	"math/bits"
)

// This file holds the pure-Go half of the cuBLASLt GEMM: the parameters,
// their checks and defaults, and the mapping of a row-major problem onto
// cuBLASLt's column-major one. blas.go makes the calls.

// DataType is an element type of a GEMM operand.
type DataType uint8

const (
	Float32  DataType = iota + 1 // CUDA_R_32F
	BFloat16                     // CUDA_R_16BF
	Float16                      // CUDA_R_16F
)

// cudaDataType values (library_types.h).
const (
	cudaR32F  = 0
	cudaR16F  = 2
	cudaR16BF = 14
)

func (t DataType) cuda() int {
	switch t {
	case Float32:
		return cudaR32F
	case BFloat16:
		return cudaR16BF
	case Float16:
		return cudaR16F
	}
	return -1
}

// Size is the element size in bytes (0 for an unset type).
func (t DataType) Size() int {
	switch t {
	case Float32:
		return 4
	case BFloat16, Float16:
		return 2
	}
	return 0
}

func (t DataType) String() string {
	switch t {
	case Float32:
		return "f32"
	case BFloat16:
		return "bf16"
	case Float16:
		return "f16"
	}
	return fmt.Sprintf("DataType(%d)", uint8(t))
}

// Epilogue is what cuBLASLt applies to alpha·op(A)·op(B) + beta·C before
// storing it, described in the row-major terms of GemmParams.
type Epilogue uint8

const (
	// EpilogueNone stores the product as is (CUBLASLT_EPILOGUE_DEFAULT).
	EpilogueNone Epilogue = iota
	// EpilogueBias adds Bias (N elements) to every row of C:
	// C[i, j] = alpha·(op(A)·op(B))[i, j] + beta·C[i, j] + Bias[j]
	// (CUBLASLT_EPILOGUE_BIAS). Tested.
	EpilogueBias
	// EpilogueReLUBias applies max(x, 0) after the bias
	// (CUBLASLT_EPILOGUE_RELU_BIAS). Not tested.
	EpilogueReLUBias
	// EpilogueGELU applies GELU (cuBLASLt's, believed to be the tanh
	// approximation) to the result (CUBLASLT_EPILOGUE_GELU). Not tested.
	EpilogueGELU
	// EpilogueGELUBias adds Bias, then applies GELU
	// (CUBLASLT_EPILOGUE_GELU_BIAS). Not tested.
	EpilogueGELUBias
	// EpilogueGELUAuxBias adds Bias, stores the pre-activation into Aux
	// (an M×N row-major matrix with row stride AuxLD, a multiple of 8),
	// then applies GELU (CUBLASLT_EPILOGUE_GELU_AUX_BIAS); the backward
	// pass then uses EpilogueDGELUBiasGrad. Not tested.
	EpilogueGELUAuxBias
	// EpilogueDGELUBiasGrad multiplies the product by GELU'(Aux) and
	// writes the column sums of the result into Bias
	// (CUBLASLT_EPILOGUE_DGELU_BGRAD). Not tested.
	EpilogueDGELUBiasGrad
	// EpilogueBiasGradA also writes Σ_k op(A)[i, k] into Bias (M
	// elements): the bias gradient when A is dY in dW = dYᵀ·X
	// (CUBLASLT_EPILOGUE_BGRADB, since A is cuBLASLt's B). Not tested.
	EpilogueBiasGradA
	// EpilogueBiasGradB also writes Σ_k op(B)[k, j] into Bias (N
	// elements) (CUBLASLT_EPILOGUE_BGRADA). Not tested.
	EpilogueBiasGradB
)

// cublasLtEpilogue_t values (cublasLt.h, CUDA 11.8 and 12.6).
func (e Epilogue) lt() uint32 {
	switch e {
	case EpilogueNone:
		return 1
	case EpilogueBias:
		return 4
	case EpilogueReLUBias:
		return 2 | 4
	case EpilogueGELU:
		return 32
	case EpilogueGELUBias:
		return 32 | 4
	case EpilogueGELUAuxBias:
		return 32 | 128 | 4
	case EpilogueDGELUBiasGrad:
		return 64 | 128 | 16
	case EpilogueBiasGradA:
		return 512
	case EpilogueBiasGradB:
		return 256
	}
	return 0
}

func (e Epilogue) usesBias() bool { return e != EpilogueNone && e != EpilogueGELU }
func (e Epilogue) usesAux() bool  { return e == EpilogueGELUAuxBias || e == EpilogueDGELUBiasGrad }

func (e Epilogue) String() string {
	return [...]string{"none", "bias", "relu+bias", "gelu", "gelu+bias", "gelu+aux+bias",
		"dgelu+bgrad", "bgrad(A)", "bgrad(B)"}[e]
}

// GemmParams describes C = alpha·op(A)·op(B) + beta·C on row-major
// matrices, the layout the rest of the project uses: op(A) is M×K, op(B) is
// K×N, C is M×N. With TransA, A is stored K×M (so op(A) = Aᵀ); with TransB,
// B is stored N×K.
//
// Leading dimensions are row strides in elements (row-major "ld"); 0 means
// packed (the stored row length). With Batch > 1 the three matrices are
// repeated Batch times, StrideA/B/C elements apart (0 means packed, one
// matrix right after the other).
//
// beta = 0 does not read C, so C may hold anything (even NaN) then.
type GemmParams struct {
	TransA, TransB bool
	M, N, K        int
	Alpha, Beta    float32

	A, B, C             DevicePtr
	LDA, LDB, LDC       int
	TypeA, TypeB, TypeC DataType // A and B: Float32 or BFloat16 (same); C: Float32 or BFloat16

	Batch                     int
	StrideA, StrideB, StrideC int64

	// FastTF32 lets Float32 inputs use TF32 tensor cores
	// (CUBLAS_COMPUTE_32F_FAST_TF32); otherwise the compute type is
	// CUBLAS_COMPUTE_32F, exact fp32 for fp32 inputs.
	FastTF32 bool

	Epilogue  Epilogue
	Bias      DevicePtr // see Epilogue
	BiasType  DataType  // 0: cuBLASLt's default, TypeC
	Aux       DevicePtr // see EpilogueGELUAuxBias
	AuxLD     int       // row stride of Aux in elements; 0: N
	AuxStride int64     // Aux elements between batch entries; 0: M·AuxLD
}

func (p *GemmParams) String() string {
	s := fmt.Sprintf("%v×%v→%v m=%d n=%d k=%d", p.TypeA, p.TypeB, p.TypeC, p.M, p.N, p.K)
	if p.TransA {
		s += " Aᵀ"
	}
	if p.TransB {
		s += " Bᵀ"
	}
	if p.Batch > 1 {
		s += fmt.Sprintf(" batch=%d", p.Batch)
	}
	if p.Epilogue != EpilogueNone {
		s += " epilogue=" + p.Epilogue.String()
	}
	return s
}

// stored returns the stored (row-major) shape of A and B.
func (p *GemmParams) storedA() (rows, cols int) {
	if p.TransA {
		return p.K, p.M
	}
	return p.M, p.K
}

func (p *GemmParams) storedB() (rows, cols int) {
	if p.TransB {
		return p.N, p.K
	}
	return p.K, p.N
}

// normalize checks p and fills the defaults (leading dimensions, strides).
func (p GemmParams) normalize() (GemmParams, error) {
	bad := func(format string, args ...any) (GemmParams, error) {
		return GemmParams{}, gemmError(p, format, args...)
	}
	if p.M <= 0 || p.N <= 0 || p.K <= 0 {
		return bad("M, N and K must be positive")
	}
	switch {
	case p.TypeA != Float32 && p.TypeA != BFloat16 && p.TypeA != Float16:
		return bad("TypeA must be Float32, BFloat16 or Float16")
	case p.TypeB != p.TypeA:
		return bad("TypeB must equal TypeA")
	case p.TypeC != Float32 && p.TypeC != BFloat16 && p.TypeC != Float16:
		return bad("TypeC must be Float32, BFloat16 or Float16")
	}
	if p.A == 0 || p.B == 0 || p.C == 0 {
		return bad("A, B and C must be set")
	}
	ar, ac := p.storedA()
	br, bc := p.storedB()
	if p.LDA == 0 {
		p.LDA = ac
	}
	if p.LDB == 0 {
		p.LDB = bc
	}
	if p.LDC == 0 {
		p.LDC = p.N
	}
	if p.LDA < ac || p.LDB < bc || p.LDC < p.N {
		return bad("leading dimensions lda=%d ldb=%d ldc=%d are below the row lengths %d, %d, %d", p.LDA, p.LDB, p.LDC, ac, bc, p.N)
	}
	if p.Batch < 1 {
		p.Batch = 1
	}
	if p.Batch > 1 {
		if p.StrideA == 0 {
			p.StrideA = int64(ar) * int64(p.LDA)
		}
		if p.StrideB == 0 {
			p.StrideB = int64(br) * int64(p.LDB)
		}
		if p.StrideC == 0 {
			p.StrideC = int64(p.M) * int64(p.LDC)
		}
	} else {
		p.StrideA, p.StrideB, p.StrideC = 0, 0, 0
	}
	if p.Epilogue > EpilogueBiasGradB {
		return bad("unknown epilogue %d", p.Epilogue)
	}
	if p.Epilogue.usesBias() && p.Bias == 0 {
		return bad("epilogue %v needs Bias", p.Epilogue)
	}
	if !p.Epilogue.usesBias() {
		p.Bias, p.BiasType = 0, 0
	}
	if p.Epilogue.usesAux() {
		if p.Aux == 0 {
			return bad("epilogue %v needs Aux", p.Epilogue)
		}
		if p.AuxLD == 0 {
			p.AuxLD = p.N
		}
		if p.Batch > 1 && p.AuxStride == 0 {
			p.AuxStride = int64(p.M) * int64(p.AuxLD)
		}
	} else {
		p.Aux, p.AuxLD, p.AuxStride = 0, 0, 0
	}
	return p, nil
}

// gemmError describes a bad GemmParams (p is a copy, so that only the error
// path moves it to the heap).
func gemmError(p GemmParams, format string, args ...any) error {
	return fmt.Errorf("cuda: gemm %v: %s", &p, fmt.Sprintf(format, args...))
}

// ltMatrix is one cuBLASLt (column-major) operand.
type ltMatrix struct {
	ptr        DevicePtr
	typ        DataType
	rows, cols uint64
	ld         int64
	stride     int64
}

// ltGemm is the problem as cuBLASLt sees it.
type ltGemm struct {
	transA, transB bool // cuBLASLt's op(A), op(B)
	m, n, k        uint64
	a, b, c        ltMatrix
	batch          int
}

// lt maps a normalized row-major problem onto cuBLASLt.
//
// cuBLASLt is column-major. A row-major R×C matrix with row stride ld is,
// byte for byte, the column-major C×R matrix (its transpose) with leading
// dimension ld. So the row-major C = op(A)·op(B) is, read column-major,
// Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLASLt computes it with its "A" = our B and its "B"
// = our A, its m = our N and its n = our M, and the same transpose flags
// (our B stored N×K with TransB is, column-major, K×N, which cuBLASLt's op
// T turns into the N×K it needs, and so on). No data moves; only the roles
// swap. The bias of CUBLASLT_EPILOGUE_BIAS, one value per row of cuBLASLt's
// D, is therefore one value per column of our C, i.e. per output feature,
// broadcast over our rows.
func (p *GemmParams) lt() ltGemm {
	ar, ac := p.storedA()
	br, bc := p.storedB()
	return ltGemm{
		transA: p.TransB,
		transB: p.TransA,
		m:      uint64(p.N),
		n:      uint64(p.M),
		k:      uint64(p.K),
		// A column-major view of a stored row-major R×C matrix: C rows,
		// R columns.
		a:     ltMatrix{ptr: p.B, typ: p.TypeB, rows: uint64(bc), cols: uint64(br), ld: int64(p.LDB), stride: p.StrideB},
		b:     ltMatrix{ptr: p.A, typ: p.TypeA, rows: uint64(ac), cols: uint64(ar), ld: int64(p.LDA), stride: p.StrideA},
		c:     ltMatrix{ptr: p.C, typ: p.TypeC, rows: uint64(p.N), cols: uint64(p.M), ld: int64(p.LDC), stride: p.StrideC},
		batch: p.Batch,
	}
}

// alignment is the largest power of two, at most 256, dividing the byte
// address p and every byte stride given: what cuBLASLt's heuristics may
// assume about an operand (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES).
func alignment(p DevicePtr, strides ...int64) uint32 {
	v := uint64(p) | 256
	for _, s := range strides {
		v |= uint64(s)
	}
	return uint32(1) << bits.TrailingZeros64(v)
}

// planKey identifies a cached cuBLASLt plan: everything the descriptors and
// the chosen algorithm depend on, but not the addresses themselves.
type planKey struct {
	transA, transB            bool
	m, n, k                   uint64
	typeA, typeC              DataType
	lda, ldb, ldc             int64
	strideA, strideB, strideC int64
	batch                     int
	fastTF32                  bool
	epilogue                  Epilogue
	biasType                  DataType
	auxLD, auxStride          int64
	alignA, alignB, alignC    uint32
	alignBias, alignAux       uint32
}

func (p *GemmParams) key(g *ltGemm) planKey {
	es := func(t DataType, n int64) int64 { return n * int64(t.Size()) }
	return planKey{
		transA: g.transA, transB: g.transB,
		m: g.m, n: g.n, k: g.k,
		typeA: p.TypeA, typeC: p.TypeC,
		lda: g.a.ld, ldb: g.b.ld, ldc: g.c.ld,
		strideA: g.a.stride, strideB: g.b.stride, strideC: g.c.stride,
		batch:    g.batch,
		fastTF32: p.FastTF32,
		epilogue: p.Epilogue, biasType: p.BiasType,
		auxLD: int64(p.AuxLD), auxStride: p.AuxStride,
		alignA:    alignment(g.a.ptr, es(g.a.typ, g.a.ld), es(g.a.typ, g.a.stride)),
		alignB:    alignment(g.b.ptr, es(g.b.typ, g.b.ld), es(g.b.typ, g.b.stride)),
		alignC:    alignment(g.c.ptr, es(g.c.typ, g.c.ld), es(g.c.typ, g.c.stride)),
		alignBias: alignment(p.Bias),
		alignAux:  alignment(p.Aux),
	}
}
