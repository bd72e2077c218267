package ablate

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// orderCI gives the textbook distribution-free intervals of the median
// (sign test): n = 10 at 95 %: [x(2), x(9)]; n = 20: [x(6), x(15)]; n = 20
// at 99 %: [x(4), x(17)]; n = 5 at 95 %: none (2/32 > 5 %).
func TestOrderCI(t *testing.T) {
	for _, c := range []struct {
		n    int
		a    float64
		want int
	}{{10, 0.05, 2}, {20, 0.05, 6}, {20, 0.01, 4}, {5, 0.05, 0}, {6, 0.05, 1}, {1, 0.5, 0}} {
		if got := orderCI(c.n, c.a); got != c.want {
			t.Errorf("orderCI(%d, %g) = %d, want %d", c.n, c.a, got, c.want)
		}
	}
	if got := MinRounds(0.05, 1); got != 6 {
		t.Errorf("MinRounds(0.05, 1) = %d, want 6 (2/2⁶ ≤ 5 %% < 2/2⁵)", got)
	}
	if got := MinRounds(0.05, 100); got != 12 {
		t.Errorf("MinRounds(0.05, 100) = %d, want 12 (2/2¹² ≤ 0.05 %% < 2/2¹¹)", got)
	}
}

// The intervals cover the true median ratio at least at their level:
// rounds whose times scatter log-normally around a known ratio, drawn
// many times (a fixed seed), miss it in at most the allowed share.
func TestIntervalCoverage(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	st := Stats{Alpha: 0.1, MinEffect: 0, Comparisons: 1}
	const trials, n, ratio = 4000, 15, 0.8
	miss := 0
	for range trials {
		a, ref := make([]float64, n), make([]float64, n)
		for i := range n {
			base := 1000 * math.Exp(0.3*rng.NormFloat64()) // the round's load
			ref[i] = base * math.Exp(0.1*rng.NormFloat64())
			a[i] = ratio * base * math.Exp(0.1*rng.NormFloat64())
		}
		iv := st.compare(a, ref)
		if !iv.Determined() {
			t.Fatalf("no interval at n = %d, level %g", n, iv.Level)
		}
		if ratio < iv.Lo || ratio > iv.Hi {
			miss++
		}
	}
	// The sign test's interval is conservative: its error rate is at most
	// alpha (with n = 15 exactly 2·P(Bin(15, ½) ≤ 3) = 3.5 %).
	if rate := float64(miss) / trials; rate > 0.1 {
		t.Errorf("the interval missed the true ratio in %.1f %% of %d trials, want ≤ 10 %%", 100*rate, trials)
	}
}

// A verdict needs the whole interval beyond the minimum effect; the
// median is the ratio's, the speedup its inverse.
func TestIntervalVerdict(t *testing.T) {
	ref := make([]float64, 20)
	for i := range ref {
		ref[i] = 100 + float64(i%5)
	}
	scaled := func(f float64, jitter float64) []float64 {
		out := make([]float64, len(ref))
		for i, r := range ref {
			out[i] = f * r * (1 + jitter*float64(i%3-1))
		}
		return out
	}
	for _, c := range []struct {
		name      string
		a         []float64
		minEffect float64
		want      string
	}{
		{"20 % faster", scaled(0.8, 0.02), 0.05, Faster},
		{"20 % faster, a minimum effect of 30 %", scaled(0.8, 0.02), 0.3, NoDiff},
		{"25 % slower", scaled(1.25, 0.02), 0.05, Slower},
		{"2 % faster, a minimum effect of 5 %", scaled(0.98, 0.001), 0.05, NoDiff},
		{"the same", scaled(1, 0.05), 0.0, NoDiff},
	} {
		iv := Stats{Alpha: 0.05, MinEffect: c.minEffect, Comparisons: 3}.compare(c.a, ref)
		if iv.Verdict != c.want {
			t.Errorf("%s: %+v, want %s", c.name, iv, c.want)
		}
	}
	// Too few rounds: no interval, no verdict.
	iv := Stats{Alpha: 0.05, MinEffect: 0, Comparisons: 1}.compare(scaled(0.5, 0)[:4], ref[:4])
	if iv.Determined() || iv.Verdict != NoDiff || iv.Ratio != 0.5 {
		t.Errorf("4 rounds: %+v, want ratio 0.5 without an interval or a verdict", iv)
	}
	if s, lo, hi := (Interval{Ratio: 0.8, Lo: 0.5, Hi: 1}).Speedup(); s != 1.25 || lo != 1 || hi != 2 {
		t.Errorf("speedup of ratio 0.8 in [0.5, 1]: %g in [%g, %g], want 1.25 in [1, 2]", s, lo, hi)
	}
}

// The geometric mean per round weighs every cell the same; the sum per
// round adds directions.
func TestRoundsCombined(t *testing.T) {
	g := geoRounds([][2][]float64{{{2, 1}, {1, 1}}, {{8, 4}, {1, 1}}})
	if len(g) != 2 || math.Abs(g[0]-4) > 1e-12 || math.Abs(g[1]-2) > 1e-12 {
		t.Errorf("geoRounds: %v, want [4 2]", g)
	}
	if s := sumRounds([]float64{1, 2}, []float64{10, 20}); len(s) != 2 || s[0] != 11 || s[1] != 22 {
		t.Errorf("sumRounds: %v, want [11 22]", s)
	}
	if s := sumRounds([]float64{1, 2}, []float64{10}); s != nil {
		t.Errorf("sumRounds of unequal rounds: %v, want nil", s)
	}
}

// The cache's choice: collective unless another strategy is faster beyond
// the noise; of two such, the first in the matrix's order unless the other
// beats it; collective significant when every other is slower.
func TestPick(t *testing.T) {
	st := Stats{Alpha: 0.05, MinEffect: 0.05, Comparisons: 3}
	rounds := func(f float64) []float64 {
		out := make([]float64, 24)
		for i := range out {
			out[i] = f * (100 + float64(i%7))
		}
		return out
	}
	for _, c := range []struct {
		name  string
		sums  map[string][]float64
		want  string
		sig   bool
		names []string
	}{
		{"none faster", map[string][]float64{Collective: rounds(1), Pipelined: rounds(0.99)}, Collective, false, nil},
		{"pipelined faster", map[string][]float64{Collective: rounds(1), Pipelined: rounds(0.7)}, Pipelined, true, nil},
		{"pipelined slower", map[string][]float64{Collective: rounds(1), Pipelined: rounds(1.5)}, Collective, true, nil},
		{"both faster, alike", map[string][]float64{Collective: rounds(1), Pipelined: rounds(0.7), Fused: rounds(0.69)}, Pipelined, true, nil},
		{"both faster, fused more", map[string][]float64{Collective: rounds(1), Pipelined: rounds(0.7), Fused: rounds(0.4)}, Fused, true, nil},
		{"collective alone", map[string][]float64{Collective: rounds(1)}, Collective, false, nil},
	} {
		var names []string
		for _, n := range Strategies {
			if _, ok := c.sums[n]; ok {
				names = append(names, n)
			}
		}
		got, sig, basis, _ := pick(names, c.sums, st)
		if got != c.want || sig != c.sig || basis == "" {
			t.Errorf("%s: %s, significant %v (%q); want %s, %v", c.name, got, sig, basis, c.want, c.sig)
		}
	}
}

// numLabel and the tickers give readable axes: several labelled round
// values on a linear axis, 1-2-5 labels on a log axis within a decade.
func TestTicks(t *testing.T) {
	var labels []string
	for _, tk := range (linTicks{n: 8}).Ticks(0, 25000) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if len(labels) != 6 || labels[0] != "0" || labels[1] != "5000" || labels[5] != "25\u2009000" {
		t.Errorf("linear ticks of [0, 25000]: %q, want 0 to 25 000 every 5000", labels)
	}
	labels = nil
	for _, tk := range (logTicks{format: bytesLabel}).Ticks(30e3, 600e3) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	sort.Strings(labels)
	if len(labels) < 3 {
		t.Errorf("log ticks of [30 kB, 600 kB]: %q, want 50 kB, 100 kB, 200 kB, 500 kB", labels)
	}
}
