package eptest

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/asynctp/asynctp/tensor"
)

// slot names one token-slot of the step: token n of token-group rank q,
// choice j (slot s = n·K + j of that rank).
type slot struct{ q, n, j int }

// world is the float64 reference of one step, the same on every rank: every
// token-group rank's tokens, choices, weights and the rows the suite plays
// for the experts' outputs and gradients, and the routing they make under
// the drop rule of layers.RoutingPlan (derived here independently).
type world struct {
	sc      Scenario
	step    int
	E, K, C int
	P, Q    int // EP and token-group sizes
	cap     int // kept slots per expert; 0: dropless
	n       []int
	idx     [][]int32 // (Q) the (N_q·K) choices of each token-group rank
	kept    [][]bool  // (Q) the (N_q·K) kept flags
	routed  []int     // (E) slots routed to each expert over the token group
	keptE   [][]int   // (Q, E) slots kept per expert, per token-group rank
	x, w    []mat     // (Q) tokens (N_q, C), weights (N_q, K)
	y, g    []mat     // (Q) per slot (N_q·K, C): the expert output and the received-row gradient the suite plays
	dout    []mat     // (Q) (N_q, C) the combine's output gradient
	dropped int
}

// genMat is the seeded matrix `what` of token-group rank q in the step,
// rounded to dt so the reference sees exactly what the path sees; every
// rank can make every rank's. Values are in ±[0.25, 1): no zero, so a
// missing term always shows.
func genMat(seed uint64, dt tensor.DType, sc Scenario, step, q int, what string, rows, cols int) mat {
	rng := rngFor(seed, sc, step, q, what)
	m := zeros(rows, cols)
	for i := range m.v {
		v := 0.25 + 0.75*rng.Float64()
		if rng.IntN(2) == 0 {
			v = -v
		}
		m.v[i] = dt.Round(v)
	}
	return m
}

func rngFor(seed uint64, sc Scenario, step, q int, what string) *rand.Rand {
	h := uint64(14695981039346656037)
	for _, ch := range fmt.Sprintf("%s/%s/%d/%d", sc.Name, what, step, q) {
		h = (h ^ uint64(ch)) * 1099511628211
	}
	return rand.New(rand.NewPCG(seed, h))
}

// newWorld builds the reference of step `step` of scenario sc over a token
// group of Q ranks whose EP groups have P ranks.
func newWorld(seed uint64, dt tensor.DType, sc Scenario, step, P, Q int) (*world, error) {
	E, K, C := sc.Experts(P), sc.TopK, sc.Cols
	wd := &world{sc: sc, step: step, E: E, K: K, C: C, P: P, Q: Q, routed: make([]int, E)}
	allowed := sc.allowed(E, P)
	if len(allowed) < K {
		return nil, fmt.Errorf("scenario %s: %d experts may be chosen over EP %d, expected at least top-%d", sc.Name, len(allowed), P, K)
	}
	T := 0
	for q := range Q {
		n := sc.Tokens(step, q)
		T += n
		wd.n = append(wd.n, n)
		rng := rngFor(seed, sc, step, q, "idx")
		idx := make([]int32, 0, n*K)
		for t := range n {
			// The favourite is every token's choice (with top-1, every
			// even token's), at a random position among its K: it
			// overflows any capacity below T (T/2 with top-1).
			fav := sc.Favour >= 0 && (K > 1 || t%2 == 0)
			choice := make([]int32, 0, K)
			for _, p := range rng.Perm(len(allowed)) {
				if e := allowed[p]; !fav || e != sc.Favour {
					choice = append(choice, int32(e))
				}
			}
			if fav {
				choice = append([]int32{int32(sc.Favour)}, choice...)
				j := rng.IntN(K)
				choice[0], choice[j] = choice[j], choice[0]
			}
			choice = choice[:K]
			idx = append(idx, choice...)
		}
		wd.idx = append(wd.idx, idx)
		wd.x = append(wd.x, genMat(seed, dt, sc, step, q, "x", n, C))
		wd.w = append(wd.w, genMat(seed, dt, sc, step, q, "weights", n, K))
		wd.y = append(wd.y, genMat(seed, dt, sc, step, q, "y", n*K, C))
		wd.g = append(wd.g, genMat(seed, dt, sc, step, q, "g", n*K, C))
		wd.dout = append(wd.dout, genMat(seed, dt, sc, step, q, "dout", n, C))
	}
	if sc.CapacityFactor > 0 {
		wd.cap = int(math.Ceil(sc.CapacityFactor * float64(T*K) / float64(E)))
	}
	// The drop rule: each expert keeps its first cap slots in token-group
	// order (rank 0's tokens first, each rank's in token then choice order).
	for q := range Q {
		kept := make([]bool, len(wd.idx[q]))
		ke := make([]int, E)
		for s, e := range wd.idx[q] {
			if wd.cap == 0 || wd.routed[e] < wd.cap {
				kept[s] = true
				ke[e]++
			} else {
				wd.dropped++
			}
			wd.routed[e]++
		}
		wd.kept = append(wd.kept, kept)
		wd.keptE = append(wd.keptE, ke)
	}
	return wd, nil
}

// owner is the EP rank that holds expert e.
func (wd *world) owner(e int) int { return e / (wd.E / wd.P) }

// recvOrder lists the slots EP rank me receives (base is the token-group
// rank of EP rank 0 of its group), in the documented order: source rank,
// then local expert, then the source's token order.
func (wd *world) recvOrder(base, me int) []slot {
	L := wd.E / wd.P
	var out []slot
	for s := range wd.P {
		q := base + s
		for e := me * L; e < (me+1)*L; e++ {
			for i, c := range wd.idx[q] {
				if int(c) == e && wd.kept[q][i] {
					out = append(out, slot{q, i / wd.K, i % wd.K})
				}
			}
		}
	}
	return out
}

// expertOrder is the same slots in expert order: local expert, then source
// rank, then token order.
func (wd *world) expertOrder(base, me int) []slot {
	L := wd.E / wd.P
	var out []slot
	for e := me * L; e < (me+1)*L; e++ {
		for s := range wd.P {
			q := base + s
			for i, c := range wd.idx[q] {
				if int(c) == e && wd.kept[q][i] {
					out = append(out, slot{q, i / wd.K, i % wd.K})
				}
			}
		}
	}
	return out
}

// rowsOf stacks, for each slot, the row f gives.
func (wd *world) rowsOf(slots []slot, f func(slot) []float64) mat {
	m := zeros(len(slots), wd.C)
	for i, s := range slots {
		copy(m.v[i*wd.C:(i+1)*wd.C], f(s))
	}
	return m
}

func (wd *world) xRow(s slot) []float64 { return wd.x[s.q].row(s.n) }
func (wd *world) yRow(s slot) []float64 { return wd.y[s.q].row(s.n*wd.K + s.j) }
func (wd *world) gRow(s slot) []float64 { return wd.g[s.q].row(s.n*wd.K + s.j) }

// dyRow is ∂L/∂y of a slot: its weight times the token's output gradient.
func (wd *world) dyRow(s slot) []float64 {
	r := append([]float64(nil), wd.dout[s.q].row(s.n)...)
	for i := range r {
		r[i] *= wd.w[s.q].at(s.n, s.j)
	}
	return r
}

// combine is Σ_j w[n, j]·rows(slot (n, j)) over the kept slots of token
// group rank q's tokens, with w nil meaning 1.
func (wd *world) combine(q int, rows mat, w *mat) mat {
	out := zeros(wd.n[q], wd.C)
	for n := range wd.n[q] {
		for j := range wd.K {
			if !wd.kept[q][n*wd.K+j] {
				continue
			}
			c := 1.0
			if w != nil {
				c = w.at(n, j)
			}
			for k, v := range rows.row(n*wd.K + j) {
				out.v[n*wd.C+k] += c * v
			}
		}
	}
	return out
}

// dweights is ⟨dout[n], y(slot (n, j))⟩ for the kept slots, 0 for dropped.
func (wd *world) dweights(q int) mat {
	out := zeros(wd.n[q], wd.K)
	for n := range wd.n[q] {
		for j := range wd.K {
			if wd.kept[q][n*wd.K+j] {
				out.v[n*wd.K+j] = dot(wd.dout[q].row(n), wd.y[q].row(n*wd.K+j))
			}
		}
	}
	return out
}
