package train_test

import (
	"testing"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
	"github.com/asynctp/asynctp/tokens"
	"github.com/asynctp/asynctp/train"
)

// BenchmarkTrainStep times one full step (forward, backward, gradient norm,
// AdamW) of the tiny preset's model on the CPU backend, and reports tokens/s
// and the model FLOP rate.
func BenchmarkTrainStep(b *testing.B) {
	for _, c := range []struct {
		name                   string
		layers, dim, heads, sq int
		batch                  int
	}{
		{"tiny-L2-D64-T64-B8", 2, 64, 4, 64, 8},
		{"small-L4-D128-T128-B8", 4, 128, 4, 128, 8},
	} {
		b.Run(c.name, func(b *testing.B) {
			be := cpu.New()
			m, err := layers.NewGPT(be, layers.GPTConfig{Layers: c.layers, Dim: c.dim, Heads: c.heads, Vocab: 256, Seq: c.sq, TiedEmbeddings: true, Seed: 1}, tensor.Float32)
			if err != nil {
				b.Fatal(err)
			}
			opt, err := optim.NewAdamWWithConfig(be, m.Params(), optim.AdamWConfig{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1})
			if err != nil {
				b.Fatal(err)
			}
			text := make([]byte, 1<<16)
			for i := range text {
				text[i] = byte(i * 7919 % 256)
			}
			ld, err := train.NewLoader(tokens.FromBytes("bench", text), train.LoaderConfig{Batch: c.batch, Seq: c.sq, Vocab: 256, Seed: 1})
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				x, y, err := ld.Next()
				if err != nil {
					b.Fatal(err)
				}
				m.ZeroGrad()
				if _, err := m.Forward(x, y); err != nil {
					b.Fatal(err)
				}
				if err := m.Backward(); err != nil {
					b.Fatal(err)
				}
				norm, err := opt.GradNorm()
				if err != nil {
					b.Fatal(err)
				}
				if err := opt.Step(i+1, 1e-3, optim.ClipScale(norm, 1)); err != nil {
					b.Fatal(err)
				}
			}
			tokens := float64(c.batch * c.sq * b.N)
			sec := b.Elapsed().Seconds()
			b.ReportMetric(tokens/sec, "tokens/s")
			b.ReportMetric(tokens*m.FLOPsPerToken()/sec/1e9, "GFLOP/s")
		})
	}
}
