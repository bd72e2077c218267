// Package train runs the training loop of asynctp's token models: the data
// loader, the loop (Run, RunSharded), checkpoints, metrics, the loss plot
// and the progress bar. The optimizer and the learning-rate schedule it
// runs are package optim's, the file format of its checkpoints package
// safetensors'; a program with its own loop imports those, not train.
// Run trains token models (Model: ids and targets in, a loss out); any
// other model trains in a loop of the program's own around the same step:
// its forward and backward, parallel/grads' Reducer for the gradients and
// the norm, optim.AdamW.ClipStep for the update (examples/tensorparallel,
// examples/trainloop).
//
// One step is: ZeroGrad, Forward, Backward, then the optimizer's ClipStep
// (optim.AdamW): the global gradient norm's Σ g² into a device scalar, then
// AdamW clipping by that scalar on the device (tensor.AdamW's NormSq: the
// clip factor is computed by the update itself, and a non-finite norm skips
// the update), then metrics.
// A model with AsyncLoss (layers.GPT, parallel/model.Model) runs
// ForwardAsync instead of Forward; with LossReader too, its loss and the
// gradient norm are read back asynchronously (tensor.ReadAsync) and taken
// only after the next step is queued, so the host never waits for the
// device inside a step and the device never waits for the host between
// steps. The metrics of step s (its own loss and norm) are recorded then,
// one step late; a step that is checkpointed or validated, and the last,
// is read back at once, and a non-finite loss or norm stops the run naming
// its step before any later checkpoint is written. Models with only a host
// GradSumSquarer (no optim.DeviceGradSumSquarer) keep the synchronous path.
//
// A MicroBatcher model (layers.GPT, parallel/model.Model) runs the forward
// and backward of a step in one call, ForwardBackward, as the
// Config.MicroBatch micro-batches per replica say (gradient accumulation:
// Batch = MicroBatch × accumulation steps × DP, refused otherwise); its
// gradient reduction starts behind the backward.
//
// Everything that decides the numbers of a step is a pure function of the
// saved state: the parameters, the AdamW moments, the step (learning rate and
// bias correction), the schedule's replans and the data position (epoch,
// index). So a run of N steps and the same run stopped at step N/2 and
// resumed from its checkpoint produce the same losses, bit for bit. A
// resume with another Config.Steps re-plans the schedule from its step
// (Replans, optim.Replanned): the rest of the decay spreads over the new
// length. A program that resumes keeps its other settings by reading them
// from the checkpoint's State (TrainConfig, RunConfig: WithRunConfig).
//
// A checkpoint is a directory step-NNNNNN/ under the output directory:
//
//	model.safetensors   every parameter by name (F32, or F64 for f64 models)
//	optim.safetensors   the AdamW moments, "m.<name>" and "v.<name>"
//	state.json          format version, step, data position, configs,
//	                    sha256 of both files, and a free-form "layout"
//
// A rank of a model sharded over ranks records in both files the slice of
// the full tensor each of its tensors is (shard.SlicesKey), and in
// state.json the number of ranks; a rank of a distributed optimizer holds
// runs of its parameters' state, "<name>[lo:hi]", recorded under RunsKey.
// A resume at the layout that wrote a checkpoint reads each rank's own
// files; at another (RunSharded, or Run from a run of several ranks),
// each rank assembles its tensors from the pieces of every rank's.
//
// It is written into a temporary directory, fsynced and renamed into place;
// the file "latest" then names it (also written temp + rename). Readers
// validate everything and never panic on hostile input (see the fuzz tests).
// Run saves asynchronously: at the step boundary it copies the parameters
// and moments to the host (TakeSnapshot), and a background writer writes,
// renames and prunes (KeepCheckpoints counts completed checkpoints only)
// while the next steps run. One save is written at a time (the next waits
// for it), a failed write stops the run at the next step, and Run returns
// only once the save in flight is complete, however it ends; a process
// killed in the middle of a write leaves the checkpoint before it the
// latest, and the next run removes the temporary directory.
//
// Metrics go to metrics.jsonl (one JSON object per step), a PNG loss curve
// (loss.png), and a progress bar on a terminal or plain log lines otherwise.
// Only rank 0 writes them (WithRank0).
//
// A StepWatcher (WithStepWatcher; overlap.Shadow, shadow mode, is one) is
// told where each step begins and ends — before its forward, right after
// its backward — and may add metrics or stop the run after the step, with
// a checkpoint.
//
// RunSharded runs one rank of a model sharded over ranks (train.Sharded,
// which parallel/model.Model implements): per-rank checkpoint dirs
// (RankDir), the layout in each state.json, and a resume that the ranks
// agree on. The dependency points down: train adapts the sharded model,
// which does not import train.
package train
