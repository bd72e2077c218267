// Package grads reduces the gradients of any model whose parameters are
// split over ranks, driven by what the layers describe of their
// parameters (shard.Shard): the sums over the data-parallel, tensor-parallel
// and expert groups that give every rank the gradient of the global loss,
// and the global gradient norm with each parameter counted once
// (GradSumSquares on the host, GradSumSquaresTo on the device for
// optim.AdamW.ClipStep, ClipGrads for a loop that clips itself).
//
// # Main gradients
//
// A Reducer reads and writes the parameter set's main gradients
// (layers.ParamSet.MainGrads): for f32 and f64 parameters their gradients,
// for a bf16 set given fp32 main gradients (ParamSet.UseMainGrads) that
// fp32 buffer, beside the optimizer's fp32 master weights. The sums run
// in the main gradients' dtype, fp32 by default; Config.DType bf16 rounds
// them to bf16 for the sum (what a bf16 model's reduction was before).
//
// # Buckets behind the backward
//
// The runs of the flat gradient summed over one group (the dense
// parameters over DP, the experts over EDP) are cut into buckets of
// Config.BucketBytes (DefaultBucketBytes, 25 MiB, as PyTorch DDP). A
// Reducer is a layers.GradSync: a Decoder tells it when each micro-batch's
// backward begins and ends and, in between, which parameters' gradients
// are complete; on a step's last micro-batch each bucket whose parameters
// are all complete goes into the main gradients and its sum starts at once
// on a side lane — the Reducer's own stream on a GPU (tensor.Streams; the
// sum is queued after the backward's writes by an event), a goroutine on
// the CPU — while the backward goes on (PyTorch DDP's buckets, Megatron-LM's
// --overlap-grad-reduce). EndBackward waits for every bucket (the
// backend's stream waits on the GPU), then sums the partial gradients
// over TP. The sums are elementwise and every rank starts its buckets in
// the same order, so overlapped, after the backward (Config.AfterBackward,
// Reduce) or in one call the results are the same bits on transports whose
// sums are (comm/local, comm/tcp: float64 in rank order).
//
// Earlier micro-batches only move their gradients into separate main
// gradients (AccumulateGrads, clearing the bf16 ones for the next
// micro-batch); a set without separate ones accumulates in its gradients,
// where the backward adds.
//
// # A distributed optimizer
//
// The buckets (Buckets) are contiguous runs of the flat buffers the
// optimizer's state is laid out like. With Config.Shard the Reducer is a
// distributed optimizer's (ZeRO stage 1, Megatron-LM's distributed
// optimizer; zero.go): each bucket is split into one part per rank of its
// group (padded with zeros where the group's size does not divide it;
// Config.BucketAlign defaults to the groups' sizes so that only the last
// bucket of a run is), its sum is a reduce-scatter leaving each rank its
// part, and the parts a rank owns, packed, are its sharded gradients
// (Sharding: what optim.NewShardedAdamW updates from). The partial
// gradients' sums over TP and the gradient norm (each rank's parts summed
// over the bucket's group, then as above) run on them; GatherParams
// all-gathers the updated parameters on a lane of their own (a second
// side stream on a GPU) and WaitParams waits for them. Config.ReduceBucket replaces a bucket's
// all-reduce with a caller's collective instead.
//
// Close waits for the collectives in flight and releases the side
// streams; its owner (parallel/model.Model.Close) calls it once the
// training is over.
//
// Reductions lists the sums as gradient tensors grouped by the group they
// are summed over, for a caller that schedules them itself.
// parallel/model's GPT uses this package; a custom model passes its
// layers' Shards and the groups of its grid.
package grads
