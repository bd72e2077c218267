package model

import (
	"errors"
	"fmt"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// checkTokens checks a host int32 (B, T) tensor of the global batch.
func (m *Model) checkTokens(what string, t *tensor.Tensor) error {
	if err := layers.CheckTokens("model", what, t, m.cfg.Seq); err != nil {
		return err
	}
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
	if err := m.ForwardAsync(ids, targets); err != nil {
		return 0, err
	}
	return m.ReadLoss()
}

// ForwardAsync is Forward without reading the loss back: the global sum of
// the per-row losses is formed on the device (SumRows, then an all-reduce
// over DP) and stays there until ReadLoss, so a Backward queues behind the
// forward with no host sync for the loss in between.
func (m *Model) ForwardAsync(ids, targets *tensor.Tensor) error {
	m.ready, m.lossAt = false, lossNone
	if err := m.checkTokens("ids", ids); err != nil {
		return err
	}
	if err := layers.CheckIDs("model: ids", ids, m.cfg.Vocab); err != nil {
		return err
	}
	nTargets := 0
	if targets != nil {
		if err := m.checkTokens("targets", targets); err != nil {
			return err
		}
		var err error
		if nTargets, err = layers.CountTargets("model", targets, ids, m.cfg.Vocab); err != nil {
			return err
		}
	}
	if err := m.b.Err(); err != nil {
		return m.fail(fmt.Errorf("model: the backend already holds an error: %w", err))
	}
	if err := m.forward(ids, targets, nTargets); err != nil {
		return m.fail(err)
	}
	m.ready = targets != nil
	return nil
}

// Where the loss of the last forward is.
const (
	lossNone     = iota // no successful forward
	lossZero            // a forward without targets: 0
	lossOnDevice        // the global Σ losses in lossSum, over nTargets targets
)

// ReadLoss returns the loss of the last ForwardAsync (what Forward
// returns), reading one scalar from the device: it waits for the work
// queued before it, so read it after Backward to keep the two back to
// back. It involves no other rank and may be called more than once.
func (m *Model) ReadLoss() (float64, error) {
	switch m.lossAt {
	case lossNone:
		return 0, errors.New("model: ReadLoss needs a successful Forward first")
	case lossZero:
		return 0, nil
	}
	h := tensor.MustHost(tensor.Float64, 1)
	m.b.Download(h, m.lossSum)
	if err := sticky(m.b, "reading the loss"); err != nil {
		return 0, m.fail(err)
	}
	if m.nTargets == 0 {
		return m.AuxLoss(), nil
	}
	return h.F64()[0]/float64(m.nTargets) + m.AuxLoss(), nil
}

func (m *Model) forward(ids, targets *tensor.Tensor, nTargets int) error {
	lo, hi := m.ReplicaRows(ids.Dim(0))
	B, T := hi-lo, ids.Dim(1)
	N := B * T
	m.alloc(B, T)
	myIDs, err := ids.Rows(lo, hi)
	if err != nil {
		return err
	}
	if err := m.Embed.Forward(m.xs[0], myIDs); err != nil {
		return err
	}
	for l, blk := range m.Blocks {
		if err := blk.Forward(m.xs[l+1], m.xs[l], B, T); err != nil {
			return err
		}
	}
	if err := m.Norm.Forward(m.hf, m.xs[len(m.Blocks)]); err != nil {
		return err
	}
	if err := m.Head.Forward(m.logits, m.hf); err != nil {
		return err
	}
	if targets == nil {
		m.lossAt = lossZero
		return sticky(m.b, "forward")
	}
	scale := float32(0)
	if nTargets > 0 {
		scale = float32(1 / float64(nTargets))
	}
	myTargets, err := targets.Rows(lo, hi)
	if err != nil {
		return err
	}
	if err := m.Loss.Forward(m.losses, m.dlogits, m.logits, myTargets, scale); err != nil {
		return err
	}
	// The global sum of the losses, on the device: Σ over this replica's
	// rows, then over the replicas.
	m.b.Fill(m.lossSum, 0)
	m.b.SumRows(m.lossSum, layers.Reshape(m.losses, N, 1))
	if err := sticky(m.b, "forward"); err != nil {
		return err
	}
	if err := m.allReduce(m.grid.DPGroup, "loss over the DP group", m.lossSum); err != nil {
		return err
	}
	m.lossAt, m.nTargets = lossOnDevice, nTargets
	return sticky(m.b, "forward")
}

// alloc (re)allocates the activations for a replica batch of B sequences
// of T tokens.
func (m *Model) alloc(B, T int) {
	if m.bt == [2]int{B, T} {
		return
	}
	m.bt = [2]int{B, T}
	b, dt, C := m.b, m.dt, m.cfg.Dim
	N := B * T
	n := N
	if m.par.SequenceParallel {
		n = N / m.grid.TP
	}
	if m.xs == nil {
		m.xs = make([]*tensor.Tensor, len(m.Blocks)+1)
	}
	for i := range m.xs {
		m.xs[i] = layers.Ensure(b, m.xs[i], dt, n, C)
	}
	m.hf = layers.Ensure(b, m.hf, dt, n, C)
	m.logits = layers.Ensure(b, m.logits, dt, N, m.Head.LocalOut)
	m.dlogits = layers.Ensure(b, m.dlogits, dt, N, m.Head.LocalOut)
	m.losses = layers.Ensure(b, m.losses, layers.StatDType(dt), N)
	m.lossSum = layers.Ensure(b, m.lossSum, layers.StatDType(dt), 1)
	m.dhf = layers.Ensure(b, m.dhf, dt, n, C)
	m.dxa = layers.Ensure(b, m.dxa, dt, n, C)
	m.dxb = layers.Ensure(b, m.dxb, dt, n, C)
}

// Backward adds this replica's gradient of the last Forward's global mean
// loss to the parameters' gradients, then reduces them so that every rank
// holds, for each of its parameters, the gradient of the global mean: the
// sum over the DP group, and for replicated parameters whose gradients are
// partial per TP rank (sequence parallelism) also the sum over the TP
// group. It requires a Forward with targets, and runs once per Forward. An
// error aborts the world (comm.Aborter).
func (m *Model) Backward() error {
	if !m.ready {
		return errors.New("model: Backward needs a successful Forward with targets since the last Backward")
	}
	m.ready = false
	if err := m.backward(); err != nil {
		return m.fail(err)
	}
	return nil
}

func (m *Model) backward() error {
	if err := m.Head.Backward(m.dhf, m.dlogits); err != nil {
		return err
	}
	dx, dnext := m.dxa, m.dxb
	if err := m.Norm.Backward(dx, m.dhf); err != nil {
		return err
	}
	for l := len(m.Blocks) - 1; l >= 0; l-- {
		if err := m.Blocks[l].Backward(dnext, dx); err != nil {
			return err
		}
		dx, dnext = dnext, dx
	}
	if err := m.Embed.Backward(dx); err != nil {
		return err
	}
	if err := sticky(m.b, "backward"); err != nil {
		return err
	}
	return m.reduceGrads()
}

// sticky wraps the backend's sticky error.
func sticky(b tensor.Backend, pass string) error {
	if err := b.Err(); err != nil {
		return fmt.Errorf("model: %s: %w", pass, err)
	}
	return nil
}
