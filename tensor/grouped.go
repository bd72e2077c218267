package tensor

import "fmt"

// GroupedGEMM is an optional capability of a Backend: the grouped GEMMs of
// mixture-of-experts layers, one call for all the experts of a rank. It is
// found by type assertion (GroupedOf), like MoEOps; a backend without it
// still runs MoE layers, one MatMul per expert.
//
// The rows of a and c are split into G groups by offsets, a (G+1) Int32
// tensor on the device, read by the op itself (no host copy of the counts,
// so a device-side dispatch can produce it): group g has rows
// [offsets[g], offsets[g+1]), with
//
//	0 ≤ offsets[0] ≤ offsets[1] ≤ … ≤ offsets[G] ≤ M.
//
// Any group may be empty. Offsets out of order or out of range are an error
// (found on the host by the CPU, by the kernel on a GPU and reported at the
// next Sync). All float operands share one of the backend's float dtypes;
// accumulation is in fp32 or better. beta = 0 overwrites (old contents,
// even NaN, are ignored). Outputs must not overlap inputs.
type GroupedGEMM interface {
	// GroupedMatMul computes, for each group g with rows R_g,
	//
	//	c[R_g, :] = alpha·a[R_g, :]·op(w[g]) + beta·c[R_g, :]
	//
	// for a (M, K), c (M, N), and w (G, N, K) with transW (op(w) = wᵀ: the
	// expert forward x·W_eᵀ) or (G, K, N) without (the input gradient
	// dy·W_e). Rows of c outside [offsets[0], offsets[G]) are left as they
	// are.
	GroupedMatMul(c, a, w, offsets *Tensor, transW bool, alpha, beta float32)
	// GroupedMatMulTN computes, for each group g with rows R_g,
	//
	//	c[g] = alpha·a[R_g, :]ᵀ·b[R_g, :] + beta·c[g]
	//
	// for a (M, P), b (M, Q), c (G, P, Q): the weight gradient
	// dW_e += dy_eᵀ·x_e. An empty group gives c[g] = beta·c[g].
	GroupedMatMulTN(c, a, b, offsets *Tensor, alpha, beta float32)
}

// GroupedOf returns b's GroupedGEMM, or an error saying that b lacks it.
func GroupedOf(b Backend) (GroupedGEMM, error) {
	if b == nil {
		return nil, fmt.Errorf("tensor: GroupedOf a nil backend")
	}
	g, ok := b.(GroupedGEMM)
	if !ok {
		return nil, fmt.Errorf("tensor: backend %q (%T) does not implement tensor.GroupedGEMM (GroupedMatMul, GroupedMatMulTN)", b.Name(), b)
	}
	return g, nil
}

// GroupedPreference is an optional method of a backend with GroupedGEMM:
// whether its grouped op is the way layers should take. The CUDA backend
// answers true where its tensor-core grouped engine runs (Hopper) and false
// where only its SIMT grouped kernel would (far slower than one tensor-core
// cuBLASLt GEMM per expert), unless cudabackend.WithGroupedGEMM says
// otherwise; a backend without the method is taken at its word (true).
type GroupedPreference interface {
	PreferGrouped() bool // whether the layers should take GroupedGEMM
}

// GroupedCountPreference is an optional method of a backend with
// GroupedGEMM whose preference depends on the groups of a layer (its
// local experts): for such a layer it replaces GroupedPreference. The
// CUDA backend's grouped engine wins over one GEMM per expert with many
// small experts and loses with a few large ones.
type GroupedCountPreference interface {
	PreferGroupedFor(groups int) bool // whether a layer of that many groups should take GroupedGEMM
}

// UseGrouped returns b's GroupedGEMM when b has one and prefers it, else nil.
func UseGrouped(b Backend) GroupedGEMM {
	g, ok := b.(GroupedGEMM)
	if !ok {
		return nil
	}
	if p, ok := b.(GroupedPreference); ok && !p.PreferGrouped() {
		return nil
	}
	return g
}

// UseGroupedFor is UseGrouped for a layer of groups groups (local
// experts): a backend with GroupedCountPreference answers for that count.
func UseGroupedFor(b Backend, groups int) GroupedGEMM {
	g, ok := b.(GroupedGEMM)
	if !ok {
		return nil
	}
	if p, ok := b.(GroupedCountPreference); ok {
		if !p.PreferGroupedFor(groups) {
			return nil
		}
		return g
	}
	return UseGrouped(b)
}
