package cpu

import (
	"math"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// optChunk is the number of elements an AdamW or SumSquares work item
// covers; fixed, so that results do not depend on the thread count.
const optChunk = 1 << 14

// AdamW updates p in place from the gradient g with the moments m and v:
//
//	g' = GradScale·g   (GradScale 0 means 1)
//	m = β1·m + (1−β1)·g';  v = β2·v + (1−β2)·g'²
//	p −= LR·(m/(1−β1^t) / (sqrt(v/(1−β2^t)) + ε) + WeightDecay·p)
//
// with t = hp.Step ≥ 1. The update is computed in the dtype of master when
// master is not nil (Float32, or Float64), and p then receives master rounded
// to p's dtype; otherwise in p's dtype (Float32 or Float64). m and v have the
// compute dtype; g may be any float dtype. All have the same numel.
func (bk *Backend) AdamW(p, g, m, v, master *tensor.Tensor, hp tensor.AdamW) {
	c := bk.check("AdamW")
	cd := opcheck.AdamW(c, p, g, m, v, master, hp)
	if !c.OK() {
		return
	}
	if hp.NormSq != nil {
		ns := scalarValue(hp.NormSq)
		if math.IsNaN(ns) || math.IsInf(ns, 0) {
			return // a non-finite gradient never reaches the weights
		}
		gs := float64(hp.GradScale)
		if gs == 0 {
			gs = 1
		}
		hp.GradScale = float32(gs * tensor.ClipFactor(ns, float64(hp.Clip)))
	}
	w := p // the weights the update is computed on
	if master != nil {
		w = master
	}
	switch cd {
	case tensor.Float32:
		adamW(bk, w.F32(), g, m.F32(), v.F32(), p, master != nil, hp)
	case tensor.Float64:
		adamW(bk, w.F64(), g, m.F64(), v.F64(), p, master != nil, hp)
	}
}

// adamW updates the weights wd (p, or the master copy, in which case p
// receives them rounded when toP is set).
func adamW[T float](bk *Backend, wd []T, g *tensor.Tensor, m, v []T, p *tensor.Tensor, toP bool, hp tensor.AdamW) {
	gs := hp.GradScale
	if gs == 0 {
		gs = 1
	}
	b1, b2 := T(hp.Beta1), T(hp.Beta2)
	bc1 := T(1 - math.Pow(float64(hp.Beta1), float64(hp.Step)))
	bc2 := T(1 - math.Pow(float64(hp.Beta2), float64(hp.Step)))
	lr, eps, decay, scale := T(hp.LR), T(hp.Eps), T(hp.WeightDecay), T(gs)
	n := len(m)
	chunks := (n + optChunk - 1) / optChunk
	bk.parallelFor(chunks, 16*optChunk, func(lo, hi int) {
		gbuf := make([]T, optChunk)
		for ch := lo; ch < hi; ch++ {
			s, e := ch*optChunk, min((ch+1)*optChunk, n)
			gr := loadFloats(gbuf[:e-s], g, s)
			for i := s; i < e; i++ {
				gi := scale * gr[i-s]
				m[i] = b1*m[i] + (1-b1)*gi
				v[i] = b2*v[i] + (1-b2)*gi*gi
				mhat, vhat := m[i]/bc1, v[i]/bc2
				wd[i] -= lr * (mhat/(T(math.Sqrt(float64(vhat)))+eps) + decay*wd[i])
			}
			if toP {
				storeFloats(p, s, wd[s:e])
			}
		}
	})
}

// loadFloats returns the elements [s, s+len(buf)) of the host float tensor t
// as T: t's own storage when it has dtype T, else converted into buf.
func loadFloats[T float](buf []T, t *tensor.Tensor, s int) []T {
	e := s + len(buf)
	switch t.DType() {
	case tensor.Float32:
		if d, ok := any(t.F32()[s:e]).([]T); ok {
			return d
		}
		for i, x := range t.F32()[s:e] {
			buf[i] = T(x)
		}
	case tensor.Float64:
		if d, ok := any(t.F64()[s:e]).([]T); ok {
			return d
		}
		for i, x := range t.F64()[s:e] {
			buf[i] = T(x)
		}
	case tensor.BFloat16:
		for i, x := range t.BF16()[s:e] {
			buf[i] = T(tensor.BF16ToFloat32(x))
		}
	}
	return buf
}

// storeFloats writes src into the elements [s, s+len(src)) of the host float
// tensor t, rounding to t's dtype.
func storeFloats[T float](t *tensor.Tensor, s int, src []T) {
	e := s + len(src)
	switch t.DType() {
	case tensor.Float32:
		d := t.F32()[s:e]
		for i, x := range src {
			d[i] = float32(x)
		}
	case tensor.Float64:
		d := t.F64()[s:e]
		for i, x := range src {
			d[i] = float64(x)
		}
	case tensor.BFloat16:
		d := t.BF16()[s:e]
		for i, x := range src {
			d[i] = tensor.BF16FromFloat32(float32(x))
		}
	}
}

// SumSquares returns Σ x² for a float tensor, accumulated in float64 (in
// fixed blocks, then the blocks in order). It returns NaN, and does nothing,
// once the backend holds an error.
func (bk *Backend) SumSquares(x *tensor.Tensor) float64 {
	c := bk.check("SumSquares")
	opcheck.SumSquares(c, x)
	if !c.OK() {
		return math.NaN()
	}
	return bk.sumSquares(x)
}

// SumSquaresTo adds Σ x² (as SumSquares computes it) to dst[0] (Float32 or
// Float64), rounding once.
func (bk *Backend) SumSquaresTo(dst, x *tensor.Tensor) {
	c := bk.check("SumSquaresTo")
	opcheck.SumSquaresTo(c, dst, x)
	if !c.OK() {
		return
	}
	ss := bk.sumSquares(x)
	switch dst.DType() {
	case tensor.Float32:
		d := dst.F32()
		d[0] = float32(float64(d[0]) + ss)
	case tensor.Float64:
		dst.F64()[0] += ss
	}
}

// scalarValue is the value of a checked one-element float tensor.
func scalarValue(t *tensor.Tensor) float64 {
	if t.DType() == tensor.Float32 {
		return float64(t.F32()[0])
	}
	return t.F64()[0]
}

func (bk *Backend) sumSquares(x *tensor.Tensor) float64 {
	n := x.Numel()
	chunks := (n + optChunk - 1) / optChunk
	part := make([]float64, chunks)
	bk.parallelFor(chunks, optChunk, func(lo, hi int) {
		for ch := lo; ch < hi; ch++ {
			s, e := ch*optChunk, min((ch+1)*optChunk, n)
			var sum float64
			switch x.DType() {
			case tensor.Float32:
				for _, v := range x.F32()[s:e] {
					sum += float64(v) * float64(v)
				}
			case tensor.Float64:
				for _, v := range x.F64()[s:e] {
					sum += v * v
				}
			case tensor.BFloat16:
				for _, v := range x.BF16()[s:e] {
					f := float64(tensor.BF16ToFloat32(v))
					sum += f * f
				}
			}
			part[ch] = sum
		}
	})
	var sum float64
	for _, v := range part {
		sum += v
	}
	return sum
}
