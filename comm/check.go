package comm

import (
	"fmt"
	"math"

	"github.com/asynctp/asynctp/tensor"
)

// Op names, as they appear in errors.
const (
	OpAllGather     = "all-gather"
	OpReduceScatter = "reduce-scatter"
	OpAllReduce     = "all-reduce"
	OpAllToAllV     = "all-to-all-v"
	OpBroadcast     = "broadcast"
	OpBarrier       = "barrier"
	OpSplit         = "split"
)

// Error is the error of one op on one rank: which op, on which group and
// rank, and why (Err says what was expected and what was found, and may wrap
// ErrTimeout, ErrMismatch...). Transports return it (possibly wrapped), so
// callers can find it with errors.As.
type Error struct {
	Op    string // "all-gather", ..., or a mapping/strategy name
	Group string // the Comm's Name
	Rank  int    // the rank in the group
	Err   error  // what was expected and what was found (may wrap ErrTimeout, ErrMismatch...)
}

// Error is "op on group, rank r: err".
func (e *Error) Error() string {
	return fmt.Sprintf("%s on %s, rank %d: %v", e.Op, e.Group, e.Rank, e.Err)
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// Errorf makes an *Error for op on c's rank, formatting Err like fmt.Errorf
// (so %w wraps).
func Errorf(c Comm, op, format string, args ...any) error {
	return &Error{Op: op, Group: c.Name(), Rank: c.Rank(), Err: fmt.Errorf(format, args...)}
}

// CheckAllGather checks the local preconditions of AllGather: same dtype and
// device, dst (Size·R, ...) for src (R, ...).
func CheckAllGather(c Comm, dst, src *tensor.Tensor) error {
	if err := checkPair(c, OpAllGather, dst, src); err != nil {
		return err
	}
	if want := scaleRows(src.Shape(), c.Size()); !dst.Shape().Equal(want) {
		return Errorf(c, OpAllGather, "dst %v: expected shape %v (%d ranks × src %v)", dst, want, c.Size(), src.Shape())
	}
	return nil
}

// CheckReduceScatter checks the local preconditions of ReduceScatter: same
// dtype and device, a reducible dtype, src (Size·R, ...) for dst (R, ...).
func CheckReduceScatter(c Comm, dst, src *tensor.Tensor, op ReduceOp) error {
	if err := checkPair(c, OpReduceScatter, dst, src); err != nil {
		return err
	}
	if err := checkReducible(c, OpReduceScatter, src, op); err != nil {
		return err
	}
	if want := scaleRows(dst.Shape(), c.Size()); !src.Shape().Equal(want) {
		return Errorf(c, OpReduceScatter, "src %v: expected shape %v (%d ranks × dst %v)", src, want, c.Size(), dst.Shape())
	}
	return nil
}

// CheckAllReduce checks the local preconditions of AllReduce.
func CheckAllReduce(c Comm, buf *tensor.Tensor, op ReduceOp) error {
	if buf == nil {
		return Errorf(c, OpAllReduce, "nil buf")
	}
	return checkReducible(c, OpAllReduce, buf, op)
}

// CheckAllToAllV checks the local preconditions of AllToAllV: same dtype,
// device and row shape, Size non-negative counts on each side, summing to
// the rows of src and dst.
func CheckAllToAllV(c Comm, dst, src *tensor.Tensor, sendCounts, recvCounts []int) error {
	if err := checkPair(c, OpAllToAllV, dst, src); err != nil {
		return err
	}
	if len(dst.Shape()) == 0 || len(src.Shape()) == 0 {
		return Errorf(c, OpAllToAllV, "dst %v, src %v: expected tensors with a first dimension", dst, src)
	}
	if !tensor.Shape(dst.Shape()[1:]).Equal(src.Shape()[1:]) {
		return Errorf(c, OpAllToAllV, "dst %v, src %v: expected the same shape after the first dim", dst, src)
	}
	for _, side := range []struct {
		name   string
		counts []int
		t      *tensor.Tensor
	}{{"sendCounts", sendCounts, src}, {"recvCounts", recvCounts, dst}} {
		if len(side.counts) != c.Size() {
			return Errorf(c, OpAllToAllV, "%s %v: expected %d counts (one per rank), found %d", side.name, side.counts, c.Size(), len(side.counts))
		}
		total := 0
		for j, n := range side.counts {
			if n < 0 {
				return Errorf(c, OpAllToAllV, "%s[%d] = %d: expected a count ≥ 0", side.name, j, n)
			}
			total += n
		}
		if total != side.t.Dim(0) {
			return Errorf(c, OpAllToAllV, "%s %v sum to %d rows: expected the %d rows of %v", side.name, side.counts, total, side.t.Dim(0), side.t)
		}
	}
	return nil
}

// CheckBroadcast checks the local preconditions of Broadcast.
func CheckBroadcast(c Comm, buf *tensor.Tensor, root int) error {
	if buf == nil {
		return Errorf(c, OpBroadcast, "nil buf")
	}
	if root < 0 || root >= c.Size() {
		return Errorf(c, OpBroadcast, "root %d: expected a rank in [0, %d)", root, c.Size())
	}
	if buf.DType().Size() == 0 {
		return Errorf(c, OpBroadcast, "buf %v: invalid dtype", buf)
	}
	return nil
}

func checkPair(c Comm, op string, dst, src *tensor.Tensor) error {
	if dst == nil || src == nil {
		return Errorf(c, op, "expected dst and src, found dst %v, src %v", dst, src)
	}
	if dst.DType() != src.DType() {
		return Errorf(c, op, "dst %v, src %v: expected the same dtype", dst, src)
	}
	if dst.DType().Size() == 0 {
		return Errorf(c, op, "dst %v: invalid dtype", dst)
	}
	if dst.Device() != src.Device() {
		return Errorf(c, op, "dst %v, src %v: expected the same device", dst, src)
	}
	return nil
}

func checkReducible(c Comm, op string, t *tensor.Tensor, rop ReduceOp) error {
	if rop > Max {
		return Errorf(c, op, "reduction %v: expected sum, avg or max", rop)
	}
	switch dt := t.DType(); {
	case dt.IsFloat():
	case dt == tensor.Int32 && rop != Avg:
	default:
		return Errorf(c, op, "%v with %v: expected a float dtype (or i32 for sum and max)", t, rop)
	}
	return nil
}

// scaleRows is s with its first dim multiplied by n (a scalar shape gets
// one).
func scaleRows(s tensor.Shape, n int) tensor.Shape {
	if len(s) == 0 {
		return tensor.Shape{n}
	}
	out := s.Clone()
	out[0] *= n
	return out
}

// CheckSplit validates the arguments of Split for transports whose native
// split takes 32-bit colors and keys (NCCL, NVSHMEM): color in
// [0, MaxInt32] or NoColor, key a 32-bit integer.
func CheckSplit(c Comm, color, key int) error {
	if color < 0 && color != NoColor || color > math.MaxInt32 {
		return Errorf(c, OpSplit, "color %d: expected 0 ≤ color ≤ %d, or comm.NoColor (%d)", color, math.MaxInt32, NoColor)
	}
	if key < math.MinInt32 || key > math.MaxInt32 {
		return Errorf(c, OpSplit, "key %d: expected a 32-bit integer", key)
	}
	return nil
}
