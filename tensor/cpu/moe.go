package cpu

import (
	"math"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

var _ tensor.MoEOps = (*Backend)(nil)

// TopK writes the K largest values of each row of x (N, E) into vals (N, K),
// largest first, and their columns into idx (N, K) int32; ties go to the
// lower column. With normalize each row of vals is divided by its sum.
//
// Reference loop: K passes over the row, each taking the largest value not
// taken yet (strict >, so the lowest column wins a tie).
func (bk *Backend) TopK(vals, idx, x *tensor.Tensor, normalize bool) {
	c := bk.check("TopK")
	_, e, k := opcheck.TopK(c, vals, idx, x)
	if !c.OK() {
		return
	}
	switch x.DType() {
	case tensor.Float32:
		topK(bk, vals.F32(), idx.I32(), x.F32(), e, k, normalize)
	case tensor.Float64:
		topK(bk, vals.F64(), idx.I32(), x.F64(), e, k, normalize)
	}
}

func topK[T float](bk *Backend, vals []T, idx []int32, x []T, e, k int, normalize bool) {
	n := len(x) / e
	bk.parallelFor(n, e*k, func(lo, hi int) {
		taken := make([]bool, e)
		for r := lo; r < hi; r++ {
			row, vr, ir := x[r*e:(r+1)*e], vals[r*k:(r+1)*k], idx[r*k:(r+1)*k]
			clear(taken)
			var sum T
			for j := range k {
				best := -1
				for col, v := range row {
					if !taken[col] && (best < 0 || v > row[best]) {
						best = col
					}
				}
				taken[best] = true
				vr[j], ir[j] = row[best], int32(best)
				sum += row[best]
			}
			if normalize {
				for j := range vr {
					vr[j] /= sum
				}
			}
		}
	})
}

// TopKBackward scatters dvals (N, K) back to the selected columns of dx
// (N, E), through the renormalisation when normalize.
func (bk *Backend) TopKBackward(dx, dvals, vals, idx, x *tensor.Tensor, normalize bool) {
	c := bk.check("TopKBackward")
	_, e, k := opcheck.TopKBackward(c, dx, dvals, vals, idx, x)
	indices(c, "idx", idx, e)
	if !c.OK() {
		return
	}
	switch x.DType() {
	case tensor.Float32:
		topKBackward(bk, dx.F32(), dvals.F32(), vals.F32(), idx.I32(), x.F32(), e, k, normalize)
	case tensor.Float64:
		topKBackward(bk, dx.F64(), dvals.F64(), vals.F64(), idx.I32(), x.F64(), e, k, normalize)
	}
}

func topKBackward[T float](bk *Backend, dx, dvals, vals []T, idx []int32, x []T, e, k int, normalize bool) {
	n := len(x) / e
	bk.parallelFor(n, e, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			dr, row := dx[r*e:(r+1)*e], x[r*e:(r+1)*e]
			dv, vr, ir := dvals[r*k:(r+1)*k], vals[r*k:(r+1)*k], idx[r*k:(r+1)*k]
			clear(dr)
			if !normalize {
				for j, col := range ir {
					dr[col] += dv[j]
				}
				continue
			}
			var sum, dot T
			for j, col := range ir {
				sum += row[col]
				dot += dv[j] * vr[j]
			}
			for j, col := range ir {
				dr[col] += (dv[j] - dot) / sum
			}
		}
	})
}

// GatherRows sets dst[i] = scale[i]·src[idx[i]] (zero where idx[i] < 0).
func (bk *Backend) GatherRows(dst, src, idx, scale *tensor.Tensor) {
	c := bk.check("GatherRows")
	_, r, cols := opcheck.GatherRows(c, dst, src, idx, scale)
	indices(c, "idx", idx, r)
	if !c.OK() {
		return
	}
	switch src.DType() {
	case tensor.Float32:
		gatherRows(bk, dst.F32(), src.F32(), idx.I32(), optF32(scale), cols)
	case tensor.Float64:
		gatherRows(bk, dst.F64(), src.F64(), idx.I32(), optF64(scale), cols)
	}
}

func gatherRows[T float](bk *Backend, dst, src []T, idx []int32, scale []T, cols int) {
	bk.parallelFor(len(idx), cols, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			d := dst[i*cols : (i+1)*cols]
			r := idx[i]
			if r < 0 {
				clear(d)
				continue
			}
			s := src[int(r)*cols : (int(r)+1)*cols]
			if scale == nil {
				copy(d, s)
				continue
			}
			for j, v := range s {
				d[j] = scale[i] * v
			}
		}
	})
}

// CombineRows sets out[n] = Σ_j weights[n, j]·src[pos[n, j]], skipping
// negative positions.
func (bk *Backend) CombineRows(out, src, pos, weights *tensor.Tensor) {
	c := bk.check("CombineRows")
	_, k, m, cols := opcheck.CombineRows(c, out, src, pos, weights)
	indices(c, "pos", pos, m)
	if !c.OK() {
		return
	}
	switch src.DType() {
	case tensor.Float32:
		combineRows(bk, out.F32(), src.F32(), pos.I32(), optF32(weights), cols, k)
	case tensor.Float64:
		combineRows(bk, out.F64(), src.F64(), pos.I32(), optF64(weights), cols, k)
	}
}

func combineRows[T float](bk *Backend, out, src []T, pos []int32, w []T, cols, k int) {
	n := len(pos) / max(k, 1)
	bk.parallelFor(n, cols*k, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			o := out[r*cols : (r+1)*cols]
			clear(o)
			for j := range k {
				p := pos[r*k+j]
				if p < 0 {
					continue
				}
				s := src[int(p)*cols : (int(p)+1)*cols]
				wt := T(1)
				if w != nil {
					wt = w[r*k+j]
				}
				for i, v := range s {
					o[i] += wt * v
				}
			}
		}
	})
}

// CombineRowsBackward sets dsrc[pos[n, j]] = weights[n, j]·dout[n] (other
// rows zero) and dweights[n, j] = ⟨dout[n], src[pos[n, j]]⟩.
func (bk *Backend) CombineRowsBackward(dsrc, dweights, dout, src, pos, weights *tensor.Tensor) {
	c := bk.check("CombineRowsBackward")
	_, k, m, cols := opcheck.CombineRowsBackward(c, dsrc, dweights, dout, src, pos, weights)
	indices(c, "pos", pos, m)
	if !c.Failed() {
		seen := make([]bool, m)
		for i, p := range pos.I32() {
			if p >= 0 && seen[p] {
				c.Failf("pos[%d] = %d refers to a row of src that another slot uses, expected distinct positions", i, p)
				break
			}
			if p >= 0 {
				seen[p] = true
			}
		}
	}
	if !c.OK() {
		return
	}
	switch src.DType() {
	case tensor.Float32:
		combineRowsBackward(bk, dsrc.F32(), optF32(dweights), dout.F32(), src.F32(), pos.I32(), optF32(weights), cols, k)
	case tensor.Float64:
		combineRowsBackward(bk, dsrc.F64(), optF64(dweights), dout.F64(), src.F64(), pos.I32(), optF64(weights), cols, k)
	}
}

func combineRowsBackward[T float](bk *Backend, dsrc, dw, dout, src []T, pos []int32, w []T, cols, k int) {
	clear(dsrc)
	n := len(pos) / max(k, 1)
	bk.parallelFor(n, cols*k, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			d := dout[r*cols : (r+1)*cols]
			for j := range k {
				p := pos[r*k+j]
				if p < 0 {
					if dw != nil {
						dw[r*k+j] = 0
					}
					continue
				}
				ds, s := dsrc[int(p)*cols:(int(p)+1)*cols], src[int(p)*cols:(int(p)+1)*cols]
				wt := T(1)
				if w != nil {
					wt = w[r*k+j]
				}
				var dot T
				for i, v := range d {
					ds[i] = wt * v
					dot += v * s[i]
				}
				if dw != nil {
					dw[r*k+j] = dot
				}
			}
		}
	})
}

// LogSumExp writes lse[n] = log Σ_e exp(x[n, e]), max-subtracted.
func (bk *Backend) LogSumExp(lse, x *tensor.Tensor) {
	c := bk.check("LogSumExp")
	n, e := opcheck.LogSumExp(c, lse, x)
	if !c.OK() {
		return
	}
	xs, _ := x.Float64s()
	out := make([]float64, n)
	bk.parallelFor(n, 16*e, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			row := xs[r*e : (r+1)*e]
			m := math.Inf(-1)
			for _, v := range row {
				m = max(m, v)
			}
			var s float64
			for _, v := range row {
				s += math.Exp(v - m)
			}
			out[r] = m + math.Log(s)
		}
	})
	if err := lse.SetFloat64s(out); err != nil {
		bk.setErr(err)
	}
}

// LogSumExpBackward writes dx[n, e] = dlse[n]·exp(x[n, e] − lse[n]).
func (bk *Backend) LogSumExpBackward(dx, dlse, x, lse *tensor.Tensor) {
	c := bk.check("LogSumExpBackward")
	n, e := opcheck.LogSumExpBackward(c, dx, dlse, x, lse)
	if !c.OK() {
		return
	}
	xs, _ := x.Float64s()
	ls, _ := lse.Float64s()
	ds, _ := dlse.Float64s()
	out := make([]float64, n*e)
	bk.parallelFor(n, 16*e, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			for j := range e {
				out[r*e+j] = ds[r] * math.Exp(xs[r*e+j]-ls[r])
			}
		}
	})
	if err := dx.SetFloat64s(out); err != nil {
		bk.setErr(err)
	}
}

// optF32 and optF64 are F32 and F64 of an optional operand (nil stays nil).
func optF32(t *tensor.Tensor) []float32 {
	if t == nil {
		return nil
	}
	return t.F32()
}

func optF64(t *tensor.Tensor) []float64 {
	if t == nil {
		return nil
	}
	return t.F64()
}
