package main

import (
	"strings"
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

// --grouped-gemm: its values are taken as given, an unknown one and on/off
// for a dense model are refused, the CUDA backend gets one option for on
// and off and none for auto, and on the CPU off declines the grouped op
// (the CPU's MoE ops stay).
func TestGroupedGEMMFlag(t *testing.T) {
	t.Setenv(envAttention, "")
	out := t.TempDir()
	args := append(par(out), moe...)
	for _, mode := range groupedModes {
		cfg, err := loadConfig(append(append([]string{}, args...), "--grouped-gemm", mode))
		if err != nil {
			t.Fatalf("--grouped-gemm %s: %v", mode, err)
		}
		if cfg.GroupedGEMM != mode {
			t.Errorf("--grouped-gemm %s: config has %q", mode, cfg.GroupedGEMM)
		}
		opts, _, _, err := cudaOptions(cfg.GroupedGEMM)
		if want := map[string]int{GroupedAuto: 0, GroupedOn: 1, GroupedOff: 1}[mode]; err != nil || len(opts) != want {
			t.Errorf("--grouped-gemm %s: %d CUDA options (%v), want %d", mode, len(opts), err, want)
		}
		b, _, _, err := openBackend("cpu", mode)
		if err != nil {
			t.Fatalf("--grouped-gemm %s on the CPU: %v", mode, err)
		}
		if got := tensor.UseGrouped(b) != nil; got != (mode != GroupedOff) {
			t.Errorf("--grouped-gemm %s on the CPU: grouped %v", mode, got)
		}
		if _, err := tensor.MoEOpsOf(b); err != nil {
			t.Errorf("--grouped-gemm %s on the CPU: %v", mode, err)
		}
	}
	if cfg, err := loadConfig(args); err != nil || cfg.GroupedGEMM != GroupedAuto {
		t.Errorf("no --grouped-gemm: %q, %v; want auto", cfg.GroupedGEMM, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(append([]string{}, args...), "--grouped-gemm", "yes"), `--grouped-gemm "yes": expected one of auto, on, off`},
		{append(par(out), "--grouped-gemm", "on"), "--grouped-gemm on: the model has no MoE blocks"},
		{append(par(out), "--grouped-gemm", "off"), "--grouped-gemm off: the model has no MoE blocks"},
	} {
		if _, err := loadConfig(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
	if _, err := loadConfig(append(par(out), "--grouped-gemm", "auto")); err != nil {
		t.Errorf("--grouped-gemm auto on a dense model: %v", err)
	}
}

// --grouped-gemm off (one GEMM per expert) writes the losses, aux losses
// and tokens per expert of the grouped default, on one rank and at DP 2 ×
// EP 2, and the header says which path runs.
func TestGroupedGEMMOffFollowsGrouped(t *testing.T) {
	for _, layout := range [][]string{nil, {"--dp", "2", "--ep", "2"}} {
		args := append(append([]string{}, moe...), layout...)
		grouped := metrics(t, trainRun(t, args...))
		off := metrics(t, trainRun(t, append(args, "--grouped-gemm", "off")...))
		sameRun(t, "--grouped-gemm off "+strings.Join(layout, " "), off, grouped, 1e-5)
	}
	for mode, want := range map[string]string{
		GroupedOff: "moe: expert GEMMs one GEMM per expert (--grouped-gemm off); host counts",
		GroupedOn:  "moe: expert GEMMs grouped (cpu's grouped GEMM, one call per projection for all local experts; --grouped-gemm on); host counts",
	} {
		out, code := runMain(t, append(small(t.TempDir(), moe...), "--device", "cpu", "--steps", "1", "--warmup", "0", "--grouped-gemm", mode)...)
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("--grouped-gemm %s: exit %d, want a line %q in:\n%s", mode, code, want, out)
		}
	}
}
