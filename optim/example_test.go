package optim_test

import (
	"fmt"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// A loop that fits a linear layer to y = 2·x with the optimizer and the
// schedule, reading the gradient norm of each step back one step late.
func ExampleAdamW_ClipStep() {
	b := cpu.New()
	ps := layers.NewParamSet(1)
	lin, err := layers.NewLinear(b, ps, "fc", layers.LinearConfig{In: 1, Out: 1, Std: 0.1})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := ps.Materialize(b, tensor.Float64); err != nil {
		fmt.Println(err)
		return
	}
	cfg := optim.DefaultAdamWConfig()
	cfg.WeightDecay = 0
	opt, err := optim.NewAdamWWithConfig(b, ps, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	sched := optim.WarmupCosine{Peak: 0.1, Min: 0.01, Warmup: 5, Steps: 300}
	x, _ := tensor.FromFloat64([]float64{-1, 0.5, 1, 2}, 4, 1)
	dy := b.Zeros(tensor.Float64, 4, 1)
	y := b.Zeros(tensor.Float64, 4, 1)
	dx := b.Zeros(tensor.Float64, 4, 1)
	for step := 1; step <= 300; step++ {
		ps.ZeroGrad()
		if err := lin.Forward(y, x); err != nil {
			fmt.Println(err)
			return
		}
		// dL/dy of L = Σ (y − 2x)² / 2N.
		for i, v := range y.F64() {
			dy.F64()[i] = (v - 2*x.F64()[i]) / 4
		}
		if err := lin.Backward(dx, dy); err != nil {
			fmt.Println(err)
			return
		}
		norm, err := opt.ClipStep(step, sched.LR(step), 1, nil)
		if err != nil {
			fmt.Println(err)
			return
		}
		if _, err := norm.Wait(); err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Printf("w = %.2f\n", lin.W.W.F64()[0])
	// Output:
	// w = 2.00
}

func ExampleWarmupCosine() {
	s := optim.WarmupCosine{Peak: 1e-3, Min: 1e-4, Warmup: 10, Steps: 100}
	for _, step := range []int{1, 10, 55, 100} {
		fmt.Printf("step %3d: lr %.2e\n", step, s.LR(step))
	}
	// Output:
	// step   1: lr 1.00e-04
	// step  10: lr 1.00e-03
	// step  55: lr 5.50e-04
	// step 100: lr 1.00e-04
}

func ExampleAdamWConfig_Validate() {
	cfg := optim.AdamWConfig{} // Eps 0 would divide 0 by 0
	fmt.Println(cfg.Validate())
	// Output:
	// optim: AdamWConfig.Eps = 0, expected a finite value > 0 (it keeps the update's denominator sqrt(v̂) + Eps above 0)
}
