package ablate

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Answer is the report's short answer for one op at one world size over
// one transport in one dtype (a layer cell: op and its sequence
// parallelism): the strategy to use and by how much, over all the op's
// cells there (shapes, token counts, directions). Each other strategy is
// compared with collective by the per-round geometric mean of its cells'
// time ratios (each cell weighing the same), with the interval and
// verdict of Stats; the choice among them is pick's. At world 1 there is
// nothing to exchange: collective, and the comparisons are the cost of the
// other strategies' machinery.
type Answer struct {
	Op        Op     `json:"op"`
	Dir       string `json:"dir,omitempty"` // a layer cell's sp or nosp
	World     int    `json:"world"`
	Transport string `json:"transport"`
	DType     string `json:"dtype"`
	Use       string `json:"use"`
	// Significant: the choice rests on a significant difference (pick).
	Significant bool   `json:"significant"`
	Basis       string `json:"basis"`
	// Vs are the other strategies' comparisons with collective.
	Vs []AnswerVs `json:"vs,omitempty"`
}

// AnswerVs is one strategy against collective over an answer's cells.
type AnswerVs struct {
	Strategy string   `json:"strategy"`
	Interval Interval `json:"interval"`
	// Cells: how many cells were compared, and of them how many are
	// faster and slower beyond the noise (the rest: no significant
	// difference).
	Cells  int `json:"cells"`
	Faster int `json:"faster"`
	Slower int `json:"slower"`
}

// label is the op as the answer names it.
func (a Answer) label() string {
	if a.Dir != "" {
		return string(a.Op) + " " + a.Dir
	}
	return string(a.Op)
}

// answerAcc is one answer's timed cell comparisons (answerGroups groups
// them): per strategy, the pairs (strategy rounds, collective rounds) of
// its cells, and the cells (their verdicts).
type answerAcc struct {
	a     Answer
	pairs map[string][][2][]float64
	cells map[string][]*Result
}

func answerKey(r Result) (Answer, string) {
	a := Answer{Op: r.Op, World: r.World, Transport: r.Transport, DType: r.DType}
	if r.Op.IsLayer() {
		a.Dir = r.Dir
	}
	return a, fmt.Sprintf("%s|%s|%d|%s|%s", a.Op, a.Dir, a.World, a.Transport, a.DType)
}

func answerGroups(rs []Result) []*answerAcc {
	coll := map[string][]float64{}
	for _, r := range rs {
		if r.Strategy == Collective && r.Timed() && len(r.TimesUS) > 0 {
			coll[r.Group()] = r.TimesUS
		}
	}
	accs := map[string]*answerAcc{}
	var order []*answerAcc
	for i := range rs {
		r := &rs[i]
		c, ok := coll[r.Group()]
		if !ok {
			continue
		}
		a, k := answerKey(*r)
		acc := accs[k]
		if acc == nil {
			acc = &answerAcc{a: a, pairs: map[string][][2][]float64{}, cells: map[string][]*Result{}}
			accs[k] = acc
			order = append(order, acc)
		}
		if r.Strategy == Collective || !r.Timed() || len(r.TimesUS) == 0 {
			continue
		}
		acc.pairs[r.Strategy] = append(acc.pairs[r.Strategy], [2][]float64{r.TimesUS, c})
		acc.cells[r.Strategy] = append(acc.cells[r.Strategy], r)
	}
	return order
}

// strategies are the acc's compared strategies, in the matrix's order.
func (acc *answerAcc) strategies() []string {
	var out []string
	for _, n := range Strategies {
		if n != Collective && len(acc.pairs[n]) > 0 {
			out = append(out, n)
		}
	}
	for n := range acc.pairs { // names outside the matrix's list (a test's)
		if !slices.Contains(Strategies, n) {
			out = append(out, n)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return indexOf(Strategies, out[i]) < indexOf(Strategies, out[j]) })
	return out
}

// indexOf is s's place in l, len(l) (after every name of l) when absent.
func indexOf(l []string, s string) int {
	for i, x := range l {
		if x == s {
			return i
		}
	}
	return len(l)
}

// Answers are the short answers of results whose metrics Derive has filled
// at st's level.
func Answers(rs []Result, st Stats) []Answer {
	var out []Answer
	for _, acc := range answerGroups(rs) {
		a := acc.a
		names := acc.strategies()
		geo := map[string][]float64{}
		for _, n := range names {
			g := geoRounds(acc.pairs[n])
			if g == nil {
				continue
			}
			geo[n] = g
			iv := st.interval(g)
			vs := AnswerVs{Strategy: n, Interval: iv, Cells: len(acc.cells[n])}
			for _, r := range acc.cells[n] {
				if r.VsCollective == nil {
					continue
				}
				switch r.VsCollective.Verdict {
				case Faster:
					vs.Faster++
				case Slower:
					vs.Slower++
				}
			}
			a.Vs = append(a.Vs, vs)
		}
		a.Use, a.Significant, a.Basis = Collective, false, "no other strategy was verified and timed here"
		switch {
		case a.World == 1:
			a.Basis = "nothing to exchange at world 1: the other strategies' figures are the cost of their machinery"
		case len(a.Vs) > 0:
			a.Use, a.Significant, a.Basis = pickAnswer(a.Vs, acc, geo, st)
		}
		out = append(out, a)
	}
	sort.SliceStable(out, func(i, j int) bool {
		x, y := out[i], out[j]
		if x.Transport != y.Transport {
			return x.Transport < y.Transport
		}
		if x.World != y.World {
			return x.World < y.World
		}
		if x.Op != y.Op {
			return slices.Index(Ops, x.Op) < slices.Index(Ops, y.Op)
		}
		return x.Dir > y.Dir // sp before nosp
	})
	return out
}

// pickAnswer is pick over an answer's aggregated comparisons: a strategy
// faster than collective beyond the noise (the faster of two such only
// when it beats the other beyond the noise on the cells both have), else
// collective.
func pickAnswer(vs []AnswerVs, acc *answerAcc, geo map[string][]float64, st Stats) (string, bool, string) {
	var faster []AnswerVs
	slower := 0
	for _, v := range vs {
		switch v.Interval.Verdict {
		case Faster:
			faster = append(faster, v)
		case Slower:
			slower++
		}
	}
	if len(faster) == 0 {
		if slower == len(vs) {
			return Collective, true, "every other strategy is slower than collective beyond the noise"
		}
		return Collective, false, "no significant difference, so collective"
	}
	best := faster[0]
	for _, v := range faster[1:] {
		if st.compare(geo[v.Strategy], geo[best.Strategy]).Verdict == Faster {
			best = v
		}
	}
	return best.Strategy, true, fmt.Sprintf("faster than collective beyond the noise: %s", best.Interval.SpeedupText())
}

// For is st with Comparisons set to the number of comparisons the report
// and the cache of rs make: each non-collective cell against its
// collective, and per cache entry and per answer, each candidate against
// collective and each pair of candidates.
func (st Stats) For(rs []Result) Stats {
	m := 0
	coll := map[string]bool{}
	for _, r := range rs {
		if r.Strategy == Collective && r.Timed() {
			coll[r.Group()] = true
		}
	}
	for _, r := range rs {
		if r.Strategy != Collective && r.Timed() && coll[r.Group()] {
			m++
		}
	}
	for _, a := range sites(rs, "") {
		if names, _, ok := a.candidates(); ok {
			m += entryComparisons(len(names) - 1)
		}
	}
	for _, acc := range answerGroups(rs) {
		m += entryComparisons(len(acc.strategies()))
	}
	st.Comparisons = max(1, m)
	return st
}

// answerRows are the answers of world ≥ 2 (world1: of world 1) as table
// rows: op, P, transport, use, and per other strategy its comparison with
// collective (world 1: the cost of its machinery).
func answerRows(all []Answer, world1 bool) (head []string, rows [][]string) {
	var as []Answer
	for _, a := range all {
		if (a.World == 1) == world1 {
			as = append(as, a)
		}
	}
	var others []string
	for _, a := range as {
		for _, v := range a.Vs {
			if !slices.Contains(others, v.Strategy) {
				others = append(others, v.Strategy)
			}
		}
	}
	sort.SliceStable(others, func(i, j int) bool { return indexOf(Strategies, others[i]) < indexOf(Strategies, others[j]) })
	head = []string{"op", "P", "transport", "dtype", "use"}
	for _, o := range others {
		if world1 {
			head = append(head, o+": its machinery's cost")
		} else {
			head = append(head, o+" against collective")
		}
	}
	for _, a := range as {
		use := a.Use
		switch {
		case a.World == 1:
			use = "collective (nothing to exchange)"
		case a.Use != Collective:
			for _, v := range a.Vs {
				if v.Strategy == a.Use {
					use = fmt.Sprintf("%s: %s faster", a.Use, v.Interval.SpeedupText())
				}
			}
		case a.Significant:
			use = "collective: the others are slower"
		case len(a.Vs) > 0:
			use = "collective: no significant difference"
		default:
			use = "collective: nothing else verified"
		}
		row := []string{a.label(), fmt.Sprint(a.World), a.Transport, a.DType, use}
		for _, o := range others {
			cell := "–"
			for _, v := range a.Vs {
				if v.Strategy != o {
					continue
				}
				if a.World == 1 {
					cell = v.Interval.CostText()
				} else {
					cell = fmt.Sprintf("%s, %s", v.Interval.SpeedupText(), v.Interval.verdictText())
				}
				cell += fmt.Sprintf("; cells: %s", cellCounts(v, a.World == 1))
			}
			row = append(row, cell)
		}
		rows = append(rows, row)
	}
	return head, rows
}

func verdictText(v string) string {
	switch v {
	case Faster:
		return "faster"
	case Slower:
		return "slower"
	}
	return "no significant difference"
}

// cellCounts is "2 faster, 1 slower, 3 n.s. of 6" (world 1: cheaper and
// costlier machinery).
func cellCounts(v AnswerVs, world1 bool) string {
	fast, slow := "faster", "slower"
	if world1 {
		fast, slow = "cheaper", "costlier"
	}
	var parts []string
	if v.Faster > 0 {
		parts = append(parts, fmt.Sprintf("%d %s", v.Faster, fast))
	}
	if v.Slower > 0 {
		parts = append(parts, fmt.Sprintf("%d %s", v.Slower, slow))
	}
	if n := v.Cells - v.Faster - v.Slower; n > 0 {
		parts = append(parts, fmt.Sprintf("%d n.s.", n))
	}
	return strings.Join(parts, ", ") + fmt.Sprintf(" of %d", v.Cells)
}
