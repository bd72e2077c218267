package overlap

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// The shadowed sites: a decorator around the site the chooser built with
// the chosen strategy, holding a collective site built from the same Spec.
// On a step the Shadow does not sample they only forward the call. On a
// sampled step the real site runs first, exactly as it would unshadowed,
// and its Work is waited (the caller's overlap of its Work with other math
// is given up on that step); then the collective site runs from the same
// inputs into the decorator's own buffers, on the same group and stream
// (the group is the site's until its Work is waited, so the reference
// comes after: on a GPU on the compute stream too, since the backend's
// math has one stream), and the results are compared (read back to the
// host). The weight gradients accumulate (+=): the collective's start
// from a copy of the gradient taken before the real site adds to it, so
// both add to the same start and a strategy that gives collective's bits
// reports 0; the real accumulation is never touched. The decorator returns
// comm.Done on a sampled step: everything is complete by then.

// shadowSite is the shadow handle of the site of sp built by s (nil: not
// shadowed).
func (c *Chooser) shadowSite(sp Spec, s Strategy) *ShadowSite {
	if c.shadow == nil {
		return nil
	}
	return c.shadow.site(sp, s.Name())
}

// ShadowOf returns the shadow handle of the site of sp, which the strategy
// s builds, or nil when no shadow covers it (no Shadow, s is collective,
// or the shadow's patterns leave it out). For the sites the chooser cannot
// wrap itself: the MoE expert path (parallel/ep). Call it once per site.
func (c *Chooser) ShadowOf(sp Spec, s Strategy) *ShadowSite { return c.shadowSite(sp, s) }

// WithShadow makes the chooser wrap every site it builds that sh shadows
// (a strategy other than collective, selected by sh's patterns): on the
// steps sh samples the site also runs collective and the two are
// compared. sh is one rank's: give each rank's chooser its own.
func WithShadow(sh *Shadow) ChooserOption { return func(c *Chooser) { c.shadow = sh } }

type shadowAGMM struct {
	real, ref AllGatherMatmul
	site      *ShadowSite
	sp        Spec
	xFull, dx buffer
	outs, dws []buffer
}

func (s *shadowAGMM) Forward(outs []*tensor.Tensor, xFull, x *tensor.Tensor, ws []*tensor.Tensor) error {
	if err := s.real.Forward(outs, xFull, x, ws); err != nil || !s.site.Sampled() {
		return err
	}
	b := s.sp.Backend
	sx := s.xFull.get(b, xFull.DType(), xFull.Dim(0), xFull.Dim(1))
	souts := like(b, &s.outs, outs)
	if err := s.ref.Forward(souts, sx, x, ws); err != nil {
		return shadowErr(s.sp, "forward", err)
	}
	if err := s.site.Compare(b, SlotOut, xFull, sx); err != nil {
		return err
	}
	for i := range outs {
		if err := s.site.Compare(b, SlotOut, outs[i], souts[i]); err != nil {
			return err
		}
	}
	return nil
}

func (s *shadowAGMM) Backward(dx *tensor.Tensor, dws, douts []*tensor.Tensor, xFull *tensor.Tensor, ws []*tensor.Tensor) (comm.Work, error) {
	if !s.site.Sampled() {
		return s.real.Backward(dx, dws, douts, xFull, ws)
	}
	b := s.sp.Backend
	sdws := like(b, &s.dws, dws)
	for i := range dws {
		b.Copy(sdws[i], dws[i]) // the start the real site adds to
	}
	w, err := s.real.Backward(dx, dws, douts, xFull, ws)
	if err != nil {
		return nil, err
	}
	if err := w.Wait(s.sp.Stream); err != nil {
		return nil, err
	}
	sdx := s.dx.get(b, dx.DType(), dx.Dim(0), dx.Dim(1))
	if err := waitOn(s.sp)(s.ref.Backward(sdx, sdws, douts, xFull, ws)); err != nil {
		return nil, shadowErr(s.sp, "backward", err)
	}
	if err := s.site.Compare(b, SlotDX, dx, sdx); err != nil {
		return nil, err
	}
	for i := range dws {
		if err := s.site.Compare(b, SlotDW, dws[i], sdws[i]); err != nil {
			return nil, err
		}
	}
	return comm.Done, nil
}

func (s *shadowAGMM) Close() error {
	b := s.sp.Backend
	s.xFull.free(b)
	s.dx.free(b)
	freeAll(b, s.outs)
	freeAll(b, s.dws)
	return firstErr(s.real.Close(), s.ref.Close())
}

type shadowMMRS struct {
	real, ref   MatmulReduceScatter
	site        *ShadowSite
	sp          Spec
	out, dx, dw buffer
}

func (s *shadowMMRS) Forward(out, x, w *tensor.Tensor) error {
	if err := s.real.Forward(out, x, w); err != nil || !s.site.Sampled() {
		return err
	}
	b := s.sp.Backend
	so := s.out.get(b, out.DType(), out.Dim(0), out.Dim(1))
	if err := s.ref.Forward(so, x, w); err != nil {
		return shadowErr(s.sp, "forward", err)
	}
	return s.site.Compare(b, SlotOut, out, so)
}

func (s *shadowMMRS) Backward(dx, dw, dout, x, w *tensor.Tensor) (comm.Work, error) {
	if !s.site.Sampled() {
		return s.real.Backward(dx, dw, dout, x, w)
	}
	b := s.sp.Backend
	sdw := s.dw.get(b, dw.DType(), dw.Dim(0), dw.Dim(1))
	b.Copy(sdw, dw) // the start the real site adds to
	wk, err := s.real.Backward(dx, dw, dout, x, w)
	if err != nil {
		return nil, err
	}
	if err := wk.Wait(s.sp.Stream); err != nil {
		return nil, err
	}
	sdx := s.dx.get(b, dx.DType(), dx.Dim(0), dx.Dim(1))
	if err := waitOn(s.sp)(s.ref.Backward(sdx, sdw, dout, x, w)); err != nil {
		return nil, shadowErr(s.sp, "backward", err)
	}
	if err := s.site.Compare(b, SlotDX, dx, sdx); err != nil {
		return nil, err
	}
	if err := s.site.Compare(b, SlotDW, dw, sdw); err != nil {
		return nil, err
	}
	return comm.Done, nil
}

func (s *shadowMMRS) Close() error {
	b := s.sp.Backend
	s.out.free(b)
	s.dx.free(b)
	s.dw.free(b)
	return firstErr(s.real.Close(), s.ref.Close())
}

type shadowMMAR struct {
	real, ref MatmulAllReduce
	site      *ShadowSite
	sp        Spec
	out       buffer
}

func (s *shadowMMAR) Run(out *tensor.Tensor, as, ws []*tensor.Tensor, transW bool) (comm.Work, error) {
	w, err := s.real.Run(out, as, ws, transW)
	if err != nil || !s.site.Sampled() {
		return w, err
	}
	if err := w.Wait(s.sp.Stream); err != nil {
		return nil, err
	}
	b := s.sp.Backend
	so := s.out.get(b, out.DType(), out.Dim(0), out.Dim(1))
	if err := waitOn(s.sp)(s.ref.Run(so, as, ws, transW)); err != nil {
		return nil, shadowErr(s.sp, "run", err)
	}
	if err := s.site.Compare(b, SlotOut, out, so); err != nil {
		return nil, err
	}
	return comm.Done, nil
}

func (s *shadowMMAR) Close() error {
	s.out.free(s.sp.Backend)
	return firstErr(s.real.Close(), s.ref.Close())
}

// like returns tensors of bufs shaped as ts (2-D), growing bufs to len(ts).
func like(b tensor.Backend, bufs *[]buffer, ts []*tensor.Tensor) []*tensor.Tensor {
	for len(*bufs) < len(ts) {
		*bufs = append(*bufs, buffer{})
	}
	out := make([]*tensor.Tensor, len(ts))
	for i, t := range ts {
		out[i] = (*bufs)[i].get(b, t.DType(), t.Dim(0), t.Dim(1))
	}
	return out
}

func freeAll(b tensor.Backend, bufs []buffer) {
	for i := range bufs {
		bufs[i].free(b)
	}
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func shadowErr(sp Spec, pass string, err error) error {
	return fmt.Errorf("%s: shadow %s on collective: %w", sp.what(), pass, err)
}
