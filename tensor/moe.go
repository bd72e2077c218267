package tensor

import "fmt"

// MoEOps is an optional capability of a Backend: the routing and permutation
// ops of mixture-of-experts layers. It is found by type assertion (the
// io.WriterTo pattern), so a backend that does not implement it yet still
// builds and runs every dense model; MoEOpsOf gives the MoE layers a clear
// error for it.
//
// The conventions of Backend apply: sticky errors, dst first, gradients of
// inputs overwritten. Index tensors are Int32. All float operands of one op
// share a dtype, except the side tensors (lse, dlse), which are fp32 or the
// op's dtype, like RMSNorm's rstd.
//
// The MoE layers use them as follows (N tokens, K choices, E experts, M kept
// token-slots in expert-contiguous order):
//
//	probs (N, E) ──TopK──► weights (N, K), idx (N, K)
//	x (N, C) ──GatherRows(tok)──► xe (M, C) ──experts──► ye (M, C)
//	ye ──CombineRows(pos, weights)──► out (N, C)
//
// and backward CombineRowsBackward, CombineRows(pos, nil) (the adjoint of the
// gather), TopKBackward, and LogSumExp/LogSumExpBackward for the router
// z-loss.
type MoEOps interface {
	// TopK writes, for each row of x (N, E), the K largest values into vals
	// (N, K) and their column indices into idx (N, K) int32, largest first;
	// equal values go to the lower index first. With normalize, vals are
	// divided by their row sum (the top-k renormalisation of a router; x
	// then holds probabilities, whose selected sum is positive). 1 ≤ K ≤ E.
	TopK(vals, idx, x *Tensor, normalize bool)
	// TopKBackward writes dx (N, E), overwritten: zero except at the
	// selected columns, dx[n, idx[n, j]] = ∂L/∂x from dvals (N, K). vals,
	// idx and x are the forward's; with normalize the gradient goes through
	// the renormalisation: (dvals[j] − Σ_i dvals[i]·vals[i]) / s with s the
	// row's selected sum of x.
	TopKBackward(dx, dvals, vals, idx, x *Tensor, normalize bool)

	// GatherRows sets dst[i, :] = scale[i]·src[idx[i], :] for dst (M, C),
	// src (R, C), idx (M) int32, scale (M) or nil (1). A negative idx[i]
	// gives a zero row; an index ≥ R is an error. dst must not overlap src.
	GatherRows(dst, src, idx, scale *Tensor)
	// CombineRows sets out[n, :] = Σ_j weights[n, j]·src[pos[n, j], :] for
	// out (N, C), src (M, C), pos (N, K) int32, weights (N, K) or nil (1),
	// overwriting out; slots with a negative pos are skipped. It is the
	// weighted combine of expert outputs, and with nil weights the adjoint
	// of GatherRows (the sum of a token's slot gradients).
	CombineRows(out, src, pos, weights *Tensor)
	// CombineRowsBackward is CombineRows' backward: dsrc (M, C) is
	// overwritten with dsrc[pos[n, j], :] = weights[n, j]·dout[n, :] (rows
	// no slot refers to are zero), and dweights (N, K), if not nil, with
	// dweights[n, j] = ⟨dout[n, :], src[pos[n, j], :]⟩ (0 for skipped
	// slots). The non-negative entries of pos must be distinct (each src
	// row feeds one slot), as an MoE layout guarantees.
	CombineRowsBackward(dsrc, dweights, dout, src, pos, weights *Tensor)

	// LogSumExp writes lse[n] = log Σ_e exp(x[n, e]) for x (N, E), lse (N).
	LogSumExp(lse, x *Tensor)
	// LogSumExpBackward writes dx (N, E), overwritten, as
	// dx[n, e] = dlse[n]·exp(x[n, e] − lse[n]), from the forward's x, lse.
	LogSumExpBackward(dx, dlse, x, lse *Tensor)
}

// MoEOpsOf returns b's MoEOps, or an error saying that b lacks them.
func MoEOpsOf(b Backend) (MoEOps, error) {
	if b == nil {
		return nil, fmt.Errorf("tensor: MoEOpsOf a nil backend")
	}
	ops, ok := b.(MoEOps)
	if !ok {
		return nil, fmt.Errorf("tensor: backend %q (%T) does not implement tensor.MoEOps (TopK, GatherRows, CombineRows, LogSumExp and their backwards), which mixture-of-experts layers need", b.Name(), b)
	}
	return ops, nil
}
