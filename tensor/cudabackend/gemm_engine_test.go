package cudabackend

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// The GEMM engine's tests run on an sm_90 GPU and skip elsewhere, saying why
// (no GPU, another architecture, an image without the engine).
//
//	./build/cudabackend.test -test.run 'TestEngine' -test.v
//	./build/cudabackend.test -test.run '^$' -test.bench 'BenchmarkEngine' -test.benchtime 20x

// openEngine opens GPU 0 with MatMul on the engine, or skips.
func openEngine(t testing.TB) *Backend {
	t.Helper()
	return openGPU(t, WithGEMMEngine(GEMMAsyncTP))
}

// engineCase is one engine call with random operands, on the GPU and on the
// CPU reference (fp32 on the bf16-rounded inputs).
type engineCase struct {
	m, n, k        int
	transA, transB bool
	out            tensor.DType
	alpha, beta    float32
}

func (e engineCase) String() string {
	return fmt.Sprintf("%dx%dx%d/%s/%v/beta=%v", e.m, e.n, e.k, engineKernel(e.transA, e.transB, e.out)[len("gemm_sm90_"):], e.out, e.beta)
}

// operands returns the stored shapes of a and b.
func (e engineCase) operands() (ar, ac, br, bc int) {
	ar, ac = e.m, e.k
	if e.transA {
		ar, ac = e.k, e.m
	}
	br, bc = e.k, e.n
	if e.transB {
		br, bc = e.n, e.k
	}
	return
}

// engineInputs makes the operands on g: random a and b, and c random (beta
// ≠ 0) or NaN (beta = 0), and the fp32 reference result on the CPU.
func engineInputs(t *testing.T, g *Backend, e engineCase, seed uint64) (a, b, c *tensor.Tensor, want []float64) {
	t.Helper()
	rng := testutil.Rng(seed)
	ar, ac, br, bc := e.operands()
	av := testutil.RandFloats(rng, ar*ac, -1, 1)
	bv := testutil.RandFloats(rng, br*bc, -1, 1)
	cv := testutil.RandFloats(rng, e.m*e.n, -2, 2)
	for i := range av {
		av[i] = tensor.BFloat16.Round(av[i])
	}
	for i := range bv {
		bv[i] = tensor.BFloat16.Round(bv[i])
	}
	for i := range cv {
		cv[i] = e.out.Round(cv[i])
	}
	a = testutil.Upload(g, tensor.BFloat16, av, ar, ac)
	b = testutil.Upload(g, tensor.BFloat16, bv, br, bc)
	if e.beta == 0 {
		c = testutil.Poisoned(g, e.out, e.m, e.n)
	} else {
		c = testutil.Upload(g, e.out, cv, e.m, e.n)
	}
	ref := cpu.New()
	ra := testutil.Upload(ref, tensor.Float32, av, ar, ac)
	rb := testutil.Upload(ref, tensor.Float32, bv, br, bc)
	rc := testutil.Upload(ref, tensor.Float32, cv, e.m, e.n)
	ref.MatMul(rc, ra, rb, e.transA, e.transB, e.alpha, e.beta)
	if err := ref.Err(); err != nil {
		t.Fatal(err)
	}
	want = testutil.Download(ref, rc)
	for i := range want {
		want[i] = e.out.Round(want[i])
	}
	return a, b, c, want
}

// checkElems compares element by element: |got − want| ≤ tol·max(1, |want|)
// (fp32 accumulation in another order; bf16 outputs may round to the
// neighbouring value). The first bad element is named by row and column.
func checkElems(t *testing.T, name string, got, want []float64, n int, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	bad := 0
	first := -1
	for i := range got {
		if !(math.Abs(got[i]-want[i]) <= tol*math.Max(1, math.Abs(want[i]))) {
			if bad == 0 {
				first = i
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d elements differ; first at (row %d, col %d): got %v, want %v",
			name, bad, len(got), first/n, first%n, got[first], want[first])
	}
}

func engineTol(out tensor.DType) float64 {
	if out == tensor.BFloat16 {
		return 1e-2
	}
	return 1e-4
}

// engineLayouts are MatMul's four transpose combinations: NT (y = x·Wᵀ), NN
// (dx = dy·W), TN (dW = dyᵀ·x) and TT.
var engineLayouts = [][2]bool{{false, true}, {false, false}, {true, false}, {true, true}}

// checkEngineCase runs one engine case on fresh random operands of seed
// with run (c, a, b: the call under test), compares C with the CPU
// reference and returns it (the same seed: the same inputs, for bit
// comparisons between two forms of a call).
func checkEngineCase(t *testing.T, g *Backend, e engineCase, seed uint64, name string, run func(c, a, b *tensor.Tensor) error) []float64 {
	t.Helper()
	a, b, c, want := engineInputs(t, g, e, seed)
	if err := run(c, a, b); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := g.Sync(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	got := testutil.Download(g, c)
	checkElems(t, name, got, want, e.n, engineTol(e.out))
	g.Free(a)
	g.Free(b)
	g.Free(c)
	return got
}

// engineOpts is a run of checkEngineCase: EngineMatMul with o.
func engineOpts(g *Backend, e engineCase, o GEMMOptions) func(c, a, b *tensor.Tensor) error {
	return func(c, a, b *tensor.Tensor) error {
		return g.EngineMatMul(c, a, b, e.transA, e.transB, e.alpha, e.beta, o)
	}
}

// TestEngineConformance checks the engine against the CPU for every layout,
// bf16 and f32 outputs, beta 0 (over a NaN-poisoned C) and 1, on shapes with
// edge tiles in M, N and K (tiles of 128 × 256, K steps of 64). bf16 outputs
// go through MatMul (WithGEMMEngine), f32 ones through EngineMatMul.
func TestEngineConformance(t *testing.T) {
	g := openEngine(t)
	shapes := [][3]int{
		{8, 24, 8}, {136, 264, 200}, {1000, 264, 72}, {128, 256, 64}, {256, 512, 256},
		{1000, 24, 200}, {8, 264, 72}, {384, 768, 1024}, {520, 1032, 136},
	}
	// M of no multiple of 8 (any M for a K-major A: the fused sites'
	// ragged rows); the MN-major A layouts (tn, tt) refuse them.
	shapes = append(shapes, [3]int{1, 24, 8}, [3]int{5, 264, 200}, [3]int{1001, 264, 72}, [3]int{131, 520, 136})
	seed := uint64(1)
	for _, s := range shapes {
		for _, l := range engineLayouts {
			if s[0]%8 != 0 && l[0] {
				continue
			}
			for _, out := range []tensor.DType{tensor.BFloat16, tensor.Float32} {
				for _, ab := range [][2]float32{{1, 0}, {0.5, 1}} {
					e := engineCase{m: s[0], n: s[1], k: s[2], transA: l[0], transB: l[1], out: out, alpha: ab[0], beta: ab[1]}
					seed++
					checkEngineCase(t, g, e, seed, e.String(), func(c, a, b *tensor.Tensor) error {
						if out != tensor.BFloat16 {
							return g.EngineMatMul(c, a, b, e.transA, e.transB, e.alpha, e.beta, GEMMOptions{})
						}
						if !g.useEngine(c, a, b, e.transA, e.transB, 1) {
							t.Fatalf("%v: MatMul would not take the engine", e)
						}
						g.MatMul(c, a, b, e.transA, e.transB, e.alpha, e.beta)
						return nil
					})
				}
			}
		}
	}
}

// TestEngineSplitK checks the split-K path against the CPU for every layout,
// both output dtypes and beta 0 / 1: explicit slice counts, including one
// whose last slice is empty (K = 1024 is 16 k-blocks; 5 slices of 4), a K
// that is no multiple of 64 with edge tiles, and the same bits on a second
// run (the slices are added in a fixed order).
func TestEngineSplitK(t *testing.T) {
	g := openEngine(t)
	seed := uint64(900)
	for _, sc := range []struct {
		m, n, k int
		splits  []int
	}{
		{384, 768, 1024, []int{2, 3, 5}},
		{136, 264, 2000, []int{7}},
	} {
		for _, l := range engineLayouts {
			for _, out := range []tensor.DType{tensor.BFloat16, tensor.Float32} {
				for _, ab := range [][2]float32{{1, 0}, {0.5, 1}} {
					for _, split := range sc.splits {
						e := engineCase{m: sc.m, n: sc.n, k: sc.k, transA: l[0], transB: l[1], out: out, alpha: ab[0], beta: ab[1]}
						name := fmt.Sprintf("%v/split=%d", e, split)
						seed++
						a, b, c, want := engineInputs(t, g, e, seed)
						c0 := testutil.Download(g, c)
						// The same bits whichever unit of a tile counts last:
						// a second run, a grid of 3 CTAs (each takes many
						// units, in another order), and for a bf16 C the
						// TMA-store kernel's split path.
						runs := []GEMMOptions{{SplitK: split}, {SplitK: split}, {SplitK: split, Grid: 3}}
						if out == tensor.BFloat16 {
							runs = append(runs, GEMMOptions{SplitK: split, Store: EngineStoreTMA})
						}
						var first []float64
						for run, o := range runs {
							if run > 0 { // the same C as the first run started from
								g.Free(c)
								c = testutil.Upload(g, out, c0, e.m, e.n)
							}
							if err := g.EngineMatMul(c, a, b, e.transA, e.transB, e.alpha, e.beta, o); err != nil {
								t.Fatalf("%s %+v: %v", name, o, err)
							}
							if err := g.Sync(); err != nil {
								t.Fatalf("%s %+v: %v", name, o, err)
							}
							got := testutil.Download(g, c)
							if run == 0 {
								checkElems(t, name, got, want, e.n, engineTol(out))
								first = got
							} else if i := firstBitDiff(got, first); i >= 0 {
								t.Errorf("%s: run %d (%+v) differs from run 1 at element %d: %v, %v", name, run+1, o, i, got[i], first[i])
							}
						}
						g.Free(a)
						g.Free(b)
						g.Free(c)
					}
				}
			}
		}
	}
}

// TestEngineTileN192 checks the …_n192 kernels (tiles of 128 × 192, the
// weight-gradient layout) against the CPU, bf16 and f32 C, beta 0 (over a
// poisoned C) and 1, edge tiles in M, N and K, with and without split-K,
// and against tiles of 256 columns with the same split bit for bit (each
// element's K sum runs in the same order).
func TestEngineTileN192(t *testing.T) {
	g := openEngine(t)
	seed := uint64(2600)
	for _, sh := range [][3]int{{384, 776, 1024}, {136, 200, 2000}, {264, 192, 64}, {8, 8, 8}} {
		for _, out := range []tensor.DType{tensor.BFloat16, tensor.Float32} {
			for _, ab := range [][2]float32{{1, 0}, {0.5, 1}} {
				for _, split := range []int{1, 2, 3} {
					if split > ceilDiv(sh[2], 64) {
						continue
					}
					e := engineCase{m: sh[0], n: sh[1], k: sh[2], transA: true, transB: false, out: out, alpha: ab[0], beta: ab[1]}
					seed++
					name := fmt.Sprintf("%v/split=%d", e, split)
					wide := checkEngineCase(t, g, e, seed, name+"/tilen=256", engineOpts(g, e, GEMMOptions{TileN: EngineTileN, SplitK: split}))
					got := checkEngineCase(t, g, e, seed, name+"/tilen=192", engineOpts(g, e, GEMMOptions{TileN: engineTileN192, SplitK: split}))
					if i := firstBitDiff(got, wide); i >= 0 {
						t.Errorf("%s/tilen=192: element %d is %v, %v with tiles of 256 columns", name, i, got[i], wide[i])
					}
				}
			}
		}
	}
}

// TestEngineStore checks both epilogues against the CPU on every layout
// with a bf16 C, and against each other bit for bit: the staged one and the
// TMA store (beta ≠ 0: C loaded by TMA during the main loop), on shapes
// with edge tiles in M and N (TMA clips the boxes), a K above the automatic
// choice's bound, and M of no multiple of 8 for a K-major A.
func TestEngineStore(t *testing.T) {
	g := openEngine(t)
	seed := uint64(1900)
	for _, sh := range [][3]int{{136, 264, 200}, {1001, 520, 72}, {5, 24, 8}, {264, 776, 4160}, {520, 1032, 136}} {
		for _, l := range engineLayouts {
			if sh[0]%8 != 0 && l[0] {
				continue
			}
			for _, ab := range [][2]float32{{1, 0}, {0.5, 1}, {0.75, -0.375}} {
				e := engineCase{m: sh[0], n: sh[1], k: sh[2], transA: l[0], transB: l[1], out: tensor.BFloat16, alpha: ab[0], beta: ab[1]}
				seed++
				staged := checkEngineCase(t, g, e, seed, fmt.Sprintf("%v/staged", e), engineOpts(g, e, GEMMOptions{Store: EngineStoreStaged, SplitK: 1}))
				got := checkEngineCase(t, g, e, seed, fmt.Sprintf("%v/tma", e), engineOpts(g, e, GEMMOptions{Store: EngineStoreTMA, SplitK: 1}))
				if i := firstBitDiff(got, staged); i >= 0 {
					t.Errorf("%v/tma: element %d is %v, %v with the staged epilogue", e, i, got[i], staged[i])
				}
			}
		}
	}
	// An f32 C has no TMA-store kernel: refused, saying why.
	a := g.Zeros(tensor.BFloat16, 128, 64)
	w := g.Zeros(tensor.BFloat16, 256, 64)
	c := g.Zeros(tensor.Float32, 128, 256)
	err := g.EngineMatMul(c, a, w, false, true, 1, 0, GEMMOptions{Store: EngineStoreTMA})
	if err == nil || !strings.Contains(err.Error(), "expected bf16") {
		t.Errorf("Store = EngineStoreTMA with an f32 c: got %v, want a refusal naming bf16", err)
	}
}

// firstBitDiff is the first index where got and want differ in bits, -1
// when none does.
func firstBitDiff(got, want []float64) int {
	for i := range got {
		if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
			return i
		}
	}
	return -1
}

// TestEngineTileOrder checks that the raster group and the rotation change
// the order only: every setting gives the same bits.
func TestEngineTileOrder(t *testing.T) {
	g := openEngine(t)
	e := engineCase{m: 1000, n: 1032, k: 200, transA: false, transB: true, out: tensor.Float32, alpha: 1}
	a, b, c, want := engineInputs(t, g, e, 7)
	var first []float64
	for _, o := range []GEMMOptions{{}, {GroupM: 1}, {GroupM: 3, RotateRows: 300}, {RotateRows: 999}, {GroupM: 100, RotateRows: 128}} {
		if err := g.EngineMatMul(c, a, b, e.transA, e.transB, e.alpha, e.beta, o); err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		got := testutil.Download(g, c)
		if err := g.Err(); err != nil {
			t.Fatal(err)
		}
		checkElems(t, fmt.Sprintf("%v %+v", e, o), got, want, e.n, engineTol(e.out))
		if first == nil {
			first = got
		} else {
			for i := range got {
				if got[i] != first[i] {
					t.Fatalf("%+v: element %d is %v, %v with the default order", o, i, got[i], first[i])
				}
			}
		}
	}
}

// flagWords makes n zeroed 64-bit flags (pairs of int32, little-endian).
func flagWords(g *Backend, n int) *tensor.Tensor { return g.Zeros(tensor.Int32, 2*n) }

// setFlags uploads vals into the 64-bit flags f.
func setFlags(t testing.TB, g *Backend, f *tensor.Tensor, vals []uint64) {
	t.Helper()
	w := make([]int32, 2*len(vals))
	for i, v := range vals {
		w[2*i], w[2*i+1] = int32(uint32(v)), int32(uint32(v>>32))
	}
	h, err := tensor.FromInt32(w, len(w))
	if err != nil {
		t.Fatal(err)
	}
	g.Upload(f, h)
}

// readFlags downloads the 64-bit flags f.
func readFlags(t *testing.T, g *Backend, f *tensor.Tensor) []uint64 {
	t.Helper()
	h := tensor.MustHost(tensor.Int32, f.Shape()...)
	g.Download(h, f)
	if err := g.Err(); err != nil {
		t.Fatal(err)
	}
	w := h.I32()
	v := make([]uint64, len(w)/2)
	for i := range v {
		v[i] = uint64(uint32(w[2*i])) | uint64(uint32(w[2*i+1]))<<32
	}
	return v
}

// TestEngineWaitSignal runs the hooks with every flag already set: the
// result is right and every row block's signal counts its n-blocks, for
// both layouts of A (the wait guards rows of op(A)).
func TestEngineWaitSignal(t *testing.T) {
	g := openEngine(t)
	for _, l := range [][2]bool{{false, true}, {true, false}} {
		e := engineCase{m: 1000, n: 600, k: 136, transA: l[0], transB: l[1], out: tensor.Float32, alpha: 1}
		a, b, c, want := engineInputs(t, g, e, 11)
		const rows = 100
		chunks := ceilDiv(e.m, rows)
		wait := flagWords(g, chunks)
		vals := make([]uint64, chunks)
		for i := range vals {
			vals[i] = 5 + uint64(i) // ≥ the target 5
		}
		setFlags(t, g, wait, vals)
		numM, numN := ceilDiv(e.m, EngineTileM), ceilDiv(e.n, EngineTileN)
		perRow, perTile := flagWords(g, numM), flagWords(g, numM*numN)
		o := GEMMOptions{RotateRows: 300, Wait: &GEMMWait{Flags: DevicePtr(wait), ChunkRows: rows, Target: 5, Timeout: time.Second},
			Signal: &GEMMSignal{Flags: DevicePtr(perRow), PerRowBlock: true, Value: 1}}
		if err := g.EngineMatMul(c, a, b, e.transA, e.transB, 1, 0, o); err != nil {
			t.Fatal(err)
		}
		o.Signal = &GEMMSignal{Flags: DevicePtr(perTile), Value: 3}
		if err := g.EngineMatMul(c, a, b, e.transA, e.transB, 1, 0, o); err != nil {
			t.Fatal(err)
		}
		if err := g.Sync(); err != nil {
			t.Fatalf("%v: %v", e, err)
		}
		checkElems(t, e.String(), testutil.Download(g, c), want, e.n, engineTol(e.out))
		for i, v := range readFlags(t, g, perRow) {
			if v != uint64(numN) {
				t.Errorf("%v: row block %d signalled %d, want %d (one per n-block)", e, i, v, numN)
			}
		}
		for i, v := range readFlags(t, g, perTile) {
			if v != 3 {
				t.Errorf("%v: tile %d (m-block %d, n-block %d) signalled %d, want 3", e, i, i/numN, i%numN, v)
			}
		}
	}
}

// TestEngineWaitTimeout leaves one chunk's flag short of the target: the
// kernel must stop at its deadline and the next Sync fail naming the chunk.
func TestEngineWaitTimeout(t *testing.T) {
	g := openEngine(t)
	e := engineCase{m: 1000, n: 600, k: 136, transB: true, out: tensor.BFloat16, alpha: 1}
	a, b, c, _ := engineInputs(t, g, e, 13)
	const rows = 100
	chunks := ceilDiv(e.m, rows)
	wait := flagWords(g, chunks)
	vals := make([]uint64, chunks)
	for i := range vals {
		vals[i] = 1
	}
	vals[7] = 0 // rows 700 to 799 never arrive
	setFlags(t, g, wait, vals)
	if err := g.Sync(); err != nil {
		t.Fatal(err)
	}
	const timeout = 50 * time.Millisecond
	start := time.Now()
	err := g.EngineMatMul(c, a, b, e.transA, e.transB, 1, 0, GEMMOptions{
		Wait: &GEMMWait{Flags: DevicePtr(wait), ChunkRows: rows, Target: 1, Timeout: timeout}})
	if err != nil {
		t.Fatalf("the call itself failed: %v", err)
	}
	err = g.Sync()
	took := time.Since(start)
	if err == nil {
		t.Fatal("Sync returned nil; expected the flag wait of chunk 7 to time out")
	}
	if !errors.Is(err, ErrGEMMWaitTimeout) || !strings.Contains(err.Error(), "chunk 7 ") {
		t.Fatalf("Sync: %v; expected an ErrGEMMWaitTimeout naming chunk 7", err)
	}
	if took > 5*time.Second {
		t.Fatalf("the kernel took %v to stop (timeout %v)", took, timeout)
	}
	t.Logf("%v after %v", err, took)
}

// TestEngineRefusals checks the errors of calls the engine cannot take
// (each on a fresh backend: a refusal is the backend's sticky error).
func TestEngineRefusals(t *testing.T) {
	openEngine(t)
	for _, tc := range []struct {
		want string
		call func(g *Backend) error
	}{
		{"K = 12, expected a positive multiple of 8", func(g *Backend) error {
			return g.EngineMatMul(g.Zeros(tensor.Float32, 8, 8), g.Zeros(tensor.BFloat16, 8, 12), g.Zeros(tensor.BFloat16, 12, 8), false, false, 1, 0, GEMMOptions{})
		}},
		{"expected bf16 operands", func(g *Backend) error {
			return g.EngineMatMul(g.Zeros(tensor.Float32, 8, 8), g.Zeros(tensor.Float32, 8, 8), g.Zeros(tensor.Float32, 8, 8), false, false, 1, 0, GEMMOptions{})
		}},
		{"RotateRows = 8, expected 0 ≤ RotateRows < M = 8", func(g *Backend) error {
			return g.EngineMatMul(g.Zeros(tensor.Float32, 8, 8), g.Zeros(tensor.BFloat16, 8, 8), g.Zeros(tensor.BFloat16, 8, 8), false, false, 1, 0, GEMMOptions{RotateRows: 8})
		}},
	} {
		if err := tc.call(openEngine(t)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
}

// BenchmarkEngine times the engine against cuBLASLt on the same call, for
// the forward and both backward GEMMs of a linear layer y = x·Wᵀ with x
// (M, K), W (N, K): NT y = x·Wᵀ (M×N×K), NN dx = dy·W (M×K×N), TN dW += dyᵀ·x
// (N×K×M, beta 1). Shapes: three tensor-parallel GEMM shapes (long and short
// K, few and many tiles) and gpt2-124m's at
// 16384 tokens. Metrics: engine-TFLOP/s, cublaslt-TFLOP/s and their ratio.
func BenchmarkEngine(b *testing.B) {
	shapes := []struct {
		name    string
		m, n, k int
	}{
		{"tp/16384x1536x8192", 16384, 1536, 8192},
		{"tp/8192x6144x12288", 8192, 6144, 12288},
		{"tp/16384x8192x1024", 16384, 8192, 1024},
		{"gpt2/qkv-768to2304", 16384, 2304, 768},
		{"gpt2/o-768to768", 16384, 768, 768},
		{"gpt2/gateup-768to4096", 16384, 4096, 768},
		{"gpt2/down-2048to768", 16384, 768, 2048},
		{"gpt2/head-768to50304", 16384, 50304, 768},
	}
	be := openGPU(b)
	if err := be.engineErr(); err != nil {
		b.Skipf("no GEMM engine here: %v", err)
	}
	for _, s := range shapes {
		// The tensors are made inside the shape's sub-benchmark, so that a
		// -test.bench filter for one shape does not build every shape's.
		b.Run(s.name, func(b *testing.B) { benchEngineShape(b, be, s.m, s.n, s.k) })
	}
}

// benchEngineShape is BenchmarkEngine's three layouts on one shape.
func benchEngineShape(b *testing.B, be *Backend, m, n, k int) {
	x := benchRand(b, be, tensor.BFloat16, m, k)
	w := benchRand(b, be, tensor.BFloat16, n, k)
	dy := benchRand(b, be, tensor.BFloat16, m, n)
	y := be.Zeros(tensor.BFloat16, m, n)
	dx := be.Zeros(tensor.BFloat16, m, k)
	dw := be.Zeros(tensor.BFloat16, n, k)
	flops := 2 * float64(m) * float64(n) * float64(k) / 1e12
	for _, f := range []struct {
		name           string
		c, a, bm       *tensor.Tensor
		transA, transB bool
		beta           float32
	}{
		{"nt", y, x, w, false, true, 0},
		{"nn", dx, dy, w, false, false, 0},
		{"tn", dw, dy, x, true, false, 1},
	} {
		b.Run(f.name, func(b *testing.B) {
			eng := func() { be.EngineMatMul(f.c, f.a, f.bm, f.transA, f.transB, 1, f.beta, GEMMOptions{}) }
			lt := func() { be.MatMul(f.c, f.a, f.bm, f.transA, f.transB, 1, f.beta) }
			te, tl := timeOps(b, be, eng), timeOps(b, be, lt)
			b.ReportMetric(flops*float64(b.N)/te, "engine-TFLOP/s")
			b.ReportMetric(flops*float64(b.N)/tl, "cublaslt-TFLOP/s")
			b.ReportMetric(tl/te, "ratio")
			{ // both epilogues, the same call without split
				for _, st := range []struct {
					name  string
					store EngineStore
				}{{"staged", EngineStoreStaged}, {"tma", EngineStoreTMA}} {
					op := func() {
						be.EngineMatMul(f.c, f.a, f.bm, f.transA, f.transB, 1, f.beta, GEMMOptions{Store: st.store, SplitK: 1})
					}
					b.ReportMetric(flops*float64(b.N)/timeOps(b, be, op), st.name+"-TFLOP/s")
				}
			}
			sms, _ := be.EngineSMs()
			cm, cn, ck, err := engineShape(f.c, f.a, f.bm, f.transA, f.transB)
			if err != nil {
				b.Fatal(err)
			}
			tileN, split := (engineCall{m: cm, n: cn, k: ck, transA: f.transA, transB: f.transB}).tiling(sms)
			b.ReportMetric(float64(tileN), "tilen")
			if split > 1 || tileN != EngineTileN {
				// The engine chose split-K or narrower tiles: the call
				// with neither, beside.
				one := func() { be.EngineMatMul(f.c, f.a, f.bm, f.transA, f.transB, 1, f.beta, GEMMOptions{SplitK: 1}) }
				b.ReportMetric(float64(split), "splitk")
				b.ReportMetric(flops*float64(b.N)/timeOps(b, be, one), "nosplit-TFLOP/s")
			}
			if f.transA && !f.transB { // the weight gradient: each tile width with its own split
				for _, tn := range []int{EngineTileN, engineTileN192} {
					op := func() { be.EngineMatMul(f.c, f.a, f.bm, f.transA, f.transB, 1, f.beta, GEMMOptions{TileN: tn}) }
					b.ReportMetric(flops*float64(b.N)/timeOps(b, be, op), fmt.Sprintf("n%d-TFLOP/s", tn))
				}
			}
			// $ASYNCTP_BENCH_SPLITS (e.g. "2,4,8"): the same call at each of
			// these slice counts, to fit engineSplitK's model.
			for _, word := range strings.Split(os.Getenv("ASYNCTP_BENCH_SPLITS"), ",") {
				s, err := strconv.Atoi(strings.TrimSpace(word))
				if err != nil || s < 2 || ceilDiv(ck, 64) < 4*s {
					continue
				}
				op := func() { be.EngineMatMul(f.c, f.a, f.bm, f.transA, f.transB, 1, f.beta, GEMMOptions{SplitK: s}) }
				b.ReportMetric(flops*float64(b.N)/timeOps(b, be, op), fmt.Sprintf("split%d-TFLOP/s", s))
			}
		})
	}
	for _, t := range []*tensor.Tensor{x, w, dy, y, dx, dw} {
		be.Free(t)
	}
}

// timeOps runs op b.N times after a warm-up and returns the seconds taken.
func timeOps(b *testing.B, be *Backend, op func()) float64 {
	b.Helper()
	op()
	if err := be.Sync(); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	for range b.N {
		op()
	}
	if err := be.Sync(); err != nil {
		b.Fatal(err)
	}
	return time.Since(start).Seconds()
}

// BenchmarkEngineHooks is the cost of fusion on one GPU (the aim: ≤ 1.05 ×
// the GEMM alone, or the fused strategy cannot beat the pipelined one): the engine with the fused strategy's hooks — tile
// rotation, the producer's wait on per-chunk flags (all already at their
// target, so nothing is waited for but the acquire loads) and the per-row-
// block signal — against the plain engine and cuBLASLt, on the shapes of
// overlap/peercopy's bench (rows 8192, K 4096; N 3072 the q,k,v of 4 ranks;
// and the reduce-scatter's K 1024 → N 4096). Metric: hooks/plain.
func BenchmarkEngineHooks(b *testing.B) {
	be := openGPU(b)
	if err := be.engineErr(); err != nil {
		b.Skipf("no GEMM engine here: %v", err)
	}
	for _, s := range []struct {
		name    string
		m, n, k int
	}{{"ag/8192x3072x4096", 8192, 3072, 4096}, {"rs/8192x4096x1024", 8192, 4096, 1024}} {
		x := benchRand(b, be, tensor.BFloat16, s.m, s.k)
		w := benchRand(b, be, tensor.BFloat16, s.n, s.k)
		y := be.Zeros(tensor.BFloat16, s.m, s.n)
		const chunks = 4
		wait := flagWords(be, chunks)
		vals := make([]uint64, chunks)
		for i := range vals {
			vals[i] = 1
		}
		setFlags(b, be, wait, vals)
		sig := flagWords(be, ceilDiv(s.m, EngineTileM))
		flops := 2 * float64(s.m) * float64(s.n) * float64(s.k) / 1e12
		b.Run(s.name, func(b *testing.B) {
			hooks := GEMMOptions{RotateRows: s.m / chunks,
				Wait:   &GEMMWait{Flags: DevicePtr(wait), ChunkRows: s.m / chunks, Target: 1, Timeout: 10 * time.Second},
				Signal: &GEMMSignal{Flags: DevicePtr(sig), PerRowBlock: true, Value: 1}}
			var err error
			th := timeOps(b, be, func() {
				if e := be.EngineMatMul(y, x, w, false, true, 1, 0, hooks); e != nil {
					err = e
				}
			})
			// With the reserve off: the hooks' own cost, apart from the
			// SMs a waiting engine leaves free.
			noRes := hooks
			noRes.Wait = &GEMMWait{Flags: hooks.Wait.Flags, ChunkRows: hooks.Wait.ChunkRows, Target: 1, Timeout: 10 * time.Second, ReserveSMs: -1}
			tn := timeOps(b, be, func() {
				if e := be.EngineMatMul(y, x, w, false, true, 1, 0, noRes); e != nil {
					err = e
				}
			})
			tp := timeOps(b, be, func() { _ = be.EngineMatMul(y, x, w, false, true, 1, 0, GEMMOptions{}) })
			tl := timeOps(b, be, func() { be.MatMul(y, x, w, false, true, 1, 0) })
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(flops*float64(b.N)/th, "hooks-TFLOP/s")
			b.ReportMetric(flops*float64(b.N)/tp, "engine-TFLOP/s")
			b.ReportMetric(flops*float64(b.N)/tl, "cublaslt-TFLOP/s")
			b.ReportMetric(th/tp, "hooks/plain")
			b.ReportMetric(tn/tp, "hooks-noreserve/plain")
		})
		for _, t := range []*tensor.Tensor{x, w, y, wait, sig} {
			be.Free(t)
		}
	}
}

// BenchmarkEngineGrid sweeps the engine's persistent grid (GEMMOptions.Grid)
// around the SMs the process is given (EngineSMs), to see that the grid it
// picks is the one that fills the share in one wave: a grid one CTA too
// large runs in two waves (the kernel's time nearly doubles), one too
// small leaves SMs idle (under MPS the client's share is what the device
// reports). Shape 8192×6144×4096 NT (1536
// tiles). Metrics: engine TFLOP/s per grid, cuBLASLt's beside.
func BenchmarkEngineGrid(b *testing.B) {
	be := openGPU(b)
	if err := be.engineErr(); err != nil {
		b.Skipf("no GEMM engine here: %v", err)
	}
	share, from := be.EngineSMs()
	b.Logf("engine grid: %d SMs, from %s", share, from)
	const m, n, k = 8192, 6144, 4096
	x := benchRand(b, be, tensor.BFloat16, m, k)
	w := benchRand(b, be, tensor.BFloat16, n, k)
	y := be.Zeros(tensor.BFloat16, m, n)
	defer func() {
		for _, t := range []*tensor.Tensor{x, w, y} {
			be.Free(t)
		}
	}()
	flops := 2 * float64(m) * float64(n) * float64(k) / 1e12
	grids := []int{0, share / 2, share - 12, share - 8, share - 6, share - 4, share - 2, share - 1, share, share + 2}
	seen := map[int]bool{}
	for _, g := range grids {
		if g < 0 || seen[g] {
			continue
		}
		seen[g] = true
		name := fmt.Sprintf("grid=%d", g)
		if g == 0 {
			name = fmt.Sprintf("grid=auto(%d)", share)
		}
		b.Run(name, func(b *testing.B) {
			var err error
			te := timeOps(b, be, func() {
				if e := be.EngineMatMul(y, x, w, false, true, 1, 0, GEMMOptions{Grid: g}); e != nil {
					err = e
				}
			})
			tl := timeOps(b, be, func() { be.MatMul(y, x, w, false, true, 1, 0) })
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(flops*float64(b.N)/te, "engine-TFLOP/s")
			b.ReportMetric(flops*float64(b.N)/tl, "cublaslt-TFLOP/s")
			b.ReportMetric(tl/te, "ratio")
		})
	}
}
