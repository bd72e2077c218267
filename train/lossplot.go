package train

import (
	"math"
	"strconv"

	"gonum.org/v1/plot"
)

// The loss plot's axes: the loss on a logarithmic scale (a falling loss
// spans a decade or more, and its late improvements would be flat on a
// linear one), labelled so, with enough labelled ticks on both axes to read
// a value off the curve.

// minTicks and maxTicks bound the labelled ticks of an axis.
const minTicks, maxTicks = 5, 12

// stepTicks labels the step axis at a round interval (1, 2 or 5 times a
// power of ten): the widest that still labels at least six values.
func stepTicks(lo, hi float64) []plot.Tick { return linearTicks(lo, hi) }

// linearTicks are the multiples in [lo, hi] of the widest round interval
// (1, 2 or 5 times a power of ten) that has at least six of them, each
// labelled, with an unlabelled tick halfway between two.
func linearTicks(lo, hi float64) []plot.Tick {
	if !(hi > lo) || math.IsInf(hi-lo, 0) {
		return []plot.Tick{{Value: lo, Label: formatTick(lo)}}
	}
	count := func(step float64) int { return int(math.Floor(hi/step+1e-9) - math.Ceil(lo/step-1e-9) + 1) }
	step := 0.0
	for e := math.Floor(math.Log10(hi-lo)) + 1; step == 0; e-- {
		for _, m := range []float64{5, 2, 1} {
			if s := m * math.Pow(10, e); count(s) >= 6 {
				step = s
				break
			}
		}
	}
	var ts []plot.Tick
	for i := math.Ceil(lo/step - 1e-9); i*step <= hi+1e-9*step; i++ {
		v := i * step
		ts = append(ts, plot.Tick{Value: v, Label: formatTick(v)})
		if m := v + step/2; m <= hi {
			ts = append(ts, plot.Tick{Value: m})
		}
	}
	return ts
}

// lossTicks labels a logarithmic loss axis: the densest of the mantissa
// sets below that labels at most maxTicks values of [lo, hi]; where even
// the densest labels fewer than minTicks (a range within a factor of about
// two), round linear values (linearTicks).
func lossTicks(lo, hi float64) []plot.Tick {
	if !(lo > 0) || !(hi > lo) {
		return linearTicks(lo, hi)
	}
	sets := [][]float64{
		{1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9},
		{1, 1.5, 2, 3, 4, 5, 6, 8},
		{1, 2, 3, 5},
		{1, 2, 5},
		{1},
	}
	for _, set := range sets {
		var ts []plot.Tick
		for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
			for _, m := range set {
				if v := m * math.Pow(10, e); v >= lo*(1-1e-9) && v <= hi*(1+1e-9) {
					ts = append(ts, plot.Tick{Value: v, Label: formatTick(v)})
				}
			}
		}
		if len(ts) <= maxTicks {
			if len(ts) < minTicks {
				return linearTicks(lo, hi)
			}
			return ts
		}
	}
	return plot.LogTicks{}.Ticks(lo, hi)
}

// formatTick writes a tick's value with at most three significant digits.
func formatTick(v float64) string {
	return strconv.FormatFloat(v, 'g', 3, 64)
}
