// Package cpu is the reference implementation of tensor.Backend: plain Go
// loops (and gonum BLAS for the GEMMs) over host tensors, in float32 or
// float64.
//
// Every other backend is compared with this one (see tensor/backendtest), so
// the kernels favour clarity over speed: each op validates its arguments, then
// runs a straightforward loop, split by rows over a few goroutines where the
// op is heavy. Results are bit-for-bit the same whatever the number of
// threads: every output element is computed by exactly one goroutine in a
// fixed order, and reductions across rows (the gradients of weights, SumRows,
// SumSquares) run in an order that does not depend on how the work is split.
//
// Dtypes: float ops take Float32 or Float64 tensors (all the float operands of
// one op share a dtype); ids and targets are Int32; BFloat16 is supported by
// Zeros, Upload, Download, Copy and Fill (conversions round to nearest even),
// by AdamW for p and g, and by SumSquares. The fp32 side outputs of the
// interface (RMSNorm's rstd, Attention's lse, CrossEntropy's losses) may be
// Float32 or, for exact float64 gradient checks, the op's own dtype.
//
// Errors are sticky, as tensor.Backend specifies: an op that finds a bad
// shape, dtype or device records an error naming the op and what it expected,
// does nothing, and every later op is a no-op. Ops never panic on bad input.
// The argument checks are those of every backend (tensor/opcheck), with the
// CPU's policy (check.go); the CPU also checks the ids and indices it reads.
// A Backend may be used from several goroutines, but the usual pattern is
// one Backend per simulated rank.
package cpu
