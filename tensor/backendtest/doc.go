// Package backendtest is the conformance suite of tensor.Backend, in the
// style of gonum's blas/testblas: exported test functions that take the
// implementation under test.
//
// A backend's tests call Run (or single Test* functions):
//
//	func TestConformance(t *testing.T) {
//		backendtest.Run(t, mybackend.New(), backendtest.Options{DType: tensor.BFloat16, Tol: 1e-2})
//	}
//
// Every test draws random non-zero inputs on the host, rounds them to the
// dtype the backend computes in, uploads them with the backend's Upload, and
// runs the op both on the backend and on a fresh CPU reference (tensor/cpu)
// in float64 on the same values. Outputs are poisoned first (filled with NaN)
// so an element the backend forgets to write fails; accumulated gradients
// start from random values, so an overwrite instead of += fails too. Results
// come back through Download and are compared by relative norm
// (‖got − want‖ / ‖want‖ ≤ Options.Tol). Shapes are deliberately awkward
// (37 rows of 50, a vocabulary of 61) so that kernels tiled by powers of two
// meet their edges.
//
// Side outputs that the interface keeps in fp32 (RMSNorm's rstd, Attention's
// lse, CrossEntropy's losses) and the optimizer state (master weights, m, v)
// are Float32 on the backend under test; ids and targets are Int32.
package backendtest
