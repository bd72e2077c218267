package ep

import (
	"fmt"
	"math"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
)

// Shadow mode on the expert path (overlap.Shadow): an expert path whose
// strategy is not collective, and which the shadow samples, is wrapped in
// a decorator that holds a collective *Dispatcher of its own. On a sampled
// step the real path runs first, as it would unshadowed (its Works are
// waited: the step's overlap is given up on that step); then the
// dispatcher runs the same protocol from the same inputs — the layer's
// tokens and routing (so the same capacity and drops), and the real
// path's expert outputs and their gradients — into its own buffers, and
// the results are compared:
//
//	out       the dispatched rows (received order, or expert order on a
//	          device step: the valid rows) and the combined output
//	dx        the combine backward's rows (∂L/∂y) and the dispatch
//	          backward's token gradients
//	dweights  the combine backward's gradient of the routing weights
//
// The expert GEMMs are the layer's, the same for both: a difference is
// the path's. A device step's (DeviceOffsets, and FusedOffsets whose rows
// land while the GEMMs run) comparisons are made once the real forward's
// combine, and the backward's dispatch, are done: the dispatcher then runs
// the forward's protocol (the routing read back to the host) and the
// backward's. The decorator keeps the real path's capabilities
// (DeviceOffsets, FusedOffsets, Close), so the layer takes the same step.

// shadowExpertPath wraps path when ss is not nil: ref is the collective
// dispatcher it is compared with.
func shadowExpertPath(path ExpertPath, ref *Dispatcher, ss *overlap.ShadowSite, b tensor.Backend, stream comm.Stream) ExpertPath {
	s := &shadowPath{ExpertPath: path, ref: ref, site: ss, b: b, stream: stream}
	switch p := path.(type) {
	case FusedOffsets:
		return &shadowFused{shadowDevice{shadowPath: s, dev: p}, p}
	case DeviceOffsets:
		return &shadowDevice{shadowPath: s, dev: p}
	}
	return s
}

type shadowPath struct {
	ExpertPath // the real path
	ref        *Dispatcher
	site       *overlap.ShadowSite
	b          tensor.Backend
	stream     comm.Stream

	// The sampled step's reference.
	rl  *Layout
	rh  *Handle
	out rowBuffer // (N, C) the reference's combined output, then its dx
	dw  rowBuffer // (N, K) its dweights
	tmp rowBuffer // (M, C) rows moved between the orders
}

func (s *shadowPath) what() string { return "ep: shadow of the expert path" }

func (s *shadowPath) wait(w comm.Work, err error) error {
	if err != nil {
		return err
	}
	return w.Wait(s.stream)
}

// Close frees the decorator's buffers and closes the collective reference
// and the real path (when it has a Close); the first error.
func (s *shadowPath) Close() error {
	s.Release(nil)
	for _, r := range []*rowBuffer{&s.out, &s.dw, &s.tmp} {
		r.free(s.b)
	}
	err := s.ref.Close()
	if c, ok := s.ExpertPath.(interface{ Close() error }); ok {
		if cerr := c.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

func (s *shadowPath) Layout(idx []int32, tokens, topK int, capacityFactor float64) (*Layout, error) {
	l, err := s.ExpertPath.Layout(idx, tokens, topK, capacityFactor)
	if err != nil || !s.site.Sampled() {
		return l, err
	}
	if s.rl, err = s.ref.Layout(idx, tokens, topK, capacityFactor); err != nil {
		return nil, fmt.Errorf("%s: layout: %w", s.what(), err)
	}
	return l, nil
}

func (s *shadowPath) Dispatch(x *tensor.Tensor, l *Layout) (*tensor.Tensor, *Handle, comm.Work, error) {
	recv, h, w, err := s.ExpertPath.Dispatch(x, l)
	if err != nil || !s.site.Sampled() || s.rl == nil {
		return recv, h, w, err
	}
	if err := w.Wait(s.stream); err != nil {
		return nil, nil, nil, err
	}
	rrecv, err := s.refDispatch(x, s.rl)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := s.compare(overlap.SlotOut, recv, rrecv); err != nil {
		return nil, nil, nil, err
	}
	return recv, h, comm.Done, nil
}

// refDispatch dispatches x by l on the dispatcher and waits for its rows.
func (s *shadowPath) refDispatch(x *tensor.Tensor, l *Layout) (*tensor.Tensor, error) {
	s.releaseRef()
	recv, h, w, err := s.ref.Dispatch(x, l)
	if err != nil {
		return nil, fmt.Errorf("%s: dispatch on collective: %w", s.what(), err)
	}
	s.rh = h
	if err := w.Wait(s.stream); err != nil {
		return nil, fmt.Errorf("%s: dispatch on collective: %w", s.what(), err)
	}
	return recv, nil
}

// compare records got against want in slot; tensors of different rows
// (a path that received other rows than the dispatcher) differ
// everywhere.
func (s *shadowPath) compare(slot int, got, want *tensor.Tensor) error {
	if got == nil || want == nil || !got.Shape().Equal(want.Shape()) {
		s.site.Record(slot, mismatch)
		return nil
	}
	return s.site.Compare(s.b, slot, got, want)
}

// mismatch is the difference recorded for tensors of different shapes.
var mismatch = overlap.Diff{Rel: math.Inf(1), ULP: math.Inf(1), Index: -1}

// rowsOf is the first rows of t (2-D).
func rowsOf(t *tensor.Tensor, rows int) *tensor.Tensor {
	v, err := t.Rows(0, rows)
	if err != nil { // cannot happen: the callers bound rows
		panic("ep: internal error: " + err.Error())
	}
	return v
}

func (s *shadowPath) Combine(out, y, weights *tensor.Tensor, h *Handle) error {
	if err := s.ExpertPath.Combine(out, y, weights, h); err != nil || !s.sampledStep() {
		return err
	}
	return s.refCombine(out, y, weights)
}

// refCombine combines y (received order) on the dispatcher and compares
// the output with out.
func (s *shadowPath) refCombine(out, y, weights *tensor.Tensor) error {
	if y.Dim(0) != s.rh.RecvRows() {
		s.site.Record(overlap.SlotOut, mismatch)
		return nil
	}
	ro := s.out.get(s.b, out.DType(), s.rh.Layout.Tokens, s.rh.cols)
	if err := s.ref.Combine(ro, y, weights, s.rh); err != nil {
		return fmt.Errorf("%s: combine on collective: %w", s.what(), err)
	}
	return s.compare(overlap.SlotOut, reshape(out, ro.Dim(0), ro.Dim(1)), ro)
}

// sampledStep reports whether this step is sampled and the dispatcher
// holds its handle.
func (s *shadowPath) sampledStep() bool { return s.rh != nil && s.site.Sampled() }

func (s *shadowPath) CombineBackward(dweights, dout, weights *tensor.Tensor, h *Handle) (*tensor.Tensor, comm.Work, error) {
	dy, w, err := s.ExpertPath.CombineBackward(dweights, dout, weights, h)
	if err != nil || !s.sampledStep() {
		return dy, w, err
	}
	if err := w.Wait(s.stream); err != nil {
		return nil, nil, err
	}
	rdy, err := s.refCombineBackward(dweights, dout, weights)
	if err != nil {
		return nil, nil, err
	}
	if err := s.compare(overlap.SlotDX, dy, rdy); err != nil {
		return nil, nil, err
	}
	return dy, comm.Done, nil
}

// refCombineBackward runs the combine backward on the dispatcher, waits
// for its rows, compares dweights, and returns its ∂L/∂y (received order).
func (s *shadowPath) refCombineBackward(dweights, dout, weights *tensor.Tensor) (*tensor.Tensor, error) {
	var rdw *tensor.Tensor
	if dweights != nil {
		rdw = s.dw.get(s.b, dweights.DType(), dweights.Dim(0), dweights.Dim(1))
	}
	rdy, err := s.wait2(s.ref.CombineBackward(rdw, dout, weights, s.rh))
	if err != nil {
		return nil, fmt.Errorf("%s: combine backward on collective: %w", s.what(), err)
	}
	if dweights != nil {
		if err := s.compare(overlap.SlotDW, dweights, rdw); err != nil {
			return nil, err
		}
	}
	return rdy, nil
}

func (s *shadowPath) wait2(t *tensor.Tensor, w comm.Work, err error) (*tensor.Tensor, error) {
	return t, s.wait(w, err)
}

func (s *shadowPath) DispatchBackward(dx, drecv *tensor.Tensor, h *Handle) error {
	if err := s.ExpertPath.DispatchBackward(dx, drecv, h); err != nil || !s.sampledStep() {
		return err
	}
	return s.refDispatchBackward(dx, drecv)
}

// refDispatchBackward sends drecv (received order) back on the dispatcher
// and compares the token gradients with dx.
func (s *shadowPath) refDispatchBackward(dx, drecv *tensor.Tensor) error {
	if drecv.Dim(0) != s.rh.RecvRows() {
		s.site.Record(overlap.SlotDX, mismatch)
		return nil
	}
	rdx := s.out.get(s.b, dx.DType(), s.rh.Layout.Tokens, s.rh.cols)
	if err := s.ref.DispatchBackward(rdx, drecv, s.rh); err != nil {
		return fmt.Errorf("%s: dispatch backward on collective: %w", s.what(), err)
	}
	return s.compare(overlap.SlotDX, reshape(dx, rdx.Dim(0), rdx.Dim(1)), rdx)
}

func (s *shadowPath) Release(h *Handle) {
	if h != nil {
		s.ExpertPath.Release(h)
	}
	s.releaseRef()
}

func (s *shadowPath) releaseRef() {
	if s.rh != nil {
		s.ref.Release(s.rh)
		s.rh = nil
	}
	s.rl = nil
}

// shadowDevice is the decorator of a DeviceOffsets path: its device
// step's comparisons run at CombineDevice (forward) and
// DispatchBackwardDevice (backward), once the real step's rows are done.
type shadowDevice struct {
	*shadowPath
	dev DeviceOffsets

	// The sampled step's inputs, kept until the comparisons.
	x, idx, xe               *tensor.Tensor
	dout, dweights, dye, wts *tensor.Tensor
	cf                       float64
	host                     []int32 // idx read back
}

var _ DeviceOffsets = (*shadowDevice)(nil)

func (s *shadowDevice) DispatchDevice(x, idx *tensor.Tensor, capacityFactor float64) (*tensor.Tensor, *Handle, error) {
	xe, h, err := s.dev.DispatchDevice(x, idx, capacityFactor)
	if err == nil {
		s.keepForward(x, idx, xe, capacityFactor)
	}
	return xe, h, err
}

func (s *shadowDevice) keepForward(x, idx, xe *tensor.Tensor, cf float64) {
	s.releaseRef()
	s.x, s.idx, s.xe, s.cf = nil, nil, nil, 0
	if s.site.Sampled() {
		s.x, s.idx, s.xe, s.cf = x, idx, xe, cf
	}
}

func (s *shadowDevice) CombineDevice(out, ye, weights *tensor.Tensor, h *Handle) error {
	if err := s.dev.CombineDevice(out, ye, weights, h); err != nil || s.x == nil {
		return err
	}
	x, idx := s.x, s.idx
	s.x = nil
	N, K := idx.Dim(0), idx.Dim(1)
	hi := tensor.MustHost(tensor.Int32, N, K)
	s.b.Download(hi, idx)
	if err := s.b.Err(); err != nil {
		return fmt.Errorf("%s: reading the routing back: %w", s.what(), err)
	}
	s.host = append(s.host[:0], hi.I32()...) // the layout keeps it
	var err error
	if s.rl, err = s.ref.Layout(s.host, N, K, s.cf); err != nil {
		return fmt.Errorf("%s: layout: %w", s.what(), err)
	}
	rrecv, err := s.refDispatch(x, s.rl)
	if err != nil {
		return err
	}
	y, err := s.checkSorted(overlap.SlotOut, s.xe, rrecv, ye)
	if err != nil || y == nil {
		return err
	}
	return s.refCombine(out, y, weights)
}

// checkSorted compares the device step's rows, in expert order, with the
// reference's: dev is the device's buffer, ref the reference's (M, ·) rows
// in receive order, recorded in slot. It returns the first M rows of next
// (the device's operand of the following step, in expert order) in
// receive order, for the reference's following step; nil when the
// device's buffers hold fewer than M rows (recorded as a mismatch).
func (s *shadowDevice) checkSorted(slot int, dev, ref, next *tensor.Tensor) (*tensor.Tensor, error) {
	M := s.rh.RecvRows()
	if M > dev.Dim(0) || M > next.Dim(0) {
		s.site.Record(slot, mismatch)
		return nil, nil
	}
	sorted := s.tmp.get(s.b, ref.DType(), M, ref.Dim(1))
	s.ref.SortByExpert(sorted, ref, s.rh)
	if err := s.compare(slot, rowsOf(dev, M), sorted); err != nil {
		return nil, err
	}
	recv := s.tmp.get(s.b, next.DType(), M, next.Dim(1))
	s.ref.UnsortByExpert(recv, rowsOf(next, M), s.rh)
	return recv, nil
}

func (s *shadowDevice) CombineBackwardDevice(dweights, dout, weights *tensor.Tensor, h *Handle) (*tensor.Tensor, error) {
	dye, err := s.dev.CombineBackwardDevice(dweights, dout, weights, h)
	if err == nil {
		s.keepBackward(dweights, dout, weights, dye)
	}
	return dye, err
}

func (s *shadowDevice) keepBackward(dweights, dout, weights, dye *tensor.Tensor) {
	s.dout, s.dweights, s.wts, s.dye = nil, nil, nil, nil
	if s.sampledStep() {
		s.dout, s.dweights, s.wts, s.dye = dout, dweights, weights, dye
	}
}

func (s *shadowDevice) DispatchBackwardDevice(dx, dxe *tensor.Tensor, h *Handle) error {
	if err := s.dev.DispatchBackwardDevice(dx, dxe, h); err != nil || s.dout == nil {
		return err
	}
	dout := s.dout
	s.dout = nil
	rdy, err := s.refCombineBackward(s.dweights, dout, s.wts)
	if err != nil {
		return err
	}
	drecv, err := s.checkSorted(overlap.SlotDX, s.dye, rdy, dxe)
	if err != nil || drecv == nil {
		return err
	}
	return s.refDispatchBackward(dx, drecv)
}

// shadowFused is the decorator of a FusedOffsets path: the fused calls
// are the real path's, their comparisons the device step's.
type shadowFused struct {
	shadowDevice
	fused FusedOffsets
}

var _ FusedOffsets = (*shadowFused)(nil)

func (s *shadowFused) Fused() bool { return s.fused.Fused() }

func (s *shadowFused) DispatchFused(x, idx *tensor.Tensor, capacityFactor float64) (*tensor.Tensor, *Handle, *layers.GroupedHooks, error) {
	xe, h, hooks, err := s.fused.DispatchFused(x, idx, capacityFactor)
	if err == nil {
		s.keepForward(x, idx, xe, capacityFactor)
	}
	return xe, h, hooks, err
}

func (s *shadowFused) CombineBackwardFused(dweights, dout, weights *tensor.Tensor, h *Handle) (*tensor.Tensor, *layers.GroupedBackwardHooks, error) {
	dye, hooks, err := s.fused.CombineBackwardFused(dweights, dout, weights, h)
	if err == nil {
		s.keepBackward(dweights, dout, weights, dye)
	}
	return dye, hooks, err
}
