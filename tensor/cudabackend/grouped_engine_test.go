package cudabackend

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// The grouped GEMM engine's tests run on an sm_90 GPU with the grouped
// kernels in the image, and skip elsewhere, saying why.
//
//	./build/tensor_cudabackend.test -test.run 'TestGroupedEngine' -test.v
//	./build/tensor_cudabackend.test -test.run '^$' -test.bench 'BenchmarkGroupedEngine' -test.benchtime 10x

// openGroupedEngine opens GPU 0 with the grouped engine, or skips.
func openGroupedEngine(t testing.TB) *Backend {
	t.Helper()
	g := openGPU(t)
	if err := g.groupedEngineErr(); err != nil {
		t.Skipf("no grouped GEMM engine here: %v", err)
	}
	return g
}

// groupedEngineCase is a grouping of rows (counts per group, rows before
// the first group and after the last, which the forward must leave as they
// are) and the widths: the forward is (M, K) → (M, N), the wgrad's c is
// (G, N, K) from a (M, N), b (M, K).
type groupedEngineCase struct {
	name         string
	counts       []int
	before, past int
	n, k         int
}

func (gc groupedEngineCase) offsets() ([]int32, int) {
	off := make([]int32, len(gc.counts)+1)
	off[0] = int32(gc.before)
	for g, c := range gc.counts {
		off[g+1] = off[g] + int32(c)
	}
	return off, int(off[len(gc.counts)]) + gc.past
}

// groupedEngineCases have empty groups, groups of 1 row, of 127, 128, 129
// rows, of no multiple of 64, G = 1, 8 and 64, M up to about 4000, N and K
// multiples of 8 but not of 64 or 128 (and below one K step).
func groupedEngineCases() []groupedEngineCase {
	rng := testutil.Rng(31)
	many := make([]int, 64)
	for g := range many {
		switch g % 8 {
		case 0:
			many[g] = 0
		case 3:
			many[g] = 1
		default:
			many[g] = rng.IntN(120)
		}
	}
	many[63] = 0 // the last group empty too
	big := make([]int, 8)
	for g := range big {
		big[g] = 300 + rng.IntN(400)
	}
	big[5] = 0
	return []groupedEngineCase{
		{name: "one group", counts: []int{300}, n: 264, k: 136},
		{name: "eight uneven", counts: []int{0, 1, 127, 128, 129, 200, 0, 69}, n: 520, k: 200},
		{name: "64 groups", counts: many, n: 136, k: 264},
		{name: "rows outside the groups, K 8", counts: []int{5, 0, 130, 1}, before: 5, past: 7, n: 24, k: 8},
		{name: "eight large", counts: big, n: 1032, k: 520},
	}
}

// groupedUpload uploads vals as a dt tensor of shape on g.
func groupedUpload(t *testing.T, g *Backend, dt tensor.DType, vals []float64, shape ...int) *tensor.Tensor {
	t.Helper()
	h := tensor.MustHost(dt, shape...)
	if err := h.SetFloat64s(vals); err != nil {
		t.Fatal(err)
	}
	x := g.Zeros(dt, shape...)
	g.Upload(x, h)
	return x
}

// roundedRand returns n random values, none zero, rounded to dt.
func roundedRand(rng *rand.Rand, dt tensor.DType, n int, lo, hi float64) []float64 {
	v := testutil.RandFloats(rng, n, lo, hi)
	for i := range v {
		v[i] = dt.Round(v[i])
	}
	return v
}

// refView is a view of a CPU tensor.
func refView(t *testing.T, x *tensor.Tensor, off int, shape ...int) *tensor.Tensor {
	t.Helper()
	v, err := x.View(off, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// groupedOut makes c on g: NaN everywhere when poison (beta 0 over a c that
// every element of is written), else the values cv.
func groupedOut(t *testing.T, g *Backend, dt tensor.DType, poison bool, cv []float64, shape ...int) *tensor.Tensor {
	t.Helper()
	if poison {
		c := g.Zeros(dt, shape...)
		g.Fill(c, math.NaN())
		return c
	}
	return groupedUpload(t, g, dt, cv, shape...)
}

// TestGroupedEngineConformance checks the engine's grouped forward (x·W_eᵀ),
// dgrad (dy·W_e) and wgrad (dy_eᵀ·x_e) against the CPU (fp32 MatMul per
// group on the bf16-rounded inputs), bf16 outputs through GroupedMatMul and
// GroupedMatMulTN (which must take the engine), f32 ones through
// EngineGroupedMatMul(TN); beta 0 over NaN and alpha 0.5, beta 1.
func TestGroupedEngineConformance(t *testing.T) {
	g := openGroupedEngine(t)
	ref := cpu.New()
	seed := uint64(100)
	for _, gc := range groupedEngineCases() {
		off, m := gc.offsets()
		G, N, K := len(gc.counts), gc.n, gc.k
		covered := gc.before == 0 && gc.past == 0
		offs := g.Zeros(tensor.Int32, G+1)
		g.Upload(offs, mustI32(t, off))
		for _, out := range []tensor.DType{tensor.BFloat16, tensor.Float32} {
			for _, ab := range [][2]float32{{1, 0}, {0.5, 1}} {
				for _, transW := range []bool{true, false} {
					seed++
					rng := testutil.Rng(seed)
					name := fmt.Sprintf("%s (G=%d M=%d N=%d K=%d) transW=%v %v alpha=%v beta=%v", gc.name, G, m, N, K, transW, out, ab[0], ab[1])
					ws := []int{G, K, N}
					if transW {
						ws = []int{G, N, K}
					}
					av := roundedRand(rng, tensor.BFloat16, m*K, 0.05, 1)
					wv := roundedRand(rng, tensor.BFloat16, G*N*K, 0.05, 1)
					cv := roundedRand(rng, out, m*N, 0.05, 2)
					a := groupedUpload(t, g, tensor.BFloat16, av, m, K)
					w := groupedUpload(t, g, tensor.BFloat16, wv, ws...)
					c := groupedOut(t, g, out, ab[1] == 0 && covered, cv, m, N)
					if out == tensor.BFloat16 {
						if err := g.groupedEngineFor(c, a, w, offs, false, transW); err != nil {
							t.Fatalf("%s: GroupedMatMul would not take the engine: %v", name, err)
						}
						g.GroupedMatMul(c, a, w, offs, transW, ab[0], ab[1])
					} else if err := g.EngineGroupedMatMul(c, a, w, offs, transW, ab[0], ab[1]); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					got := testutil.Download(g, c)
					if err := g.Err(); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					ra := testutil.Upload(ref, tensor.Float32, av, m, K)
					rw := groupedUpload32(t, ref, wv, ws...)
					rc := testutil.Upload(ref, tensor.Float32, cv, m, N)
					for e := range G {
						lo, hi := int(off[e]), int(off[e+1])
						if lo == hi {
							continue
						}
						ref.MatMul(refView(t, rc, lo*N, hi-lo, N), refView(t, ra, lo*K, hi-lo, K),
							refView(t, rw, e*N*K, ws[1], ws[2]), false, transW, ab[0], ab[1])
					}
					want := roundedDownload(t, ref, rc, out)
					checkElems(t, name, got, want, N, engineTol(out))
					g.Free(a)
					g.Free(w)
					g.Free(c)
				}
				// The wgrad: c (G, N, K) = alpha·a[R_g]ᵀ·b[R_g] + beta·c, a (M, N), b (M, K).
				seed++
				rng := testutil.Rng(seed)
				name := fmt.Sprintf("%s (G=%d M=%d P=%d Q=%d) TN %v alpha=%v beta=%v", gc.name, G, m, N, K, out, ab[0], ab[1])
				av := roundedRand(rng, tensor.BFloat16, m*N, 0.05, 1)
				bv := roundedRand(rng, tensor.BFloat16, m*K, 0.05, 1)
				cv := roundedRand(rng, out, G*N*K, 0.05, 2)
				a := groupedUpload(t, g, tensor.BFloat16, av, m, N)
				bm := groupedUpload(t, g, tensor.BFloat16, bv, m, K)
				c := groupedOut(t, g, out, ab[1] == 0, cv, G, N, K)
				if out == tensor.BFloat16 {
					if err := g.groupedEngineFor(c, a, bm, offs, true, false); err != nil {
						t.Fatalf("%s: GroupedMatMulTN would not take the engine: %v", name, err)
					}
					g.GroupedMatMulTN(c, a, bm, offs, ab[0], ab[1])
				} else if err := g.EngineGroupedMatMulTN(c, a, bm, offs, ab[0], ab[1]); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				got := testutil.Download(g, c)
				if err := g.Err(); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				ra := testutil.Upload(ref, tensor.Float32, av, m, N)
				rb := testutil.Upload(ref, tensor.Float32, bv, m, K)
				rc := groupedUpload32(t, ref, cv, G, N, K)
				for e := range G {
					lo, hi := int(off[e]), int(off[e+1])
					ce := refView(t, rc, e*N*K, N, K)
					if lo == hi { // an empty group: c[g] = beta·c[g]
						ref.Scale(ce, ce, ab[1])
						continue
					}
					ref.MatMul(ce, refView(t, ra, lo*N, hi-lo, N), refView(t, rb, lo*K, hi-lo, K), true, false, ab[0], ab[1])
				}
				want := roundedDownload(t, ref, rc, out)
				checkElems(t, name, got, want, K, engineTol(out))
				g.Free(a)
				g.Free(bm)
				g.Free(c)
			}
		}
		g.Free(offs)
	}
}

// groupedUpload32 uploads vals as f32 of shape on the CPU reference.
func groupedUpload32(t *testing.T, ref tensor.Backend, vals []float64, shape ...int) *tensor.Tensor {
	t.Helper()
	h := tensor.MustHost(tensor.Float32, shape...)
	if err := h.SetFloat64s(vals); err != nil {
		t.Fatal(err)
	}
	x := ref.Zeros(tensor.Float32, shape...)
	ref.Upload(x, h)
	return x
}

// roundedDownload downloads the reference's x, rounded to dt (the GPU's
// output dtype).
func roundedDownload(t *testing.T, ref tensor.Backend, x *tensor.Tensor, dt tensor.DType) []float64 {
	t.Helper()
	v := testutil.Download(ref, x)
	if err := ref.Err(); err != nil {
		t.Fatal(err)
	}
	for i := range v {
		v[i] = dt.Round(v[i])
	}
	return v
}

func mustI32(t testing.TB, vals []int32) *tensor.Tensor {
	t.Helper()
	x, err := tensor.FromInt32(vals, len(vals))
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// TestGroupedEngineSIMTOverride checks the escape hatch: with the SIMT
// kernels forced (as $ASYNCTP_GROUPED=simt does) the ops leave the engine,
// PreferGrouped answers false, and the SIMT kernel's result matches the
// engine's within bf16 rounding; the preference follows WithGroupedGEMM.
func TestGroupedEngineSIMTOverride(t *testing.T) {
	g := openGroupedEngine(t)
	if g.PreferGrouped() {
		t.Fatal("PreferGrouped() = true by default; want false (per-expert cuBLASLt is faster today: WithGroupedGEMM)")
	}
	if !openGPU(t, WithGroupedGEMM(true)).PreferGrouped() {
		t.Error("PreferGrouped() = false under WithGroupedGEMM(true); want true")
	}
	if openGPU(t, WithGroupedGEMM(false)).PreferGrouped() {
		t.Error("PreferGrouped() = true under WithGroupedGEMM(false); want false (one cuBLASLt GEMM per expert)")
	}
	gc := groupedEngineCases()[1]
	offs, a, w, m, N := groupedForwardInputs(t, g, gc, 5)
	ce, cs := g.Zeros(tensor.BFloat16, m, N), g.Zeros(tensor.BFloat16, m, N)
	g.GroupedMatMul(ce, a, w, offs, true, 1, 0)
	g.cfg.groupedSIMT = true
	defer func() { g.cfg.groupedSIMT = false }()
	if err := g.groupedEngineFor(cs, a, w, offs, false, true); err == nil || !strings.Contains(err.Error(), EnvGrouped) {
		t.Fatalf("with the SIMT kernels forced, groupedEngineFor = %v; want an error naming $%s", err, EnvGrouped)
	}
	if g.PreferGrouped() {
		t.Error("PreferGrouped() = true with the SIMT kernels forced; want false")
	}
	g.GroupedMatMul(cs, a, w, offs, true, 1, 0)
	got, want := testutil.Download(g, cs), testutil.Download(g, ce)
	if err := g.Err(); err != nil {
		t.Fatal(err)
	}
	checkElems(t, "SIMT vs engine", got, want, N, 2*engineTol(tensor.BFloat16))
}

// groupedForwardInputs uploads a forward call of case gc: the offsets and
// random bf16 a (M, K) and w (G, N, K) from seed; M and N.
func groupedForwardInputs(t *testing.T, g *Backend, gc groupedEngineCase, seed uint64) (offs, a, w *tensor.Tensor, m, N int) {
	t.Helper()
	off, m := gc.offsets()
	G, N, K := len(gc.counts), gc.n, gc.k
	rng := testutil.Rng(seed)
	offs = g.Zeros(tensor.Int32, G+1)
	g.Upload(offs, mustI32(t, off))
	a = groupedUpload(t, g, tensor.BFloat16, roundedRand(rng, tensor.BFloat16, m*K, 0.05, 1), m, K)
	w = groupedUpload(t, g, tensor.BFloat16, roundedRand(rng, tensor.BFloat16, G*N*K, 0.05, 1), G, N, K)
	return offs, a, w, m, N
}

// TestGroupedEngineBadOffsets gives the engine offsets out of order or past
// M: the next Sync must fail naming the op and the first bad entry (each
// on a fresh backend: the failure is sticky).
func TestGroupedEngineBadOffsets(t *testing.T) {
	openGroupedEngine(t)
	const m, n, k = 200, 24, 16
	for _, tc := range []struct {
		name string
		off  []int32
		want string
		tn   bool
	}{
		{"decreasing", []int32{0, 100, 50, 200}, "offsets[2]", false},
		{"past M", []int32{0, 100, 150, 201}, "offsets[3]", false},
		{"negative first", []int32{-1, 100, 150, 200}, "offsets[0]", true},
		{"decreasing TN", []int32{0, 120, 119, 200}, "offsets[2]", true},
	} {
		g := openGroupedEngine(t)
		offs := g.Zeros(tensor.Int32, len(tc.off))
		g.Upload(offs, mustI32(t, tc.off))
		G := len(tc.off) - 1
		op := "GroupedMatMul"
		if tc.tn {
			op = "GroupedMatMulTN"
			c, a, b := g.Zeros(tensor.BFloat16, G, n, k), g.Zeros(tensor.BFloat16, m, n), g.Zeros(tensor.BFloat16, m, k)
			if err := g.groupedEngineFor(c, a, b, offs, true, false); err != nil {
				t.Fatalf("%s: not on the engine: %v", tc.name, err)
			}
			g.GroupedMatMulTN(c, a, b, offs, 1, 0)
		} else {
			c, a, w := g.Zeros(tensor.BFloat16, m, n), g.Zeros(tensor.BFloat16, m, k), g.Zeros(tensor.BFloat16, G, n, k)
			if err := g.groupedEngineFor(c, a, w, offs, false, true); err != nil {
				t.Fatalf("%s: not on the engine: %v", tc.name, err)
			}
			g.GroupedMatMul(c, a, w, offs, true, 1, 0)
		}
		err := g.Sync()
		if err == nil {
			t.Errorf("%s: Sync returned nil; expected the kernel to flag %s", tc.name, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), op+":") || !strings.Contains(err.Error(), tc.want+" breaks") {
			t.Errorf("%s: Sync: %v; want an error of %s naming %s", tc.name, err, op, tc.want)
		}
	}
}

// TestGroupedEngineRefusals checks the errors of direct engine calls it
// cannot take.
func TestGroupedEngineRefusals(t *testing.T) {
	openGroupedEngine(t)
	bf := tensor.BFloat16
	for _, tc := range []struct {
		want string
		call func(g *Backend) error
	}{
		{"K = 12, expected a positive multiple of 8", func(g *Backend) error {
			return g.EngineGroupedMatMul(g.Zeros(bf, 8, 8), g.Zeros(bf, 8, 12), g.Zeros(bf, 2, 8, 12), g.Zeros(tensor.Int32, 3), true, 1, 0)
		}},
		{"expected bf16 operands", func(g *Backend) error {
			f := tensor.Float32
			return g.EngineGroupedMatMulTN(g.Zeros(f, 2, 8, 8), g.Zeros(f, 8, 8), g.Zeros(f, 8, 8), g.Zeros(tensor.Int32, 3), 1, 0)
		}},
	} {
		if err := tc.call(openGroupedEngine(t)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
}

// BenchmarkGroupedEngine times the grouped engine against dense cuBLASLt at
// the same FLOPs (one MatMul of M_total rows), one cuBLASLt MatMul per
// expert (what the layers do without the grouped GEMM) and the SIMT grouped
// kernel, for the three GEMMs of an expert's linear y = x·W_eᵀ (x (M, K), W_e
// (N, K)): forward NT y = x·W_eᵀ, dgrad NN dx = dy·W_e, wgrad TN dW_e +=
// dy_eᵀ·x_e (beta 1). E experts of R rows each, shapes K → N 4096 → 1536
// and 7168 → 2048. Metrics: TFLOP/s of each and engine/dense,
// engine/per-expert, engine/simt.
func BenchmarkGroupedEngine(b *testing.B) {
	be := openGroupedEngine(b)
	for _, s := range []struct{ k, n int }{{4096, 1536}, {7168, 2048}} {
		for _, er := range [][2]int{{8, 512}, {8, 2048}, {8, 4096}, {64, 512}, {64, 1024}} {
			E, R := er[0], er[1]
			M := E * R
			off := make([]int32, E+1)
			for e := range E {
				off[e+1] = off[e] + int32(R)
			}
			offs := be.Zeros(tensor.Int32, E+1)
			be.Upload(offs, mustI32(b, off))
			x := benchRand(b, be, tensor.BFloat16, M, s.k)
			dy := benchRand(b, be, tensor.BFloat16, M, s.n)
			w := benchRand(b, be, tensor.BFloat16, E, s.n, s.k) // (E, N, K)
			y := be.Zeros(tensor.BFloat16, M, s.n)
			dx := be.Zeros(tensor.BFloat16, M, s.k)
			dw := be.Zeros(tensor.BFloat16, E, s.n, s.k)
			wd := benchRand(b, be, tensor.BFloat16, s.n, s.k) // the dense weight
			dwd := be.Zeros(tensor.BFloat16, s.n, s.k)
			view := func(t *tensor.Tensor, off int, shape ...int) *tensor.Tensor {
				v, err := t.View(off, shape...)
				if err != nil {
					b.Fatal(err)
				}
				return v
			}
			for _, err := range []error{be.groupedEngineFor(y, x, w, offs, false, true),
				be.groupedEngineFor(dx, dy, w, offs, false, false), be.groupedEngineFor(dw, dy, x, offs, true, false)} {
				if err != nil {
					b.Fatalf("K %d → N %d, %d experts × %d rows: not on the engine: %v", s.k, s.n, E, R, err)
				}
			}
			flops := 2 * float64(M) * float64(s.n) * float64(s.k) / 1e12
			for _, f := range []struct {
				name     string
				grouped  func()
				dense    func()
				perExper func()
			}{
				{"nt", func() { be.GroupedMatMul(y, x, w, offs, true, 1, 0) },
					func() { be.MatMul(y, x, wd, false, true, 1, 0) },
					func() {
						for e := range E {
							be.MatMul(view(y, e*R*s.n, R, s.n), view(x, e*R*s.k, R, s.k), view(w, e*s.n*s.k, s.n, s.k), false, true, 1, 0)
						}
					}},
				// dgrad dx (M, K) = dy (M, N)·W_e (N, K): GroupedMatMul's w
				// (G, K', N') without transW is w as stored, K' = N, N' = K.
				{"nn", func() { be.GroupedMatMul(dx, dy, w, offs, false, 1, 0) },
					func() { be.MatMul(dx, dy, wd, false, false, 1, 0) },
					func() {
						for e := range E {
							be.MatMul(view(dx, e*R*s.k, R, s.k), view(dy, e*R*s.n, R, s.n), view(w, e*s.n*s.k, s.n, s.k), false, false, 1, 0)
						}
					}},
				{"tn", func() { be.GroupedMatMulTN(dw, dy, x, offs, 1, 1) },
					func() { be.MatMul(dwd, dy, x, true, false, 1, 1) },
					func() {
						for e := range E {
							be.MatMul(view(dw, e*s.n*s.k, s.n, s.k), view(dy, e*R*s.n, R, s.n), view(x, e*R*s.k, R, s.k), true, false, 1, 1)
						}
					}},
			} {
				b.Run(fmt.Sprintf("%dto%d/E%dx%d/%s", s.k, s.n, E, R, f.name), func(b *testing.B) {
					tg := timeOps(b, be, f.grouped)
					td := timeOps(b, be, f.dense)
					tp := timeOps(b, be, f.perExper)
					be.cfg.groupedSIMT = true
					ts := timeOps(b, be, f.grouped)
					be.cfg.groupedSIMT = false
					b.ReportMetric(flops*float64(b.N)/tg, "grouped-TFLOP/s")
					b.ReportMetric(flops*float64(b.N)/td, "dense-TFLOP/s")
					b.ReportMetric(flops*float64(b.N)/tp, "perexpert-TFLOP/s")
					b.ReportMetric(flops*float64(b.N)/ts, "simt-TFLOP/s")
					b.ReportMetric(td/tg, "vs-dense")
					b.ReportMetric(tp/tg, "vs-perexpert")
					b.ReportMetric(ts/tg, "vs-simt")
				})
			}
			for _, t := range []*tensor.Tensor{offs, x, dy, w, y, dx, dw, wd, dwd} {
				be.Free(t)
			}
		}
	}
}
