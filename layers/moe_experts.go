package layers

import (
	"errors"
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"

	"github.com/asynctp/asynctp/tensor"
)

// ExpertsConfig describes a group of SwiGLU experts: experts [First,
// First+Count) of a layer of Experts experts (Count 0 means all of them).
type ExpertsConfig struct {
	Dim, Hidden  int     // each expert's input and output features, and its hidden ones
	Experts      int     // in the whole layer
	First, Count int     // the experts this group holds
	Std          float64 // init std of w_gate and w_up
	OutStd       float64 // init std of w_down
}

// Experts is a group of SwiGLU MLPs, one per expert, with stacked weights
// w_gate, w_up (Count, Hidden, Dim) and w_down (Count, Dim, Hidden). It runs
// on a buffer of rows that is expert-contiguous (a RoutingPlan's order):
// counts[e] rows for local expert e, one after the other. Each projection is
// one grouped GEMM over all the local experts (tensor.GroupedGEMM, with the
// experts' row offsets uploaded to the device), forward and backward; on a
// backend without GroupedGEMM, one MatMul per expert on row views of the
// buffer and of the stacked weights.
//
// A group that holds a slice of the experts registers its weights under the
// full layer's names with ShardInit, so that they have exactly the values
// of the unsharded layer with the same seed.
type Experts struct {
	Name              string // the layer's name, its parameters' prefix
	Dim, Hidden       int    // each expert's input and output features, and its hidden ones
	Experts           int    // in the whole layer
	First, Count      int    // this group holds experts [First, First+Count)
	Gate, Up, Down    *Param // the stacked weights: (Count, Hidden, Dim), (Count, Hidden, Dim), (Count, Dim, Hidden)
	b                 tensor.Backend
	grouped           tensor.GroupedGEMM // nil: one MatMul per expert
	counts            []int              // rows per local expert of the last Forward; nil before one
	offsets           *tensor.Tensor     // (Count+1) int32 on the device: the row offsets of the last Forward
	devOff            *tensor.Tensor     // ForwardOffsets' offsets (the caller's; nil after Forward)
	x                 *tensor.Tensor     // (M, Dim) the last Forward's input
	act               *SwiGLUCore        // on the (M, Hidden) rows of all the experts
	h                 *tensor.Tensor     // (M, Hidden) the activation's output, the input of w_down
	gateW, upW, downW []*tensor.Tensor
	gateG, upG, downG []*tensor.Tensor
	rowsM             int
	viewsOK           bool
}

// NewExperts registers name+".w_gate", ".w_up" and ".w_down" in ps.
func NewExperts(b tensor.Backend, ps *ParamSet, name string, cfg ExpertsConfig) (*Experts, error) {
	if b == nil || ps == nil {
		return nil, fmt.Errorf("layers: experts %q: nil backend or parameter set", name)
	}
	if cfg.Count == 0 {
		cfg.Count = cfg.Experts - cfg.First
	}
	if cfg.Dim <= 0 || cfg.Hidden <= 0 || cfg.Experts <= 0 || cfg.First < 0 || cfg.Count <= 0 || cfg.First+cfg.Count > cfg.Experts {
		return nil, fmt.Errorf("layers: experts %q: Dim = %d, Hidden = %d, experts [%d, %d) of %d: expected positive sizes and a non-empty range inside [0, Experts)", name, cfg.Dim, cfg.Hidden, cfg.First, cfg.First+cfg.Count, cfg.Experts)
	}
	ex := &Experts{Name: name, Dim: cfg.Dim, Hidden: cfg.Hidden, Experts: cfg.Experts, First: cfg.First, Count: cfg.Count, b: b,
		act: NewSwiGLUCore(b)}
	ex.grouped = tensor.UseGroupedFor(b, cfg.Count)
	add := func(suffix string, rows, cols int, std float64) (*Param, error) {
		init := Normal(std)
		if cfg.Count != cfg.Experts {
			var err error
			if init, err = ShardInit(init, []int{cfg.Experts, rows, cols}, 0, cfg.First, cfg.First+cfg.Count); err != nil {
				return nil, fmt.Errorf("layers: experts %q: %w", name, err)
			}
		}
		return ps.Add(name+suffix, []int{cfg.Count, rows, cols}, true, init)
	}
	var err error
	if ex.Gate, err = add(".w_gate", cfg.Hidden, cfg.Dim, cfg.Std); err != nil {
		return nil, err
	}
	if ex.Up, err = add(".w_up", cfg.Hidden, cfg.Dim, cfg.Std); err != nil {
		return nil, err
	}
	if ex.Down, err = add(".w_down", cfg.Dim, cfg.Hidden, cfg.OutStd); err != nil {
		return nil, err
	}
	return ex, nil
}

// Params returns w_gate, w_up, w_down.
func (ex *Experts) Params() []*Param { return []*Param{ex.Gate, ex.Up, ex.Down} }

func (ex *Experts) what() string { return "layers: experts " + ex.Name }

// views makes the per-expert views of the stacked weights and gradients.
func (ex *Experts) views() {
	if ex.viewsOK {
		return
	}
	per := func(t *tensor.Tensor, rows, cols int) []*tensor.Tensor {
		vs := make([]*tensor.Tensor, ex.Count)
		for e := range vs {
			v, err := t.View(e*rows*cols, rows, cols)
			if err != nil {
				panic("layers: internal error: " + err.Error())
			}
			vs[e] = v
		}
		return vs
	}
	F, C := ex.Hidden, ex.Dim
	ex.gateW, ex.gateG = per(ex.Gate.W, F, C), per(ex.Gate.G, F, C)
	ex.upW, ex.upG = per(ex.Up.W, F, C), per(ex.Up.G, F, C)
	ex.downW, ex.downG = per(ex.Down.W, C, F), per(ex.Down.G, C, F)
	ex.viewsOK = true
}

// rows returns the view of rows [lo, hi) of a 2-D tensor.
func rows(t *tensor.Tensor, lo, hi int) *tensor.Tensor {
	v, err := t.Rows(lo, hi)
	if err != nil {
		panic("layers: internal error: " + err.Error())
	}
	return v
}

// Forward writes out (M, Dim) from x (M, Dim), whose rows are grouped by
// local expert: counts[e] rows for expert First+e, in order. M may be 0.
// x must stay unchanged until Backward.
func (ex *Experts) Forward(out, x *tensor.Tensor, counts []int) error {
	ex.counts = nil
	if err := checkParams(ex.what(), ex.Params()...); err != nil {
		return err
	}
	if len(counts) != ex.Count {
		return fmt.Errorf("%s: %d row counts, expected one per local expert (%d)", ex.what(), len(counts), ex.Count)
	}
	m := 0
	for e, c := range counts {
		if c < 0 {
			return fmt.Errorf("%s: %d rows for expert %d, expected ≥ 0", ex.what(), c, ex.First+e)
		}
		m += c
	}
	dt := ex.Gate.W.DType()
	if err := layerkit.CheckShape(ex.b, ex.what(), "input x", x, dt, m, ex.Dim); err != nil {
		return err
	}
	if err := layerkit.CheckShape(ex.b, ex.what(), "output", out, dt, m, ex.Dim); err != nil {
		return err
	}
	if err := layerkit.CheckApart(ex.what(), "output", out, "input x", x); err != nil {
		return err
	}
	gate, up := ex.act.Inputs(dt, m, ex.Hidden)
	if ex.grouped != nil {
		ex.offsets = uploadInts(ex.b, ex.offsets, offsetsOf(counts), ex.Count+1)
		_ = ex.forwardGrouped(out, x, gate, up, ex.offsets, nil) // no hooks: no error
	} else {
		ex.forwardLoop(out, x, gate, up, counts)
	}
	ex.x, ex.counts, ex.rowsM, ex.devOff = x, append([]int(nil), counts...), m, nil
	return layerkit.Sticky(ex.b, ex.what(), "forward")
}

// ForwardOffsets is Forward with the row offsets on the device (an
// expert path's device step, parallel/ep's DeviceOffsets): x and out are
// (M, Dim) buffers of a bound M, offsets (Count+1) int32 on the device the
// experts' rows in them, read by the grouped GEMM itself (nothing is read
// back to the host). Rows outside [offsets[0], offsets[Count]) are
// ignored: the GEMMs never read or write them, and SwiGLU, row-local,
// writes such rows of its own buffers only from such rows of the gate and
// up buffers (which the GEMMs leave as they were: zero when allocated,
// finite after). It needs the backend's grouped GEMM (tensor.UseGroupedFor).
// offsets and x must stay unchanged until Backward.
func (ex *Experts) ForwardOffsets(out, x, offsets *tensor.Tensor) error {
	return ex.ForwardOffsetsHooked(out, x, offsets, nil)
}

// GroupedHooks let an expert path fuse its communication into the experts'
// grouped GEMMs (ForwardOffsetsHooked; parallel/ep/peerep's fused
// strategy). Each computes c[R_g] = a[R_g]·w[g]ᵀ for the offsets' groups —
// the backend's GroupedMatMul(c, a, w, offsets, true, 1, 0) — its own way.
type GroupedHooks struct {
	// First is the gate projection, the first GEMM to read x: x's rows may
	// still be landing when it is called (it waits for each block).
	First func(c, a, w, offsets *tensor.Tensor) error
	// Down is the down projection: it may send each block of c on as it is
	// stored.
	Down func(c, a, w, offsets *tensor.Tensor) error
}

// ForwardOffsetsHooked is ForwardOffsets with the gate and down
// projections' GEMMs computed by hooks (nil, or a nil field: the
// backend's grouped GEMM). The up projection reads x after First.
func (ex *Experts) ForwardOffsetsHooked(out, x, offsets *tensor.Tensor, hooks *GroupedHooks) error {
	ex.counts = nil
	if err := checkParams(ex.what(), ex.Params()...); err != nil {
		return err
	}
	if ex.grouped == nil {
		return fmt.Errorf("%s: row offsets on the device need the backend's grouped GEMM (tensor.UseGroupedFor)", ex.what())
	}
	if offsets == nil || offsets.DType() != tensor.Int32 || offsets.Device() != ex.b.Device() || !offsets.Shape().Equal(tensor.Shape{ex.Count + 1}) {
		return fmt.Errorf("%s: offsets %v, expected int32(%d) on %v", ex.what(), offsets, ex.Count+1, ex.b.Device())
	}
	dt := ex.Gate.W.DType()
	if x == nil || len(x.Shape()) != 2 {
		return fmt.Errorf("%s: input x %v, expected (M, %d)", ex.what(), x, ex.Dim)
	}
	m := x.Dim(0)
	if err := layerkit.CheckShape(ex.b, ex.what(), "input x", x, dt, m, ex.Dim); err != nil {
		return err
	}
	if err := layerkit.CheckShape(ex.b, ex.what(), "output", out, dt, m, ex.Dim); err != nil {
		return err
	}
	if err := layerkit.CheckApart(ex.what(), "output", out, "input x", x); err != nil {
		return err
	}
	gate, up := ex.act.Inputs(dt, m, ex.Hidden)
	if err := ex.forwardGrouped(out, x, gate, up, offsets, hooks); err != nil {
		return fmt.Errorf("%s: forward: %w", ex.what(), err)
	}
	ex.x, ex.counts, ex.rowsM, ex.devOff = x, []int{}, m, offsets
	return layerkit.Sticky(ex.b, ex.what(), "forward")
}

// forwardGrouped is the experts' forward by the grouped GEMM, the rows of
// each expert given by offsets on the device: gate and up, SwiGLU, down;
// the gate and down GEMMs by hooks where it has them (nil: none). Without
// hooks it cannot fail.
func (ex *Experts) forwardGrouped(out, x, gate, up, offsets *tensor.Tensor, hooks *GroupedHooks) error {
	if hooks == nil {
		hooks = &GroupedHooks{}
	}
	tensor.MarkPhase(ex.b, "moe.experts.gate")
	if err := ex.groupedGEMM(hooks.First, gate, x, ex.Gate.W, offsets, true, 0); err != nil {
		return err
	}
	tensor.MarkPhase(ex.b, "moe.experts.up")
	ex.grouped.GroupedMatMul(up, x, ex.Up.W, offsets, true, 1, 0)
	tensor.MarkPhase(ex.b, "moe.experts.act")
	ex.h = ex.act.Forward()
	tensor.MarkPhase(ex.b, "moe.experts.down") // with a fused path's hook: and the combine's send
	return ex.groupedGEMM(hooks.Down, out, ex.h, ex.Down.W, offsets, true, 0)
}

// groupedGEMM is c = a·op(w) + beta·c over the offsets' groups: by hook
// when it is set, else by the backend's grouped GEMM.
func (ex *Experts) groupedGEMM(hook func(c, a, w, offsets *tensor.Tensor) error, c, a, w, offsets *tensor.Tensor, transW bool, beta float32) error {
	if hook != nil {
		return hook(c, a, w, offsets)
	}
	ex.grouped.GroupedMatMul(c, a, w, offsets, transW, 1, beta)
	return nil
}

// GroupedBackwardHooks are GroupedHooks for the backward (BackwardHooked):
// each computes c[R_g] = a[R_g]·w[g] + beta·c[R_g] — the backend's
// GroupedMatMul(c, a, w, offsets, false, 1, beta) — its own way.
type GroupedBackwardHooks struct {
	// DH is the first GEMM to read dout (dh = dout·W_down, beta 0): dout's
	// rows may still be landing when it is called.
	DH func(c, a, w, offsets *tensor.Tensor) error
	// DX is the last GEMM to write dx (dx += dup·W_up, beta 1): it may send
	// each block of dx on as it is stored.
	DX func(c, a, w, offsets *tensor.Tensor) error
}

// Backward overwrites dx (M, Dim) with ∂L/∂x and adds the weights'
// gradients, from dout (M, Dim).
func (ex *Experts) Backward(dx, dout *tensor.Tensor) error {
	return ex.BackwardHooked(dx, dout, nil)
}

// BackwardHooked is Backward with the GEMMs of hooks (nil, or a nil field:
// the backend's grouped GEMM); hooks need the grouped GEMM.
func (ex *Experts) BackwardHooked(dx, dout *tensor.Tensor, hooks *GroupedBackwardHooks) error {
	if ex.counts == nil {
		return errors.New(ex.what() + ": Backward without a successful Forward")
	}
	dt, m := ex.Gate.W.DType(), ex.rowsM
	if err := layerkit.CheckShape(ex.b, ex.what(), "output gradient", dout, dt, m, ex.Dim); err != nil {
		return err
	}
	if err := layerkit.CheckShape(ex.b, ex.what(), "input gradient dx", dx, dt, m, ex.Dim); err != nil {
		return err
	}
	if err := layerkit.CheckApart(ex.what(), "input gradient dx", dx, "output gradient", dout); err != nil {
		return err
	}
	if ex.grouped == nil {
		if hooks != nil {
			return fmt.Errorf("%s: backward hooks need the backend's grouped GEMM", ex.what())
		}
		ex.backwardLoop(dx, dout)
		return layerkit.Sticky(ex.b, ex.what(), "backward")
	}
	g, off := ex.grouped, ex.offsets
	if ex.devOff != nil {
		off = ex.devOff
	}
	if hooks == nil {
		hooks = &GroupedBackwardHooks{}
	}
	dh := ex.act.OutputGrad()
	tensor.MarkPhase(ex.b, "moe.experts.bwd.dh")
	if err := ex.groupedGEMM(hooks.DH, dh, dout, ex.Down.W, off, false, 0); err != nil { // dh = dout·W_down
		return fmt.Errorf("%s: backward: %w", ex.what(), err)
	}
	tensor.MarkPhase(ex.b, "moe.experts.bwd.wgrad")
	g.GroupedMatMulTN(ex.Down.G, dout, ex.h, off, 1, 1) // dW_down += doutᵀ·h
	tensor.MarkPhase(ex.b, "moe.experts.bwd.act")
	dgate, dup := ex.act.Backward()
	// With a fused path's hook this phase holds the dispatch backward's send too.
	tensor.MarkPhase(ex.b, "moe.experts.bwd.dx")
	g.GroupedMatMul(dx, dgate, ex.Gate.W, off, false, 1, 0) // dx = dgate·W_gate + dup·W_up
	if err := ex.groupedGEMM(hooks.DX, dx, dup, ex.Up.W, off, false, 1); err != nil {
		return fmt.Errorf("%s: backward: %w", ex.what(), err)
	}
	tensor.MarkPhase(ex.b, "moe.experts.bwd.wgrad")
	g.GroupedMatMulTN(ex.Gate.G, dgate, ex.x, off, 1, 1) // dW += dᵀ·x
	g.GroupedMatMulTN(ex.Up.G, dup, ex.x, off, 1, 1)
	return layerkit.Sticky(ex.b, ex.what(), "backward")
}

// offsetsOf returns the len(counts)+1 row offsets of consecutive groups of
// counts rows.
func offsetsOf(counts []int) []int32 {
	off := make([]int32, len(counts)+1)
	for e, c := range counts {
		off[e+1] = off[e] + int32(c)
	}
	return off
}

// forwardLoop is Forward on a backend without GroupedGEMM: one MatMul per
// expert and projection on row views.
func (ex *Experts) forwardLoop(out, x, gate, up *tensor.Tensor, counts []int) {
	ex.views()
	lo := 0
	for e, c := range counts {
		if c == 0 {
			continue
		}
		hi := lo + c
		xe := rows(x, lo, hi)
		ex.b.MatMul(rows(gate, lo, hi), xe, ex.gateW[e], false, true, 1, 0)
		ex.b.MatMul(rows(up, lo, hi), xe, ex.upW[e], false, true, 1, 0)
		lo = hi
	}
	ex.h = ex.act.Forward()
	lo = 0
	for e, c := range counts {
		if c == 0 {
			continue
		}
		hi := lo + c
		ex.b.MatMul(rows(out, lo, hi), rows(ex.h, lo, hi), ex.downW[e], false, true, 1, 0)
		lo = hi
	}
}

// backwardLoop is Backward on a backend without GroupedGEMM.
func (ex *Experts) backwardLoop(dx, dout *tensor.Tensor) {
	dh := ex.act.OutputGrad()
	lo := 0
	for e, c := range ex.counts {
		if c == 0 {
			continue
		}
		hi := lo + c
		do := rows(dout, lo, hi)
		ex.b.MatMul(rows(dh, lo, hi), do, ex.downW[e], false, false, 1, 0)  // dh = dout·W_down
		ex.b.MatMul(ex.downG[e], do, rows(ex.h, lo, hi), true, false, 1, 1) // dW_down += doutᵀ·h
		lo = hi
	}
	dgate, dup := ex.act.Backward()
	lo = 0
	for e, c := range ex.counts {
		if c == 0 {
			continue
		}
		hi := lo + c
		xe, dxe := rows(ex.x, lo, hi), rows(dx, lo, hi)
		dg, du := rows(dgate, lo, hi), rows(dup, lo, hi)
		ex.b.MatMul(dxe, dg, ex.gateW[e], false, false, 1, 0) // dx = dgate·W_gate + dup·W_up
		ex.b.MatMul(dxe, du, ex.upW[e], false, false, 1, 1)
		ex.b.MatMul(ex.gateG[e], dg, xe, true, false, 1, 1) // dW += dᵀ·x
		ex.b.MatMul(ex.upG[e], du, xe, true, false, 1, 1)
		lo = hi
	}
}

// Grouped reports whether the experts run the backend's grouped GEMM (and
// so can take device row offsets: ForwardOffsets).
func (ex *Experts) Grouped() bool { return ex.grouped != nil }
