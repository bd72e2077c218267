// Package opcheck is the one definition of what each tensor.Backend op
// accepts: the dtypes, ranks and shapes of its arguments and how they must
// agree, and the sizes that follow from them.
//
// Every backend validates its arguments on the host before it runs (or
// queues) anything, and every backend must accept exactly the same input as
// the reference, tensor/cpu: a model that runs on the CPU must not fail on
// the GPU with a shape error, and a bad call must fail on both, with the
// same message. Written once per backend, these checks had drifted apart in
// small ways; here they are written once, and a backend calls them:
//
//	c := b.check("MatMul") // opcheck.New with the backend's Policy
//	batch, m, n, k := opcheck.MatMul(c, out, a, bm, transA, transB)
//	if !c.OK() {           // records the first failure as the sticky error
//		return
//	}
//
// What legitimately differs between backends is a Policy: which tensors are
// the backend's own (host memory for the CPU, a live buffer of this backend
// for a GPU), which float dtypes its ops compute in, which dtypes the side
// outputs (RMSNorm's rstd, Attention's lse, CrossEntropy's losses) and the
// optimizer state may have. Checks that only one backend needs stay in that
// backend, after the shared ones: the CPU reads index tensors on the host and
// checks every id, a GPU backend checks that sizes fit its kernels' 32-bit
// arguments and leaves the ids to its kernels.
//
// A Checker reports only its first failure, as
// "<prefix>: <op>: <what was expected and found>"; once a check has failed,
// the later ones do nothing, so an op can list its checks without testing
// each result.
package opcheck
