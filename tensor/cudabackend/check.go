package cudabackend

import (
	"fmt"
	"math"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// policy is what this backend decides in the shared argument checks (see
// tensor/opcheck): its own live device tensors; float ops in BFloat16 or
// Float32; side outputs (rstd, lse, losses) in Float32; parameters in
// BFloat16 or Float32, updated in Float32 (a bf16 p without a master copy
// through fp32 moments, which the CPU reference refuses).
func (b *Backend) policy() opcheck.Policy {
	return opcheck.Policy{
		Prefix: "cuda",
		Own:    b.own,
		Floats: []tensor.DType{tensor.BFloat16, tensor.Float32},
		Params: []tensor.DType{tensor.BFloat16, tensor.Float32},
		Optim:  []tensor.DType{tensor.Float32},
		Upcast: true,
	}
}

// own checks that t is a live tensor of this backend, or of device memory
// on its device that another allocator owns (DeviceBuffer).
func (b *Backend) own(name string, t *tensor.Tensor) string {
	buf, ok := t.Buffer().(*Buffer)
	if !ok && isForeign(b, t) {
		return "" // same-device memory of another allocator (DeviceBuffer)
	}
	if !ok || buf.owner != b {
		return fmt.Sprintf("%s is %v, expected a tensor of this backend (%v)", name, t, b.Device())
	}
	if buf.freed {
		return fmt.Sprintf("%s %v has no storage (freed, or its allocation failed)", name, t)
	}
	return ""
}

// check starts the argument checks of op, on the host before anything is
// queued; a failure becomes the sticky error when the op asks OK.
func (b *Backend) check(op string) *opcheck.Checker {
	return opcheck.New(&b.pol, op, b.failed(), b.fail)
}

// fits checks that a size fits the kernels' int32 arguments.
func fits(c *opcheck.Checker, what string, n int) {
	if !c.Failed() && n > math.MaxInt32 {
		c.Failf("%s = %d does not fit the kernels' 32-bit sizes", what, n)
	}
}

// rowsFit checks the rows N and the row length C of an op on rows.
func rowsFit(c *opcheck.Checker, n, cols int) {
	fits(c, "N", n)
	fits(c, "C", cols)
}

// sfx is the kernel name suffix of a float dtype.
func sfx(dt tensor.DType) string {
	if dt == tensor.Float32 {
		return "_f32"
	}
	return "_bf16"
}
