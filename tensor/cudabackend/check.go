package cudabackend

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
)

// checker validates the arguments of one op on the host, before anything is
// queued. Its methods do nothing once a check has failed, so an op lists its
// checks and then asks ok(); only the first failure is reported, as
// "cuda: <op>: <what was expected and found>".
type checker struct {
	b    *Backend
	op   string
	err  error
	skip bool // the backend already holds an error: the op is a no-op
}

func (b *Backend) check(op string) *checker {
	return &checker{b: b, op: op, skip: b.failed()}
}

func (c *checker) failed() bool { return c.skip || c.err != nil }

func (c *checker) failf(format string, args ...any) {
	if c.failed() {
		return
	}
	c.err = fmt.Errorf("cuda: %s: %s", c.op, fmt.Sprintf(format, args...))
}

// ok records the op's failure, if any, and reports whether the op may run.
func (c *checker) ok() bool {
	if c.skip {
		return false
	}
	if c.err != nil {
		c.b.fail(c.err)
		return false
	}
	return true
}

// dev checks that t is a live tensor of this backend.
func (c *checker) dev(name string, t *tensor.Tensor) {
	if c.failed() {
		return
	}
	if t == nil {
		c.failf("%s is nil", name)
		return
	}
	buf, ok := t.Buffer().(*Buffer)
	if !ok || buf.owner != c.b {
		c.failf("%s is %v, expected a tensor of this backend (%v)", name, t, c.b.Device())
		return
	}
	if buf.freed {
		c.failf("%s %v has no storage (freed, or its allocation failed)", name, t)
	}
}

// float checks that t is a BFloat16 or Float32 tensor of this backend.
func (c *checker) float(name string, t *tensor.Tensor) {
	c.dev(name, t)
	if c.failed() {
		return
	}
	if dt := t.DType(); dt != tensor.BFloat16 && dt != tensor.Float32 {
		c.failf("%s is %v, expected bf16 or f32", name, t)
	}
}

// dtype checks that t is a tensor of this backend of dtype dt.
func (c *checker) dtype(name string, t *tensor.Tensor, dt tensor.DType) {
	c.dev(name, t)
	if c.failed() {
		return
	}
	if t.DType() != dt {
		c.failf("%s is %v, expected dtype %v", name, t, dt)
	}
}

// like checks that t has ref's dtype and shape.
func (c *checker) like(name string, t *tensor.Tensor, refName string, ref *tensor.Tensor) {
	c.dtype(name, t, ref.DType())
	c.shape(name, t, ref.Shape(), "to match "+refName)
}

// shape checks t's shape against want; why completes the message.
func (c *checker) shape(name string, t *tensor.Tensor, want tensor.Shape, why string) {
	if c.failed() {
		return
	}
	if !t.Shape().Equal(want) {
		if why != "" {
			why = " " + why
		}
		c.failf("%s has shape %v, expected %v%s", name, t.Shape(), want, why)
	}
}

// rank checks the number of dimensions of t.
func (c *checker) rank(name string, t *tensor.Tensor, lo, hi int) {
	if c.failed() {
		return
	}
	if r := len(t.Shape()); r < lo || r > hi {
		if lo == hi {
			c.failf("%s has shape %v, expected %d dimensions", name, t.Shape(), lo)
		} else {
			c.failf("%s has shape %v, expected %d to %d dimensions", name, t.Shape(), lo, hi)
		}
	}
}

// fits checks that a size fits the kernels' int32 arguments.
func (c *checker) fits(what string, n int) {
	if c.failed() {
		return
	}
	if n > 1<<31-1 {
		c.failf("%s = %d does not fit the kernels' 32-bit sizes", what, n)
	}
}

// rows splits t (at least 1-D) into rows (the product of all but the last
// dimension) and the row length.
func rows(t *tensor.Tensor) (n, c int) {
	s := t.Shape()
	c = s[len(s)-1]
	return s[:len(s)-1].Numel(), c
}

// outer is s without its last dimension.
func outer(s tensor.Shape) tensor.Shape { return s[:len(s)-1].Clone() }

// sfx is the kernel name suffix of a float dtype.
func sfx(dt tensor.DType) string {
	if dt == tensor.Float32 {
		return "_f32"
	}
	return "_bf16"
}
