//go:build asynctp_emu

package emuworld

import (
	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// Staged is a group whose collectives of device tensors go through host
// copies on B (comm/local moves host tensors only); those of host tensors
// go to the group as they are. The groups split from it are staged too.
type Staged struct {
	comm.Comm
	B *cudabackend.Backend
}

// host is a host copy of t.
func (c Staged) host(t *tensor.Tensor) (*tensor.Tensor, error) {
	h := tensor.MustHost(t.DType(), t.Shape()...)
	c.B.Download(h, t)
	return h, c.B.Sync()
}

// viaHost runs op on host copies of dst and src (dst's contents included:
// an all-to-all writes only its received rows), waits for it and uploads
// dst; src nil is an op in place.
func (c Staged) viaHost(dst, src *tensor.Tensor, op func(hd, hs *tensor.Tensor) (comm.Work, error)) (comm.Work, error) {
	hd, err := c.host(dst)
	if err != nil {
		return nil, err
	}
	hs := hd
	if src != nil {
		if hs, err = c.host(src); err != nil {
			return nil, err
		}
	}
	w, err := op(hd, hs)
	if err == nil {
		err = w.Wait(nil)
	}
	if err != nil {
		return nil, err
	}
	c.B.Upload(dst, hd)
	return comm.Done, c.B.Err()
}

func (c Staged) AllReduce(buf *tensor.Tensor, op comm.ReduceOp, s comm.Stream) (comm.Work, error) {
	if buf.Device().Kind == tensor.CPU {
		return c.Comm.AllReduce(buf, op, s)
	}
	return c.viaHost(buf, nil, func(hd, _ *tensor.Tensor) (comm.Work, error) { return c.Comm.AllReduce(hd, op, nil) })
}

func (c Staged) AllGather(dst, src *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	if src.Device().Kind == tensor.CPU {
		return c.Comm.AllGather(dst, src, s)
	}
	return c.viaHost(dst, src, func(hd, hs *tensor.Tensor) (comm.Work, error) { return c.Comm.AllGather(hd, hs, nil) })
}

func (c Staged) ReduceScatter(dst, src *tensor.Tensor, op comm.ReduceOp, s comm.Stream) (comm.Work, error) {
	if src.Device().Kind == tensor.CPU {
		return c.Comm.ReduceScatter(dst, src, op, s)
	}
	return c.viaHost(dst, src, func(hd, hs *tensor.Tensor) (comm.Work, error) { return c.Comm.ReduceScatter(hd, hs, op, nil) })
}

func (c Staged) AllToAllV(dst, src *tensor.Tensor, sendCounts, recvCounts []int, s comm.Stream) (comm.Work, error) {
	if src.Device().Kind == tensor.CPU {
		return c.Comm.AllToAllV(dst, src, sendCounts, recvCounts, s)
	}
	return c.viaHost(dst, src, func(hd, hs *tensor.Tensor) (comm.Work, error) {
		return c.Comm.AllToAllV(hd, hs, sendCounts, recvCounts, nil)
	})
}

func (c Staged) Broadcast(buf *tensor.Tensor, root int, s comm.Stream) (comm.Work, error) {
	if buf.Device().Kind == tensor.CPU {
		return c.Comm.Broadcast(buf, root, s)
	}
	return c.viaHost(buf, nil, func(hd, _ *tensor.Tensor) (comm.Work, error) { return c.Comm.Broadcast(hd, root, nil) })
}

// Unwrap is the group underneath.
func (c Staged) Unwrap() comm.Comm { return c.Comm }

func (c Staged) Split(color, key int) (comm.Comm, error) { return c.SplitNamed(color, key, "") }

func (c Staged) SplitNamed(color, key int, label string) (comm.Comm, error) {
	g, err := comm.SplitNamed(c.Comm, color, key, label)
	if err != nil || g == nil {
		return nil, err
	}
	return Staged{g, c.B}, nil
}
