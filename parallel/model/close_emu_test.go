//go:build asynctp_emu

package model_test

import (
	"fmt"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/testing/emuworld"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/parallel/ep/peerep"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// TestEmuModelCloseFreesSymmetric: on the kernel emulator, two ranks whose
// hybrid groups have the emulated symmetric memory (emuworld.Sym: the
// collectives of one comm/local world, the symmetric allocations of
// another, counted by its registry), the model at TP 2 with sequence
// parallelism and its sites pipelined (overlap/peercopy's copy-engine
// pulls) or fused (the GEMM engine's form, bf16), and the MoE model at TP
// 2 × EP 2 with the pipelined expert path (parallel/ep/peerep: symmetric
// buffers and its dispatch engine), runs a step, then Model.Close frees
// every symmetric allocation the model made, on every rank, exactly once
// (a second Close returns nil and frees nothing: the registry would count
// a second free, and the emulated allocator refuses one).
func TestEmuModelCloseFreesSymmetric(t *testing.T) {
	moe := moeConfig()
	moe.Layers = 1
	for _, c := range []struct {
		name     string
		cfg      layers.GPTConfig
		strategy string
		dt       tensor.DType
		ep       int
	}{
		{"pipelined", smallConfig(), "pipelined", tensor.Float32, 1},
		{"fused", smallConfig(), "fused", tensor.BFloat16, 1},
		{"moe/pipelined", moe, "pipelined", tensor.Float32, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			const P = 2
			ids, targets := batch(7, 2, 8, c.cfg.Vocab)
			reg := emuworld.NewRegistry()
			defer reg.CloseAll(t)
			opts := []cudabackend.Option{cudabackend.WithGroupedGEMM(true)}
			err := emuworld.HybridRanks(P, reg, nil, opts, func(w comm.Comm, b *cudabackend.Backend, bar *emuworld.Barrier) error {
				g, err := comm.NewGrid(w, 1, P, c.ep)
				if err != nil {
					return err
				}
				defer g.Close()
				all := strategies.All(strategies.Options{StreamHooks: true, Expert: []peerep.Option{peerep.WithBeforeWait(bar.Wait)}})
				ch, err := overlap.NewChooser(overlap.Config{Default: c.strategy}, all, nil)
				if err != nil {
					return err
				}
				m, err := model.New(b, g, c.cfg, model.Options{SequenceParallel: true, Stream: b.Stream(), Overlap: ch, MaxTokens: 8}, c.dt)
				if err != nil {
					return err
				}
				if sum := ch.Summary(); g.World.Rank() == 0 {
					t.Logf("sites: %v", sum)
				}
				if err := m.ForwardBackward(ids, targets); err != nil {
					return err
				}
				if _, err := m.ReadLoss(); err != nil {
					return err
				}
				if err := m.Close(); err != nil {
					return fmt.Errorf("rank %d: Close: %w", g.World.Rank(), err)
				}
				if err := m.Close(); err != nil {
					return fmt.Errorf("rank %d: second Close: %v, want nil", g.World.Rank(), err)
				}
				return b.Err()
			})
			if err != nil {
				t.Fatal(err)
			}
			n, err := reg.SymmetricCounts()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				t.Fatalf("the model made no symmetric allocation: the %s sites did not run over symmetric memory", c.strategy)
			}
			t.Logf("%d symmetric allocations, each freed once on every rank", n)
		})
	}
}
