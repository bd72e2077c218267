//go:build asynctp_emu

package grads_test

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/parallel/grads"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// TestEmuDistributedOptimizer: on the CUDA backend's kernels (the
// emulator), a bf16 GPT at DP 2 with its optimizer's state sharded over
// the replicas (fp32 master weights and moments of each rank's parts,
// fp32 main gradients reduce-scattered, bf16 parameters all-gathered)
// takes 3 AdamW steps to the replicated optimizer's bf16 parameters and
// fp32 master weights bit for bit (no clipping: the norm's summation order
// is the only thing the two compute differently).
func TestEmuDistributedOptimizer(t *testing.T) {
	ids, targets := emuBatch()
	var mu sync.Mutex
	params := map[bool][][]float64{}
	masters := map[bool][][]float64{}
	for _, dist := range []bool{false, true} {
		emuDP2(t, 5*time.Minute, func(_ int, b *cudabackend.Backend, g *comm.Grid) error {
			m, err := model.New(b, g, emuGPT, model.Options{DistributedOptimizer: dist, GradReduce: grads.Config{BucketBytes: 4096, AfterBackward: true}}, tensor.BFloat16)
			if err != nil {
				return err
			}
			cfg := optim.AdamWConfig{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
			var opt *optim.AdamW
			if sh, ok := m.OptimizerSharding(); ok {
				opt, err = optim.NewShardedAdamW(b, m.Params(), cfg, sh)
			} else {
				opt, err = optim.NewAdamWWithConfig(b, m.Params(), cfg)
			}
			if err != nil {
				return err
			}
			for step := 1; step <= 3; step++ {
				m.ZeroGrad()
				if err := m.ForwardBackward(ids, targets); err != nil {
					return err
				}
				read, err := opt.ClipStep(step, 1e-2, 0, m)
				if err != nil {
					return err
				}
				if _, err := read.Wait(); err != nil {
					return err
				}
			}
			if err := m.Close(); err != nil { // waits for the last all-gather
				return err
			}
			w, _ := m.Params().Flat()
			full := make([]float64, w.Numel())
			pieces, err := opt.StatePieces()
			if err != nil {
				return err
			}
			for _, p := range pieces { // this rank's master weights, where it holds them
				copy(full[p.Param.Offset()+p.Lo:p.Param.Offset()+p.Hi], testutil.Download(b, p.W))
			}
			mu.Lock()
			params[dist] = append(params[dist], testutil.Download(b, w))
			masters[dist] = append(masters[dist], full)
			mu.Unlock()
			return b.Err()
		})
	}
	for r := range 2 {
		if !slices.Equal(params[true][r], params[false][r]) {
			t.Fatalf("rank %d: the bf16 parameters after 3 steps differ between the distributed and the replicated optimizer", r)
		}
	}
	// The ranks' master weights, each where it holds them, are the
	// replicated optimizer's.
	for i, want := range masters[false][0] {
		got := masters[true][0][i]
		if got == 0 {
			got = masters[true][1][i]
		}
		if math.Float64bits(got) != math.Float64bits(want) && !(got == 0 && want == 0) {
			t.Fatalf("master weight %d: %v with the distributed optimizer, %v with the replicated one", i, got, want)
		}
	}
}

// oneRankOf is a group of size ranks seen from its rank 0, for planning a
// distributed optimizer's parts without any collective.
type oneRankOf struct {
	comm.Comm
	size int
}

func (g oneRankOf) Size() int    { return g.size }
func (g oneRankOf) Rank() int    { return 0 }
func (g oneRankOf) Name() string { return fmt.Sprintf("dp[%d ranks]", g.size) }

// TestEmuDistributedOptimizerLedger prints the memory ledger's account of
// the optimizer state (fp32 master weights, m, v) of rank 0 of a bf16 GPT
// whose optimizer is sharded over DP ranks, for each DP of
// $ASYNCTP_DISTOPT_DP ("1,2,4,8" by default; 1 is the replicated
// optimizer), at the shapes of $ASYNCTP_DISTOPT_LEDGER
// ("name:layers,dim,heads,ffn,vocab;..."), on the emulator's kernels with
// the arithmetic left out (NewEmulatedAccounting: the allocations alone);
// skipped without it. It fails if a rank's state is not the replicated
// state over DP within 5 %. BENCHMARKS.md's figures come from it.
func TestEmuDistributedOptimizerLedger(t *testing.T) {
	spec := os.Getenv("ASYNCTP_DISTOPT_LEDGER")
	if spec == "" {
		t.Skip("set ASYNCTP_DISTOPT_LEDGER=name:layers,dim,heads,ffn,vocab;...")
	}
	dps := []int{1, 2, 4, 8}
	if v := os.Getenv("ASYNCTP_DISTOPT_DP"); v != "" {
		dps = nil
		for _, f := range strings.Split(v, ",") {
			var d int
			if _, err := fmt.Sscan(f, &d); err != nil || d < 1 {
				t.Fatalf("ASYNCTP_DISTOPT_DP=%q: expected sizes ≥ 1", v)
			}
			dps = append(dps, d)
		}
	}
	for _, item := range strings.Split(spec, ";") {
		name, dims, ok := strings.Cut(item, ":")
		var v [5]int
		if _, err := fmt.Sscanf(dims, "%d,%d,%d,%d,%d", &v[0], &v[1], &v[2], &v[3], &v[4]); err != nil || !ok {
			t.Fatalf("%q: expected name:layers,dim,heads,ffn,vocab (%v)", item, err)
		}
		cfg := layers.GPTConfig{Layers: v[0], Dim: v[1], Heads: v[2], FFN: v[3], Vocab: v[4], Seq: 64, TiedEmbeddings: true, Seed: 1}
		var replicated int64
		for _, dp := range dps {
			b, err := cudabackend.NewEmulatedAccounting(cudabackend.WithMemLedger())
			if err != nil {
				t.Fatal(err)
			}
			m, err := layers.NewGPT(b, cfg, tensor.BFloat16)
			if err != nil {
				t.Fatal(err)
			}
			ps := m.Params()
			if err := ps.UseMainGrads(); err != nil {
				t.Fatal(err)
			}
			acfg := optim.AdamWConfig{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
			var opt *optim.AdamW
			if dp == 1 {
				opt, err = optim.NewAdamWWithConfig(b, ps, acfg)
			} else {
				var red *grads.Reducer
				red, err = grads.NewReducerWith(b, ps, shard.Whole(ps.Params()), grads.Groups{DP: oneRankOf{size: dp}}, grads.Config{Shard: true})
				if err != nil {
					t.Fatal(err)
				}
				sh, _ := red.Sharding()
				opt, err = optim.NewShardedAdamW(b, ps, acfg, sh)
			}
			if err != nil {
				t.Fatal(err)
			}
			rep, _ := b.MemLedger()
			state := category(rep, cudabackend.CatOptimizer)
			if dp == 1 {
				replicated = state
			}
			ratio := float64(state) * float64(dp) / float64(replicated)
			fmt.Printf("%s (%.1fM parameters), DP %d: optimizer state per rank %9.1f MiB (ledger; the optimizer's own count %9.1f MiB), × DP / replicated = %.4f\n",
				name, float64(ps.Numel())/1e6, dp, float64(state)/(1<<20), float64(opt.StateBytes())/(1<<20), ratio)
			if math.Abs(ratio-1) > 0.05 {
				t.Errorf("%s at DP %d: a rank's optimizer state is %.4f of the replicated state / DP, want within 5 %%", name, dp, ratio)
			}
			_ = b.Close()
		}
	}
}

// category is the bytes of a ledger category at the in-use peak.
func category(r cudabackend.MemReport, cat string) int64 {
	for _, c := range r.Categories() {
		if c.Category == cat {
			return c.Bytes
		}
	}
	return 0
}
