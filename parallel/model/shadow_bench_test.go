package model_test

import (
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// BenchmarkShadowStep is the cost of shadow mode on the CPU at TP 2 with
// sequence parallelism, every site pipelined: the model of cmd/train's
// tiny preset (2 layers, width 64, 4 heads, vocabulary 256) on its batch
// of 8 × 64 tokens, one goroutine rank per core. Each iteration is two
// forward-and-backward steps of the model, the first not sampled and the
// second sampled (every site also runs collective, the comparisons read
// back, the ranks' reports merged), so both are timed under the same
// load. It reports each one's time and the average step time's growth
// when one step in overlap.DefaultShadowEvery is sampled:
// (sampled − plain) / (DefaultShadowEvery · plain).
func BenchmarkShadowStep(b *testing.B) {
	cfg := layers.GPTConfig{Layers: 2, Dim: 64, Heads: 4, Vocab: 256, Seq: 64, TiedEmbeddings: true, Seed: 1337}
	const batchSize = 8
	var plain, sampled time.Duration
	err := local.Run(2, func(c comm.Comm) error {
		be := cpu.New(cpu.WithThreads(1))
		g, err := comm.NewGrid(c, 1, 2, 1)
		if err != nil {
			return err
		}
		defer g.Close()
		sh, err := overlap.NewShadow(overlap.ShadowConfig{Every: 2}, g.World, be, nil, tensor.Float32)
		if err != nil {
			return err
		}
		ch, err := overlap.NewChooser(overlap.Config{Default: "pipelined"}, []overlap.Strategy{strategies.Pipelined{}}, nil, overlap.WithShadow(sh))
		if err != nil {
			return err
		}
		m, err := model.New(be, g, cfg, model.Options{SequenceParallel: true, Overlap: ch}, tensor.Float32)
		if err != nil {
			return err
		}
		ids, targets := batch(7, batchSize, cfg.Seq, cfg.Vocab)
		step := func(n int) (time.Duration, error) {
			t0 := time.Now()
			sh.BeginStep(n)
			m.ZeroGrad()
			if _, err := m.Forward(ids, targets); err != nil {
				return 0, err
			}
			if err := m.Backward(); err != nil {
				return 0, err
			}
			if _, err := sh.EndStep(n); err != nil {
				return 0, err
			}
			return time.Since(t0), be.Err()
		}
		if _, err := step(1); err != nil { // warm-up: buffers, the shadow's included
			return err
		}
		if _, err := step(2); err != nil {
			return err
		}
		if c.Rank() == 0 {
			b.ResetTimer()
		}
		var p, s time.Duration
		for i := range b.N {
			dp, err := step(2*i + 3)
			if err != nil {
				return err
			}
			ds, err := step(2*i + 4)
			if err != nil {
				return err
			}
			p, s = p+dp, s+ds
		}
		if c.Rank() == 0 {
			plain, sampled = p, s
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	n := float64(b.N)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / n }
	b.ReportMetric(ms(plain), "ms/step")
	b.ReportMetric(ms(sampled), "ms/sampled-step")
	b.ReportMetric(100*(ms(sampled)-ms(plain))/(overlap.DefaultShadowEvery*ms(plain)), "%/step-at-default")
	b.ReportMetric(0, "ns/op")
}
