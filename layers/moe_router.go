package layers

import (
	"errors"
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"
	"math"

	"github.com/asynctp/asynctp/tensor"
)

// RouterConfig describes the router of an MoE layer.
type RouterConfig struct {
	Dim, Experts, TopK int     // input features, experts, experts per token
	Std                float64 // init std of the router weight
	AuxLossCoef        float64 // weight of the load-balancing loss (0: off)
	ZLossCoef          float64 // weight of the router z-loss (0: off)
}

// LoadStats are the sums over tokens that the router's auxiliary losses
// need. A Router computes them over its own tokens (Local); an
// expert-parallel layer sums them over its group and hands the totals back
// (SetGlobal), so that the losses are those of the union of the tokens.
type LoadStats struct {
	Tokens     int       // N
	Routed     []int     // (E) token-slots routed to each expert (before any capacity)
	ProbSums   []float64 // (E) Σ_n p[n, e]
	LSESquares float64   // Σ_n logsumexp(logits[n])²
}

// Router is the gate of an MoE layer: logits = x·Wᵀ (W (E, Dim)),
// p = softmax(logits), and for each token the TopK experts of largest p
// (ties to the lower index), with weights p renormalised to sum to 1 over
// the K chosen. Gradients flow to the chosen probabilities (no
// straight-through estimator).
//
// Auxiliary losses, over the T tokens of the step (Switch / GShard forms):
//
//	load balance  E·Σ_e f_e·P_e, f_e = (slots routed to e)/(T·K),
//	              P_e = (1/T)·Σ_n p[n, e]                (1 when balanced)
//	z-loss        (1/T)·Σ_n logsumexp(logits[n])²
//
// AuxLoss is AuxLossCoef·balance + ZLossCoef·z, and Backward adds its
// gradient (f_e is piecewise constant: the gradient goes through P_e).
//
// Routing runs in fp32 when the model is bf16 (RouterDType): the router
// GEMM multiplies fp32 copies of x and of the (bf16) weight, and the
// logits, softmax, top-k, renormalisation, z-loss and their backwards are
// fp32; only the weights handed to the combine (Weights) are rounded to the
// model's dtype, and the logits' gradient is rounded to it for the two
// GEMMs of the backward. f32 and f64 models route in their own dtype.
type Router struct {
	Name               string  // the layer's name, its parameter's prefix
	Dim, Experts, TopK int     // input features, experts, experts per token
	AuxLossCoef        float64 // weight of the load-balancing loss (0: off)
	ZLossCoef          float64 // weight of the router z-loss (0: off)
	// AuxGradScale multiplies the gradient of the auxiliary losses (not
	// their values); 0 means 1. An expert-parallel layer whose gradients
	// are averaged over D ranks sets D, so that the aux term keeps its
	// weight (see parallel/ep).
	AuxGradScale float64
	// AuxWeight also multiplies that gradient: the weight of this
	// forward's auxiliary losses in the step's loss, 1/k for each of k
	// micro-batches (Decoder.ForwardBackward sets it); 0 means 1.
	AuxWeight float64
	// DeviceStats makes Forward keep the choices and the load statistics
	// on the device (no download, no waiting read): Indices is then nil,
	// IndicesDevice and LocalDevice hold them, and SetGlobalDevice takes
	// the group's sums as device tensors (an expert path's device step).
	DeviceStats bool
	W           *Param // (E, Dim)

	b   tensor.Backend
	ops tensor.MoEOps
	n   int            // tokens of the last Forward; 0 before a successful one
	x   *tensor.Tensor // (N, Dim) the input of the last Forward
	// Activations (reallocated when N changes), in RouterDType except
	// weights.
	logits, probs *tensor.Tensor // (N, E)
	rweights      *tensor.Tensor // (N, K) renormalised top-k probabilities
	weights       *tensor.Tensor // (N, K) rweights in the model's dtype (rweights itself when they agree)
	idx           *tensor.Tensor // (N, K) int32 chosen experts
	lse           *tensor.Tensor // (N) logsumexp(logits), fp32 (f64 for f64 models)
	psum          *tensor.Tensor // (E) Σ_n p[n, :]
	hostIdx       *tensor.Tensor // (N, K) int32 host copy of idx
	hostSum       *tensor.Tensor // (E) f64 host copy of psum
	local         LoadStats
	// DeviceStats: (2E+1) RouterDType [routed per expert | Σ p | Σ lse²],
	// the one-hot of the choices and its ones.
	dstats, onehot, ones *tensor.Tensor
	zInv                 *tensor.Tensor // (1, 1) 1/T on the device (SetGlobalDevice's, or a view of hostG)
	zGradC               float64        // ∂(ZLossCoef·z)/∂lse[n] = zGradC·zInv·lse[n]
	auxTmp               *tensor.Tensor // (E, 1)

	// Set by SetGlobal.
	global         bool
	balance, zloss float64        // raw losses over the union of the tokens
	auxGrad        *tensor.Tensor // (E) ∂(AuxLossCoef·balance)/∂p[n, e]
	hostG          *tensor.Tensor // (E+1) RouterDType: SetGlobal's routed counts and 1/T, uploaded

	// Backward scratch.
	dprobs, dlogits, dz *tensor.Tensor // (N, E) RouterDType
	dlogitsM            *tensor.Tensor // (N, E) dlogits in the model's dtype (when they differ)
	dweights            *tensor.Tensor // (N, K) RouterDType (when it differs from the model's)
	dlse                *tensor.Tensor // (N)
}

// NewRouter registers name+".weight" (Experts, Dim) in ps.
func NewRouter(b tensor.Backend, ps *ParamSet, name string, cfg RouterConfig) (*Router, error) {
	if b == nil || ps == nil {
		return nil, fmt.Errorf("layers: router %q: nil backend or parameter set", name)
	}
	if cfg.Dim <= 0 || cfg.Experts <= 0 || cfg.TopK < 1 || cfg.TopK > cfg.Experts {
		return nil, fmt.Errorf("layers: router %q: Dim = %d, Experts = %d, TopK = %d: expected positive sizes and 1 ≤ TopK ≤ Experts", name, cfg.Dim, cfg.Experts, cfg.TopK)
	}
	for _, c := range []struct {
		name string
		v    float64
	}{{"AuxLossCoef", cfg.AuxLossCoef}, {"ZLossCoef", cfg.ZLossCoef}} {
		if !(c.v >= 0) || math.IsInf(c.v, 0) {
			return nil, fmt.Errorf("layers: router %q: %s = %v, expected a finite value ≥ 0", name, c.name, c.v)
		}
	}
	ops, err := tensor.MoEOpsOf(b)
	if err != nil {
		return nil, fmt.Errorf("layers: router %q: %w", name, err)
	}
	w, err := ps.Add(name+".weight", []int{cfg.Experts, cfg.Dim}, true, Normal(cfg.Std))
	if err != nil {
		return nil, err
	}
	return &Router{Name: name, Dim: cfg.Dim, Experts: cfg.Experts, TopK: cfg.TopK,
		AuxLossCoef: cfg.AuxLossCoef, ZLossCoef: cfg.ZLossCoef, W: w, b: b, ops: ops}, nil
}

func (r *Router) what() string { return "layers: router " + r.Name }

// Forward routes the tokens x (N, Dim): it computes the probabilities, the
// top-k choices and weights, and the local load statistics (downloading
// the N·K indices and the E probability sums to the host). x must stay
// unchanged until Backward. SetGlobal must follow before AuxLoss or
// Backward.
func (r *Router) Forward(x *tensor.Tensor) error {
	r.n, r.global = 0, false
	if err := checkParams(r.what(), r.W); err != nil {
		return err
	}
	dt := r.W.W.DType()
	n, err := layerkit.CheckRows(r.b, r.what(), "input x", x, dt, r.Dim)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%s: input x has shape %v, expected at least one token", r.what(), x.Shape())
	}
	E, K, rdt := r.Experts, r.TopK, layerkit.RouterDType(dt)
	r.logits = layerkit.Ensure(r.b, r.logits, rdt, n, E)
	r.probs = layerkit.Ensure(r.b, r.probs, rdt, n, E)
	r.rweights = layerkit.Ensure(r.b, r.rweights, rdt, n, K)
	if rdt == dt {
		r.weights = r.rweights
	} else {
		if r.weights == r.rweights {
			r.weights = nil // not a tensor of its own: Ensure must not free rweights
		}
		r.weights = layerkit.Ensure(r.b, r.weights, dt, n, K)
	}
	r.idx = layerkit.Ensure(r.b, r.idx, tensor.Int32, n, K)
	r.lse = layerkit.Ensure(r.b, r.lse, layerkit.StatDType(rdt), n)
	r.psum = layerkit.Ensure(r.b, r.psum, rdt, E)
	if r.hostIdx == nil || !r.hostIdx.Shape().Equal(tensor.Shape{n, K}) {
		r.hostIdx = tensor.MustHost(tensor.Int32, n, K)
	}
	if r.hostSum == nil {
		r.hostSum = tensor.MustHost(tensor.Float64, E)
	}
	x2 := layerkit.Reshape(x, n, r.Dim)
	if rdt == dt {
		r.b.MatMul(r.logits, x2, r.W.W, false, true, 1, 0)
	} else {
		// fp32 copies of the inputs, freed at once (the backward's GEMMs
		// read the model's x and W): the products of bf16 values are exact
		// in fp32, so this is the bf16-in, fp32-out GEMM.
		x32, w32 := r.b.Zeros(rdt, n, r.Dim), r.b.Zeros(rdt, E, r.Dim)
		r.b.Copy(x32, x2)
		r.b.Copy(w32, r.W.W)
		r.b.MatMul(r.logits, x32, w32, false, true, 1, 0)
		r.b.Free(x32)
		r.b.Free(w32)
	}
	r.b.Softmax(r.probs, r.logits)
	r.ops.TopK(r.rweights, r.idx, r.probs, true)
	if rdt != dt {
		r.b.Copy(r.weights, r.rweights)
	}
	r.ops.LogSumExp(r.lse, r.logits)
	if r.DeviceStats {
		r.forwardStats(n)
		if err := layerkit.Sticky(r.b, r.what(), "forward"); err != nil {
			return err
		}
		r.local = LoadStats{}
		r.x, r.n = x2, n
		return nil
	}
	r.b.Fill(r.psum, 0)
	r.b.SumRows(r.psum, r.probs)
	r.b.Download(r.hostIdx, r.idx)
	r.b.Download(r.hostSum, r.psum)
	sq := r.b.SumSquares(r.lse)
	if err := layerkit.Sticky(r.b, r.what(), "forward"); err != nil {
		return err
	}
	r.local = LoadStats{Tokens: n, Routed: make([]int, E), ProbSums: append([]float64(nil), r.hostSum.F64()...), LSESquares: sq}
	for _, e := range r.hostIdx.I32() {
		r.local.Routed[e]++
	}
	r.x, r.n = x2, n
	return nil
}

// forwardStats writes the (2E+1) local statistics on the device: the
// routed counts as the column sums of the choices' one-hot (TopKBackward
// of ones without renormalisation), Σ_n p[n, :], Σ_n lse[n]².
func (r *Router) forwardStats(n int) {
	E, K, rdt := r.Experts, r.TopK, layerkit.RouterDType(r.W.W.DType())
	r.dstats = layerkit.Ensure(r.b, r.dstats, rdt, 2*E+1)
	r.onehot = layerkit.Ensure(r.b, r.onehot, rdt, n, E)
	if r.ones == nil || !r.ones.Shape().Equal(tensor.Shape{n, K}) {
		r.ones = layerkit.Ensure(r.b, r.ones, rdt, n, K)
		r.b.Fill(r.ones, 1)
	}
	r.b.Fill(r.dstats, 0)
	r.ops.TopKBackward(r.onehot, r.ones, r.rweights, r.idx, r.probs, false)
	r.b.SumRows(r.statsPart(0, E), r.onehot)
	r.b.SumRows(r.statsPart(E, E), r.probs)
	r.b.SumSquaresTo(r.statsPart(2*E, 1), r.lse)
}

func (r *Router) statsPart(off, n int) *tensor.Tensor {
	v, err := r.dstats.View(off, n)
	if err != nil {
		panic("layers: internal error: " + err.Error())
	}
	return v
}

// IndicesDevice returns the (N, K) int32 choices of the last Forward on
// the device.
func (r *Router) IndicesDevice() *tensor.Tensor { return r.idx }

// LocalDevice returns the last Forward's statistics on the device (with
// DeviceStats; nil otherwise): (2E+1) RouterDType, the slots routed to
// each expert, Σ_n p[n, :] and Σ_n lse[n]² of its own tokens — the device
// form of Local, to be summed over the token group.
func (r *Router) LocalDevice() *tensor.Tensor {
	if !r.DeviceStats {
		return nil
	}
	return r.dstats
}

// SetGlobalDevice is SetGlobal with the group's statistics on the device:
// g (2E+1) RouterDType the sums over the token group of LocalDevice, invT
// (1, 1) RouterDType 1/T for the T tokens of the group. It prepares the
// gradients of the auxiliary losses on the device (nothing is read back);
// their values follow with SetLosses, once the host has the sums.
func (r *Router) SetGlobalDevice(g, invT *tensor.Tensor) error {
	if r.n == 0 {
		return errors.New(r.what() + ": SetGlobalDevice without a successful Forward")
	}
	E, rdt := r.Experts, layerkit.RouterDType(r.W.W.DType())
	if g == nil || g.DType() != rdt || g.Numel() != 2*E+1 || invT == nil || invT.DType() != rdt || !invT.Shape().Equal(tensor.Shape{1, 1}) {
		return fmt.Errorf("%s: global statistics %v and 1/T %v, expected %v(%d) and %v(1, 1)", r.what(), g, invT, rdt, 2*E+1, rdt)
	}
	routed, err := g.View(0, E, 1)
	if err != nil {
		return err
	}
	r.prepareGrads(routed, invT)
	r.balance, r.zloss = math.NaN(), math.NaN()
	r.global = true
	return layerkit.Sticky(r.b, r.what(), "forward")
}

// SetLosses sets the auxiliary losses' values of a step prepared by
// SetGlobalDevice from the group's statistics g, read back later
// (asynchronously): the values SetGlobal(g) computes.
func (r *Router) SetLosses(g LoadStats) {
	r.balance, r.zloss = lossesOf(g, r.Experts, r.TopK)
}

// lossesOf is the raw load balance and z-loss of the statistics g.
func lossesOf(g LoadStats, E, K int) (balance, z float64) {
	T := float64(g.Tokens)
	for e := range E {
		f := float64(g.Routed[e]) / (T * float64(K))
		balance += f * g.ProbSums[e] / T
	}
	return float64(E) * balance, g.LSESquares / T
}

// Indices returns the host copy of the last Forward's choices, (N·K)
// row-major: the input of a RoutingPlan. It is valid until the next Forward.
func (r *Router) Indices() []int32 { return r.hostIdx.I32() }

// Weights returns the (N, K) renormalised weights of the last Forward, on
// the device.
func (r *Router) Weights() *tensor.Tensor { return r.weights }

// Probs returns the (N, E) router probabilities of the last Forward, on the
// device, in RouterDType. It is valid until the next Forward.
func (r *Router) Probs() *tensor.Tensor { return r.probs }

// Local returns the load statistics of the last Forward's own tokens.
func (r *Router) Local() LoadStats { return r.local }

// SetGlobal sets the statistics of every token of the step (Local for a
// single rank; the sums over an expert-parallel group otherwise), computes
// the auxiliary losses and prepares their gradients.
func (r *Router) SetGlobal(g LoadStats) error {
	if r.n == 0 {
		return errors.New(r.what() + ": SetGlobal without a successful Forward")
	}
	E, K := r.Experts, r.TopK
	if g.Tokens < r.n || len(g.Routed) != E || len(g.ProbSums) != E {
		return fmt.Errorf("%s: global statistics of %d tokens, %d counts, %d sums; expected ≥ %d tokens and %d experts", r.what(), g.Tokens, len(g.Routed), len(g.ProbSums), r.n, E)
	}
	r.balance, r.zloss = lossesOf(g, E, K)
	// The gradients from the same device ops as SetGlobalDevice's, on the
	// counts and 1/T uploaded: the host-count step (the collective expert
	// path) and the device step (the pipelined and fused paths) give the
	// router the same bits. 1/T is rounded to RouterDType as the device
	// step's softmax of its token mask gives it (1/S in that dtype, S = T
	// exactly).
	if r.AuxLossCoef == 0 && r.ZLossCoef == 0 {
		r.global = true
		return layerkit.Sticky(r.b, r.what(), "forward") // no gradient to prepare
	}
	rdt := layerkit.RouterDType(r.W.W.DType())
	vals := make([]float64, E+1)
	for e, n := range g.Routed {
		vals[e] = float64(n)
	}
	vals[E] = 1 / float64(g.Tokens)
	if rdt == tensor.Float32 {
		vals[E] = float64(float32(1) / float32(g.Tokens))
	}
	r.hostG = layerkit.Ensure(r.b, r.hostG, rdt, E+1)
	h, err := tensor.FromFloat64(vals, E+1)
	if err != nil {
		return fmt.Errorf("%s: %w", r.what(), err)
	}
	r.b.Upload(r.hostG, h)
	routed, err := r.hostG.View(0, E, 1)
	if err != nil {
		return err
	}
	invT, err := r.hostG.View(E, 1, 1)
	if err != nil {
		return err
	}
	r.prepareGrads(routed, invT)
	r.global = true
	return layerkit.Sticky(r.b, r.what(), "forward")
}

// prepareGrads prepares the auxiliary losses' gradients from the group's
// routed counts routed (E, 1) and 1/T invT (1, 1), RouterDType tensors on
// the device, with the same ops on either step (SetGlobal, SetGlobalDevice):
// ∂(AuxLossCoef·balance)/∂p[n, e] = scale·coef·E·f_e/T =
// (scale·coef·E/K)·routed_e·(1/T)², two GEMMs; ∂(ZLossCoef·z)/∂lse[n] =
// zGradC·(1/T)·lse[n], one GEMM in Backward. invT must stay unchanged until
// Backward.
func (r *Router) prepareGrads(routed, invT *tensor.Tensor) {
	E, K, rdt := r.Experts, r.TopK, layerkit.RouterDType(r.W.W.DType())
	scale := r.AuxGradScale
	if scale == 0 {
		scale = 1
	}
	if r.AuxWeight != 0 {
		scale *= r.AuxWeight
	}
	if r.AuxLossCoef != 0 {
		r.auxGrad = layerkit.Ensure(r.b, r.auxGrad, rdt, E)
		r.auxTmp = layerkit.Ensure(r.b, r.auxTmp, rdt, E, 1)
		r.b.MatMul(r.auxTmp, routed, invT, false, false, 1, 0)
		r.b.MatMul(layerkit.Reshape(r.auxGrad, E, 1), r.auxTmp, invT, false, false, float32(scale*r.AuxLossCoef*float64(E)/float64(K)), 0)
	}
	r.zInv, r.zGradC = invT, scale*r.ZLossCoef*2
}

// SetAuxWeight sets AuxWeight (layers.AuxWeighter).
func (r *Router) SetAuxWeight(w float64) { r.AuxWeight = w }

// Losses returns the raw load-balancing loss and z-loss of the last step
// (before their coefficients).
func (r *Router) Losses() (balance, z float64) { return r.balance, r.zloss }

// AuxLoss is AuxLossCoef·balance + ZLossCoef·z of the last step: the term
// the layer adds to the training loss.
func (r *Router) AuxLoss() float64 {
	if !r.global {
		return 0
	}
	return r.AuxLossCoef*r.balance + r.ZLossCoef*r.zloss
}

// Backward takes dweights (N, K), the gradient of the loss with respect to
// the top-k weights (from the combine), adds the gradient of AuxLoss, adds
// the router weight's gradient and writes ∂L/∂x into dx (N, Dim):
// overwritten, or added when accumulate is true (x also feeds the experts).
func (r *Router) Backward(dx, dweights *tensor.Tensor, accumulate bool) error {
	if r.n == 0 || !r.global {
		return errors.New(r.what() + ": Backward needs a Forward and SetGlobal first")
	}
	dt, n, E := r.W.W.DType(), r.n, r.Experts
	if err := layerkit.CheckShape(r.b, r.what(), "weight gradient", dweights, dt, n, r.TopK); err != nil {
		return err
	}
	if err := layerkit.CheckRowsN(r.b, r.what(), "input gradient dx", dx, dt, r.Dim, n, "like the forward's input"); err != nil {
		return err
	}
	rdt := layerkit.RouterDType(dt)
	r.dprobs = layerkit.Ensure(r.b, r.dprobs, rdt, n, E)
	r.dlogits = layerkit.Ensure(r.b, r.dlogits, rdt, n, E)
	dw := dweights
	if rdt != dt {
		r.dweights = layerkit.Ensure(r.b, r.dweights, rdt, n, r.TopK)
		r.b.Copy(r.dweights, dweights)
		dw = r.dweights
	}
	r.ops.TopKBackward(r.dprobs, dw, r.rweights, r.idx, r.probs, true)
	if r.AuxLossCoef != 0 {
		r.b.AddBias(r.dprobs, r.auxGrad) // ∂/∂p[n, e] = coef·E·f_e/T for every token
	}
	r.b.SoftmaxBackward(r.dlogits, r.dprobs, r.probs)
	if r.ZLossCoef != 0 {
		r.dz = layerkit.Ensure(r.b, r.dz, rdt, n, E)
		r.dlse = layerkit.Ensure(r.b, r.dlse, layerkit.StatDType(rdt), n)
		r.b.MatMul(layerkit.Reshape(r.dlse, n, 1), layerkit.Reshape(r.lse, n, 1), r.zInv, false, false, float32(r.zGradC), 0) // zGradC·(1/T)·lse
		r.ops.LogSumExpBackward(r.dz, r.dlse, r.logits, r.lse)
		r.b.Add(r.dlogits, r.dlogits, r.dz)
	}
	dl := r.dlogits
	if rdt != dt { // the GEMMs run in the model's dtype (fp32 accumulation)
		r.dlogitsM = layerkit.Ensure(r.b, r.dlogitsM, dt, n, E)
		r.b.Copy(r.dlogitsM, r.dlogits)
		dl = r.dlogitsM
	}
	r.b.MatMul(r.W.G, dl, r.x, true, false, 1, 1) // dW += dlogitsᵀ·x
	beta := float32(0)
	if accumulate {
		beta = 1
	}
	r.b.MatMul(layerkit.Reshape(dx, n, r.Dim), dl, r.W.W, false, false, 1, beta)
	return layerkit.Sticky(r.b, r.what(), "backward")
}
