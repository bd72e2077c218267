package cpu_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/backendtest"
	"github.com/asynctp/asynctp/tensor/cpu"
)

func TestConformanceMoEFloat32(t *testing.T) {
	backendtest.RunMoE(t, cpu.New(), backendtest.Options{DType: tensor.Float32, Tol: 1e-5, NewBackend: newBackend})
}

func TestConformanceMoEFloat64(t *testing.T) {
	backendtest.RunMoE(t, cpu.New(cpu.WithThreads(1)), backendtest.Options{DType: tensor.Float64, Tol: 1e-6, NewBackend: newBackend})
}

func ints(vals []int32, shape ...int) *tensor.Tensor {
	t, err := tensor.FromInt32(vals, shape...)
	if err != nil {
		panic(err)
	}
	return t
}

func TestTopKValues(t *testing.T) {
	b := cpu.New()
	x, _ := tensor.FromFloat64([]float64{
		0.1, 0.4, 0.1, 0.4, // a tie: columns 1 then 3
		0.7, 0.1, 0.1, 0.1, // a tie for the second place: column 1
	}, 2, 4)
	vals, idx := zeros(2, 2), tensor.MustHost(tensor.Int32, 2, 2)
	b.TopK(vals, idx, x, false)
	noErr(t, b)
	if fmt.Sprint(idx.I32()) != "[1 3 0 1]" || fmt.Sprint(vals.F64()) != "[0.4 0.4 0.7 0.1]" {
		t.Fatalf("TopK: idx %v vals %v", idx.I32(), vals.F64())
	}
	b.TopK(vals, idx, x, true)
	noErr(t, b)
	testutil.AllClose(t, "normalized", vals.F64(), []float64{0.5, 0.5, 0.875, 0.125}, 1e-15)
}

// TestGradTopK: the backward through the selection and the renormalisation,
// on rows without near-ties (the selection is stable under the step).
func TestGradTopK(t *testing.T) {
	b := cpu.New()
	rng := testutil.Rng(11)
	const n, e, k = 5, 7, 3
	for _, norm := range []bool{false, true} {
		x := zeros(n, e)
		for i := range x.F64() { // distinct positive values, gaps ≥ 0.01
			x.F64()[i] = 0.1 + 0.01*float64(rng.IntN(80))
		}
		for r := range n {
			row := x.F64()[r*e : (r+1)*e]
			for j := range row {
				row[j] += 0.9 * float64(j*j%e) / float64(e) // distinct in each row
			}
		}
		vals, idx := zeros(n, k), tensor.MustHost(tensor.Int32, n, k)
		w := testutil.RandFloats(rng, n*k, 0.1, 1)
		loss := func() float64 {
			b.TopK(vals, idx, x, norm)
			return testutil.Dot(vals.F64(), w)
		}
		loss()
		dvals, _ := tensor.FromFloat64(w, n, k)
		dx := zeros(n, e)
		b.Fill(dx, 7)
		b.TopKBackward(dx, dvals, vals, idx, x, norm)
		noErr(t, b)
		checkGrad(t, fmt.Sprintf("TopK normalize=%v dx", norm), loss, x, dx.F64())
	}
}

// TestGradCombineRows: CombineRowsBackward against finite differences of
// CombineRows, with a dropped slot, and GatherRows as CombineRows' adjoint.
func TestGradCombineRows(t *testing.T) {
	b := cpu.New()
	rng := testutil.Rng(12)
	const n, k, c = 4, 2, 3
	// slot s = n·k + j goes to row perm[s]; slot 5 is dropped.
	pos := ints([]int32{3, 0, 6, 1, 5, -1, 2, 4}, n, k)
	tok := ints([]int32{0, 1, 3, 0, 3, 2, 1}, 7) // tok[pos[s]] = s / k
	const m = 7
	src, wts := rnd(rng, m, c), rnd(rng, n, k)
	out := zeros(n, c)
	w := testutil.RandFloats(rng, n*c, 0.1, 1)
	loss := func() float64 {
		b.CombineRows(out, src, pos, wts)
		return testutil.Dot(out.F64(), w)
	}
	loss()
	dout, _ := tensor.FromFloat64(w, n, c)
	dsrc, dw := zeros(m, c), zeros(n, k)
	b.Fill(dsrc, 3)
	b.Fill(dw, 3)
	b.CombineRowsBackward(dsrc, dw, dout, src, pos, wts)
	noErr(t, b)
	checkGrad(t, "CombineRows dsrc", loss, src, dsrc.F64())
	checkGrad(t, "CombineRows dweights", loss, wts, dw.F64())
	if dw.F64()[5] != 0 {
		t.Errorf("dweights of the dropped slot = %v, want 0", dw.F64()[5])
	}

	// ⟨GatherRows(x), y⟩ = ⟨x, CombineRows(y, pos, nil)⟩.
	x, y := rnd(rng, n, c), rnd(rng, m, c)
	gx, cy := zeros(m, c), zeros(n, c)
	b.GatherRows(gx, x, tok, nil)
	b.CombineRows(cy, y, pos, nil)
	noErr(t, b)
	if l, r := testutil.Dot(gx.F64(), y.F64()), testutil.Dot(x.F64(), cy.F64()); math.Abs(l-r) > 1e-12 {
		t.Errorf("GatherRows and CombineRows(nil) are not adjoint: %v vs %v", l, r)
	}
	// With scale, GatherRows(dout, tok, weights in slot order) is dsrc.
	sc := zeros(m)
	for s, p := range pos.I32() {
		if p >= 0 {
			sc.F64()[p] = wts.F64()[s]
		}
	}
	g2 := zeros(m, c)
	b.GatherRows(g2, dout, tok, sc)
	noErr(t, b)
	testutil.AllClose(t, "GatherRows scaled = CombineRowsBackward dsrc", g2.F64(), dsrc.F64(), 1e-15)
}

func TestGradLogSumExp(t *testing.T) {
	b := cpu.New()
	rng := testutil.Rng(13)
	const n, e = 5, 6
	x, lse := rnd(rng, n, e), zeros(n)
	b.Scale(x, x, 3)
	w := testutil.RandFloats(rng, n, 0.1, 1)
	loss := func() float64 {
		b.LogSumExp(lse, x)
		return testutil.Dot(lse.F64(), w)
	}
	loss()
	dlse, _ := tensor.FromFloat64(w, n)
	dx := zeros(n, e)
	b.LogSumExpBackward(dx, dlse, x, lse)
	noErr(t, b)
	checkGrad(t, "LogSumExp dx", loss, x, dx.F64())
}

func TestCombineRowsDuplicatePositions(t *testing.T) {
	b := cpu.New()
	pos := ints([]int32{0, 1, 1, 2}, 2, 2)
	b.CombineRowsBackward(zeros(3, 2), nil, zeros(2, 2), zeros(3, 2), pos, nil)
	if err := b.Err(); err == nil || !strings.Contains(err.Error(), "distinct") {
		t.Fatalf("duplicate positions: error %v", err)
	}
}

func TestMoEOpsOf(t *testing.T) {
	if _, err := tensor.MoEOpsOf(cpu.New()); err != nil {
		t.Fatal(err)
	}
	var b tensor.Backend = struct{ tensor.Backend }{cpu.New()}
	if _, err := tensor.MoEOpsOf(b); err == nil || !strings.Contains(err.Error(), "does not implement tensor.MoEOps") {
		t.Fatalf("a backend without MoE ops: %v", err)
	}
}
