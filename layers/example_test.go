package layers_test

import (
	"fmt"
	"log"
	"math"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// A tiny GPT on the CPU: one forward and backward pass, then one plain SGD
// step on the flat parameter buffers.
func ExampleNewGPT() {
	b := cpu.New()
	cfg := layers.GPTConfig{Layers: 2, Dim: 32, Heads: 4, Vocab: 50, Seq: 16, TiedEmbeddings: true, Seed: 1}
	m, err := layers.NewGPT(b, cfg, tensor.Float32)
	if err != nil {
		log.Fatal(err)
	}
	// One sequence of 8 tokens; the targets are the next tokens (the last
	// one is unknown: a negative target is ignored).
	ids, _ := tensor.FromInt32([]int32{3, 14, 15, 9, 26, 5, 35, 8}, 1, 8)
	targets, _ := tensor.FromInt32([]int32{14, 15, 9, 26, 5, 35, 8, -1}, 1, 8)

	m.ZeroGrad()
	loss, err := m.Forward(ids, targets)
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Backward(); err != nil {
		log.Fatal(err)
	}
	w, g := m.Params().Flat()
	b.Axpy(w, -0.3, g) // w -= lr·g
	after, err := m.Forward(ids, targets)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("parameters: %d (%d with weight decay)\n", m.Params().Numel(), m.Params().DecayNumel())
	fmt.Printf("logits: %v\n", m.Logits().Shape())
	fmt.Printf("initial loss %.2f, log(Vocab) %.2f\n", loss, math.Log(float64(cfg.Vocab)))
	fmt.Println("loss fell after one step:", after < loss)
	// Output:
	// parameters: 34528 (34368 with weight decay)
	// logits: (8, 50)
	// initial loss 4.01, log(Vocab) 3.91
	// loss fell after one step: true
}
