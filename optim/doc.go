// Package optim holds the optimizer of asynctp's models and its
// learning-rate schedule, with no dependency beyond the tensor and layers
// packages: a program that trains its own model with its own loop imports
// it without the training loop's metrics, plots and progress bar (train).
//
// AdamW updates a materialized layers.ParamSet in place over its flat
// buffers (decoupled weight decay on the parameters with Decay only, fp32
// master weights for bf16 parameters). NewAdamW takes PyTorch's defaults;
// NewAdamWWithConfig takes an AdamWConfig, which is validated: a beta
// outside [0, 1), an Eps that is not > 0, a NaN or negative weight decay is
// refused with an error naming the field, as is a NaN, infinite or negative
// learning rate at a step.
//
// A step after the backward is one call: ClipStep forms Σ g² of the whole
// gradient on the device (from a DeviceGradSumSquarer: grads.Reducer for a
// model sharded over ranks, the optimizer's own flat gradient otherwise)
// and updates with the gradient clipped by it, skipping the update when it
// is not finite; nothing is read back until the caller waits for the norm.
// Step is the same with a clipping factor known on the host (ClipScale).
//
// NewShardedAdamW is a rank of a distributed optimizer (ZeRO stage 1): it
// holds the fp32 master weights and moments of the runs of the flat
// buffers it owns (Sharding: parallel/grads makes one), updates them from
// the reduced gradients of those runs and calls the gathering of the
// updated parameters; StatePieces lists the state any AdamW holds, by
// parameter and run, for checkpoints.
//
// WarmupCosine is the schedule of the learning rate over a run;
// Replanned is one whose length a resume changed (the rest of the decay
// spread over the new length).
package optim
