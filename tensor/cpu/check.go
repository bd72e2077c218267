package cpu

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
)

// checker validates the arguments of one op. Its methods do nothing once a
// check has failed, so an op lists its checks and then asks ok(); only the
// first failure is reported.
type checker struct {
	b    *Backend
	op   string
	err  error
	skip bool // the backend already holds an error: the op is a no-op
}

func (b *Backend) check(op string) *checker {
	return &checker{b: b, op: op, skip: b.Err() != nil}
}

func (c *checker) failed() bool { return c.skip || c.err != nil }

// failf records the first failure of the op.
func (c *checker) failf(format string, args ...any) {
	if c.failed() {
		return
	}
	c.err = fmt.Errorf("cpu: %s: %s", c.op, fmt.Sprintf(format, args...))
}

// ok records the op's failure, if any, in the backend and reports whether the
// op may run.
func (c *checker) ok() bool {
	if c.skip {
		return false
	}
	if c.err != nil {
		c.b.setErr(c.err)
		return false
	}
	return true
}

// host checks that t is a tensor in host memory.
func (c *checker) host(name string, t *tensor.Tensor) {
	if c.failed() {
		return
	}
	if t == nil {
		c.failf("%s is nil", name)
		return
	}
	if _, isHost := t.Buffer().(*tensor.HostBuffer); !isHost || t.Device() != tensor.HostDevice {
		c.failf("%s is %v, expected a tensor in host memory (cpu)", name, t)
	}
}

// float checks that t is a host Float32 or Float64 tensor.
func (c *checker) float(name string, t *tensor.Tensor) {
	c.host(name, t)
	if c.failed() {
		return
	}
	if dt := t.DType(); dt != tensor.Float32 && dt != tensor.Float64 {
		c.failf("%s is %v, expected f32 or f64", name, t)
	}
}

// dtype checks that t is a host tensor of dtype dt.
func (c *checker) dtype(name string, t *tensor.Tensor, dt tensor.DType) {
	c.host(name, t)
	if c.failed() {
		return
	}
	if t.DType() != dt {
		c.failf("%s is %v, expected dtype %v", name, t, dt)
	}
}

// like checks that t is a host tensor with ref's dtype and shape.
func (c *checker) like(name string, t *tensor.Tensor, refName string, ref *tensor.Tensor) {
	if c.failed() {
		return
	}
	c.dtype(name, t, ref.DType())
	c.shape(name, t, ref.Shape(), "to match "+refName)
}

// side checks a side output (rstd, lse, losses): Float32, or the op's
// compute dtype dt.
func (c *checker) side(name string, t *tensor.Tensor, dt tensor.DType) {
	c.host(name, t)
	if c.failed() {
		return
	}
	if t.DType() != tensor.Float32 && t.DType() != dt {
		c.failf("%s is %v, expected dtype f32 (or %v like the op's inputs)", name, t, dt)
	}
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

// rows splits the shape of a tensor of at least one dimension into the number
// of rows (the product of all but the last dimension) and the row length.
func rows(t *tensor.Tensor) (n, c int) {
	s := t.Shape()
	c = s[len(s)-1]
	return s[:len(s)-1].Numel(), c
}

// outer returns shape s without its last dimension.
func outer(s tensor.Shape) tensor.Shape { return s[:len(s)-1].Clone() }
