package model

import (
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/grads"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/parallel/tp"
	"github.com/asynctp/asynctp/tensor"
)

// Options are the parallel knobs of a Model.
type Options struct {
	// SequenceParallel splits the residual stream, the norms and the
	// embedding's output along the tokens over the TP group.
	SequenceParallel bool
	// Overlap chooses the strategy of every communication site of the TP
	// layers (overlap.Chooser: --overlap and the "overlap" configuration);
	// nil gives every site overlap.Collective.
	Overlap *overlap.Chooser
	// Stream is the stream of the backend (nil on the CPU; on a GPU the
	// backend's own, e.g. tensor/cudabackend's Backend.Stream). Every
	// collective of the model, of its layers and of its sites
	// is queued on it and waited for on it (Work.Wait(Stream)) before its
	// result is used, so a GPU transport orders them with the backend's
	// ops on the device, without host synchronisation.
	Stream comm.Stream
	// MaxTokens bounds the tokens per rank of every MoE layer's step
	// (ep.Parallel.MaxTokens): the size of the expert path's buffers, which the
	// pipelined expert path (parallel/ep/peerep) needs. 0: none.
	MaxTokens int
	// GradReduce says how the gradients are reduced over the replicas
	// (grads.Config): the zero value sums them in fp32 (a bf16 model has
	// fp32 main gradients), in buckets of grads.DefaultBucketBytes, each
	// started on a side stream (a goroutine on the CPU) as soon as the
	// backward has completed it.
	GradReduce grads.Config
	// DistributedOptimizer shards the optimizer's state over the DP group
	// (the experts' over the EDP group): ZeRO stage 1, as Megatron-LM's
	// distributed optimizer. Each bucket's gradients are reduce-scattered
	// (GradReduce.Shard), each rank's optimizer holds the fp32 master
	// weights and moments of its parts only (OptimizerSharding), and the
	// updated parameters are all-gathered after the step, on the
	// reduction's lane, waited for by the next forward.
	DistributedOptimizer bool
}

// Model is the tensor- and data-parallel GPT: layers.GPT with its weights
// split over the grid's TP group (vocab-parallel embedding and LM head,
// TP attention and MLP, vocab-parallel cross-entropy) and its batch split
// over the DP group. It is the same assembly as layers.GPT (a
// layers.Decoder, built here from these parts, with hooks for the
// replica's rows, the token shard, the loss all-reduce and the abort of
// the world); what is the model's own is the layout, the gradient
// reduction and failure handling. It implements train.Model; each rank
// holds one Model, with its own shards in its own ParamSet.
type Model struct {
	Embed  *tp.VocabParallelEmbedding
	Blocks []Block                  // *tp.Block, or *MoEBlock for the MoE blocks (GPTConfig.IsMoE)
	Norm   *layers.RMSNorm          // final norm, replicated
	Head   *tp.ColumnParallelLinear // (Vocab/P, Dim): the embedding's rows when tied
	Loss   *tp.VocabParallelCrossEntropy

	cfg     layers.GPTConfig
	b       tensor.Backend
	dt      tensor.DType
	grid    *comm.Grid
	par     tp.Parallel
	ps      *layers.ParamSet
	shards  []shard.Shard
	experts []*layers.Param // the MoE blocks' expert weights (split over EP)
	red     *grads.Reducer  // the gradient reduction and norm, by the shards
	distOpt bool            // the optimizer's state is sharded (Options.DistributedOptimizer)
	dec     *layers.Decoder // the assembly of the parts above
	closed  bool            // Close has run
}

// New builds this rank's part of the model described by cfg on b, with
// parameters of dtype dt, over grid's groups. Every rank of the grid calls
// it with the same arguments.
//
// The dense blocks are tp.Blocks over the TP group. With cfg.Experts > 0
// the MoE blocks (cfg.IsMoE) are MoEBlocks: TP attention and an ep.MoE
// over the grid's EP group whose token group is the world (every rank
// routes its own slice of the global batch). In a dense model grid.EP is
// only recorded in the Layout.
//
// The layout is validated before anything is allocated: grid.World's size
// must be DP × TP, the groups must have those sizes, TP must divide Heads,
// KVHeads (each rank holds whole key/value heads, as Megatron splits
// grouped-query attention), Dim, FFN and Vocab, and with experts EP must divide the world and the
// experts (and TopK ≤ Experts).
func New(b tensor.Backend, grid *comm.Grid, cfg layers.GPTConfig, opts Options, dt tensor.DType) (*Model, error) {
	if b == nil {
		return nil, errors.New("model: New with a nil backend")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if err := checkLayout(grid, cfg); err != nil {
		return nil, err
	}
	if cfg.Experts > 0 {
		if _, err := tensor.MoEOpsOf(b); err != nil {
			return nil, fmt.Errorf("model: the MoE blocks: %w", err)
		}
	}
	if !dt.IsFloat() {
		return nil, fmt.Errorf("model: dtype %v, expected a float dtype (f32 or f64 on the cpu)", dt)
	}
	m := &Model{cfg: cfg, b: b, dt: dt, grid: grid, ps: layers.NewParamSet(cfg.Seed),
		par: tp.Parallel{Group: grid.TPGroup, Overlap: opts.Overlap, SequenceParallel: opts.SequenceParallel, Stream: opts.Stream}}
	std, outStd := cfg.InitStd, cfg.InitStd/math.Sqrt(2*float64(cfg.Layers))
	var err error
	if m.Embed, err = tp.NewVocabParallelEmbedding(b, m.ps, m.par, "embed", cfg.Vocab, cfg.Dim, std); err != nil {
		return nil, err
	}
	m.shards = append(m.shards, m.Embed.Shards()...)
	var blocks []*layers.Block // the shared blocks behind m.Blocks
	for l := range cfg.Layers {
		name := fmt.Sprintf("blocks.%d", l)
		bc := layers.BlockConfig{
			Dim: cfg.Dim, Heads: cfg.Heads, KVHeads: cfg.KVHeads, FFN: cfg.FFN, RopeTheta: cfg.RopeTheta,
			NormEps: cfg.NormEps, Std: std, OutStd: outStd,
		}
		var blk Block
		if cfg.IsMoE(l) {
			mb, err := newMoEBlock(b, m.ps, m.par, grid, name, bc, cfg.MoEConfig(), opts.MaxTokens)
			if err != nil {
				return nil, err
			}
			m.experts = append(m.experts, mb.MoE.ExpertParams()...)
			blk = mb
			blocks = append(blocks, mb.Block.Block)
		} else {
			tb, err := tp.NewBlock(b, m.ps, m.par, name, bc)
			if err != nil {
				return nil, err
			}
			blk = tb
			blocks = append(blocks, tb.Block)
		}
		m.Blocks = append(m.Blocks, blk)
		m.shards = append(m.shards, blk.Shards()...)
	}
	if m.Norm, err = layers.NewRMSNorm(b, m.ps, "final_norm", cfg.Dim, cfg.NormEps); err != nil {
		return nil, err
	}
	m.shards = append(m.shards, shard.Replicated(m.Norm.W, opts.SequenceParallel && grid.TP > 1))
	if cfg.TiedEmbeddings {
		m.Head, err = tp.NewColumnParallelLinearFromParams(b, m.par, "lm_head", m.Embed.W, nil, cfg.Vocab, false)
	} else {
		m.Head, err = tp.NewColumnParallelLinear(b, m.ps, m.par, "lm_head", tp.ColumnConfig{In: cfg.Dim, Out: cfg.Vocab, Std: std})
	}
	if err != nil {
		return nil, err
	}
	m.shards = append(m.shards, m.Head.Shards()...)
	if m.Loss, err = tp.NewVocabParallelCrossEntropy(b, m.par, cfg.Vocab); err != nil {
		return nil, err
	}
	if m.dec, err = layers.NewDecoder(b, layers.DecoderParts{
		What: "model", Seq: cfg.Seq, Vocab: cfg.Vocab, Dim: cfg.Dim, LogitCols: m.Head.LocalOut, DType: dt,
		Embed: m.Embed, Blocks: blocks, Norm: m.Norm, Head: m.Head, Loss: m.Loss,
		CheckBatch: m.checkBatch,
		Replica:    m.ReplicaRows,
		Rows: func(tokens int) (int, error) {
			if m.par.SequenceParallel {
				return tokens / grid.TP, nil // checkBatch saw that TP divides them
			}
			return tokens, nil
		},
		ReduceLoss: func(sum *tensor.Tensor) error {
			return m.allReduce(grid.DPGroup, "loss over the DP group", sum)
		},
		Fail: m.fail,
	}); err != nil {
		return nil, err
	}
	if err := m.ps.Materialize(b, dt); err != nil {
		return nil, err
	}
	if err := m.ps.UseMainGrads(); err != nil { // fp32 main gradients for a bf16 model
		return nil, err
	}
	gr := opts.GradReduce
	gr.Shard = gr.Shard || opts.DistributedOptimizer
	m.distOpt = gr.Shard
	if m.red, err = grads.NewReducerWith(b, m.ps, m.shards, grads.GridGroups(grid, opts.Stream), gr); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	m.dec.SetGradSync(m.red)
	return m, nil
}

// checkLayout validates the grid against cfg (defaults filled in) before
// any work.
func checkLayout(grid *comm.Grid, cfg layers.GPTConfig) error {
	if grid == nil || grid.World == nil || grid.TPGroup == nil || grid.DPGroup == nil {
		return errors.New("model: New needs a grid with its world, TP and DP groups (comm.NewGrid)")
	}
	w := grid.World.Size()
	if grid.DP < 1 || grid.TP < 1 || grid.DP*grid.TP != w {
		return fmt.Errorf("model: layout dp %d × tp %d does not match the world of %d ranks, expected DP × TP = world", grid.DP, grid.TP, w)
	}
	if grid.TPGroup.Size() != grid.TP || grid.DPGroup.Size() != grid.DP {
		return fmt.Errorf("model: grid groups have sizes tp %d (%s), dp %d (%s), expected tp %d, dp %d",
			grid.TPGroup.Size(), grid.TPGroup.Name(), grid.DPGroup.Size(), grid.DPGroup.Name(), grid.TP, grid.DP)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"Heads", cfg.Heads}, {"KVHeads", cfg.KVHeads}, {"Dim", cfg.Dim}, {"FFN", cfg.FFN}, {"Vocab", cfg.Vocab}} {
		if f.v%grid.TP != 0 {
			return fmt.Errorf("model: layout tp %d does not divide GPTConfig.%s = %d, expected %s divisible by the TP size", grid.TP, f.name, f.v, f.name)
		}
	}
	if cfg.Experts <= 0 {
		return nil
	}
	if grid.EP < 1 || w%grid.EP != 0 {
		return fmt.Errorf("model: layout ep %d does not divide the world of %d ranks (dp %d × tp %d), expected EP dividing DP × TP", grid.EP, w, grid.DP, grid.TP)
	}
	if cfg.Experts%grid.EP != 0 {
		return fmt.Errorf("model: layout ep %d does not divide GPTConfig.Experts = %d, expected Experts divisible by the EP size", grid.EP, cfg.Experts)
	}
	if cfg.TopK < 1 || cfg.TopK > cfg.Experts {
		return fmt.Errorf("model: GPTConfig.TopK = %d, expected 1 ≤ TopK ≤ Experts = %d", cfg.TopK, cfg.Experts)
	}
	if grid.EPGroup == nil || grid.EDPGroup == nil || grid.EPGroup.Size() != grid.EP || grid.EDPGroup.Size() != w/grid.EP {
		return fmt.Errorf("model: an MoE model needs the grid's EP group of %d ranks and EDP group of %d (comm.NewGrid)", grid.EP, w/grid.EP)
	}
	return nil
}

// Config returns the model's configuration, defaults filled in.
func (m *Model) Config() layers.GPTConfig { return m.cfg }

// Params returns this rank's parameter set: its shards and its copies of
// the replicated parameters, under the names layers.GPT gives them.
func (m *Model) Params() *layers.ParamSet { return m.ps }

// Shards describes every parameter of this rank (each once) against the
// parameter of the same name in layers.GPT. The expert weights of the MoE
// blocks are described as the slice [Lo, Hi) of dimension 0 (the experts
// this rank holds in its EP group); ExpertParams lists them.
func (m *Model) Shards() []shard.Shard { return append([]shard.Shard(nil), m.shards...) }

// ExpertParams returns this rank's expert weights (split over the EP
// group; their gradients are reduced over the EDP group), in block order.
func (m *Model) ExpertParams() []*layers.Param { return append([]*layers.Param(nil), m.experts...) }

// AuxLoss is the sum of the MoE blocks' auxiliary losses of the last
// Forward, over the tokens of the global batch (the same on every rank; 0
// in a dense model): the part of Forward's loss that is not the
// cross-entropy, as in layers.GPT.
func (m *Model) AuxLoss() float64 { return m.dec.AuxLoss() }

// RouterStats returns the routing statistics of the last Forward over the
// global batch, one per MoE block in block order (nil in a dense model;
// the same on every rank), as layers.GPT's.
func (m *Model) RouterStats() []layers.MoEStats { return m.dec.RouterStats() }

// RouterStatsAsync is AuxLoss and RouterStats given by the returned
// function, the MoE blocks' device-step statistics waited for only then
// (layers.Decoder.RouterStatsAsync): train's metrics of a step read one
// step late.
func (m *Model) RouterStatsAsync() func() (float64, []layers.MoEStats, error) {
	return m.dec.RouterStatsAsync()
}

// Grid is the grid the model was built on.
func (m *Model) Grid() *comm.Grid { return m.grid }

// Logits returns the logits of the last Forward: (N, Vocab/P), this rank's
// vocabulary columns for its replica's N = B/DP·T tokens (nil before the
// first Forward). They stay valid until the next Forward.
func (m *Model) Logits() *tensor.Tensor { return m.dec.Logits() }

// ZeroGrad sets every gradient of this rank to zero.
func (m *Model) ZeroGrad() { m.ps.ZeroGrad() }

// ReplicaRows returns the rows [lo, hi) of a global batch of batch
// sequences that this rank's data-parallel replica trains on: replica d of
// DP takes [d·batch/DP, (d+1)·batch/DP).
func (m *Model) ReplicaRows(batch int) (lo, hi int) {
	dp, d := m.grid.DP, m.grid.DPGroup.Rank()
	return d * batch / dp, (d + 1) * batch / dp
}

// FLOPsPerToken is the forward+backward FLOPs of the whole model per token
// (layers.GPT's count: all ranks together; in an MoE block the router and
// the TopK experts a token goes through), for MFU over the job.
func (m *Model) FLOPsPerToken() float64 { return m.cfg.FLOPsPerToken() }

// fail aborts the world (comm.Aborter), so that the other ranks, which
// will wait for this one in their next collective, fail at once with an
// error naming it instead of waiting for their deadline; it returns err.
func (m *Model) fail(err error) error {
	if a, ok := m.grid.World.(comm.Aborter); ok {
		a.Abort(err)
	}
	return err
}

// checkBatch checks a host int32 (B, T) tensor of the global batch against
// the layout (after layerkit.CheckTokens).
func (m *Model) checkBatch(what string, t *tensor.Tensor) error {
	s := t.Shape()
	if s[0]%m.grid.DP != 0 {
		return fmt.Errorf("model: %s has shape %v: the global batch B = %d is not divisible by DP = %d (each replica takes B/DP sequences)", what, s, s[0], m.grid.DP)
	}
	if m.par.SequenceParallel && (s[0]/m.grid.DP*s[1])%m.grid.TP != 0 {
		return fmt.Errorf("model: %s has shape %v: a replica's %d tokens (B/DP × T) are not divisible by TP = %d, as sequence parallelism needs",
			what, s, s[0]/m.grid.DP*s[1], m.grid.TP)
	}
	if m.cfg.Experts > 0 && (s[0]/m.grid.DP*s[1])%m.grid.TP != 0 {
		return fmt.Errorf("model: %s has shape %v: a replica's %d tokens (B/DP × T) are not divisible by TP = %d, as the MoE blocks need (each TP rank routes its own slice)",
			what, s, s[0]/m.grid.DP*s[1], m.grid.TP)
	}
	return nil
}

// Forward runs the model on the GLOBAL batch: ids and targets are host
// int32 (B, T), the same on every rank (every rank's loader yields the
// whole batch; B must divide by DP), and this rank's replica takes its rows
// (ReplicaRows). It returns, on every rank, the mean cross-entropy over the
// non-ignored targets of the whole global batch (negative targets are
// ignored) plus the MoE blocks' auxiliary losses over the global batch
// (AuxLoss) — what layers.GPT returns for that batch — and prepares each
// replica's gradient of that mean for Backward: each replica's losses are
// scaled by 1/(targets of the global batch), so the sum of the replicas'
// gradients is the gradient of the global mean. With nil targets the loss
// is 0 and Backward is not allowed. It is ForwardAsync then ReadLoss.
//
// Input errors are found before any work, identically on every rank; an
// error after that aborts the world (comm.Aborter) so the other ranks stop.
func (m *Model) Forward(ids, targets *tensor.Tensor) (float64, error) {
	if err := m.WaitParams(); err != nil {
		return 0, err
	}
	return m.dec.Forward(ids, targets)
}

// ForwardAsync is Forward without reading the loss back: the global sum of
// the per-row losses is formed on the device (SumRows, then an all-reduce
// over DP) and stays there until ReadLoss, so a Backward queues behind the
// forward with no host sync for the loss in between.
func (m *Model) ForwardAsync(ids, targets *tensor.Tensor) error {
	if err := m.WaitParams(); err != nil {
		return err
	}
	return m.dec.ForwardAsync(ids, targets)
}

// ReadLoss returns the loss of the last ForwardAsync (what Forward
// returns), reading one scalar from the device: it waits for the work
// queued before it, so read it after Backward to keep the two back to
// back. It involves no other rank and may be called more than once.
func (m *Model) ReadLoss() (float64, error) { return m.dec.ReadLoss() }

// LossAsync queues the read of the last ForwardAsync's loss and returns a
// function that waits for it (layers.Decoder.LossAsync): train.Run reads a
// step's loss after the next step is queued.
func (m *Model) LossAsync() (func() (float64, error), error) { return m.dec.LossAsync() }

// Backward adds this replica's gradient of the last Forward's global mean
// loss to the parameters' gradients and reduces them so that every rank
// holds, for each of its parameters, the gradient of the global mean in
// its main gradients (layers.ParamSet.MainGrads): the sum over the DP
// group, and for replicated parameters whose gradients are partial per TP
// rank (sequence parallelism) also the sum over the TP group. The sums run
// by buckets behind the backward as Options.GradReduce says (a step of
// one micro-batch of ForwardBackward). It requires a Forward with
// targets, and runs once per Forward. An error aborts the world
// (comm.Aborter).
func (m *Model) Backward() error {
	return m.dec.Backward() // the decoder has called m.fail where it applies
}

// Replicas is the number of data-parallel replicas, DP.
func (m *Model) Replicas() int { return m.grid.DP }

// SetMicroBatches makes each following ForwardBackward run the global
// batch as k micro-batches (layers.Decoder.ForwardBackward): micro-batch
// j is rows [j·B/k, (j+1)·B/k) of the global batch, of which each replica
// takes its B/(k·DP) rows, so a run at any layout sees the micro-batches
// of the single-rank run. Every rank calls it alike.
func (m *Model) SetMicroBatches(k int) error { return m.dec.SetMicroBatches(k) }

// ForwardBackward is a training step's forward and backward over the
// GLOBAL batch (as Forward takes it) in the micro-batches SetMicroBatches
// set (layers.Decoder.ForwardBackward says how the loss, the gradients
// and the MoE blocks' auxiliary losses and statistics combine over them):
// each micro-batch's gradients add into the main gradients (fp32 for a
// bf16 model), and on the last one each bucket's sum over the replicas
// starts as soon as the backward has completed it (Options.GradReduce),
// the step ending when every sum has. The loss is then read with ReadLoss
// or LossAsync. An error after the inputs' checks aborts the world.
func (m *Model) ForwardBackward(ids, targets *tensor.Tensor) error {
	if err := m.WaitParams(); err != nil {
		return err
	}
	return m.dec.ForwardBackward(ids, targets)
}

// OptimizerSharding is the part of the flat buffers this rank's optimizer
// updates with a distributed optimizer (Options.DistributedOptimizer:
// grads.Reducer.Sharding, for optim.NewShardedAdamW; train.Run makes it
// so); ok is false without one.
func (m *Model) OptimizerSharding() (sh optim.Sharding, ok bool) { return m.red.Sharding() }

// WaitParams waits for the all-gather of the parameters that a
// distributed optimizer's update started (grads.Reducer.WaitParams); the
// forwards call it first. An error aborts the world.
func (m *Model) WaitParams() error {
	if err := m.red.WaitParams(); err != nil {
		return m.fail(err)
	}
	return nil
}

// Close releases what the model holds beyond its weights, once: it waits
// for the gradient reduction's collectives in flight and releases its side
// streams (grads.Reducer.Close), waits for the device, then closes the
// communication sites its layers built through the chooser (their side
// streams, events, symmetric buffers and the expert paths' dispatch
// engines). Call it on every rank once the model is trained no more
// (after train.Run or RunSharded, which leave the model to its owner).
//
// Freeing symmetric memory is collective (every rank of a group frees the
// same buffers in the same order), so every rank closes in one order,
// which depends only on the configuration: the gradient reduction; then
// the blocks in order, each its attention's sites (wo's exit site, then
// the q/k/v entry) and its feed-forward layer's (the MLP's w_down exit
// site, then the gate/up entry; or the MoE's expert path); then the LM
// head's entry. A part that fails to close does not stop the others; the
// error joins each failure, naming the part. The weights stay readable; a
// forward or backward after Close fails. A second Close releases nothing
// and returns nil.
func (m *Model) Close() error {
	if m.closed {
		return nil
	}
	m.closed = true
	var errs []error
	if err := m.red.Close(); err != nil {
		errs = append(errs, fmt.Errorf("model: gradient reduction: %w", err))
	}
	if err := m.b.Sync(); err != nil { // the sites' buffers are read by the work queued so far
		errs = append(errs, fmt.Errorf("model: waiting for the device before closing the sites: %w", err))
	}
	for l, blk := range m.Blocks {
		if c, ok := blk.(io.Closer); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("model: block %d: %w", l, err))
			}
		}
	}
	if err := m.Head.Close(); err != nil {
		errs = append(errs, fmt.Errorf("model: LM head: %w", err))
	}
	return errors.Join(errs...)
}

// SetRecompute sets the activation recompute of the blocks
// (layers.Decoder.SetRecompute: the forward keeps only the blocks' inputs,
// or drops the attention cores' outputs, and the backward recomputes the
// rest, with the same bits). Every rank calls it alike, before the first
// forward: a recomputed block's forward runs its collectives again.
func (m *Model) SetRecompute(r layers.Recompute) error { return m.dec.SetRecompute(r) }

// Buckets lists the buckets the gradients are summed in over the replicas
// (grads.Reducer.Buckets).
func (m *Model) Buckets() []grads.Bucket { return m.red.Buckets() }
