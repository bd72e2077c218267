package cpu

import (
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// policy is what the CPU decides in the shared argument checks (see
// tensor/opcheck): host tensors; float ops in Float32 or Float64; side
// outputs in Float32 or the op's dtype (exact float64 gradient checks);
// parameters in any float dtype, updated in Float32 or Float64.
var policy = opcheck.Policy{
	Prefix:        "cpu",
	Own:           opcheck.HostMemory,
	Floats:        []tensor.DType{tensor.Float32, tensor.Float64},
	SideFollowsOp: true,
	Params:        []tensor.DType{tensor.Float32, tensor.Float64, tensor.BFloat16},
	Optim:         []tensor.DType{tensor.Float32, tensor.Float64},
}

// check starts the argument checks of op; a failure becomes the backend's
// sticky error when the op asks OK.
func (b *Backend) check(op string) *opcheck.Checker {
	b.interrupted(op)
	return opcheck.New(&policy, op, b.Err() != nil, b.setErr)
}

// The checks of the data in index tensors, which the CPU reads on the host
// before an op runs (a GPU backend leaves them to its kernels).

// indices checks that the int32 tensor t holds values < n (negative values
// are allowed: they mark skipped entries).
func indices(c *opcheck.Checker, name string, t *tensor.Tensor, n int) {
	if c.Failed() {
		return
	}
	for i, v := range t.I32() {
		if int(v) >= n {
			c.Failf("%s[%d] = %d, expected a value < %d (or negative to skip)", name, i, v, n)
			return
		}
	}
}
