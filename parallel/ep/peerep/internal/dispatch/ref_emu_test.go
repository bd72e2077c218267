//go:build asynctp_emu

package dispatch

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/asynctp/asynctp/tensor"
)

// The reference: one step of the whole world on the CPU, in float64,
// written from the protocol's contract and not from the kernels: the
// capacity rule as one counter per expert over the group's slots in
// order (source, token, choice), the two row orders as plain nested
// loops, and the combine, its backward and the dispatch backward as sums
// over each token's kept slots.

// world is the shape of an emulated world.
type world struct {
	P, E, K, C, Mt int
	dt             tensor.DType
}

func (w world) L() int { return w.E / w.P }

// R is the rows of a rank's receive buffers (RecvBound).
func (w world) R() int { return w.P * w.Mt * min(w.K, w.L()) }

func (w world) config(fused bool) Config {
	return Config{Ranks: w.P, Experts: w.E, TopK: w.K, Cols: w.C, MaxTokens: w.Mt, DType: w.dt, Fused: fused}
}

func (w world) String() string {
	return fmt.Sprintf("P%d/E%d/K%d/C%d/Mt%d/%v", w.P, w.E, w.K, w.C, w.Mt, w.dt)
}

// stepCase is what a step differs in: each rank's tokens, the capacity
// factor, and the pipelined path's row order (the fused path's is 0).
type stepCase struct {
	tokens []int
	cf     float64
	order  int
}

// slot is choice j of token n of source s.
type slot struct{ s, n, j int }

// refStep is a step's inputs for every rank and the reference's routing.
type refStep struct {
	stepCase
	w          world
	idx        [][]int32   // per source (N·K)
	x, dout    [][]float64 // per source (N·C), the tokens and ∂out
	wts        [][]float64 // per source (N·K), the routing weights
	y, g       [][]float64 // per destination (R·C): the expert outputs and the rows' gradients, in the step's order
	kept       [][]bool    // per source (N·K)
	expMajor   [][]slot    // per destination: its expert rows, expert-major (local expert, source, token, choice)
	recvOrder  [][]slot    // per destination: received order (source, local expert, token, choice)
	hdr        [][][]int   // [d][s]: source s's slots per expert (before the capacity), its tokens, the rows it sent d
	dropped    int
	empty, hot int // the expert no token chooses, and the one most do
}

// newStep draws a step of sc on w: K distinct experts per token, never
// expert empty, hot four times as likely as the others (so that a
// capacity drops slots); every value non-zero and exact in w.dt.
func newStep(w world, sc stepCase, seed uint64) *refStep {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	P, E, K, C, L := w.P, w.E, w.K, w.C, w.L()
	st := &refStep{stepCase: sc, w: w, empty: rng.IntN(E)}
	st.hot = (st.empty + 1 + rng.IntN(E-1)) % E
	val := func() float64 {
		v := rng.NormFloat64()
		if math.Abs(v) < 0.1 {
			v = math.Copysign(0.1, v)
		}
		return w.dt.Round(v)
	}
	vals := func(n int, f func() float64) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = f()
		}
		return v
	}
	for s := range P {
		N := sc.tokens[s]
		idx := make([]int32, 0, N*K)
		for range N {
			weight := make([]float64, E)
			for e := range E {
				weight[e] = 1
			}
			weight[st.empty], weight[st.hot] = 0, 4
			for range K { // without replacement
				tot := 0.0
				for _, v := range weight {
					tot += v
				}
				u, e := rng.Float64()*tot, 0
				for ; e < E-1 && u >= weight[e]; e++ {
					u -= weight[e]
				}
				for weight[e] == 0 { // the float sum's last ulp
					e--
				}
				idx = append(idx, int32(e))
				weight[e] = 0
			}
		}
		st.idx = append(st.idx, idx)
		st.x = append(st.x, vals(N*C, val))
		st.dout = append(st.dout, vals(N*C, val))
		st.wts = append(st.wts, vals(N*K, func() float64 { return w.dt.Round(0.1 + 0.9*rng.Float64()) }))
	}
	for range P {
		st.y = append(st.y, vals(w.R()*C, val))
		st.g = append(st.g, vals(w.R()*C, val))
	}

	// The capacity: each expert keeps its first capacity slots of the group's
	// slots in order, capacity = ⌈cf·T·K/E⌉ over the group's T tokens.
	T := 0
	for _, n := range sc.tokens {
		T += n
	}
	capacity := 0
	if sc.cf > 0 {
		capacity = int(math.Ceil(sc.cf * float64(T) * float64(K) / float64(E)))
	}
	seen := make([]int, E)
	for s := range P {
		kept := make([]bool, len(st.idx[s]))
		for i, e := range st.idx[s] {
			kept[i] = capacity == 0 || seen[e] < capacity
			seen[e]++
			if !kept[i] {
				st.dropped++
			}
		}
		st.kept = append(st.kept, kept)
	}

	st.hdr = make([][][]int, P)
	for d := range P {
		var em, ro []slot
		for el := range L {
			for s := range P {
				em = append(em, st.slotsOf(s, d*L+el)...)
			}
		}
		for s := range P {
			for el := range L {
				ro = append(ro, st.slotsOf(s, d*L+el)...)
			}
			h := make([]int, E+2)
			for n := range sc.tokens[s] {
				here := false
				for j := range K {
					e := int(st.idx[s][n*K+j])
					h[e]++
					here = here || e/L == d
				}
				if here {
					h[E+1]++
				}
			}
			h[E] = sc.tokens[s]
			st.hdr[d] = append(st.hdr[d], h)
		}
		st.expMajor = append(st.expMajor, em)
		st.recvOrder = append(st.recvOrder, ro)
	}
	return st
}

// slotsOf is source s's kept slots of expert e, in token then choice order.
func (st *refStep) slotsOf(s, e int) []slot {
	var out []slot
	for i, c := range st.idx[s] {
		if int(c) == e && st.kept[s][i] {
			out = append(out, slot{s, i / st.w.K, i % st.w.K})
		}
	}
	return out
}

// rows are rank d's expert rows in the given order.
func (st *refStep) rows(d, order int) []slot {
	if order == 1 {
		return st.recvOrder[d]
	}
	return st.expMajor[d]
}

// where is the destination rank and row (in the given order) of each kept
// slot.
func (st *refStep) where(order int) map[slot][2]int {
	m := map[slot][2]int{}
	for d := range st.w.P {
		for i, sl := range st.rows(d, order) {
			m[sl] = [2]int{d, i}
		}
	}
	return m
}

// eachKept calls f for each kept slot (n, j) of source s, in token then
// choice order, with its destination rank d and row i in the given order.
func (st *refStep) eachKept(s, order int, f func(n, j, d, i int)) {
	at := st.where(order)
	for n := range st.tokens[s] {
		for j := range st.w.K {
			if p, ok := at[slot{s, n, j}]; ok {
				f(n, j, p[0], p[1])
			}
		}
	}
}

// nan is n NaNs: the rows the engine must leave alone.
func nan(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = math.NaN()
	}
	return v
}

// recv is rank d's receive buffer (R, C) after the dispatch: the token row
// of each expert row, NaN past them.
func (st *refStep) recv(d, order int) []float64 {
	C := st.w.C
	out := nan(st.w.R() * C)
	for i, sl := range st.rows(d, order) {
		copy(out[i*C:(i+1)*C], st.x[sl.s][sl.n*C:(sl.n+1)*C])
	}
	return out
}

// combine is source s's out (N, C) = Σ_j w[n, j]·y(slot (n, j)) over the
// kept slots.
func (st *refStep) combine(s, order int) []float64 {
	K, C := st.w.K, st.w.C
	out := make([]float64, st.tokens[s]*C)
	st.eachKept(s, order, func(n, j, d, i int) {
		for c := range C {
			out[n*C+c] += st.wts[s][n*K+j] * st.y[d][i*C+c]
		}
	})
	return out
}

// dweights is source s's (N, K) ⟨∂out[n], y(slot (n, j))⟩, 0 where dropped.
func (st *refStep) dweights(s, order int) []float64 {
	K, C := st.w.K, st.w.C
	out := make([]float64, st.tokens[s]*K)
	st.eachKept(s, order, func(n, j, d, i int) {
		for c := range C {
			out[n*K+j] += st.dout[s][n*C+c] * st.y[d][i*C+c]
		}
	})
	return out
}

// dy is rank d's (R, C) combine backward rows: w[n, j]·∂out[n] per expert
// row, NaN past them.
func (st *refStep) dy(d, order int) []float64 {
	K, C := st.w.K, st.w.C
	out := nan(st.w.R() * C)
	for i, sl := range st.rows(d, order) {
		for c := range C {
			out[i*C+c] = st.wts[sl.s][sl.n*K+sl.j] * st.dout[sl.s][sl.n*C+c]
		}
	}
	return out
}

// dx is source s's (N, C) Σ_j g(slot (n, j)) over the kept slots.
func (st *refStep) dx(s, order int) []float64 {
	C := st.w.C
	out := make([]float64, st.tokens[s]*C)
	st.eachKept(s, order, func(n, _, d, i int) {
		for c := range C {
			out[n*C+c] += st.g[d][i*C+c]
		}
	})
	return out
}

// offsets are rank d's (L+1) expert-major row offsets.
func (st *refStep) offsets(d int) []int32 {
	L := st.w.L()
	off := make([]int32, L+1)
	for el := range L {
		n := 0
		for s := range st.w.P {
			n += len(st.slotsOf(s, d*L+el))
		}
		off[el+1] = off[el] + int32(n)
	}
	return off
}

// pos is source s's (N, K) slot table: n·K + j where kept, else −1.
func (st *refStep) pos(s int) []int32 {
	out := make([]int32, len(st.kept[s]))
	for i, k := range st.kept[s] {
		out[i] = -1
		if k {
			out[i] = int32(i)
		}
	}
	return out
}

// compare checks got against want (NaN in want: the value must still be
// the NaN poison), exactly when tol is 0, else within tol·max(1, |want|).
func compare(what string, cols int, got, want []float64, tol float64) error {
	if len(got) != len(want) {
		return fmt.Errorf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		switch {
		case math.IsNaN(w) && !math.IsNaN(g):
			return fmt.Errorf("%s[%d, %d] = %v, want it left alone (still the NaN poison)", what, i/cols, i%cols, g)
		case math.IsNaN(w):
		case math.IsNaN(g) || math.Abs(g-w) > tol*max(1, math.Abs(w)):
			return fmt.Errorf("%s[%d, %d] = %v, want %v (tolerance %v)", what, i/cols, i%cols, g, w, tol)
		}
	}
	return nil
}
