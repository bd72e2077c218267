package main

import (
	"math"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/train"
)

// TestAccumFlagsRefused: a batch that is not micro-batch × steps × dp, an
// unknown reduction dtype, a bf16 reduction of the CPU's f32 model, a
// negative bucket size, and reduction settings for a run of one rank
// (which sums nothing) are refused, each naming the flags.
func TestAccumFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--micro-batch", "3"}, "--batch 4 is not --micro-batch 3 × accumulation steps × --dp 1"},
		{[]string{"--dp", "2", "--micro-batch", "4"}, "--micro-batch 4"},
		{[]string{"--dp", "2", "--micro-batch", "2", "--batch", "6"}, "micro-batch × dp = 4"},
		{[]string{"--dp", "2", "--grad-reduce-dtype", "fp16"}, `--grad-reduce-dtype "fp16", expected fp32 or bf16`},
		{[]string{"--dp", "2", "--grad-reduce-dtype", "bf16"}, "expected a bf16 model (--device cuda)"},
		{[]string{"--dp", "2", "--grad-bucket-mb", "-1"}, "--grad-bucket-mb -1"},
		{[]string{"--grad-bucket-mb", "1"}, "--grad-bucket-mb 1 cannot take effect: the buckets hold the sums over data-parallel replicas"},
		{[]string{"--tp", "2", "--overlap-grad-reduce=false"}, "--overlap-grad-reduce false cannot take effect"},
		{[]string{"--grad-reduce-dtype", "fp32"}, "--grad-reduce-dtype fp32 cannot take effect: a run of one rank"},
	} {
		_, err := loadConfig(par(t.TempDir(), c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
	// An MoE model at EP 1 sums its experts over the TP ranks that hold them.
	if _, err := loadConfig(par(t.TempDir(), append([]string{"--tp", "2", "--grad-bucket-mb", "1", "--micro-batch", "2"}, moe...)...)); err != nil {
		t.Errorf("buckets of an MoE model at TP 2: %v", err)
	}
}

// TestMicroBatchRuns: a run of micro-batches trains as the run of whole
// batches (dense, 1e-5); at DP 2 over tcp processes with buckets of 2 KiB
// (several per rank) it matches the single-process run of the same
// micro-batches, and so does an MoE run at EP 2 with the tokens per expert
// of every step exactly; with the sums after the backward
// (--overlap-grad-reduce=false) the losses are the same bits as with them
// behind it.
func TestMicroBatchRuns(t *testing.T) {
	steps := []string{"--steps", "6"}
	whole := metrics(t, trainRun(t, steps...))
	micro := metrics(t, trainRun(t, append(steps, "--micro-batch", "2")...))
	sameRun(t, "--micro-batch 2", micro, whole, 1e-5)
	microMoE := metrics(t, trainRun(t, append(append(steps, moe...), "--micro-batch", "2")...))
	for _, c := range []struct {
		name string
		args []string
		want []train.StepMetrics
	}{
		{"dense", []string{"--dp", "2"}, micro},
		{"moe", append([]string{"--ep", "2"}, moe...), microMoE},
	} {
		args := append(append([]string{"--nproc", "2", "--comm", "tcp", "--micro-batch", "1", "--grad-bucket-mb", "0.002"}, steps...), c.args...)
		sameRun(t, c.name+" "+strings.Join(args, " "), metrics(t, trainRun(t, args...)), c.want, 1e-5)
	}
	for _, procs := range [][]string{nil, {"--nproc", "2", "--comm", "tcp"}} {
		args := append(append(procs, steps...), "--dp", "2", "--micro-batch", "1", "--grad-bucket-mb", "0.002")
		sameBits(t, strings.Join(args, " ")+" behind and after the backward",
			metrics(t, trainRun(t, args...)), metrics(t, trainRun(t, append(args, "--overlap-grad-reduce=false")...)))
	}
}

// sameBits checks that two runs' losses and gradient norms are the same
// bits at every step.
func sameBits(t *testing.T, name string, got, want []train.StepMetrics) {
	t.Helper()
	if len(got) != len(want) || len(want) == 0 {
		t.Fatalf("%s: %d steps, want %d", name, len(got), len(want))
	}
	for i := range want {
		if math.Float64bits(got[i].Loss) != math.Float64bits(want[i].Loss) || got[i].GradNorm != want[i].GradNorm {
			t.Fatalf("%s: step %d: loss %v, norm %v; want %v, %v bit for bit", name, want[i].Step, got[i].Loss, got[i].GradNorm, want[i].Loss, want[i].GradNorm)
		}
	}
}

// TestRecomputeRuns: --recompute attention and block train with the
// losses and gradient norms of --recompute none bit for bit, on one rank,
// at TP 2 with sequence parallelism, and (block) at TP 2 over tcp
// processes with an MoE model; an unknown mode is refused.
func TestRecomputeRuns(t *testing.T) {
	steps := []string{"--steps", "4", "--layers", "3"}
	for _, c := range []struct {
		layout []string
		modes  []string
	}{
		{nil, []string{"attention", "block"}},
		{[]string{"--tp", "2", "--sequence-parallel"}, []string{"attention", "block"}},
		{append([]string{"--nproc", "2", "--comm", "tcp", "--tp", "2", "--ep", "2"}, moe...), []string{"block"}},
	} {
		args := append(append([]string{}, steps...), c.layout...)
		want := metrics(t, trainRun(t, args...))
		for _, mode := range c.modes {
			sameBits(t, strings.Join(args, " ")+" --recompute "+mode, metrics(t, trainRun(t, append(args, "--recompute", mode)...)), want)
		}
	}
	if _, err := loadConfig(par(t.TempDir(), "--recompute", "full")); err == nil || !strings.Contains(err.Error(), `recompute = "full", want none, attention or block`) {
		t.Errorf("--recompute full: %v", err)
	}
}
