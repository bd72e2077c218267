// Command trainloop is a training loop of its own around the library's
// optimizer: a linear layer learns y = A·x + c from noiseless samples with
// AdamW (package optim), a warm-up and cosine learning-rate schedule and
// clipping by the global gradient norm. It checks that the layer recovers
// A and c, and exits with status 1 when it does not.
package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

const (
	in, out, rows = 3, 2, 64
	steps         = 400
)

var (
	a = []float64{1.5, -2, 0.5, 0.25, 1, -1} // (out, in)
	c = []float64{0.3, -0.7}
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "trainloop:", err)
		os.Exit(1)
	}
}

func run() error {
	b := cpu.New()
	ps := layers.NewParamSet(1)
	lin, err := layers.NewLinear(b, ps, "fc", layers.LinearConfig{In: in, Out: out, Bias: true, Std: 0.1})
	if err != nil {
		return err
	}
	if err := ps.Materialize(b, tensor.Float32); err != nil {
		return err
	}
	cfg := optim.DefaultAdamWConfig()
	cfg.WeightDecay = 0 // the target has no reason to be small
	opt, err := optim.NewAdamWWithConfig(b, ps, cfg)
	if err != nil {
		return err
	}
	sched := optim.WarmupCosine{Peak: 0.05, Min: 1e-4, Warmup: 20, Steps: steps}

	rng := rand.New(rand.NewPCG(1, 2))
	x, t := tensor.MustHost(tensor.Float32, rows, in), tensor.MustHost(tensor.Float32, rows, out)
	y, dy, dx := b.Zeros(tensor.Float32, rows, out), b.Zeros(tensor.Float32, rows, out), b.Zeros(tensor.Float32, rows, in)
	var loss, norm float64
	for step := 1; step <= steps; step++ {
		for r := range rows { // a fresh batch
			for i := range in {
				x.F32()[r*in+i] = float32(rng.NormFloat64())
			}
			for o := range out {
				v := c[o]
				for i := range in {
					v += a[o*in+i] * float64(x.F32()[r*in+i])
				}
				t.F32()[r*out+o] = float32(v)
			}
		}
		ps.ZeroGrad()
		if err := lin.Forward(y, x); err != nil {
			return err
		}
		loss = 0 // ½·mean((y − t)²), and its gradient
		for i, v := range y.F32() {
			d := float64(v - t.F32()[i])
			loss += 0.5 * d * d / (rows * out)
			dy.F32()[i] = float32(d / (rows * out))
		}
		if err := lin.Backward(dx, dy); err != nil {
			return err
		}
		// Σ g² on the device, the clipped update, the norm read back.
		read, err := opt.ClipStep(step, sched.LR(step), 1.0, nil)
		if err != nil {
			return err
		}
		ss, err := read.Wait()
		if err != nil {
			return err
		}
		norm = math.Sqrt(ss[0])
	}
	worst := 0.0
	for i, w := range lin.W.W.F32() {
		worst = max(worst, math.Abs(float64(w)-a[i]))
	}
	for i, v := range lin.Bias.W.F32() {
		worst = max(worst, math.Abs(float64(v)-c[i]))
	}
	fmt.Printf("after %d steps: loss %.2e, gradient norm %.2e, largest weight error %.1e\n", steps, loss, norm, worst)
	if !(worst < 1e-2) {
		return fmt.Errorf("the layer did not recover A and c: largest error %.3g, expected < 1e-2", worst)
	}
	return nil
}
