//go:build asynctp_emu

package grads_test

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/emuworld"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/parallel/grads"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The fp32 main gradients of bf16 models, on the CUDA backend's kernels
// run by the CPU emulator (the CPU backend has no bf16 ops).

var emuGPT = layers.GPTConfig{Layers: 1, Dim: 32, Heads: 2, Vocab: 37, Seq: 8, FFN: 64, Seed: 4}

// emuDP2 runs f on 2 emulated ranks, each with its own backend and a grid
// of DP 2 over a comm/local world whose collectives of device tensors go
// through the host (emuworld.Staged), with the ranks' deadline timeout;
// it fails the test on the first rank's error.
func emuDP2(t *testing.T, timeout time.Duration, f func(rank int, b *cudabackend.Backend, g *comm.Grid) error) {
	t.Helper()
	err := local.Run(2, func(c comm.Comm) error {
		b, err := cudabackend.NewEmulated()
		if err != nil {
			return err
		}
		defer b.Close()
		g, err := comm.NewGrid(emuworld.Staged{Comm: c, B: b}, 2, 1, 1)
		if err != nil {
			return err
		}
		defer g.Close()
		return f(c.Rank(), b, g)
	}, local.WithTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
}

// emuBatch is a batch of 4 sequences with every target counted.
func emuBatch() (ids, targets *tensor.Tensor) {
	return testutil.RandInts(testutil.Rng(21), emuGPT.Vocab, 4, emuGPT.Seq), testutil.RandInts(testutil.Rng(22), emuGPT.Vocab, 4, emuGPT.Seq)
}

// TestEmuMainGradsAccumulate: a bf16 GPT's step of two micro-batches sums
// their bf16 gradients in fp32: its main gradients are, bit for bit, the
// fp32 sum of the two micro-batches' gradients taken alone (each half of
// a plain step's on its rows: the loss scale of the whole batch's count
// is half of the micro-batch's, a power of two), not their bf16 sum; and
// AdamW steps on them (fp32 gradients, fp32 master weights).
func TestEmuMainGradsAccumulate(t *testing.T) {
	b := emuworld.Backend(t)
	ids, targets := emuBatch()
	var halves [2][]float64
	for j := range 2 {
		m, err := layers.NewGPT(b, emuGPT, tensor.BFloat16)
		if err != nil {
			t.Fatal(err)
		}
		idj, _ := ids.Rows(2*j, 2*j+2)
		tj, _ := targets.Rows(2*j, 2*j+2)
		if _, err := m.Forward(idj, tj); err != nil {
			t.Fatal(err)
		}
		if err := m.Backward(); err != nil {
			t.Fatal(err)
		}
		_, g := m.Params().Flat()
		halves[j] = testutil.Download(b, g)
	}
	m, err := layers.NewGPT(b, emuGPT, tensor.BFloat16)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetMicroBatches(2); err != nil {
		t.Fatal(err)
	}
	if !m.Params().SeparateMainGrads() || m.Params().MainGrads().DType() != tensor.Float32 {
		t.Fatalf("a bf16 GPT of two micro-batches has main gradients %v, want fp32 ones of its own", m.Params().MainGrads())
	}
	opt, err := optim.NewAdamW(b, m.Params())
	if err != nil {
		t.Fatal(err)
	}
	m.ZeroGrad()
	if err := m.ForwardBackward(ids, targets); err != nil {
		t.Fatal(err)
	}
	got := testutil.Download(b, m.Params().MainGrads())
	roundedApart := 0
	for i, v := range got {
		want := float64(float32(float32(halves[0][i]/2) + float32(halves[1][i]/2)))
		if math.Float64bits(v) != math.Float64bits(want) {
			t.Fatalf("main gradient %d = %v, want the fp32 sum of the halves %v", i, v, want)
		}
		if float64(tensor.BF16ToFloat32(tensor.BF16FromFloat32(float32(want)))) != want {
			roundedApart++
		}
	}
	if roundedApart == 0 {
		t.Fatal("every fp32 sum is a bf16 value: the test cannot tell fp32 accumulation from bf16")
	}
	w0 := testutil.Download(b, m.Params().Params()[0].W)
	if err := opt.Step(1, 1e-2, 1); err != nil {
		t.Fatal(err)
	}
	if w1 := testutil.Download(b, m.Params().Params()[0].W); testutil.RelErr(w1, w0) == 0 {
		t.Fatal("AdamW on the main gradients left the weights as they were")
	}
	t.Logf("%d of %d fp32 sums are not bf16 values", roundedApart, len(got))
}

// TestEmuGradReduceDType: a bf16 model at DP 2 sums its main gradients
// over the replicas in fp32 (each element the fp32 rounding of the exact
// sum of the two replicas' values, as comm/local sums in float64), or, with
// Config.DType bf16, in bf16 (the bf16 rounding of that sum, widened back
// into the main gradients), bit for bit; the values each replica brings
// are read where the sum starts (Config.ReduceBucket, after the
// backward).
func TestEmuGradReduceDType(t *testing.T) {
	ids, targets := emuBatch()
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		t.Run(dt.String(), func(t *testing.T) {
			var mu sync.Mutex
			before := map[int]map[int][]float64{} // rank → bucket start → values
			after := map[int][]float64{}
			emuDP2(t, 2*time.Minute, func(rank int, b *cudabackend.Backend, g *comm.Grid) error {
				mine := map[int][]float64{}
				cfg := grads.Config{DType: dt, BucketBytes: 4096, AfterBackward: true,
					ReduceBucket: func(bkt grads.Bucket, buf *tensor.Tensor, s comm.Stream) (comm.Work, error) {
						if buf.DType() != dt {
							return nil, fmt.Errorf("bucket [%d, %d) summed in %v, want %v", bkt.Lo, bkt.Hi, buf.DType(), dt)
						}
						mine[bkt.Lo] = testutil.Download(b, buf)
						return bkt.Group.AllReduce(buf, comm.Sum, s)
					}}
				m, err := model.New(b, g, emuGPT, model.Options{GradReduce: cfg}, tensor.BFloat16)
				if err != nil {
					return err
				}
				if len(m.Buckets()) < 2 {
					return fmt.Errorf("%d buckets, want several", len(m.Buckets()))
				}
				m.ZeroGrad()
				if err := m.ForwardBackward(ids, targets); err != nil {
					return err
				}
				mu.Lock()
				before[rank], after[rank] = mine, testutil.Download(b, m.Params().MainGrads())
				mu.Unlock()
				if err := m.Close(); err != nil {
					return err
				}
				return b.Err()
			})
			if len(after[0]) != len(after[1]) {
				t.Fatal("the ranks' main gradients differ in size")
			}
			for lo, a := range before[0] {
				bv := before[1][lo]
				for i := range a {
					sum := float32(a[i] + bv[i])
					if dt == tensor.BFloat16 {
						sum = tensor.BF16ToFloat32(tensor.BF16FromFloat32(sum))
					}
					for r := range 2 {
						if got := after[r][lo+i]; math.Float64bits(got) != math.Float64bits(float64(sum)) {
							t.Fatalf("rank %d main gradient %d = %v, want %v (the replicas' %v + %v in %v)", r, lo+i, got, sum, a[i], bv[i], dt)
						}
					}
				}
			}
		})
	}
}
