package cudabackend

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/tensor"
)

// TestGroupedEngineShapeChecks checks the grouped engine's argument checks
// on host tensors (no GPU needed): what it accepts, and errors that say
// what was found and what was expected.
func TestGroupedEngineShapeChecks(t *testing.T) {
	h := func(dt tensor.DType, shape ...int) *tensor.Tensor { return tensor.MustHost(dt, shape...) }
	bf, f32, i32 := tensor.BFloat16, tensor.Float32, tensor.Int32
	// Forward: a (13, 16), w (3, 24, 16) → c (13, 24); M = 13 needs no multiple of 8.
	g, m, n, k, err := groupedEngineShape(h(bf, 13, 24), h(bf, 13, 16), h(bf, 3, 24, 16), h(i32, 4), true)
	if err != nil || g != 3 || m != 13 || n != 24 || k != 16 {
		t.Fatalf("NT: %d, %d, %d, %d, %v; want 3, 13, 24, 16", g, m, n, k, err)
	}
	// Dgrad: w (3, 16, 24) read as (G, K, N), f32 out.
	if g, m, n, k, err := groupedEngineShape(h(f32, 13, 24), h(bf, 13, 16), h(bf, 3, 16, 24), h(i32, 4), false); err != nil || g != 3 || m != 13 || n != 24 || k != 16 {
		t.Errorf("NN: %d, %d, %d, %d, %v; want 3, 13, 24, 16", g, m, n, k, err)
	}
	// Wgrad: a (5, 16), b (5, 40) → c (2, 16, 40).
	if g, m, p, q, err := groupedEngineShapeTN(h(f32, 2, 16, 40), h(bf, 5, 16), h(bf, 5, 40), h(i32, 3)); err != nil || g != 2 || m != 5 || p != 16 || q != 40 {
		t.Errorf("TN: %d, %d, %d, %d, %v; want 2, 5, 16, 40", g, m, p, q, err)
	}
	for _, tc := range []struct {
		want          string
		c, a, w, offs *tensor.Tensor
		transW        bool
	}{
		{"a is f32 and w is bf16, expected bf16 operands", h(f32, 8, 8), h(f32, 8, 8), h(bf, 1, 8, 8), h(i32, 2), true},
		{"c is i32, expected bf16 or f32", h(i32, 8, 8), h(bf, 8, 8), h(bf, 1, 8, 8), h(i32, 2), true},
		{"N = 12, expected a positive multiple of 8", h(bf, 8, 12), h(bf, 8, 8), h(bf, 1, 12, 8), h(i32, 2), true},
		{"K = 12, expected a positive multiple of 8", h(bf, 8, 8), h(bf, 8, 12), h(bf, 1, 12, 8), h(i32, 2), false},
		{"expected (G, N, K) with K = 16", h(bf, 8, 8), h(bf, 8, 16), h(bf, 1, 16, 8), h(i32, 2), true},
		{"c has shape (8, 16), expected (8, 8)", h(bf, 8, 16), h(bf, 8, 8), h(bf, 1, 8, 8), h(i32, 2), true},
		{"offsets is i32 (3), expected (G + 1) = (2) int32 for G = 1", h(bf, 8, 8), h(bf, 8, 8), h(bf, 1, 8, 8), h(i32, 3), true},
		{"offsets is f32 (2), expected", h(bf, 8, 8), h(bf, 8, 8), h(bf, 1, 8, 8), h(f32, 2), true},
		{"G = 1025 groups, expected 1 to 1024", h(bf, 8, 8), h(bf, 8, 8), h(bf, 1025, 8, 8), h(i32, 1026), true},
		{"M = 0 rows, expected 1 to", h(bf, 0, 8), h(bf, 0, 8), h(bf, 2, 8, 8), h(i32, 3), true},
		{"expected a (M, K), w (G, N, K) or (G, K, N)", h(bf, 8, 8), h(bf, 8, 8), h(bf, 8, 8), h(i32, 2), true},
	} {
		if _, _, _, _, err := groupedEngineShape(tc.c, tc.a, tc.w, tc.offs, tc.transW); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
	for _, tc := range []struct {
		want          string
		c, a, b, offs *tensor.Tensor
	}{
		{"P = 12, expected a positive multiple of 8", h(bf, 2, 12, 8), h(bf, 5, 12), h(bf, 5, 8), h(i32, 3)},
		{"Q = 4, expected a positive multiple of 8", h(bf, 2, 8, 4), h(bf, 5, 8), h(bf, 5, 4), h(i32, 3)},
		{"b has shape (6, 8), expected 5 rows", h(bf, 2, 8, 8), h(bf, 5, 8), h(bf, 6, 8), h(i32, 3)},
		{"c has shape (2, 8, 16), expected (2, 8, 8)", h(bf, 2, 8, 16), h(bf, 5, 8), h(bf, 5, 8), h(i32, 3)},
		{"a is bf16 and b is f32, expected bf16 operands", h(f32, 2, 8, 8), h(bf, 5, 8), h(f32, 5, 8), h(i32, 3)},
	} {
		if _, _, _, _, err := groupedEngineShapeTN(tc.c, tc.a, tc.b, tc.offs); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("TN: got %v, want an error containing %q", err, tc.want)
		}
	}
	for _, tc := range []struct {
		tn, transW bool
		out        tensor.DType
		want       string
	}{{false, true, bf, "grouped_sm90_nt_bf16"}, {false, false, f32, "grouped_sm90_nn_f32"}, {true, false, bf, "grouped_sm90_tn_bf16"}, {true, true, f32, "grouped_sm90_tn_f32"}} {
		if got := groupedKernel(tc.tn, tc.transW, tc.out); got != tc.want {
			t.Errorf("groupedKernel(%v, %v, %v) = %s, want %s", tc.tn, tc.transW, tc.out, got, tc.want)
		}
	}
	if groupedKernel(false, true, bf) != groupedEngineProbe {
		t.Errorf("the probe kernel %s is not the NT bf16 kernel %s", groupedEngineProbe, groupedKernel(false, true, bf))
	}
}

// TestGroupedEngineErrors checks the explanation of the kernel's error word
// and the $ASYNCTP_GROUPED values.
func TestGroupedEngineErrors(t *testing.T) {
	ex := groupedExplain("GroupedMatMulTN", 4, 100, nil)
	if err := ex(-1); err == nil || !strings.Contains(err.Error(), "GroupedMatMulTN: the grouped GEMM engine's kernel has no sm_90a code") {
		t.Errorf("explain(-1) = %v; want the missing sm_90a code named", err)
	}
	if err := ex(3); err == nil || !strings.Contains(err.Error(), "GroupedMatMulTN: offsets[3] breaks 0 ≤ offsets[0] ≤ … ≤ offsets[4] ≤ M = 100") {
		t.Errorf("explain(3) = %v; want offsets[3] named", err)
	}
	// With the fused path's wait, a timed-out block is named and wraps
	// ErrGEMMWaitTimeout; offsets entries still read as before.
	exw := groupedExplain("EngineGroupedMatMulHooked", 4, 100, &GroupedWait{Flags: 8, Target: 128, Timeout: time.Second})
	if err := exw(groupedWaitCode + 7); err == nil || !errors.Is(err, ErrGEMMWaitTimeout) || !strings.Contains(err.Error(), "block 7 of a's 128-row blocks") || !strings.Contains(err.Error(), "below 128 for 1s") {
		t.Errorf("explain(block 7) = %v; want block 7, its target and timeout, wrapping ErrGEMMWaitTimeout", err)
	}
	if err := exw(2); err == nil || !strings.Contains(err.Error(), "offsets[2]") {
		t.Errorf("explain(2) with a wait = %v; want offsets[2] named", err)
	}
	for _, tc := range []struct {
		env  string
		simt bool
		want string
	}{{"", false, ""}, {"engine", false, ""}, {"simt", true, ""}, {"cutlass", false, `$ASYNCTP_GROUPED="cutlass": expected "simt", "engine" or unset`}} {
		t.Setenv(EnvGrouped, tc.env)
		simt, err := groupedKernelsFromEnv()
		if tc.want != "" {
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s=%q: %v; want an error containing %q", EnvGrouped, tc.env, err, tc.want)
			}
			continue
		}
		if err != nil || simt != tc.simt {
			t.Errorf("%s=%q: %v, %v; want %v, nil", EnvGrouped, tc.env, simt, err, tc.simt)
		}
	}
	var c config
	WithGroupedGEMM(true)(&c)
	if c.grouped != groupedOn {
		t.Errorf("WithGroupedGEMM(true): %v, want groupedOn", c.grouped)
	}
	WithGroupedGEMM(false)(&c)
	if c.grouped != groupedOff {
		t.Errorf("WithGroupedGEMM(false): %v, want groupedOff", c.grouped)
	}
}

// TestPreferGroupedFor: WithGroupedGEMM decides for every count; without
// it, a layer below GroupedAutoMinExperts takes one GEMM per expert (the
// rest depends on the grouped engine running here: GPU tests).
func TestPreferGroupedFor(t *testing.T) {
	for _, tc := range []struct {
		c      groupedChoice
		groups int
		want   bool
	}{
		{groupedOn, 1, true}, {groupedOn, 64, true},
		{groupedOff, 1, false}, {groupedOff, 64, false},
		{groupedAuto, 1, false}, {groupedAuto, GroupedAutoMinExperts - 1, false},
	} {
		b := &Backend{cfg: config{grouped: tc.c}}
		if got := b.PreferGroupedFor(tc.groups); got != tc.want {
			t.Errorf("choice %d, %d groups: PreferGroupedFor = %v, want %v", tc.c, tc.groups, got, tc.want)
		}
	}
}
