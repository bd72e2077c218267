// Command quickstart is the shortest program on asynctp as a library: a
// linear layer learns y = 3·x − 1 with the library's AdamW.
package main

import (
	"fmt"
	"log"
	"math"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

func main() {
	b := cpu.New() // the CPU backend; tensor/cudabackend runs the same ops on a GPU
	ps := layers.NewParamSet(1)
	fc, err := layers.NewLinear(b, ps, "fc", layers.LinearConfig{In: 1, Out: 1, Bias: true, Std: 0.1})
	if err != nil {
		log.Fatal(err)
	}
	if err := ps.Materialize(b, tensor.Float32); err != nil {
		log.Fatal(err)
	}
	opt, err := optim.NewAdamW(b, ps) // PyTorch's defaults
	if err != nil {
		log.Fatal(err)
	}
	lr := optim.WarmupCosine{Peak: 0.1, Steps: 1000} // cosine from 0.1 down to 0
	x, _ := tensor.FromFloat32([]float32{-1, 0, 1, 2}, 4, 1)
	y, dy, dx := b.Zeros(tensor.Float32, 4, 1), b.Zeros(tensor.Float32, 4, 1), b.Zeros(tensor.Float32, 4, 1)
	for step := 1; step <= 1000; step++ {
		ps.ZeroGrad()
		if err := fc.Forward(y, x); err != nil {
			log.Fatal(err)
		}
		for i, v := range y.F32() { // the gradient of ½·mean((y − t)²), t = 3x − 1
			dy.F32()[i] = (v - (3*x.F32()[i] - 1)) / 4
		}
		if err := fc.Backward(dx, dy); err != nil {
			log.Fatal(err)
		}
		if err := opt.Step(step, lr.LR(step), 1); err != nil {
			log.Fatal(err)
		}
	}
	w, c := fc.W.W.F32()[0], fc.Bias.W.F32()[0]
	fmt.Printf("y = %.3f·x %+.3f\n", w, c)
	if math.Abs(float64(w)-3) > 2e-2 || math.Abs(float64(c)+1) > 2e-2 { // weight decay pulls w a little towards 0
		log.Fatal("expected y = 3·x − 1")
	}
}
