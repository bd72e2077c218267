package opcheck

import (
	"fmt"
	"slices"
	"strings"

	"github.com/asynctp/asynctp/tensor"
)

// Policy is what a backend decides for itself; everything else about an
// op's arguments is fixed by this package.
type Policy struct {
	// Prefix starts every error: "cpu", "cuda".
	Prefix string
	// Own checks that t (not nil) is a tensor the backend can run ops on:
	// its memory, live. It returns the failure message, naming t as name,
	// or "" when t is fine.
	Own func(name string, t *tensor.Tensor) string
	// Floats are the dtypes float ops compute in; all float operands of an
	// op share one of them.
	Floats []tensor.DType
	// SideFollowsOp lets a side output (RMSNorm's rstd, Attention's lse,
	// CrossEntropy's losses, LogSumExp's lse) have the op's dtype as well as
	// Float32.
	SideFollowsOp bool
	// Params are the float dtypes parameters and gradients may be stored in:
	// AdamW's p and g, SumSquares' x.
	Params []tensor.DType
	// Optim are the dtypes an AdamW update is computed in: master's, and
	// m's and v's. Without master the update runs in p's dtype when it is
	// one of them; otherwise in Optim[0] when Upcast, else p needs a master.
	Optim  []tensor.DType
	Upcast bool
}

// Checker validates the arguments of one op. Its methods do nothing once a
// check has failed, so an op lists its checks and then asks OK; only the
// first failure is reported.
type Checker struct {
	pol    *Policy
	op     string
	err    error
	skip   bool
	record func(error)
}

// New starts the checks of op. skip says that the backend already holds an
// error: the op is then a no-op (every check passes silently, OK reports
// false). record receives the op's failure when OK is called.
func New(pol *Policy, op string, skip bool, record func(error)) *Checker {
	return &Checker{pol: pol, op: op, skip: skip, record: record}
}

// Failed reports whether a check has failed, or the op is skipped.
func (c *Checker) Failed() bool { return c.skip || c.err != nil }

// Failf records the first failure of the op.
func (c *Checker) Failf(format string, args ...any) {
	if c.Failed() {
		return
	}
	c.err = fmt.Errorf("%s: %s: %s", c.pol.Prefix, c.op, fmt.Sprintf(format, args...))
}

// OK records the op's failure, if any, with the backend and reports whether
// the op may run.
func (c *Checker) OK() bool {
	if c.skip {
		return false
	}
	if c.err != nil {
		c.record(c.err)
		return false
	}
	return true
}

// Own checks that t is a tensor of the backend (see Policy.Own).
func (c *Checker) Own(name string, t *tensor.Tensor) {
	c.mine(name, t, c.pol.Own)
}

// Host checks that t is a tensor in host memory.
func (c *Checker) Host(name string, t *tensor.Tensor) {
	c.mine(name, t, HostMemory)
}

func (c *Checker) mine(name string, t *tensor.Tensor, own func(string, *tensor.Tensor) string) {
	if c.Failed() {
		return
	}
	if t == nil {
		c.Failf("%s is nil", name)
		return
	}
	if msg := own(name, t); msg != "" {
		c.Failf("%s", msg)
	}
}

// HostMemory is the Own of a backend that computes in host memory.
func HostMemory(name string, t *tensor.Tensor) string {
	if _, ok := t.Buffer().(*tensor.HostBuffer); !ok || t.Device() != tensor.HostDevice {
		return fmt.Sprintf("%s is %v, expected a tensor in host memory", name, t)
	}
	return ""
}

// Float checks that t is a tensor of the backend in one of its Floats.
func (c *Checker) Float(name string, t *tensor.Tensor) {
	c.Own(name, t)
	if !c.Failed() && !slices.Contains(c.pol.Floats, t.DType()) {
		c.Failf("%s is %v, expected %s", name, t, list(c.pol.Floats))
	}
}

// DType checks that t is a tensor of the backend of dtype dt.
func (c *Checker) DType(name string, t *tensor.Tensor, dt tensor.DType) {
	c.Own(name, t)
	if !c.Failed() && t.DType() != dt {
		c.Failf("%s is %v, expected dtype %v", name, t, dt)
	}
}

// Like checks that t is a tensor of the backend with ref's dtype and shape.
func (c *Checker) Like(name string, t *tensor.Tensor, refName string, ref *tensor.Tensor) {
	if c.Failed() {
		return
	}
	c.DType(name, t, ref.DType())
	c.Shape(name, t, ref.Shape(), "to match "+refName)
}

// Side checks a side output (rstd, lse, losses) of an op computing in dt:
// Float32, or dt where the policy allows it.
func (c *Checker) Side(name string, t *tensor.Tensor, dt tensor.DType) {
	if !c.pol.SideFollowsOp {
		c.DType(name, t, tensor.Float32)
		return
	}
	c.Own(name, t)
	if !c.Failed() && t.DType() != tensor.Float32 && t.DType() != dt {
		c.Failf("%s is %v, expected dtype f32 (or %v like the op's inputs)", name, t, dt)
	}
}

// Shape checks t's shape against want; why completes the message.
func (c *Checker) Shape(name string, t *tensor.Tensor, want tensor.Shape, why string) {
	if c.Failed() || t.Shape().Equal(want) {
		return
	}
	if why != "" {
		why = " " + why
	}
	c.Failf("%s has shape %v, expected %v%s", name, t.Shape(), want, why)
}

// Rank checks that t has lo to hi dimensions.
func (c *Checker) Rank(name string, t *tensor.Tensor, lo, hi int) {
	if c.Failed() {
		return
	}
	switch r := len(t.Shape()); {
	case r >= lo && r <= hi:
	case lo == hi:
		c.Failf("%s has shape %v, expected %d dimensions", name, t.Shape(), lo)
	default:
		c.Failf("%s has shape %v, expected %d to %d dimensions", name, t.Shape(), lo, hi)
	}
}

// oneOf checks that t is a tensor of the backend with one of the dtypes dts;
// what names them in the message ("" for just the list).
func (c *Checker) oneOf(name string, t *tensor.Tensor, dts []tensor.DType, what string) {
	c.Own(name, t)
	if c.Failed() || slices.Contains(dts, t.DType()) {
		return
	}
	if what != "" {
		c.Failf("%s is %v, expected %s (%s)", name, t, what, list(dts))
		return
	}
	c.Failf("%s is %v, expected %s", name, t, list(dts))
}

// list writes dtypes as "f32", "f32 or f64", "f32, f64 or bf16".
func list(dts []tensor.DType) string {
	s := make([]string, len(dts))
	for i, d := range dts {
		s[i] = d.String()
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// Rows splits the shape of t (at least 1-D) into the number of rows (the
// product of all but the last dimension) and the row length.
func Rows(t *tensor.Tensor) (n, cols int) {
	s := t.Shape()
	return s[:len(s)-1].Numel(), s[len(s)-1]
}

// outer returns shape s without its last dimension.
func outer(s tensor.Shape) tensor.Shape { return s[:len(s)-1].Clone() }
