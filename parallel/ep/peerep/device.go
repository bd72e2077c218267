package peerep

import (
	"fmt"

	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/tensor"
)

var _ ep.DeviceOffsets = (*Path)(nil)

// DispatchDevice is Dispatch with every count left on the device
// (ep.DeviceOffsets): the layout, the count exchange, the capacity and the
// expert offsets are the kernels', and the received rows come back in
// expert-major order into the path's (RecvBound, C) buffer, nothing read
// back to the host. A step of more tokens than the bound is refused on the
// rank that has them before it sends anything; its peers then fail at
// their wait's deadline, naming it (their kernels cannot tell the host).
func (p *Path) DispatchDevice(x, idx *tensor.Tensor, capacityFactor float64) (*tensor.Tensor, *ep.Handle, error) {
	xe, h, err := p.dispatchDevice(x, idx, capacityFactor, p.fused)
	if err == nil && p.fused {
		p.eng.Join() // a caller without the fused hooks reads xe directly
	}
	return xe, h, err
}

// dispatchDevice is DispatchDevice, with the fused receive (the rows still
// landing on the side stream) when fused.
func (p *Path) dispatchDevice(x, idx *tensor.Tensor, capacityFactor float64, fused bool) (*tensor.Tensor, *ep.Handle, error) {
	if p.broken != nil {
		return nil, nil, fmt.Errorf("%s: an earlier step failed: %w", p.what(), p.broken)
	}
	if x == nil || idx == nil || len(x.Shape()) != 2 || len(idx.Shape()) != 2 || x.Dim(0) != idx.Dim(0) || x.Device() != p.b.Device() {
		return nil, nil, fmt.Errorf("%s: input %v and expert ids %v: expected (N, C) and (N, K) on %v", p.what(), x, idx, p.b.Device())
	}
	N, K, C := x.Dim(0), idx.Dim(1), x.Dim(1)
	if K < 1 || K > p.experts {
		return nil, nil, fmt.Errorf("%s: top-%d of %d experts", p.what(), K, p.experts)
	}
	if N > p.maxTokens {
		return nil, nil, fmt.Errorf("%s: %d tokens on this rank, expected at most %d (the maximum tokens per rank the expert path's buffers are sized for: ep.Parallel.MaxTokens)", p.what(), N, p.maxTokens)
	}
	if err := p.ensure(K, C, x.DType()); err != nil {
		return nil, nil, err
	}
	p.cur, p.combine, p.sent, p.sentG = nil, false, nil, nil
	if err := p.eng.DispatchSend(x, idx, capacityFactor); err != nil {
		return nil, nil, p.fail(err)
	}
	var err error
	if fused {
		err = p.eng.DispatchRecvFused(p.recv)
	} else {
		err = p.eng.DispatchRecv(p.recv, 0)
	}
	if err != nil {
		return nil, nil, p.fail(err)
	}
	h := &ep.Handle{Layout: &ep.Layout{Tokens: N, TopK: K, Experts: p.experts, CapacityFactor: capacityFactor},
		Offsets: p.eng.Offsets(), Bound: p.recv.Dim(0)}
	p.cur, p.rows = h, -1
	return p.recv, h, nil
}

func (p *Path) checkDevice(h *ep.Handle, what string, t *tensor.Tensor) error {
	if err := p.checkHandle(h); err != nil {
		return err
	}
	if h.Offsets == nil {
		return fmt.Errorf("%s: a host-count handle given to a device step's call", p.what())
	}
	return p.checkRows(what, t, h.Bound)
}

// CombineDevice is Combine of expert-major rows ye (RecvBound, C).
func (p *Path) CombineDevice(out, ye, weights *tensor.Tensor, h *ep.Handle) error {
	if err := p.checkDevice(h, "expert output y", ye); err != nil {
		return err
	}
	if err := p.checkRows("output", out, h.Layout.Tokens); err != nil {
		return err
	}
	if p.sent != nil && p.sent != ye {
		return fmt.Errorf("%s: CombineDevice of %v, but the fused down GEMM sent %v", p.what(), ye, p.sent)
	}
	if p.sent == nil { // else the fused down GEMM's hook has queued the send
		if err := p.eng.CombineSend(ye, 0); err != nil {
			return p.fail(err)
		}
	}
	p.sent = nil
	if err := p.eng.CombineRecv(out, weights); err != nil {
		return p.fail(err)
	}
	p.combine = true
	return nil
}

// CombineBackwardDevice is CombineBackward returning ∂L/∂ye (RecvBound, C)
// in expert-major order (the path's buffer).
func (p *Path) CombineBackwardDevice(dweights, dout, weights *tensor.Tensor, h *ep.Handle) (*tensor.Tensor, error) {
	dye, err := p.combineBackwardDevice(dweights, dout, weights, h, p.fused)
	if err == nil && p.fused {
		p.eng.Join() // a caller without the fused hooks reads dye directly
	}
	return dye, err
}

// combineBackwardDevice is CombineBackwardDevice, with the fused receive
// (the rows still landing on the side stream) when fused.
func (p *Path) combineBackwardDevice(dweights, dout, weights *tensor.Tensor, h *ep.Handle, fused bool) (*tensor.Tensor, error) {
	if err := p.checkDevice(h, "combine buffer", p.dy); err != nil {
		return nil, err
	}
	if !p.combine {
		return nil, fmt.Errorf("%s: CombineBackward without a Combine of this handle", p.what())
	}
	if err := p.checkRows("output gradient", dout, h.Layout.Tokens); err != nil {
		return nil, err
	}
	if err := p.eng.CombineBackwardSend(dout, weights, dweights); err != nil {
		return nil, p.fail(err)
	}
	var err error
	if fused {
		err = p.eng.CombineBackwardRecvFused(p.dy)
	} else {
		err = p.eng.CombineBackwardRecv(p.dy, 0)
	}
	if err != nil {
		return nil, p.fail(err)
	}
	return p.dy, nil
}

// DispatchBackwardDevice is DispatchBackward of expert-major gradients dxe
// (RecvBound, C).
func (p *Path) DispatchBackwardDevice(dx, dxe *tensor.Tensor, h *ep.Handle) error {
	if err := p.checkDevice(h, "received-row gradient", dxe); err != nil {
		return err
	}
	if err := p.checkRows("input gradient dx", dx, h.Layout.Tokens); err != nil {
		return err
	}
	if p.sentG != nil && p.sentG != dxe {
		return fmt.Errorf("%s: DispatchBackwardDevice of %v, but the fused backward's last GEMM sent %v", p.what(), dxe, p.sentG)
	}
	if p.sentG == nil { // else the fused DX hook has queued the send
		if err := p.eng.DispatchBackwardSend(dxe, 0); err != nil {
			return p.fail(err)
		}
	}
	p.sentG = nil
	if err := p.eng.DispatchBackwardRecv(dx); err != nil {
		return p.fail(err)
	}
	return nil
}
