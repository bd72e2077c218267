package peerep

import (
	"fmt"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

var _ ep.FusedOffsets = (*Path)(nil)

// WithStreamHooks runs the fused protocol with its waits and signals as
// one-warp kernels around the backend's ordinary grouped GEMMs instead of
// inside the GEMM engine (no overlap: the first GEMM starts once every row
// has landed, the combine's sends once the down GEMM is done). It is what
// the kernel emulator runs (no TMA, wgmma), and lets tests compare the
// protocol bit for bit with the pipelined path; without it the strategy
// needs the grouped GEMM engine.
func WithStreamHooks() Option { return func(p *Path) { p.streamHooks = true } }

func withFused() Option { return func(p *Path) { p.fused = true } }

// Fused reports whether the path runs the fused protocol.
func (p *Path) Fused() bool { return p.fused }

// DispatchFused is DispatchDevice leaving the rows to land while the
// experts' first GEMM runs (ep.FusedOffsets): hooks.First waits per 128-row
// block of xe, hooks.Down sends each block of its output home as it is
// stored (CombineDevice then only waits and sums). On a path that is not
// fused it is DispatchDevice with no hooks.
func (p *Path) DispatchFused(x, idx *tensor.Tensor, capacityFactor float64) (*tensor.Tensor, *ep.Handle, *layers.GroupedHooks, error) {
	if !p.fused {
		xe, h, err := p.DispatchDevice(x, idx, capacityFactor)
		return xe, h, nil, err
	}
	xe, h, err := p.dispatchDevice(x, idx, capacityFactor, true)
	if err != nil {
		return nil, nil, nil, err
	}
	return xe, h, &layers.GroupedHooks{
		First: func(c, a, w, off *tensor.Tensor) error { return p.first(h, c, a, w, off) },
		Down:  func(c, a, w, off *tensor.Tensor) error { return p.down(h, c, a, w, off) },
	}, nil
}

func (p *Path) fusedCheck(h *ep.Handle, a, off *tensor.Tensor, what string) error {
	if err := p.checkHandle(h); err != nil {
		return err
	}
	if off != h.Offsets {
		return fmt.Errorf("%s: %s's offsets are not the step's (the handle's Offsets)", p.what(), what)
	}
	if a == nil || a.Dim(0) != h.Bound {
		return fmt.Errorf("%s: %s's input %v, expected the step's (%d, ·) expert-major rows", p.what(), what, a, h.Bound)
	}
	return nil
}

// first is the fused step's gate GEMM: the engine's producer waits on the
// dispatch's per-block counters (or, with stream hooks, one wait for all
// of them before the backend's grouped GEMM).
func (p *Path) first(h *ep.Handle, c, a, w, off *tensor.Tensor) error {
	return p.waitingGEMM(h, c, a, w, off, p.recv, true, "the first grouped GEMM", "the dispatch's rows")
}

// waitingGEMM is a grouped GEMM c = a·op(w) whose rows of a (which must be
// want, the buffer the counters guard) arrive while it runs: the engine's
// producer waits per 128-row block (stream hooks: one wait first).
func (p *Path) waitingGEMM(h *ep.Handle, c, a, w, off, want *tensor.Tensor, transB bool, what, wantWhat string) error {
	if err := p.fusedCheck(h, a, off, what); err != nil {
		return err
	}
	if a != want {
		return fmt.Errorf("%s: %s reads %v, expected %s", p.what(), what, a, wantWhat)
	}
	if p.streamHooks {
		p.eng.StreamWaitRows()
		p.b.GroupedMatMul(c, a, w, off, transB, 1, 0)
	} else if err := p.b.EngineGroupedMatMulHooked(c, a, w, off, transB, 1, 0, cudabackend.GroupedOptions{Wait: p.eng.Wait()}); err != nil {
		return p.fail(err)
	}
	if err := p.b.Err(); err != nil {
		return p.fail(err)
	}
	return nil
}

// down is the fused step's down-projection GEMM with the combine's sends
// beside it: each 128-row block of c goes home once the engine's epilogue
// has flagged it (stream hooks: once the whole GEMM is done).
func (p *Path) down(h *ep.Handle, c, a, w, off *tensor.Tensor) error {
	if err := p.sendingGEMM(h, c, a, w, off, true, 0, "the down-projection GEMM", "expert output y", p.eng.CombineSendFused); err != nil {
		return err
	}
	p.sent = c
	p.nFwd++
	return nil
}

// sendingGEMM is a grouped GEMM c = a·op(w) + beta·c whose 128-row blocks
// send(c, gemm) sends home as the engine's epilogue flags them (stream
// hooks: once the whole GEMM is done).
func (p *Path) sendingGEMM(h *ep.Handle, c, a, w, off *tensor.Tensor, transB bool, beta float32, what, cWhat string,
	send func(c *tensor.Tensor, gemm func() error) error) error {
	if err := p.fusedCheck(h, a, off, what); err != nil {
		return err
	}
	if err := p.checkRows(cWhat, c, h.Bound); err != nil {
		return err
	}
	gemm := func() error {
		if p.streamHooks {
			p.b.GroupedMatMul(c, a, w, off, transB, 1, beta)
			p.eng.StreamSignalDone()
			return p.b.Err()
		}
		return p.b.EngineGroupedMatMulHooked(c, a, w, off, transB, 1, beta, cudabackend.GroupedOptions{Signal: p.eng.Signal()})
	}
	if err := send(c, gemm); err != nil {
		return p.fail(err)
	}
	return nil
}

// CombineBackwardFused is CombineBackwardDevice leaving the ∂L/∂ye rows to
// land while the experts' first backward GEMM runs (ep.FusedOffsets):
// hooks.DH (dh = dye·W_down) waits per 128-row block of dye, hooks.DX (the
// last GEMM into dxe) sends each block home as it is stored
// (DispatchBackwardDevice then only waits and sums). On a path that is not
// fused it is CombineBackwardDevice with no hooks.
func (p *Path) CombineBackwardFused(dweights, dout, weights *tensor.Tensor, h *ep.Handle) (*tensor.Tensor, *layers.GroupedBackwardHooks, error) {
	if !p.fused {
		dye, err := p.CombineBackwardDevice(dweights, dout, weights, h)
		return dye, nil, err
	}
	dye, err := p.combineBackwardDevice(dweights, dout, weights, h, true)
	if err != nil {
		return nil, nil, err
	}
	return dye, &layers.GroupedBackwardHooks{
		DH: func(c, a, w, off *tensor.Tensor) error { return p.dh(h, c, a, w, off) },
		DX: func(c, a, w, off *tensor.Tensor) error { return p.dx(h, c, a, w, off) },
	}, nil
}

// dh is the fused backward's first GEMM (dh = dye·W_down, w (L, C, F) in
// the dgrad layout): it waits on the combine backward's per-block counters.
func (p *Path) dh(h *ep.Handle, c, a, w, off *tensor.Tensor) error {
	return p.waitingGEMM(h, c, a, w, off, p.dy, false, "the backward's first grouped GEMM", "the combine backward's rows")
}

// dx is the fused backward's last GEMM into the expert rows' gradients (dx
// += dup·W_up) with the dispatch backward's sends beside it.
func (p *Path) dx(h *ep.Handle, c, a, w, off *tensor.Tensor) error {
	if err := p.sendingGEMM(h, c, a, w, off, false, 1, "the backward's last grouped GEMM", "received-row gradient", p.eng.DispatchBackwardSendFused); err != nil {
		return err
	}
	p.sentG = c
	p.nBwd++
	return nil
}

// FusedSteps is how many forward and backward steps ran their combine (or
// dispatch backward) from the GEMM hooks (tests and diagnostics).
func (p *Path) FusedSteps() (forward, backward int) { return p.nFwd, p.nBwd }

// groupedFor is the grouped GEMM the expert site's layer takes on b: for
// its local experts when the spec gives the experts (as the layers decide,
// tensor.UseGroupedFor), else the backend's general preference.
func groupedFor(b tensor.Backend, sp overlap.Spec) tensor.GroupedGEMM {
	if P := sp.Group.Size(); sp.Experts > 0 && P > 0 {
		return tensor.UseGroupedFor(b, sp.Experts/P)
	}
	return tensor.UseGrouped(b)
}
