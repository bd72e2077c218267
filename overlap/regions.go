package overlap

import (
	"fmt"
	"github.com/asynctp/asynctp/comm"

	"github.com/asynctp/asynctp/tensor"
)

// The conjugate pairs of tensor parallelism (Megatron's mappings): each
// region's forward collective and, as its backward, the adjoint of it. The
// TP and EP layers are built from these and from the Strategy ops; they
// never call collectives of their own.
//
// Conventions, shared by every function below:
//   - c is the group the region spans (a TP or EP group), passed in.
//   - Destination first, as in tensor.Backend: (dst, src).
//   - s is the stream the backend b queues its ops on (nil on the CPU): the
//     result is ordered on s. A mapping that must consume its collective's
//     result (the last-dim gathers) waits on s itself and returns comm.Done.
//   - On a group of one rank each returns early: in-place ones do nothing,
//     the others copy src to dst (nothing when they are the same view).
//   - "Split" keeps this rank's part: part r of P equal parts.

// CopyToRegionForward — forward: identity (x is used as is by every rank).
func CopyToRegionForward(c comm.Comm, x *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	return comm.Done, nil
}

// CopyToRegionBackward — backward: all-reduce (sum) of dx, in place.
func CopyToRegionBackward(c comm.Comm, dx *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	return allReduceSum(c, "copy-to-region backward", dx, s)
}

// ReduceFromRegionForward — forward: all-reduce (sum) of x, in place.
func ReduceFromRegionForward(c comm.Comm, x *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	return allReduceSum(c, "reduce-from-region forward", x, s)
}

// ReduceFromRegionBackward — backward: identity.
func ReduceFromRegionBackward(c comm.Comm, dx *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	return comm.Done, nil
}

// ScatterToRegionForward — forward: split src (..., C) along the last dim
// into dst (..., C/P).
func ScatterToRegionForward(b tensor.Backend, c comm.Comm, dst, src *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	const op = "scatter-to-region forward"
	if c.Size() == 1 {
		return copyOne(b, c, op, dst, src)
	}
	return comm.Done, splitLastDim(b, c, op, dst, src)
}

// ScatterToRegionBackward — backward: all-gather ddst (..., C/P) along the
// last dim into dsrc (..., C).
func ScatterToRegionBackward(b tensor.Backend, c comm.Comm, dsrc, ddst *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	const op = "scatter-to-region backward"
	if c.Size() == 1 {
		return copyOne(b, c, op, dsrc, ddst)
	}
	return comm.Done, allGatherLastDim(b, c, op, dsrc, ddst, s)
}

// GatherFromRegionForward — forward: all-gather src (..., C/P) along the
// last dim into dst (..., C).
func GatherFromRegionForward(b tensor.Backend, c comm.Comm, dst, src *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	const op = "gather-from-region forward"
	if c.Size() == 1 {
		return copyOne(b, c, op, dst, src)
	}
	return comm.Done, allGatherLastDim(b, c, op, dst, src, s)
}

// GatherFromRegionBackward — backward: split ddst (..., C) along the last
// dim into dsrc (..., C/P).
func GatherFromRegionBackward(b tensor.Backend, c comm.Comm, dsrc, ddst *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	const op = "gather-from-region backward"
	if c.Size() == 1 {
		return copyOne(b, c, op, dsrc, ddst)
	}
	return comm.Done, splitLastDim(b, c, op, dsrc, ddst)
}

// SequenceGatherForward — forward: all-gather src (N/P, ...) along dim 0
// into dst (N, ...) (sequence parallelism: into a TP region).
func SequenceGatherForward(b tensor.Backend, c comm.Comm, dst, src *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	const op = "sequence-gather forward"
	if c.Size() == 1 {
		return copyOne(b, c, op, dst, src)
	}
	return wrap(op)(c.AllGather(dst, src, s))
}

// SequenceGatherBackward — backward: reduce-scatter (sum) ddst (N, ...)
// along dim 0 into dsrc (N/P, ...).
func SequenceGatherBackward(b tensor.Backend, c comm.Comm, dsrc, ddst *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	const op = "sequence-gather backward"
	if c.Size() == 1 {
		return copyOne(b, c, op, dsrc, ddst)
	}
	return wrap(op)(c.ReduceScatter(dsrc, ddst, comm.Sum, s))
}

// SequenceReduceScatterForward — forward: reduce-scatter (sum) src (N, ...)
// along dim 0 into dst (N/P, ...) (sequence parallelism: out of a TP region).
func SequenceReduceScatterForward(b tensor.Backend, c comm.Comm, dst, src *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	const op = "sequence-reduce-scatter forward"
	if c.Size() == 1 {
		return copyOne(b, c, op, dst, src)
	}
	return wrap(op)(c.ReduceScatter(dst, src, comm.Sum, s))
}

// SequenceReduceScatterBackward — backward: all-gather ddst (N/P, ...)
// along dim 0 into dsrc (N, ...).
func SequenceReduceScatterBackward(b tensor.Backend, c comm.Comm, dsrc, ddst *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	const op = "sequence-reduce-scatter backward"
	if c.Size() == 1 {
		return copyOne(b, c, op, dsrc, ddst)
	}
	return wrap(op)(c.AllGather(dsrc, ddst, s))
}

// AllToAllForward — forward: all-to-all of rows, sendCounts[j] rows of src
// to rank j, recvCounts[i] rows of dst from rank i (MoE dispatch).
func AllToAllForward(b tensor.Backend, c comm.Comm, dst, src *tensor.Tensor, sendCounts, recvCounts []int, s comm.Stream) (comm.Work, error) {
	const op = "all-to-all forward"
	if c.Size() == 1 {
		if err := comm.CheckAllToAllV(c, dst, src, sendCounts, recvCounts); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		return copyOne(b, c, op, dst, src)
	}
	return wrap(op)(c.AllToAllV(dst, src, sendCounts, recvCounts, s))
}

// AllToAllBackward — backward: all-to-all with the counts swapped: ddst's
// rows go back to the ranks they came from, into dsrc. Pass the forward's
// sendCounts and recvCounts unchanged.
func AllToAllBackward(b tensor.Backend, c comm.Comm, dsrc, ddst *tensor.Tensor, sendCounts, recvCounts []int, s comm.Stream) (comm.Work, error) {
	const op = "all-to-all backward"
	if c.Size() == 1 {
		if err := comm.CheckAllToAllV(c, dsrc, ddst, recvCounts, sendCounts); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		return copyOne(b, c, op, dsrc, ddst)
	}
	return wrap(op)(c.AllToAllV(dsrc, ddst, recvCounts, sendCounts, s))
}

func allReduceSum(c comm.Comm, op string, x *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	if c.Size() == 1 {
		if err := comm.CheckAllReduce(c, x, comm.Sum); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		return comm.Done, nil
	}
	return wrap(op)(c.AllReduce(x, comm.Sum, s))
}

// copyOne is the early return of a group of one rank: dst = src.
func copyOne(b tensor.Backend, c comm.Comm, op string, dst, src *tensor.Tensor) (comm.Work, error) {
	if dst == nil || src == nil || !dst.Shape().Equal(src.Shape()) || dst.DType() != src.DType() {
		return nil, comm.Errorf(c, op, "dst %v, src %v: expected the same shape and dtype on a group of one rank", dst, src)
	}
	if !sameView(dst, src) {
		b.Copy(dst, src)
	}
	return comm.Done, nil
}

func sameView(a, b *tensor.Tensor) bool {
	return a.Buffer() == b.Buffer() && a.Offset() == b.Offset() && a.Shape().Equal(b.Shape())
}

// wrap prefixes an op's error with the mapping's name.
func wrap(op string) func(comm.Work, error) (comm.Work, error) {
	return func(w comm.Work, err error) (comm.Work, error) {
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		return w, nil
	}
}
