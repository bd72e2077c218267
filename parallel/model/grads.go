package model

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// The gradient reduction and the global gradient norm are parallel/grads'
// (a Reducer built from the layers' shard descriptions); the Model adds the
// abort of the world on failure.

// allReduce sums t over group c, in place, and waits for it (nothing on a
// group of one rank).
func (m *Model) allReduce(c comm.Comm, what string, t *tensor.Tensor) error {
	if c.Size() == 1 {
		return nil
	}
	s := m.par.Stream
	w, err := c.AllReduce(t, comm.Sum, s)
	if err == nil {
		err = w.Wait(s)
	}
	if err != nil {
		return fmt.Errorf("model: %s: %w", what, err)
	}
	return nil
}

// GradSumSquares returns Σ g² over the whole model's gradients, each
// parameter counted once (grads.Reducer.GradSumSquares: the TP shards'
// sums added over the TP group, the expert shards' over the EP group, the
// replicated parameters taken once, nothing added over DP or EDP). It is
// the same on every rank, so clipping keeps the ranks in step; train.Run
// uses it for the gradient norm (train.GradSumSquarer). Call it after
// Backward; it is collective over the TP group and, in an MoE model, the
// EP group. An error aborts the world.
func (m *Model) GradSumSquares() (float64, error) {
	ss, err := m.red.GradSumSquares()
	if err != nil {
		return 0, m.fail(err)
	}
	return ss, nil
}

// GradSumSquaresTo is GradSumSquares without the host: dst (one element,
// the model's stat dtype, Float32 for bf16) += Σ g² of the whole model,
// computed and all-reduced on the device (grads.Reducer.GradSumSquaresTo),
// so a training step can clip on the device (optim.AdamW.ClipStep) without
// waiting for the backward. It is collective like GradSumSquares
// (optim.DeviceGradSumSquarer).
func (m *Model) GradSumSquaresTo(dst *tensor.Tensor) error {
	if err := m.red.GradSumSquaresTo(dst); err != nil {
		return m.fail(err)
	}
	return nil
}
