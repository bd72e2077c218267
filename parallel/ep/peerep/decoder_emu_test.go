//go:build asynctp_emu

package peerep

import (
	"fmt"
	"github.com/asynctp/asynctp/comm"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/layerkit"
	"github.com/asynctp/asynctp/internal/testing/emuworld"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// deviceIDs is the decoder's token embedding on ids it uploads.
type deviceIDs struct {
	e   *layers.Embedding
	b   tensor.Backend
	ids *tensor.Tensor
}

func (d *deviceIDs) Forward(out, ids *tensor.Tensor) error {
	d.ids = layerkit.Ensure(d.b, d.ids, tensor.Int32, ids.Shape()...)
	d.b.Upload(d.ids, ids)
	return d.e.Forward(layerkit.Reshape(out, append(ids.Shape().Clone(), d.e.Dim)...), d.ids)
}

func (d *deviceIDs) Backward(dout *tensor.Tensor) error { return d.e.Backward(dout) }

// stepRecord is what a training loop reports of a step.
type stepRecord struct {
	loss, aux float64
	stats     []layers.MoEStats
}

// emuDecoder builds, on an emulated rank of world c, a decoder of two
// blocks (attention, then the EP MoE over the pipelined path) whose
// replica is this rank's half of the batch, the loss summed over the
// world.
func emuDecoder(b *cudabackend.Backend, c comm.Comm, bar *emuworld.Barrier, vocab, seq, dim, maxTok int, mc layers.MoEConfig) (*layers.Decoder, *layers.ParamSet, []*ep.MoE, error) {
	ps := layers.NewParamSet(5)
	emb, err := layers.NewEmbedding(b, ps, "embed", vocab, dim, 0.5)
	if err != nil {
		return nil, nil, nil, err
	}
	var blocks []*layers.Block
	var moes []*ep.MoE
	for l := range 2 {
		name := fmt.Sprintf("blocks.%d", l)
		blk, err := layers.NewBlockFrom(b, ps, name, dim, 1e-5, layers.BlockParts{
			Mixer: func() (layers.Mixer, error) {
				return layers.NewAttention(b, ps, name+".attn", layers.AttentionConfig{Dim: dim, Heads: 2, RopeTheta: 10000, Std: 0.3, OutStd: 0.2})
			},
			FFN: func() (layers.FeedForward, error) {
				m, err := ep.New(b, ps, ep.Parallel{Group: c, MaxTokens: maxTok, Stream: b.Stream(), Overlap: overlap.Single(pipelinedStrategy(WithBeforeWait(bar.Wait)))}, name+".moe", mc)
				moes = append(moes, m)
				return m, err
			},
		})
		if err != nil {
			return nil, nil, nil, err
		}
		blocks = append(blocks, blk)
	}
	norm, err := layers.NewRMSNorm(b, ps, "final_norm", dim, 1e-5)
	if err != nil {
		return nil, nil, nil, err
	}
	head, err := layers.NewLinear(b, ps, "lm_head", layers.LinearConfig{In: dim, Out: vocab, Std: 0.3})
	if err != nil {
		return nil, nil, nil, err
	}
	loss, err := layers.NewCrossEntropy(b, vocab)
	if err != nil {
		return nil, nil, nil, err
	}
	P, r := c.Size(), c.Rank()
	dec, err := layers.NewDecoder(b, layers.DecoderParts{
		What: "emu decoder", Seq: seq, Vocab: vocab, Dim: dim, LogitCols: vocab, DType: tensor.Float32,
		Embed: &deviceIDs{e: emb, b: b}, Blocks: blocks, Norm: norm, Head: head, Loss: loss,
		Replica: func(batch int) (int, int) { return r * batch / P, (r + 1) * batch / P },
		ReduceLoss: func(sum *tensor.Tensor) error {
			w, err := c.AllReduce(sum, comm.Sum, b.Stream())
			if err != nil {
				return err
			}
			return w.Wait(b.Stream())
		},
	})
	if err != nil {
		return nil, nil, nil, err
	}
	if err := ps.Materialize(b, tensor.Float32); err != nil {
		return nil, nil, nil, err
	}
	return dec, ps, moes, nil
}

// TestEmuDecoderMoENoStepWait: a decoder with two EP MoE blocks on the
// device step (pipelined path, grouped GEMM), trained the way train.Run
// does (step s+1 queued before step s's loss and router statistics are
// read), makes no blocking host read and no wait for a read of its own
// step after the first: the aux and z losses and the router statistics
// come one step late with the loss (Decoder.LossAsync,
// Decoder.RouterStatsAsync). Each step's loss, aux loss and statistics are
// bit for bit those read at once after the step (ReadLoss, AuxLoss,
// RouterStats), on random batches with a capacity factor.
func TestEmuDecoderMoENoStepWait(t *testing.T) {
	const P, vocab, seq, dim, batch, steps = 2, 32, 4, 8, 4, 4
	mc := layers.MoEConfig{Dim: dim, Hidden: 12, Experts: 4, TopK: 2, CapacityFactor: 1,
		AuxLossCoef: 0.01, ZLossCoef: 0.001, Std: 0.5, OutStd: 0.3}
	batches := make([][2]*tensor.Tensor, steps)
	rng := rand.New(rand.NewPCG(9, 1))
	for s := range batches {
		ids, targets := tensor.MustHost(tensor.Int32, batch, seq), tensor.MustHost(tensor.Int32, batch, seq)
		for i := range ids.I32() {
			ids.I32()[i], targets.I32()[i] = int32(rng.IntN(vocab)), int32(rng.IntN(vocab))
		}
		batches[s] = [2]*tensor.Tensor{ids, targets}
	}
	maxTok := batch * seq / P
	run := func(late bool) [][]stepRecord {
		var mu sync.Mutex
		recs := make([][]stepRecord, P)
		reg := emuworld.NewRegistry()
		defer reg.CloseAll(t)
		bar := emuworld.NewBarrier(P)
		err := local.Run(P, func(world comm.Comm) error {
			b, reads, err := cudabackend.NewEmulatedCounting(cudabackend.WithGroupedGEMM(true))
			if err != nil {
				return err
			}
			reg.Keep(b)
			c := &countedComm{Sym: newSymComm(world, b, reg), reads: reads}
			dec, ps, moes, err := emuDecoder(b, c, bar, vocab, seq, dim, maxTok, mc)
			if err != nil {
				return err
			}
			var out []stepRecord
			type pending struct {
				loss  func() (float64, error)
				stats func() (float64, []layers.MoEStats, error)
			}
			var prev *pending
			flush := func() error {
				if prev == nil {
					return nil
				}
				l, err := prev.loss()
				if err != nil {
					return err
				}
				aux, st, err := prev.stats()
				if err != nil {
					return err
				}
				out = append(out, stepRecord{l, aux, st})
				prev = nil
				return nil
			}
			var c0, w0 int
			for s := range steps {
				reads.NewStep()
				if s == 1 {
					c0, w0 = reads.Count(), reads.InStepWaits()
				}
				ps.ZeroGrad()
				if err := dec.ForwardAsync(batches[s][0], batches[s][1]); err != nil {
					return err
				}
				for _, m := range moes {
					if !m.DeviceStep() {
						return fmt.Errorf("rank %d: the MoE layer %s does not run the device step", c.Rank(), m.Name)
					}
				}
				if err := dec.Backward(); err != nil {
					return err
				}
				if !late {
					l, err := dec.ReadLoss()
					if err != nil {
						return err
					}
					out = append(out, stepRecord{l, dec.AuxLoss(), dec.RouterStats()})
					continue
				}
				lf, err := dec.LossAsync()
				if err != nil {
					return err
				}
				p := &pending{loss: lf, stats: dec.RouterStatsAsync()}
				if err := flush(); err != nil {
					return err
				}
				prev = p
			}
			c1, w1 := reads.Count(), reads.InStepWaits()
			if err := flush(); err != nil {
				return err
			}
			if late && (c1 != c0 || w1 != w0) {
				return fmt.Errorf("rank %d: in steps 2 to %d, %d blocking host reads and %d waits for a read of the step itself, want 0 and 0",
					c.Rank(), steps, c1-c0, w1-w0)
			}
			mu.Lock()
			recs[c.Rank()] = out
			mu.Unlock()
			return b.Err()
		}, local.WithTimeout(120*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return recs
	}
	late, now := run(true), run(false)
	same := func(a, b float64) bool { return math.Float64bits(a) == math.Float64bits(b) }
	for r := range P {
		if len(late[r]) != steps || len(now[r]) != steps {
			t.Fatalf("rank %d: %d and %d records, want %d", r, len(late[r]), len(now[r]), steps)
		}
		for s := range steps {
			g, w := late[r][s], now[r][s]
			if !same(g.loss, w.loss) || !same(g.aux, w.aux) || fmt.Sprintf("%#v", g.stats) != fmt.Sprintf("%#v", w.stats) {
				t.Errorf("rank %d step %d: read late loss %v aux %v stats %+v, read at once %v, %v, %+v", r, s+1, g.loss, g.aux, g.stats, w.loss, w.aux, w.stats)
			}
		}
		if r == 0 {
			for s := 1; s < steps; s++ {
				if fmt.Sprint(now[r][s].stats) == fmt.Sprint(now[r][s-1].stats) {
					t.Errorf("steps %d and %d have the same statistics %+v: the check cannot tell a step's values from the one before's", s, s+1, now[r][s].stats)
				}
			}
			t.Logf("step 1: loss %v, aux %v, %+v", now[r][0].loss, now[r][0].aux, now[r][0].stats)
		}
	}
}
