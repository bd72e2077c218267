package ablate

import (
	"fmt"
	"math"
	"sort"
)

// How a run tells a difference from noise. Every cell of a group is timed
// in the same rounds, the strategies alternating inside each round (the
// order rotates from round to round), so round i of a strategy and round
// i of collective saw the same machine. A comparison is the per-round
// time ratio strategy / reference: its median over the rounds and an
// order-statistic (sign-test) confidence interval of that median, exact
// for any distribution of independent rounds. The level of each interval
// is 1 − Alpha/m for the m comparisons the run makes (Bonferroni), so all
// of a run's intervals hold together with probability at least 1 − Alpha.
// A strategy is faster only when the whole interval lies below
// 1/(1 + MinEffect), slower only when it lies above 1 + MinEffect;
// anything else is no significant difference.
//
// A verdict must also replicate within the run: the rounds, in the order
// they ran, split into two halves, and each half's own interval (at level
// 1 − Alpha, the halves being a check of the whole's claim, not a family
// of their own) must lie on the verdict's side of 1. A difference that
// only a part of the run shows (a burst of load on the machine's other
// processes, a change of clock) is no verdict, so the claims a run makes
// are those that held through it, as they must through the next run. The
// family-wise guarantee is the whole intervals' (the halves only remove
// verdicts): a strategy a run calls faster is faster by more than
// MinEffect, all of the run's claims together holding with probability at
// least 1 − Alpha; so another run under the same conditions contradicts
// it (its interval lies wholly above 1/(1 + MinEffect): not faster by
// MinEffect) with probability at most 2·Alpha, the chance that either
// run's intervals miss. What no rule can give is that the other run also
// calls it faster: an effect near MinEffect is a verdict in some runs and
// no significant difference in others.

// Stats are a run's significance settings.
type Stats struct {
	Alpha     float64 `json:"alpha"`      // the family-wise error rate of the run's comparisons
	MinEffect float64 `json:"min_effect"` // the smallest time difference that counts, as a fraction (0.05: 5 %)
	// Comparisons is m, the size of the family (For sets it).
	Comparisons int `json:"comparisons"`
}

// The defaults: a 5 % family-wise error rate; on the CPU, whose shared
// cores shift a strategy's real advantage with the load, a difference
// counts from 5 %, on a GPU from 2 %.
const (
	DefaultAlpha        = 0.05
	DefaultMinEffectCPU = 0.05
	DefaultMinEffectGPU = 0.02
)

// Check says whether the settings can be used.
func (s Stats) Check() error {
	if !(s.Alpha > 0 && s.Alpha < 1) {
		return fmt.Errorf("alpha %g: expected a family-wise error rate in (0, 1)", s.Alpha)
	}
	if !(s.MinEffect >= 0 && s.MinEffect < 1) {
		return fmt.Errorf("minimum effect %g: expected a fraction in [0, 1)", s.MinEffect)
	}
	return nil
}

// Level is the confidence level of each of the run's intervals:
// 1 − Alpha/m.
func (s Stats) Level() float64 { return 1 - s.Alpha/float64(max(1, s.Comparisons)) }

// Verdicts of a comparison.
const (
	Faster = "faster"                    // beyond the noise and the minimum effect
	Slower = "slower"                    //
	NoDiff = "no significant difference" // within the noise or the minimum effect
)

// Interval is a comparison of a strategy's times with a reference's,
// paired by round: Ratio is the median of the per-round time ratios
// (strategy / reference), [Lo, Hi] its confidence interval at Level (both
// 0 when the rounds are too few for the level), Verdict what it says.
type Interval struct {
	Ratio   float64 `json:"ratio"`
	Lo      float64 `json:"lo,omitempty"`
	Hi      float64 `json:"hi,omitempty"`
	Level   float64 `json:"level"`
	Rounds  int     `json:"rounds"`
	Verdict string  `json:"verdict"`
	// Halves are the intervals of the first and the second half of the
	// rounds, in the order they ran, at HalfLevel (none when a half is
	// too short for it); a verdict needs both on its side of 1.
	Halves    []Span  `json:"halves,omitempty"`
	HalfLevel float64 `json:"half_level,omitempty"`
	// Unreplicated: the whole interval lies beyond the minimum effect, but
	// a half's does not on that side of 1, so there is no verdict.
	Unreplicated bool `json:"unreplicated,omitempty"`
}

// Span is an interval [Lo, Hi] of time ratios.
type Span struct {
	Lo float64 `json:"lo"`
	Hi float64 `json:"hi"`
}

// Speedup is the reference's time over the strategy's (> 1: faster), and
// its interval.
func (iv Interval) Speedup() (s, lo, hi float64) {
	if iv.Ratio <= 0 {
		return 0, 0, 0
	}
	s = 1 / iv.Ratio
	if iv.Hi > 0 {
		lo, hi = 1/iv.Hi, 1/iv.Lo
	}
	return s, lo, hi
}

// Determined says whether the rounds were enough for an interval.
func (iv Interval) Determined() bool { return iv.Hi > 0 }

// SpeedupText is "1.23× (1.10–1.35)", or with "(too few rounds for an
// interval)".
func (iv Interval) SpeedupText() string {
	s, lo, hi := iv.Speedup()
	if s == 0 {
		return "–"
	}
	if !iv.Determined() {
		return fmt.Sprintf("%.2f× (too few rounds for an interval)", s)
	}
	return fmt.Sprintf("%.2f× (%.2f–%.2f)", s, lo, hi)
}

// CostText is the interval as the extra time of the strategy over the
// reference: "+3.1 % (−0.5 … +6.0 %)" (world 1: the machinery's cost).
func (iv Interval) CostText() string {
	if iv.Ratio <= 0 {
		return "–"
	}
	c := fmt.Sprintf("%+.1f %%", 100*(iv.Ratio-1))
	if !iv.Determined() {
		return c + " (too few rounds for an interval)"
	}
	return fmt.Sprintf("%s (%+.1f … %+.1f %%)", c, 100*(iv.Lo-1), 100*(iv.Hi-1))
}

// compare is the paired comparison of a with ref (per-round times, the
// same rounds), at s's level and minimum effect.
func (s Stats) compare(a, ref []float64) Interval {
	n := min(len(a), len(ref))
	rs := make([]float64, 0, n)
	for i := range n {
		if a[i] > 0 && ref[i] > 0 {
			rs = append(rs, a[i]/ref[i])
		}
	}
	return s.interval(rs)
}

// interval is the comparison of per-round ratios rs, in the order the
// rounds ran.
func (s Stats) interval(rs []float64) Interval {
	iv := Interval{Level: s.Level(), Rounds: len(rs), Verdict: NoDiff}
	if len(rs) == 0 {
		return iv
	}
	sorted := append([]float64(nil), rs...)
	sort.Float64s(sorted)
	iv.Ratio = medianSorted(sorted)
	h := len(rs) / 2
	first, firstOK := orderSpan(rs[:h], s.Alpha)
	second, secondOK := orderSpan(rs[h:], s.Alpha)
	if firstOK && secondOK {
		iv.Halves, iv.HalfLevel = []Span{first, second}, 1-s.Alpha
	}
	if k := orderCI(len(sorted), 1-iv.Level); k > 0 {
		iv.Lo, iv.Hi = sorted[k-1], sorted[len(sorted)-k]
		switch {
		case iv.Hi < 1/(1+s.MinEffect):
			iv.Verdict, iv.Unreplicated = Faster, !(firstOK && secondOK && first.Hi < 1 && second.Hi < 1)
		case iv.Lo > 1+s.MinEffect:
			iv.Verdict, iv.Unreplicated = Slower, !(firstOK && secondOK && first.Lo > 1 && second.Lo > 1)
		}
		if iv.Unreplicated {
			iv.Verdict = NoDiff
		}
	}
	return iv
}

// orderSpan is the interval of the median of rs at error rate a (orderCI);
// ok is false when rs are too few for it.
func orderSpan(rs []float64, a float64) (sp Span, ok bool) {
	k := orderCI(len(rs), a)
	if k == 0 {
		return Span{}, false
	}
	sorted := append([]float64(nil), rs...)
	sort.Float64s(sorted)
	return Span{Lo: sorted[k-1], Hi: sorted[len(sorted)-k]}, true
}

// verdictText is the verdict in words, saying why there is none where the
// whole run showed a difference that its halves did not both show.
func (iv Interval) verdictText() string {
	if iv.Unreplicated {
		return "no significant difference (not replicated in both halves of the rounds)"
	}
	return verdictText(iv.Verdict)
}

// medianSorted is the median of sorted values (the mean of the middle two
// of an even count).
func medianSorted(v []float64) float64 {
	n := len(v)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// orderCI is the k of the distribution-free confidence interval
// [x_(k), x_(n+1−k)] of the median of n values at error rate a (two-sided):
// the largest k ≤ n/2 with 2·P(Bin(n, ½) ≤ k−1) ≤ a; 0 when even k = 1
// (the minimum and maximum) is not enough.
func orderCI(n int, a float64) int {
	k := 0
	cdf := 0.0 // P(Bin(n, ½) ≤ j)
	for j := 0; j < n/2; j++ {
		cdf += binomHalf(n, j)
		if 2*cdf > a {
			break
		}
		k = j + 1
	}
	return k
}

// binomHalf is P(Bin(n, ½) = j).
func binomHalf(n, j int) float64 {
	lg := func(x int) float64 { v, _ := math.Lgamma(float64(x) + 1); return v }
	return math.Exp(lg(n) - lg(j) - lg(n-j) - float64(n)*math.Ln2)
}

// MinRounds is the fewest rounds with which a comparison can be
// significant at the level of m comparisons at family-wise rate alpha:
// enough for the whole interval at 1 − alpha/m, and for each half's at
// 1 − alpha.
func MinRounds(alpha float64, m int) int {
	a := alpha / float64(max(1, m))
	for n := 1; n < 128; n++ {
		if orderCI(n, a) > 0 && orderCI(n/2, alpha) > 0 {
			return n
		}
	}
	return 128
}

// geoRounds is, per round, the geometric mean over the series of the
// ratios a[i]/ref[i]: the typical ratio of several cells of the same
// rounds (each cell weighing the same). Series of another length than the
// first are left out.
func geoRounds(pairs [][2][]float64) []float64 {
	if len(pairs) == 0 {
		return nil
	}
	n := len(pairs[0][0])
	sum := make([]float64, n)
	cnt := 0
	for _, p := range pairs {
		a, ref := p[0], p[1]
		if len(a) != n || len(ref) != n {
			continue
		}
		ok := true
		for i := range n {
			if !(a[i] > 0 && ref[i] > 0) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		for i := range n {
			sum[i] += math.Log(a[i] / ref[i])
		}
		cnt++
	}
	if cnt == 0 {
		return nil
	}
	for i := range sum {
		sum[i] = math.Exp(sum[i] / float64(cnt))
	}
	return sum
}

// sumRounds is the per-round sum of several series of the same rounds
// (nil if their lengths differ).
func sumRounds(series ...[]float64) []float64 {
	if len(series) == 0 {
		return nil
	}
	out := make([]float64, len(series[0]))
	for _, s := range series {
		if len(s) != len(out) {
			return nil
		}
		for i, v := range s {
			out[i] += v
		}
	}
	return out
}
