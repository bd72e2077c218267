package cudabackend

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/tensor"
)

// TestEngineShapeChecks checks the engine's argument checks on host tensors
// (no GPU needed): what it accepts, and errors that say what was found and
// what was expected.
func TestEngineShapeChecks(t *testing.T) {
	h := func(dt tensor.DType, shape ...int) *tensor.Tensor { return tensor.MustHost(dt, shape...) }
	bf, f32 := tensor.BFloat16, tensor.Float32
	m, n, k, err := engineShape(h(f32, 16, 24), h(bf, 40, 16), h(bf, 40, 24), true, false) // TN: dW = dyᵀ·x
	if err != nil || m != 16 || n != 24 || k != 40 {
		t.Fatalf("TN: %d, %d, %d, %v; want 16, 24, 40", m, n, k, err)
	}
	if m, _, _, err := engineShape(h(bf, 13, 8), h(bf, 13, 16), h(bf, 8, 16), false, true); err != nil || m != 13 {
		t.Errorf("NT with M = 13 (a K-major A of 13 rows): %d, %v; want 13, nil", m, err)
	}
	for _, tc := range []struct {
		want    string
		c, a, b *tensor.Tensor
		tA, tB  bool
	}{
		{"c is i32, expected bf16 or f32", h(tensor.Int32, 8, 8), h(bf, 8, 8), h(bf, 8, 8), false, false},
		{"a is f32 and b is bf16, expected bf16 operands", h(f32, 8, 8), h(f32, 8, 8), h(bf, 8, 8), false, false},
		{"N = 12, expected a positive multiple of 8", h(bf, 8, 12), h(bf, 8, 8), h(bf, 12, 8), false, true},
		{"M = 12, expected a positive multiple of 8", h(bf, 12, 8), h(bf, 8, 12), h(bf, 8, 8), true, false}, // an MN-major A: M is its rows' length
		{"expected inner dimension 16", h(bf, 8, 8), h(bf, 8, 16), h(bf, 8, 8), false, false},
		{"c has shape (8, 16), expected (8, 8)", h(bf, 8, 16), h(bf, 8, 8), h(bf, 8, 8), false, false},
		{"expected 2-D tensors", h(bf, 2, 8, 8), h(bf, 2, 8, 8), h(bf, 2, 8, 8), false, false},
	} {
		if _, _, _, err := engineShape(tc.c, tc.a, tc.b, tc.tA, tc.tB); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
	flags := uint64(1 << 20)
	for _, tc := range []struct {
		want   string
		o      GEMMOptions
		tA, tB bool // the layout
	}{
		{"RotateRows = -1", GEMMOptions{RotateRows: -1}, false, false},
		{"Grid = -3, expected ≥ 0", GEMMOptions{Grid: -3}, false, false},
		{"Wait.ChunkRows = 0, expected > 0", GEMMOptions{Wait: &GEMMWait{Flags: flags, Timeout: time.Second}}, false, false},
		{"Wait.Timeout = 0s, expected > 0", GEMMOptions{Wait: &GEMMWait{Flags: flags, ChunkRows: 8}}, false, false},
		{"Signal.Flags = 0x4, expected an 8-byte aligned", GEMMOptions{Signal: &GEMMSignal{Flags: 4}}, false, false},
		{"Store = 3, expected EngineStoreAuto", GEMMOptions{Store: 3}, false, false},
		{"SplitK = -1, expected 0 (the engine chooses) to 32", GEMMOptions{SplitK: -1}, false, false},
		{"SplitK = 33, expected 0 (the engine chooses) to 32", GEMMOptions{SplitK: 33}, false, false},
		{"SplitK = 9, expected at most the 8 k-blocks of 64 in K = 512", GEMMOptions{SplitK: 9}, false, false},
		{"SplitK = 2 with a Wait or Signal hook", GEMMOptions{SplitK: 2, Signal: &GEMMSignal{Flags: 8}}, false, false},
		{"TileN = 128, expected 0 (the engine chooses), 256 or 192", GEMMOptions{TileN: 128}, true, false},
		{"TileN = 192 with transA false, transB true", GEMMOptions{TileN: 192}, false, true},
		{"TileN = 192 with transA true, transB false, Wait false, Signal true", GEMMOptions{TileN: 192, Signal: &GEMMSignal{Flags: 8}}, true, false},
		{"TileN = 192 with transA true, transB false, Wait false, Signal false, Store 2", GEMMOptions{TileN: 192, Store: EngineStoreTMA}, true, false},
	} {
		if err := checkOptions(tc.o, 64, 512, tc.tA, tc.tB); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
	if err := checkOptions(GEMMOptions{RotateRows: 63, GroupM: 4, Wait: &GEMMWait{Flags: flags, ChunkRows: 8, Timeout: time.Second}}, 64, 512, false, false); err != nil {
		t.Errorf("valid options refused: %v", err)
	}
	if err := checkOptions(GEMMOptions{SplitK: 8}, 64, 512, false, false); err != nil {
		t.Errorf("valid split refused: %v", err)
	}
	if err := checkOptions(GEMMOptions{TileN: 192, SplitK: 2}, 64, 512, true, false); err != nil {
		t.Errorf("valid 192-column tiles refused: %v", err)
	}
	for _, tc := range []struct {
		tA, tB bool
		out    tensor.DType
		want   string
	}{{false, true, bf, "gemm_sm90_nt_bf16"}, {false, false, f32, "gemm_sm90_nn_f32"}, {true, false, bf, "gemm_sm90_tn_bf16"}, {true, true, f32, "gemm_sm90_tt_f32"}} {
		if got := engineKernel(tc.tA, tc.tB, tc.out); got != tc.want {
			t.Errorf("engineKernel(%v, %v, %v) = %s, want %s", tc.tA, tc.tB, tc.out, got, tc.want)
		}
	}
}

// TestEngineGridShare: the engine's grid follows the process's MPS share,
// and the SMs it leaves free while it waits.
func TestEngineGridShare(t *testing.T) {
	// The driver's figure wins; a failing or absent query, or one above
	// the device's count, leaves the device's count (which under MPS is
	// the client's share already).
	ctx := func(n int, err error) func() (int, error) { return func() (int, error) { return n, err } }
	for _, c := range []struct {
		sms      int
		ctx      func() (int, error)
		want     int
		fromWord string
	}{
		{132, ctx(60, nil), 60, "cuCtxGetExecAffinity"},
		{66, ctx(66, nil), 66, "cuCtxGetExecAffinity"},
		{66, ctx(0, errors.New("no such call")), 66, "the device's"},
		{66, nil, 66, "the device's"},
		{33, ctx(132, nil), 33, "the device's"},
	} {
		n, from := engineShare(c.sms, c.ctx)
		if n != c.want || !strings.Contains(from, c.fromWord) {
			t.Errorf("engineShare(%d) = %d (%s), want %d (%s)", c.sms, n, from, c.want, c.fromWord)
		}
	}
	for sms, want := range map[int]int{32: 8, 66: 8, 264: 16} {
		if got := EngineReserveSMs(sms); got != want {
			t.Errorf("EngineReserveSMs(%d) = %d, want %d", sms, got, want)
		}
	}
	if got := EngineReserveSMs(132); got != 8 {
		t.Errorf("EngineReserveSMs(132) = %d, want 8", got)
	}
	for _, bad := range []string{"-1", "four", "2.5"} {
		if _, err := parseReserve(bad); err == nil || !strings.Contains(err.Error(), "expected an integer ≥ 0") {
			t.Errorf("parseReserve(%q): %v, want a refusal", bad, err)
		}
	}
	if n, err := parseReserve("12"); err != nil || n != 12 {
		t.Errorf("parseReserve(12) = %d, %v", n, err)
	}
}

// TestEngineSplitKChoice checks engineSplitK on the H200's 132 SMs: no
// split where the tiles fill the SMs or K is short, a split for the weight
// gradients of gpt2-124m (few output tiles, K = 16384 rows), and slices of
// at least 4 k-blocks.
func TestEngineSplitKChoice(t *testing.T) {
	for _, tc := range []struct {
		name             string
		tiles, kblocks   int
		wantMin, wantMax int
	}{
		{"many tiles (gpt2 qkv forward, 1152)", 1152, 12, 1, 1},
		{"one wave of tiles, long K (TP 16384x1536x8192 fwd, 768)", 768, 128, 1, 1},
		{"short K (3 k-blocks)", 4, 3, 1, 1},
		{"dW 768x768 (18 tiles), K 16384", 18, 256, 4, 7},
		{"dW 2304x768 (54 tiles), K 16384", 54, 256, 2, 2},
		{"one tile, K 512 (8 k-blocks): not worth a second launch", 1, 8, 1, 1},
		{"one tile, K 4096 (64 k-blocks)", 1, 64, 8, 16},
	} {
		got, _ := engineSplitK(tc.tiles, tc.kblocks, 132, 1)
		if got < tc.wantMin || got > tc.wantMax {
			t.Errorf("%s: engineSplitK(%d, %d, 132, 1) = %d, want %d to %d", tc.name, tc.tiles, tc.kblocks, got, tc.wantMin, tc.wantMax)
		}
		if got > 1 && tc.kblocks < 4*got {
			t.Errorf("%s: %d slices of %d k-blocks: fewer than 4 per slice", tc.name, got, tc.kblocks)
		}
	}
}

// TestEngineTMAStoreChoice checks which calls take the TMA-store kernels:
// asked for with a bf16 C, or chosen for a bf16 C with no signal, no split
// and K ≤ engineTMAStoreMaxK or beta ≠ 0; never an f32 C or a staged
// request.
func TestEngineTMAStoreChoice(t *testing.T) {
	host := func(dt tensor.DType) *tensor.Tensor {
		buf, err := tensor.NewHostBuffer(dt, 64)
		if err != nil {
			t.Fatal(err)
		}
		x, err := tensor.New(buf, 0, 8, 8)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	bf, f32 := host(tensor.BFloat16), host(tensor.Float32)
	sig := &GEMMSignal{Flags: 8}
	for _, tc := range []struct {
		name  string
		store EngineStore
		e     engineCall
		split int
		want  bool
	}{
		{"auto, short K", EngineStoreAuto, engineCall{c: bf, k: 768}, 1, true},
		{"auto, K at the bound", EngineStoreAuto, engineCall{c: bf, k: engineTMAStoreMaxK}, 1, true},
		{"auto, long K", EngineStoreAuto, engineCall{c: bf, k: engineTMAStoreMaxK + 8}, 1, false},
		{"auto, beta 1", EngineStoreAuto, engineCall{c: bf, k: 768, beta: 1}, 1, true},
		{"auto, beta 1, long K", EngineStoreAuto, engineCall{c: bf, k: 8192, beta: 1}, 1, true},
		{"auto, beta 1, split", EngineStoreAuto, engineCall{c: bf, k: 8192, beta: 1}, 4, false},
		{"auto, a signal", EngineStoreAuto, engineCall{c: bf, k: 768, opt: GEMMOptions{Signal: sig}}, 1, false},
		{"auto, split", EngineStoreAuto, engineCall{c: bf, k: 768}, 2, false},
		{"auto, f32 C", EngineStoreAuto, engineCall{c: f32, k: 768}, 1, false},
		{"asked, long K and beta 1", EngineStoreTMA, engineCall{c: bf, k: 8192, beta: 1}, 1, true},
		{"staged asked", EngineStoreStaged, engineCall{c: bf, k: 768}, 1, false},
	} {
		tc.e.opt.Store = tc.store
		if got := tc.e.tmaStore(tc.split); got != tc.want {
			t.Errorf("%s: tmaStore = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestEngineTileChoice checks the choice between tiles of 256 and 192
// columns on the H200's 132 SMs for gpt2-124m's weight gradients (K = 16384
// rows, 256 k-blocks) and TP ones, and that a call's own TileN, SplitK or
// hooks decide instead.
func TestEngineTileChoice(t *testing.T) {
	for _, tc := range []struct {
		name             string
		m, n             int
		wantTile         int
		wantMin, wantMax int // the slices
	}{
		{"gate,up dW 4096x768: 96 tiles of 256, 128 of 192", 4096, 768, 192, 1, 1},
		{"down dW 768x2048: 48 tiles of 256, 66 of 192", 768, 2048, 192, 2, 2},
		{"qkv dW 2304x768", 2304, 768, 256, 2, 2},
		{"o dW 768x768", 768, 768, 256, 4, 7},
		{"head dW 50304x768: many tiles", 50304, 768, 256, 1, 1},
		{"TP dW 1536x8192", 1536, 8192, 256, 1, 1},
	} {
		tile, split := engineTileChoice(tc.m, tc.n, 256, 132)
		if tile != tc.wantTile || split < tc.wantMin || split > tc.wantMax {
			t.Errorf("%s: engineTileChoice = %d columns, %d slices; want %d, %d to %d", tc.name, tile, split, tc.wantTile, tc.wantMin, tc.wantMax)
		}
	}
	gateUp := engineCall{m: 4096, n: 768, k: 16384, transA: true}
	for _, tc := range []struct {
		name        string
		e           engineCall
		tile, split int
	}{
		{"the weight gradient, auto", gateUp, 192, 1},
		{"another layout (nt)", engineCall{m: 4096, n: 768, k: 16384, transB: true}, 256, 4},
		{"TileN asked", engineCall{m: 4096, n: 768, k: 16384, transA: true, opt: GEMMOptions{TileN: 256}}, 256, 4},
		{"SplitK asked", engineCall{m: 4096, n: 768, k: 16384, transA: true, opt: GEMMOptions{SplitK: 2}}, 256, 2},
		{"the TMA store asked", engineCall{m: 4096, n: 768, k: 16384, transA: true, opt: GEMMOptions{Store: EngineStoreTMA}}, 256, 4},
		{"a hook", engineCall{m: 4096, n: 768, k: 16384, transA: true, opt: GEMMOptions{Signal: &GEMMSignal{Flags: 8}}}, 256, 1},
	} {
		if tile, split := tc.e.tiling(132); tile != tc.tile || split != tc.split {
			t.Errorf("%s: tiling = %d columns, %d slices; want %d, %d", tc.name, tile, split, tc.tile, tc.split)
		}
	}
}
