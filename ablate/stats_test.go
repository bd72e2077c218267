package ablate

import (
	"math"
	"math/rand/v2"
	"sort"
	"strings"
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
	// The whole interval and each half's: 6 rounds are enough for one
	// comparison's whole interval (2/2⁶ ≤ 5 % < 2/2⁵), but each half needs 6.
	if got := MinRounds(0.05, 1); got != 12 {
		t.Errorf("MinRounds(0.05, 1) = %d, want 12 (halves of 6: 2/2⁶ ≤ 5 %% < 2/2⁵)", got)
	}
	if got := MinRounds(0.05, 100); got != 12 {
		t.Errorf("MinRounds(0.05, 100) = %d, want 12 (2/2¹² ≤ 0.05 %% < 2/2¹¹)", got)
	}
	if got := MinRounds(0.05, 1000); got != 16 {
		t.Errorf("MinRounds(0.05, 1000) = %d, want 16 (2/2¹⁶ ≤ 0.005 %% < 2/2¹⁵)", got)
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

// A verdict must replicate within the run: the same per-round ratios are
// faster (or slower) when each half of the rounds, in the order they ran,
// shows it, and no verdict (unreplicated) when the rounds against it all
// fall in one half, though the whole interval is the same.
func TestVerdictReplicated(t *testing.T) {
	st := Stats{Alpha: 0.05, MinEffect: 0.05, Comparisons: 1}
	// 24 rounds: the whole interval at 95 % is [x(7), x(18)], each half's
	// (12 rounds) [x(3), x(10)]: a half tolerates 2 rounds against.
	rounds := func(base, other float64, at ...int) []float64 {
		rs := make([]float64, 24)
		for i := range rs {
			rs[i] = base * (1 + 0.01*float64(i%5))
		}
		for _, i := range at {
			rs[i] = other
		}
		return rs
	}
	for _, c := range []struct {
		name         string
		rs           []float64
		want         string
		unreplicated bool
	}{
		{"faster throughout", rounds(0.8, 0), Faster, false},
		{"faster, 4 rounds against spread over both halves", rounds(0.8, 1.1, 1, 7, 14, 20), Faster, false},
		{"faster, the same 4 rounds against in the second half", rounds(0.8, 1.1, 13, 16, 19, 22), NoDiff, true},
		{"faster in the first half only", rounds(0.8, 1.02, 12, 13, 14, 15, 16, 17), NoDiff, true},
		{"slower throughout", rounds(1.25, 0), Slower, false},
		{"slower, the rounds against in the first half", rounds(1.25, 0.9, 0, 3, 5, 8), NoDiff, true},
		{"the same", rounds(1, 0), NoDiff, false},
	} {
		iv := st.interval(c.rs)
		if iv.Verdict != c.want || iv.Unreplicated != c.unreplicated {
			t.Errorf("%s: %+v; want %s, unreplicated %v", c.name, iv, c.want, c.unreplicated)
		}
		if len(iv.Halves) != 2 || iv.HalfLevel != 0.95 {
			t.Errorf("%s: halves %+v at %v; want two at 95 %%", c.name, iv.Halves, iv.HalfLevel)
		}
		// The whole interval does not depend on the order; the verdict may.
		sorted := append([]float64(nil), c.rs...)
		sort.Float64s(sorted)
		if w := st.interval(sorted); w.Lo != iv.Lo || w.Hi != iv.Hi || w.Ratio != iv.Ratio {
			t.Errorf("%s: the whole interval changes with the rounds' order: %+v, sorted %+v", c.name, iv, w)
		}
	}
	if got := st.interval(rounds(0.8, 1.1, 13, 16, 19, 22)).verdictText(); !strings.Contains(got, "not replicated") {
		t.Errorf("an unreplicated difference reads %q, want it to say it was not replicated", got)
	}
}

// Two runs under the same conditions, simulated: rounds whose times
// scatter log-normally (with a slow tail: a round in ten stalls) around a
// true ratio at, below and above the minimum effect. A run's verdict
// "faster" is contradicted by the other run's interval (wholly above
// 1/(1 + MinEffect)) in at most 2·Alpha of the pairs; the verdicts of
// two runs may still differ (faster and no significant difference) near
// the minimum effect, which the test counts but does not bound.
func TestBackToBackContradiction(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	st := Stats{Alpha: 0.05, MinEffect: 0.05, Comparisons: 20}
	run := func(ratio float64) Interval {
		a, ref := make([]float64, 20), make([]float64, 20)
		for i := range a {
			base := 1000 * math.Exp(0.2*rng.NormFloat64())
			ref[i] = base * math.Exp(0.05*rng.NormFloat64())
			a[i] = ratio * base * math.Exp(0.05*rng.NormFloat64())
			if rng.IntN(10) == 0 {
				a[i] *= 3
			}
			if rng.IntN(10) == 0 {
				ref[i] *= 3
			}
		}
		return st.compare(a, ref)
	}
	const trials = 2000
	for _, ratio := range []float64{0.8, 0.9, 0.93, 0.95, 1} {
		faster, contradicted, differ := 0, 0, 0
		for range trials {
			x, y := run(ratio), run(ratio)
			if x.Verdict == Faster {
				faster++
				if y.Determined() && y.Lo > 1/(1+st.MinEffect) {
					contradicted++
				}
			}
			if x.Verdict != y.Verdict {
				differ++
			}
		}
		t.Logf("true ratio %.2f: faster in %d of %d runs, contradicted %d, verdicts differ in %d pairs", ratio, faster, trials, contradicted, differ)
		if float64(contradicted) > 2*st.Alpha*trials {
			t.Errorf("true ratio %.2f: %d of %d runs called faster were contradicted by the next, want at most %.0f", ratio, contradicted, trials, 2*st.Alpha*trials)
		}
		if ratio == 0.8 && faster < trials/2 {
			t.Errorf("true ratio 0.8: faster in %d of %d runs: the test's rounds cannot show a clear effect", faster, trials)
		}
		if ratio == 1 && faster > 0 {
			t.Errorf("true ratio 1: faster in %d of %d runs", faster, trials)
		}
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
