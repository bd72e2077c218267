package train

import (
	"math"
	"path/filepath"
	"testing"
)

// labelled returns the labelled ticks' values.
func labelled(t *testing.T, ticks func(lo, hi float64) []float64, lo, hi float64) []float64 {
	t.Helper()
	vs := ticks(lo, hi)
	for _, v := range vs {
		if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
			t.Errorf("[%v, %v]: tick %v outside the range", lo, hi, v)
		}
	}
	return vs
}

func stepLabels(lo, hi float64) []float64 {
	var vs []float64
	for _, tk := range stepTicks(lo, hi) {
		if tk.Label != "" {
			vs = append(vs, tk.Value)
		}
	}
	return vs
}

func lossLabels(lo, hi float64) []float64 {
	var vs []float64
	for _, tk := range lossTicks(lo, hi) {
		if tk.Label != "" {
			vs = append(vs, tk.Value)
		}
	}
	return vs
}

// The step axis has at least six labelled ticks at an even round interval;
// the log-scale loss axis has between minTicks and maxTicks labels over
// the ranges a loss curve spans (a fraction of a unit to a decade and
// more).
func TestLossPlotTicks(t *testing.T) {
	for _, r := range [][2]float64{{1, 8}, {1, 200}, {0, 5}, {1, 1000}, {1, 37}, {5, 1e6}} {
		vs := labelled(t, stepLabels, r[0], r[1])
		if len(vs) < 6 || len(vs) > 15 {
			t.Errorf("steps %v: %d labelled ticks %v, want 6 to 15", r, len(vs), vs)
			continue
		}
		for i := 2; i < len(vs); i++ {
			if d, d0 := vs[i]-vs[i-1], vs[1]-vs[0]; math.Abs(d-d0) > 1e-9*d0 {
				t.Errorf("steps %v: uneven interval in %v", r, vs)
			}
		}
	}
	for _, r := range [][2]float64{{1.1, 5.54}, {1.88, 10.96}, {0.5, 11}, {4.9, 5.5}, {0.01, 100}, {3, 3.02}} {
		vs := labelled(t, lossLabels, r[0], r[1])
		if len(vs) < minTicks || len(vs) > maxTicks {
			t.Errorf("loss %v: %d labelled ticks %v, want %d to %d", r, len(vs), vs, minTicks, maxTicks)
		}
	}
}

// loss.png says its loss axis is logarithmic, and falls back to a linear
// one (still labelled) when a loss is not positive.
func TestLossPlotScale(t *testing.T) {
	recs := []StepMetrics{{Step: 1, Loss: 5.5}, {Step: 100, Loss: 2.1}, {Step: 200, Loss: 1.1, Extra: map[string]any{"val_loss": 1.3}}}
	p, err := lossPlot(recs)
	if err != nil {
		t.Fatal(err)
	}
	if p.Y.Label.Text != "loss (log scale)" {
		t.Errorf("y label %q, want it to say the scale is logarithmic", p.Y.Label.Text)
	}
	if n := len(lossLabels(p.Y.Min, p.Y.Max)); n < minTicks {
		t.Errorf("y axis [%v, %v]: %d labelled ticks", p.Y.Min, p.Y.Max, n)
	}
	recs[1].Loss = 0
	if p, err = lossPlot(recs); err != nil || p.Y.Label.Text != "loss" {
		t.Fatalf("a zero loss: label %q, %v; want the linear scale's \"loss\"", p.Y.Label.Text, err)
	}
	if err := WriteLossPlot(filepath.Join(t.TempDir(), "loss.png"), recs); err != nil {
		t.Fatal(err)
	}
}
