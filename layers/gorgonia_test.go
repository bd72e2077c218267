package layers

// An independent oracle: the same unsharded computations built as gorgonia
// graphs in float32 (forward from gorgonia ops, backward by gorgonia.Grad
// and a TapeMachine), compared with our layers on the CPU backend in
// float32. Nothing here is missing from gorgonia, but some pieces are
// spelled with constant matrices instead of slicing and broadcasting, which
// keeps the graphs to Mul, HadamardProd, Add and elementwise functions:
//   - heads and sequences are picked out of the (B*T, C) projections by
//     multiplying with 0/1 selection matrices and put back the same way;
//   - RoPE is the rotate-half formula x·cos + (x·R)·sin, with R the constant
//     (D, D) matrix of rotate_half and cos/sin constant (T, D) tensors;
//   - the causal mask is a constant (T, T) matrix of 0 and −1e9 added to the
//     scores before the softmax;
//   - row broadcasts (RMSNorm's 1/rms, a weight or bias row) are outer
//     products with a constant vector of ones;
//   - the embedding lookup is a one-hot (N, V) matrix times the table, and
//     the cross-entropy is −Σ onehot·log(softmax(logits)) / count.

import (
	"fmt"
	"math"
	"testing"

	G "gorgonia.org/gorgonia"
	gt "gorgonia.org/tensor"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// Tolerances against the float32 oracle, by relative norm (the fp32
// tolerance of the project; errors seen are about 1e-7 to 1e-6).
const (
	oracleTolOut  = 1e-5
	oracleTolGrad = 1e-5
)

// graph wraps a gorgonia graph with helpers that make nodes from float64
// values.
type graph struct {
	t *testing.T
	g *G.ExprGraph
	n int // counter for unique node names
}

func newGraph(t *testing.T) *graph { return &graph{t: t, g: G.NewGraph()} }

// mat makes a (rows, cols) float32 matrix node holding vals.
func (o *graph) mat(name string, vals []float64, rows, cols int) *G.Node {
	o.t.Helper()
	if len(vals) != rows*cols {
		o.t.Fatalf("oracle: %s: %d values for (%d, %d)", name, len(vals), rows, cols)
	}
	f := make([]float32, len(vals))
	for i, v := range vals {
		f[i] = float32(v)
	}
	o.n++
	return G.NewMatrix(o.g, gt.Float32, G.WithShape(rows, cols), G.WithName(fmt.Sprintf("%s_%d", name, o.n)),
		G.WithValue(gt.New(gt.WithShape(rows, cols), gt.WithBacking(f))))
}

// fill makes a constant (rows, cols) matrix with every element v.
func (o *graph) fill(v float64, rows, cols int) *G.Node {
	vals := make([]float64, rows*cols)
	for i := range vals {
		vals[i] = v
	}
	return o.mat("const", vals, rows, cols)
}

func (o *graph) must(n *G.Node, err error) *G.Node {
	o.t.Helper()
	if err != nil {
		o.t.Fatalf("oracle: %v", err)
	}
	return n
}

// linear is x·Wᵀ for x (N, In), W (Out, In).
func (o *graph) linear(x, w *G.Node) *G.Node {
	return o.must(G.Mul(x, o.must(G.Transpose(w))))
}

// rows broadcasts a (1, C) row to (n, C).
func (o *graph) rows(v *G.Node, n int) *G.Node {
	return o.must(G.Mul(o.fill(1, n, 1), v))
}

// rmsnorm is x / sqrt(mean(x²) + eps) · w for x (N, C), w (1, C).
func (o *graph) rmsnorm(x, w *G.Node, eps float32) *G.Node {
	n, c := x.Shape()[0], x.Shape()[1]
	ms := o.must(G.Mul(o.must(G.Square(x)), o.fill(1/float64(c), c, 1)))                   // (N, 1)
	rs := o.must(G.Inverse(o.must(G.Sqrt(o.must(G.Add(ms, o.fill(float64(eps), n, 1))))))) // (N, 1)
	xr := o.must(G.HadamardProd(x, o.must(G.Mul(rs, o.fill(1, 1, c)))))
	return o.must(G.HadamardProd(xr, o.rows(w, n)))
}

// swiglu is w_down(silu(w_gate(x)) · w_up(x)).
func (o *graph) swiglu(x, wg, wu, wd *G.Node) *G.Node {
	g, u := o.linear(x, wg), o.linear(x, wu)
	h := o.must(G.HadamardProd(o.must(G.HadamardProd(g, o.must(G.Sigmoid(g)))), u))
	return o.linear(h, wd)
}

// attention is causal multi-head attention with RoPE over x (B*T, C).
func (o *graph) attention(x, wq, wk, wv, wo *G.Node, B, T, H int, theta float64) *G.Node {
	C := x.Shape()[1]
	D := C / H
	q, k, v := o.linear(x, wq), o.linear(x, wk), o.linear(x, wv) // (B*T, C)
	// rotate_half(x) = x·R; cos and sin per position and column.
	R := make([]float64, D*D)
	for j := range D / 2 {
		R[(j+D/2)*D+j] = -1
		R[j*D+j+D/2] = 1
	}
	cosv, sinv := make([]float64, T*D), make([]float64, T*D)
	for t := range T {
		for i := range D {
			a := float64(t) * math.Pow(theta, -2*float64(i%(D/2))/float64(D))
			cosv[t*D+i], sinv[t*D+i] = math.Cos(a), math.Sin(a)
		}
	}
	rot, cos, sin := o.mat("R", R, D, D), o.mat("cos", cosv, T, D), o.mat("sin", sinv, T, D)
	rope := func(z *G.Node) *G.Node {
		return o.must(G.Add(o.must(G.HadamardProd(z, cos)), o.must(G.HadamardProd(o.must(G.Mul(z, rot)), sin))))
	}
	mask := make([]float64, T*T)
	for i := range T {
		for j := i + 1; j < T; j++ {
			mask[i*T+j] = -1e9
		}
	}
	maskN, scale := o.mat("mask", mask, T, T), o.fill(1/math.Sqrt(float64(D)), T, T)
	var out *G.Node
	for b := range B {
		sel := make([]float64, T*B*T) // (T, B*T): picks the rows of sequence b
		for t := range T {
			sel[t*B*T+b*T+t] = 1
		}
		sb := o.mat("sel", sel, T, B*T)
		sbT := o.must(G.Transpose(sb))
		for h := range H {
			pick := make([]float64, C*D) // (C, D): picks the columns of head h
			for i := range D {
				pick[(h*D+i)*D+i] = 1
			}
			ph := o.mat("pick", pick, C, D)
			head := func(z *G.Node) *G.Node { return o.must(G.Mul(o.must(G.Mul(sb, z)), ph)) } // (T, D)
			qh, kh, vh := rope(head(q)), rope(head(k)), head(v)
			s := o.must(G.HadamardProd(o.must(G.Mul(qh, o.must(G.Transpose(kh)))), scale))
			p := o.must(G.SoftMax(o.must(G.Add(s, maskN))))
			oh := o.must(G.Mul(p, vh))                                             // (T, D)
			back := o.must(G.Mul(o.must(G.Mul(sbT, oh)), o.must(G.Transpose(ph)))) // (B*T, C)
			if out == nil {
				out = back
			} else {
				out = o.must(G.Add(out, back))
			}
		}
	}
	return o.linear(out, wo)
}

// crossEntropy is the mean of −log softmax(logits)[target] over the
// non-negative targets.
func (o *graph) crossEntropy(logits *G.Node, targets []int32) *G.Node {
	n, v := logits.Shape()[0], logits.Shape()[1]
	count := 0
	for _, t := range targets {
		if t >= 0 {
			count++
		}
	}
	w := make([]float64, n*v)
	for i, t := range targets {
		if t >= 0 {
			w[i*v+int(t)] = -1 / float64(count)
		}
	}
	logp := o.must(G.Log(o.must(G.SoftMax(logits))))
	return o.must(G.Sum(o.must(G.HadamardProd(logp, o.mat("onehot", w, n, v)))))
}

// dot is Σ out·w for a random constant w: the scalar a layer test
// differentiates.
func (o *graph) dot(out *G.Node, w []float64) *G.Node {
	s := out.Shape()
	return o.must(G.Sum(o.must(G.HadamardProd(out, o.mat("w", w, s[0], s[1])))))
}

// run differentiates cost with respect to wrt and runs the graph.
func (o *graph) run(cost *G.Node, wrt ...*G.Node) {
	o.t.Helper()
	if _, err := G.Grad(cost, wrt...); err != nil {
		o.t.Fatalf("oracle: Grad: %v", err)
	}
	m := G.NewTapeMachine(o.g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		o.t.Fatalf("oracle: run: %v", err)
	}
}

func values32(t *testing.T, v G.Value) []float64 {
	t.Helper()
	var f []float32
	switch d := v.Data().(type) {
	case []float32:
		f = d
	case float32:
		f = []float32{d}
	default:
		t.Fatalf("oracle: value of type %T", d)
	}
	out := make([]float64, len(f))
	for i, x := range f {
		out[i] = float64(x)
	}
	return out
}

func nodeValue(t *testing.T, n *G.Node) []float64 { t.Helper(); return values32(t, n.Value()) }

func nodeGrad(t *testing.T, n *G.Node) []float64 {
	t.Helper()
	g, err := n.Grad()
	if err != nil {
		t.Fatalf("oracle: grad of %v: %v", n.Name(), err)
	}
	return values32(t, g)
}

// closeTo compares ours with the oracle's and logs the error.
func closeTo(t *testing.T, name string, got, want []float64, tol float64) {
	t.Helper()
	e := testutil.RelErr(got, want)
	t.Logf("%-32s rel err %.2e", name, e)
	if !(e <= tol) {
		t.Errorf("%s: relative error %.3g > %.3g vs gorgonia", name, e, tol)
	}
}

// layerOracle is the float32 setting shared by the layer tests: our
// parameters randomized, an input x (N, C) and the weights w of L = Σ out·w.
type layerOracle struct {
	b    tensor.Backend
	ps   *ParamSet
	o    *graph
	x    *tensor.Tensor // ours
	xv   []float64
	wv   []float64
	dout *tensor.Tensor // ours: w
}

func newLayerOracle(t *testing.T, b tensor.Backend, ps *ParamSet, xShape, outShape []int) *layerOracle {
	t.Helper()
	noErr(t, b, ps.Materialize(b, tensor.Float32))
	randomizeParams(t, ps, testutil.Rng(11), 0.5)
	rng := testutil.Rng(12)
	lo := &layerOracle{b: b, ps: ps, o: newGraph(t)}
	lo.x = randDevice(t, b, rng, tensor.Float32, 1, xShape...)
	lo.xv = download(t, b, lo.x)
	lo.wv = testutil.RandFloats(rng, tensor.Shape(outShape).Numel(), 0.1, 1)
	lo.dout = b.Zeros(tensor.Float32, outShape...)
	upload(t, b, lo.dout, lo.wv)
	return lo
}

// param makes the oracle's node for one of our parameters (vectors become
// (1, C) rows).
func (lo *layerOracle) param(t *testing.T, p *Param) *G.Node {
	t.Helper()
	s := p.Shape()
	r, c := 1, s[0]
	if len(s) == 2 {
		r, c = s[0], s[1]
	}
	return lo.o.mat(p.Name, download(t, lo.b, p.W), r, c)
}

// compare checks out and the gradients of x and of every parameter.
func (lo *layerOracle) compare(t *testing.T, out, dx *tensor.Tensor, gOut, gx *G.Node, gParams map[*Param]*G.Node) {
	t.Helper()
	closeTo(t, "out", download(t, lo.b, out), nodeValue(t, gOut), oracleTolOut)
	if dx != nil {
		closeTo(t, "dx", download(t, lo.b, dx), nodeGrad(t, gx), oracleTolGrad)
	}
	for _, p := range lo.ps.Params() {
		closeTo(t, "d"+p.Name, download(t, lo.b, p.G), nodeGrad(t, gParams[p]), oracleTolGrad)
	}
}

func TestOracleLinear(t *testing.T) {
	b, ps := newBackend(), NewParamSet(3)
	l, err := NewLinear(b, ps, "fc", LinearConfig{In: 12, Out: 7, Bias: true, Std: 0.1})
	noErr(t, b, err)
	lo := newLayerOracle(t, b, ps, []int{10, 12}, []int{10, 7})
	out, dx := b.Zeros(tensor.Float32, 10, 7), b.Zeros(tensor.Float32, 10, 12)
	noErr(t, b, l.Forward(out, lo.x))
	noErr(t, b, l.Backward(dx, lo.dout))

	o := lo.o
	gx, gw, gb := o.mat("x", lo.xv, 10, 12), lo.param(t, l.W), lo.param(t, l.Bias)
	gOut := o.must(G.Add(o.linear(gx, gw), o.rows(gb, 10)))
	o.run(o.dot(gOut, lo.wv), gx, gw, gb)
	lo.compare(t, out, dx, gOut, gx, map[*Param]*G.Node{l.W: gw, l.Bias: gb})
}

func TestOracleMLP(t *testing.T) {
	b, ps := newBackend(), NewParamSet(3)
	m, err := NewMLP(b, ps, "mlp", MLPConfig{Dim: 16, Hidden: 24, Std: 0.1, OutStd: 0.1})
	noErr(t, b, err)
	lo := newLayerOracle(t, b, ps, []int{2, 5, 16}, []int{2, 5, 16})
	out, dx := b.Zeros(tensor.Float32, 2, 5, 16), b.Zeros(tensor.Float32, 2, 5, 16)
	noErr(t, b, m.Forward(out, lo.x))
	noErr(t, b, m.Backward(dx, lo.dout))

	o := lo.o
	gx := o.mat("x", lo.xv, 10, 16)
	gg, gu, gd := lo.param(t, m.Gate.W), lo.param(t, m.Up.W), lo.param(t, m.Down.W)
	gOut := o.swiglu(gx, gg, gu, gd)
	o.run(o.dot(gOut, lo.wv), gx, gg, gu, gd)
	lo.compare(t, out, dx, gOut, gx, map[*Param]*G.Node{m.Gate.W: gg, m.Up.W: gu, m.Down.W: gd})
}

func TestOracleAttention(t *testing.T) {
	const B, T, C, H = 2, 6, 16, 2
	b, ps := newBackend(), NewParamSet(3)
	a, err := NewAttention(b, ps, "attn", AttentionConfig{Dim: C, Heads: H, RopeTheta: 10000, Std: 0.1, OutStd: 0.1})
	noErr(t, b, err)
	lo := newLayerOracle(t, b, ps, []int{B, T, C}, []int{B, T, C})
	out, dx := b.Zeros(tensor.Float32, B, T, C), b.Zeros(tensor.Float32, B, T, C)
	noErr(t, b, a.Forward(out, lo.x))
	noErr(t, b, a.Backward(dx, lo.dout))

	o := lo.o
	gx := o.mat("x", lo.xv, B*T, C)
	gq, gk, gv, gwo := lo.param(t, a.Wq.W), lo.param(t, a.Wk.W), lo.param(t, a.Wv.W), lo.param(t, a.Wo.W)
	gOut := o.attention(gx, gq, gk, gv, gwo, B, T, H, 10000)
	o.run(o.dot(gOut, lo.wv), gx, gq, gk, gv, gwo)
	lo.compare(t, out, dx, gOut, gx, map[*Param]*G.Node{a.Wq.W: gq, a.Wk.W: gk, a.Wv.W: gv, a.Wo.W: gwo})
}

// TestOracleCrossEntropy checks the LM head and the fused cross-entropy
// (loss, ∂/∂h, ∂/∂W) against gorgonia, with some ignored targets.
func TestOracleCrossEntropy(t *testing.T) {
	const N, C, V = 12, 8, 19
	b, ps := newBackend(), NewParamSet(3)
	head, err := NewLinear(b, ps, "head", LinearConfig{In: C, Out: V, Std: 0.1})
	noErr(t, b, err)
	lo := newLayerOracle(t, b, ps, []int{N, C}, []int{N, V})
	rng := testutil.Rng(13)
	tg := testutil.RandInts(rng, V, N)
	tg.I32()[2], tg.I32()[9] = -1, -1
	count := N - 2

	logits, dlogits := b.Zeros(tensor.Float32, N, V), b.Zeros(tensor.Float32, N, V)
	losses, dh := b.Zeros(tensor.Float32, N), b.Zeros(tensor.Float32, N, C)
	targets := b.Zeros(tensor.Int32, N)
	b.Upload(targets, tg)
	noErr(t, b, head.Forward(logits, lo.x))
	b.CrossEntropy(losses, dlogits, logits, targets, float32(1/float64(count)))
	noErr(t, b, head.Backward(dh, dlogits))
	var loss float64
	for _, l := range download(t, b, losses) {
		loss += l
	}
	loss /= float64(count)

	o := lo.o
	gx, gw := o.mat("h", lo.xv, N, C), lo.param(t, head.W)
	gLogits := o.linear(gx, gw)
	cost := o.crossEntropy(gLogits, tg.I32())
	o.run(cost, gx, gw)
	closeTo(t, "logits", download(t, b, logits), nodeValue(t, gLogits), oracleTolOut)
	closeTo(t, "loss", []float64{loss}, nodeValue(t, cost), oracleTolOut)
	closeTo(t, "dh", download(t, b, dh), nodeGrad(t, gx), oracleTolGrad)
	closeTo(t, "dhead.weight", download(t, b, head.W.G), nodeGrad(t, gw), oracleTolGrad)
}

// TestOracleGPT checks the whole model (embedding, blocks, final norm, tied
// or untied head, cross-entropy): loss and every parameter's gradient.
func TestOracleGPT(t *testing.T) {
	for _, tied := range []bool{false, true} {
		t.Run(fmt.Sprintf("tied=%v", tied), func(t *testing.T) {
			const B, T = 2, 5
			cfg := GPTConfig{Layers: 2, Dim: 16, Heads: 2, Vocab: 23, Seq: 8, FFN: 24, TiedEmbeddings: tied, InitStd: 0.2, Seed: 9}
			b := newBackend()
			m, err := NewGPT(b, cfg, tensor.Float32)
			noErr(t, b, err)
			cfg = m.Config()
			rng := testutil.Rng(14)
			ids := testutil.RandInts(rng, cfg.Vocab, B, T)
			tg := testutil.RandInts(rng, cfg.Vocab, B, T)
			tg.I32()[4] = -1
			loss, err := m.Forward(ids, tg)
			noErr(t, b, err)
			noErr(t, b, m.Backward())

			o := newGraph(t)
			nodes := map[*Param]*G.Node{}
			var wrt []*G.Node
			for _, p := range m.Params().Params() {
				s := p.Shape()
				r, c := 1, s[0]
				if len(s) == 2 {
					r, c = s[0], s[1]
				}
				nodes[p] = o.mat(p.Name, download(t, b, p.W), r, c)
				wrt = append(wrt, nodes[p])
			}
			N := B * T
			onehot := make([]float64, N*cfg.Vocab)
			for i, id := range ids.I32() {
				onehot[i*cfg.Vocab+int(id)] = 1
			}
			x := o.must(G.Mul(o.mat("ids", onehot, N, cfg.Vocab), nodes[m.Embed.W]))
			for _, blk := range m.Blocks {
				a := blk.Attn
				h := o.rmsnorm(x, nodes[blk.Norm1.W], cfg.NormEps)
				x = o.must(G.Add(x, o.attention(h, nodes[a.Wq.W], nodes[a.Wk.W], nodes[a.Wv.W], nodes[a.Wo.W], B, T, cfg.Heads, cfg.RopeTheta)))
				h = o.rmsnorm(x, nodes[blk.Norm2.W], cfg.NormEps)
				x = o.must(G.Add(x, o.swiglu(h, nodes[blk.MLP.Gate.W], nodes[blk.MLP.Up.W], nodes[blk.MLP.Down.W])))
			}
			logits := o.linear(o.rmsnorm(x, nodes[m.Norm.W], cfg.NormEps), nodes[m.Head.W])
			cost := o.crossEntropy(logits, tg.I32())
			o.run(cost, wrt...)

			closeTo(t, "logits", download(t, b, m.Logits()), nodeValue(t, logits), oracleTolOut)
			closeTo(t, "loss", []float64{loss}, nodeValue(t, cost), oracleTolOut)
			for _, p := range m.Params().Params() {
				closeTo(t, "d"+p.Name, download(t, b, p.G), nodeGrad(t, nodes[p]), oracleTolGrad)
			}
		})
	}
}
