package commtest

import (
	"fmt"
	"slices"
	"sync"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// checkGroup checks that r.c is the group of the given world ranks, in that
// order: its size, this rank's place, and an all-gather of world ranks.
func (r *rank) checkGroup(what string, want []int) {
	r.tb.Helper()
	if r.c.Size() != len(want) {
		r.fatalf("%s: size %d, want %d (world ranks %v)", what, r.c.Size(), len(want), want)
	}
	if i := slices.Index(want, r.world.Rank()); r.c.Rank() != i {
		r.fatalf("%s: rank %d, want %d (world ranks %v)", what, r.c.Rank(), i, want)
	}
	src := r.tensor(tensor.Float32, []float64{float64(r.world.Rank())}, 1)
	dst := r.alloc(tensor.Float32, len(want))
	w, err := r.c.AllGather(dst, src, r.cfg.stream)
	r.done(what+": all-gather of world ranks", w, err)
	var wantF []float64
	for _, q := range want {
		wantF = append(wantF, float64(q))
	}
	r.expect(what+": world ranks", dst, wantF, 0)
}

// worldRanks lists the ranks q of a world of n with f(q) == f(me).
func worldRanks(n, me int, f func(q int) int) []int {
	var out []int
	for q := range n {
		if f(q) == f(me) {
			out = append(out, q)
		}
	}
	return out
}

// splitCases: two colors (parity) with reversed keys, ops on the new groups,
// and a split of a split into single ranks.
func splitCases(r *rank) {
	p, me := r.c.Size(), r.c.Rank()
	sub, err := r.c.Split(me%2, -me)
	if err != nil {
		r.fatalf("split(parity, -rank): %v", err)
	}
	want := worldRanks(p, me, func(q int) int { return q % 2 })
	slices.Reverse(want)
	rs := r.on(sub)
	rs.checkGroup("split(parity, -rank)", want)
	rs.allReduce("split all-reduce", tensor.Float32, comm.Sum, 5)
	rs.reduceScatter("split reduce-scatter", tensor.Float64, comm.Avg, 2, 2)
	rs.allToAll("split all-to-all-v", tensor.Float32, uneven, 2)
	rs.broadcast("split broadcast", tensor.Float32, sub.Size()-1, 3)

	one, err := sub.Split(sub.Rank(), 0)
	if err != nil {
		rs.fatalf("split into single ranks: %v", err)
	}
	r1 := r.on(one)
	r1.checkGroup("split of split", []int{me})
	r1.allReduce("single all-reduce", tensor.BFloat16, comm.Avg, 3)
	r1.allGather("single all-gather", tensor.Float32, []int{2, 2}, false)
	r1.reduceScatter("single reduce-scatter", tensor.Float32, comm.Max, 2)
	r1.allToAll("single all-to-all-v", tensor.Int32, uneven, 2)
	if err := one.Close(); err != nil {
		r1.errorf("close: %v", err)
	}
	if err := sub.Close(); err != nil {
		rs.errorf("close: %v", err)
	}
}

// noColorCase: the last rank passes comm.NoColor and gets no group.
func noColorCase(r *rank) {
	p, me := r.c.Size(), r.c.Rank()
	if p < 2 {
		return
	}
	color := 0
	if me == p-1 {
		color = comm.NoColor
	}
	g, err := r.c.Split(color, me)
	if err != nil {
		r.fatalf("split with NoColor: %v", err)
	}
	if me == p-1 {
		if g != nil {
			r.errorf("split with NoColor: got group %s, want nil", g.Name())
		}
		return
	}
	rg := r.on(g)
	rg.checkGroup("split without the last rank", worldRanks(p-1, me, func(int) int { return 0 }))
	rg.allReduce("no-color all-reduce", tensor.Float32, comm.Max, 4)
	if err := g.Close(); err != nil {
		rg.errorf("close: %v", err)
	}
}

// concurrentCase: each rank drives two groups (pairs and parity) from two
// goroutines at once.
func concurrentCase(r *rank) {
	p, me := r.c.Size(), r.c.Rank()
	pairs, err := r.c.Split(me/2, me)
	if err != nil {
		r.fatalf("split pairs: %v", err)
	}
	parity, err := r.c.Split(me%2, me)
	if err != nil {
		r.fatalf("split parity: %v", err)
	}
	r.on(pairs).checkGroup("pairs", worldRanks(p, me, func(q int) int { return q / 2 }))
	r.on(parity).checkGroup("parity", worldRanks(p, me, func(q int) int { return q % 2 }))
	var wg sync.WaitGroup
	for _, g := range []comm.Comm{pairs, parity} {
		rg := r.on(g)
		wg.Go(func() {
			rg.guard(func() {
				for i := range 6 {
					rg.allReduce(fmt.Sprintf("concurrent all-reduce %d", i), tensor.Float32, comm.Sum, 33)
					rg.allGather(fmt.Sprintf("concurrent all-gather %d", i), tensor.BFloat16, []int{2, 3}, false)
				}
			})
		})
	}
	wg.Wait()
	pairs.Close()
	parity.Close()
}

// gridCases: comm.NewGrid's TP, DP, EP and EDP groups over this transport.
func gridCases(r *rank) {
	p, me := r.c.Size(), r.c.Rank()
	type shape struct{ dp, tp, ep int }
	shapes := []shape{{p, 1, p}, {1, p, 1}}
	if p%2 == 0 && p > 2 {
		shapes = append(shapes, shape{p / 2, 2, p / 2})
	}
	for _, s := range shapes {
		what := fmt.Sprintf("grid dp %d × tp %d, ep %d", s.dp, s.tp, s.ep)
		g, err := comm.NewGrid(r.c, s.dp, s.tp, s.ep)
		if err != nil {
			r.fatalf("%s: %v", what, err)
		}
		for _, grp := range []struct {
			name string
			c    comm.Comm
			f    func(q int) int
		}{
			{"tp", g.TPGroup, func(q int) int { return q / s.tp }},
			{"dp", g.DPGroup, func(q int) int { return q % s.tp }},
			{"ep", g.EPGroup, func(q int) int { return q / s.ep }},
			{"edp", g.EDPGroup, func(q int) int { return q % s.ep }},
		} {
			rg := r.on(grp.c)
			rg.checkGroup(what+" "+grp.name, worldRanks(p, me, grp.f))
			rg.allReduce(what+" "+grp.name+" all-reduce", tensor.Float32, comm.Sum, 3)
		}
		if err := g.Close(); err != nil {
			r.errorf("%s: close: %v", what, err)
		}
	}
}
