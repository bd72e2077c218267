package local

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/internal/hostops"
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
				hostops.CopyElems(to.dst, r*part, from.src, 0, part)
			}
		}
	case comm.OpReduceScatter:
		part := cs[0].dst.Numel()
		srcs := make([]*tensor.Tensor, len(cs))
		for k, from := range cs {
			srcs[k] = from.src
		}
		for r, to := range cs {
			acc := hostops.Reduce(srcs, r*part, part, to.rop)
			hostops.Narrow(to.dst, acc)
		}
	case comm.OpAllReduce:
		bufs := make([]*tensor.Tensor, len(cs))
		for k, cl := range cs {
			bufs[k] = cl.dst
		}
		acc := hostops.Reduce(bufs, 0, cs[0].dst.Numel(), cs[0].rop)
		for _, cl := range cs {
			hostops.Narrow(cl.dst, acc)
		}
	case comm.OpBroadcast:
		root := cs[0].root
		for r, cl := range cs {
			if r != root {
				hostops.CopyElems(cl.dst, 0, cs[root].src, 0, cl.dst.Numel())
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
			hostops.CopyElems(to.dst, dstOff[j]*row, from.src, srcOff*row, n*row)
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
