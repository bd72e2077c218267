package local

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// execute runs the op of a slot whose ranks have all arrived with matching
// calls, for every rank at once. It is the only code that touches another
// rank's buffers, and it runs on one goroutine: the closing of the slot's
// done channel publishes its writes to the waiting ranks.
//
// Reductions accumulate in float64 in rank order (rank 0 first), then round
// once to the dtype, so the result is deterministic and bit-identical on
// every rank.
func (g *group) execute(s *slot) error {
	cs := s.calls
	switch cs[0].op {
	case comm.OpBarrier:
		return nil
	case comm.OpSplit:
		return g.split(cs)
	case comm.OpAllGather:
		part := cs[0].src.Numel()
		for _, to := range cs {
			for r, from := range cs {
				copyElems(to.dst, r*part, from.src, 0, part)
			}
		}
	case comm.OpReduceScatter:
		part := cs[0].dst.Numel()
		srcs := make([]*tensor.Tensor, len(cs))
		for k, from := range cs {
			srcs[k] = from.src
		}
		for r, to := range cs {
			acc := reduce(srcs, r*part, part, to.rop)
			store(to.dst, acc)
		}
	case comm.OpAllReduce:
		bufs := make([]*tensor.Tensor, len(cs))
		for k, cl := range cs {
			bufs[k] = cl.dst
		}
		acc := reduce(bufs, 0, cs[0].dst.Numel(), cs[0].rop)
		for _, cl := range cs {
			store(cl.dst, acc)
		}
	case comm.OpBroadcast:
		root := cs[0].root
		for r, cl := range cs {
			if r != root {
				copyElems(cl.dst, 0, cs[root].src, 0, cl.dst.Numel())
			}
		}
	case comm.OpAllToAllV:
		return allToAllV(s.seq, cs)
	default:
		return fmt.Errorf("call #%d: unknown op %q", s.seq, cs[0].op)
	}
	return nil
}

// allToAllV checks that the counts of every pair of ranks agree, then moves
// part j of rank i's src into part i of rank j's dst.
func allToAllV(seq uint64, cs []*call) error {
	for i, from := range cs {
		for j, to := range cs {
			if from.send[j] != to.recv[i] {
				return fmt.Errorf("call #%d: rank %d sends %d rows to rank %d, which expects %d from it (%w)",
					seq, i, from.send[j], j, to.recv[i], comm.ErrMismatch)
			}
		}
	}
	row := tensor.Shape(cs[0].src.Shape()[1:]).Numel()
	dstOff := make([]int, len(cs)) // next row of each dst
	for _, from := range cs {
		srcOff := 0
		for j, to := range cs {
			n := from.send[j]
			copyElems(to.dst, dstOff[j]*row, from.src, srcOff*row, n*row)
			srcOff += n
			dstOff[j] += n
		}
	}
	return nil
}

// split forms the new groups: by color, ordered by key then old rank.
func (g *group) split(cs []*call) error {
	byColor := map[int][]int{}
	for r, cl := range cs {
		if cl.color >= 0 {
			byColor[cl.color] = append(byColor[cl.color], r)
		} else if cl.color != comm.NoColor {
			return fmt.Errorf("rank %d: color %d: expected ≥ 0 or comm.NoColor (%d)", r, cl.color, comm.NoColor)
		}
	}
	for color, ranks := range byColor {
		slices.SortStableFunc(ranks, func(a, b int) int { return cmp.Compare(cs[a].key, cs[b].key) })
		members := make([]int, len(ranks))
		for i, r := range ranks {
			members[i] = g.members[r]
		}
		label := cs[ranks[0]].label
		if label == "" {
			label = fmt.Sprintf("%s/%d", g.label, color)
		}
		ng := newGroup(g.w, label, members)
		for i, r := range ranks {
			cs[r].out = &Comm{g: ng, rank: i}
		}
	}
	return nil
}

// copyElems copies n elements of src from sOff to dst at dOff (same dtype,
// host tensors; checked before).
func copyElems(dst *tensor.Tensor, dOff int, src *tensor.Tensor, sOff, n int) {
	if n == 0 {
		return
	}
	switch dst.DType() {
	case tensor.Float32:
		copy(dst.F32()[dOff:dOff+n], src.F32()[sOff:sOff+n])
	case tensor.Float64:
		copy(dst.F64()[dOff:dOff+n], src.F64()[sOff:sOff+n])
	case tensor.Int32:
		copy(dst.I32()[dOff:dOff+n], src.I32()[sOff:sOff+n])
	case tensor.BFloat16:
		copy(dst.BF16()[dOff:dOff+n], src.BF16()[sOff:sOff+n])
	}
}

// reduce returns the reduction of elements [off, off+n) of every tensor, in
// order, in float64 (Avg already divided).
func reduce(ts []*tensor.Tensor, off, n int, op comm.ReduceOp) []float64 {
	acc := make([]float64, n)
	for k, t := range ts {
		v := load(t, off, n)
		if k == 0 {
			copy(acc, v)
			continue
		}
		for i := range acc {
			if op == comm.Max {
				acc[i] = math.Max(acc[i], v[i])
			} else {
				acc[i] += v[i]
			}
		}
	}
	if op == comm.Avg {
		for i := range acc {
			acc[i] /= float64(len(ts))
		}
	}
	return acc
}

// load widens elements [off, off+n) of t to float64.
func load(t *tensor.Tensor, off, n int) []float64 {
	out := make([]float64, n)
	switch t.DType() {
	case tensor.Float32:
		for i, x := range t.F32()[off : off+n] {
			out[i] = float64(x)
		}
	case tensor.Float64:
		copy(out, t.F64()[off:off+n])
	case tensor.Int32:
		for i, x := range t.I32()[off : off+n] {
			out[i] = float64(x)
		}
	case tensor.BFloat16:
		for i, x := range t.BF16()[off : off+n] {
			out[i] = float64(tensor.BF16ToFloat32(x))
		}
	}
	return out
}

// store rounds acc to t's dtype (bf16 through float32) into t.
func store(t *tensor.Tensor, acc []float64) {
	switch t.DType() {
	case tensor.Float32:
		d := t.F32()
		for i, v := range acc {
			d[i] = float32(v)
		}
	case tensor.Float64:
		copy(t.F64(), acc)
	case tensor.Int32:
		d := t.I32()
		for i, v := range acc {
			d[i] = int32(int64(v)) // wraps like int32 arithmetic
		}
	case tensor.BFloat16:
		d := t.BF16()
		for i, v := range acc {
			d[i] = tensor.BF16FromFloat32(float32(v))
		}
	}
}
