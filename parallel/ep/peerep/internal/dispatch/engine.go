package dispatch

import (
	"fmt"
	"math"
	"time"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// Config is the shape of one rank's device-side expert path
// (Engine): Ranks ranks of the EP group (this one Rank), Experts
// experts spread evenly (rank r holds [r·E/P, (r+1)·E/P)), TopK choices per
// token, rows of Cols features in DType (bf16 or f32), at most MaxTokens
// tokens per rank and step. Deadline bounds every wait on a peer's signal
// (0: DefaultDeadline; a negative one is refused). Fused adds the fused
// path's per-block counters, flags and side stream (fused.go); the
// pipelined calls work either way.
type Config struct {
	Ranks, Rank, Experts, TopK, Cols, MaxTokens int
	DType                                       tensor.DType
	Deadline                                    time.Duration
	Fused                                       bool
}

// DefaultDeadline is the wait bound of an Config without one.
const DefaultDeadline = 60 * time.Second

// Buf names one symmetric buffer of the expert path (cuda/kernels/ep.cuh
// describes their layout).
type Buf int

const (
	Header  Buf = iota // (P, E+2) int32: the counts every source writes here
	Tokens             // (P·Mt, C): the token rows, once per destination rank
	Meta               // (P·Mt, 1+2K) int32: each token row's source token and choices
	Weights            // (P·Mt, K) f32: routing weights (combine backward)
	Y                  // (Mt·K, C): the combine's expert outputs, by slot
	G                  // (Mt·K, C): the dispatch backward's gradients, by slot
	Signals            // (14P) int32: 7P 64-bit words (little-endian pairs), the ready and ack epochs
	NumBufs
)

var bufNames = [NumBufs]string{"header", "tokens", "meta", "weights", "combine rows", "gradient rows", "signals"}

// String is the buffer's name ("tokens").
func (b Buf) String() string {
	if b >= 0 && b < NumBufs {
		return bufNames[b]
	}
	return fmt.Sprintf("Buf(%d)", int(b))
}

// Signal channels: word [channel·P + s] of a rank's pad is written by rank s.
const (
	sigReadyTok = iota
	sigReadyY
	sigReadyG
	sigAckTok
	sigAckY
	sigAckG
	sigReadyHdr // the fused path's counts, signalled before its tokens
	numSigChannels
)

var sigNames = [numSigChannels]string{"tokens ready", "combine rows ready", "gradient rows ready",
	"token buffer free", "combine buffer free", "gradient buffer free", "counts ready"}

// Shape is the shape and dtype of a symmetric buffer.
type Shape struct {
	Shape []int
	DType tensor.DType
}

func (c Config) local() int { return c.Experts / c.Ranks }

// recvBound is the most expert rows a rank can receive: every source's
// tokens, each with at most min(K, L) choices here.
func (c Config) recvBound() int { return c.Ranks * c.MaxTokens * min(c.TopK, c.local()) }

// SymmetricShapes are the buffers an Engine of cfg needs
// allocated symmetrically (the same on every rank of the group).
func SymmetricShapes(cfg Config) [NumBufs]Shape {
	P, E, K, C, Mt := cfg.Ranks, cfg.Experts, cfg.TopK, cfg.Cols, cfg.MaxTokens
	return [NumBufs]Shape{
		Header:  {[]int{P, E + 2}, tensor.Int32},
		Tokens:  {[]int{P * Mt, C}, cfg.DType},
		Meta:    {[]int{P * Mt, 1 + 2*K}, tensor.Int32},
		Weights: {[]int{P * Mt, K}, tensor.Float32},
		Y:       {[]int{Mt * K, C}, cfg.DType},
		G:       {[]int{Mt * K, C}, cfg.DType},
		Signals: {[]int{2 * numSigChannels * P}, tensor.Int32},
	}
}

func (c Config) check() error {
	switch {
	case c.Ranks < 1:
		return fmt.Errorf("%d ranks: expected at least one", c.Ranks)
	case c.Rank < 0 || c.Rank >= c.Ranks:
		return fmt.Errorf("rank %d of %d: expected 0 ≤ rank < %d", c.Rank, c.Ranks, c.Ranks)
	case c.Experts < c.Ranks || c.Experts%c.Ranks != 0:
		return fmt.Errorf("%d experts over %d ranks: expected a positive multiple of %d", c.Experts, c.Ranks, c.Ranks)
	case c.TopK < 1 || c.TopK > c.Experts || c.Cols < 1 || c.MaxTokens < 1:
		return fmt.Errorf("top-%d of %d experts, %d columns, %d max tokens: expected 1 ≤ K ≤ E and positive sizes", c.TopK, c.Experts, c.Cols, c.MaxTokens)
	case c.DType != tensor.BFloat16 && c.DType != tensor.Float32:
		return fmt.Errorf("dtype %v: expected bf16 or f32", c.DType)
	case c.Deadline < 0:
		return fmt.Errorf("deadline %v: expected a positive duration (or 0: DefaultDeadline)", c.Deadline)
	case int64(c.Ranks)*int64(c.MaxTokens)*int64(max(c.TopK, c.Cols)) > math.MaxInt32:
		return fmt.Errorf("%d ranks × %d tokens × %d: exceeds the kernels' 32-bit sizes", c.Ranks, c.MaxTokens, max(c.TopK, c.Cols))
	case c.Ranks > waitCodeBase:
		return fmt.Errorf("%d ranks: expected at most %d (a failed wait names the silent peer as code·%d + its rank, cuda/kernels/ep_signals.cu: a larger group would be misreported)",
			c.Ranks, waitCodeBase, waitCodeBase)
	case c.Fused && c.FusedBlocks() > waitCodeBase:
		return fmt.Errorf("fused: %d blocks of %d rows (%d ranks × %d tokens × up to %d choices per rank): expected at most %d (a failed wait names the late block as code·%d + the block, cuda/kernels/ep_signals.cu)",
			c.FusedBlocks(), FusedBlockRows, c.Ranks, c.MaxTokens, min(c.TopK, c.local()), waitCodeBase, waitCodeBase)
	}
	return nil
}

// waitCodeBase is the wait kernels' error encoding (ep_wait_words in
// cuda/kernels/ep_signals.cu): a word still short at the deadline is
// reported as code·waitCodeBase + its index, the code the signal channel
// (or fusedCounterCode) and the index the silent peer's rank (or the fused
// path's block). Config.check refuses groups and block counts the index
// cannot name.
const waitCodeBase = 65536

// splitWaitCode is the code and the index of a wait kernel's report.
func splitWaitCode(v int32) (code, index int) { return int(v) / waitCodeBase, int(v) % waitCodeBase }

// Engine is one rank's device-side dispatch and combine of an MoE
// layer over symmetric memory (the pipelined strategy of the expert path),
// after DeepEP's intranode protocol: the layout, the count exchange and
// every move are kernels; peers are written through their peer pointers;
// every buffer is gated by 64-bit epoch signals with a deadline on each
// wait. Nothing here reads the device on the host: launches are sized by
// MaxTokens and the kernels read the counts on the device.
//
// A step is, on every rank in the same order:
//
//	DispatchSend(x, idx, cf)   layout; wait for the token buffers to be free; tokens and counts out; signal
//	DispatchRecv(out, order)   wait for every source; plan (capacity, drops, offsets); expand into expert rows; ack
//	CombineSend(y, order)      wait for the combine buffers; expert rows back to their tokens' homes; signal
//	CombineRecv(out, w)        wait; out = Σ_j w·y in fp32, choices in order (deterministic)
//	CombineBackwardSend(dout, w, dweights)   ∂out once per destination rank with the weights; dweights at home
//	CombineBackwardRecv(dy, order)           wait; dy = w·∂out per expert row; ack
//	DispatchBackwardSend(g, order)           expert-row gradients back to their homes; signal
//	DispatchBackwardRecv(dx)                 wait; dx = Σ_j g; ack
//
// Each Recv waits for what the matching Send of every peer signalled, so
// the two may be split by other work (and must be, on the CPU emulator,
// whose kernels run one at a time: tests run every rank's Send before any
// rank's Recv). order 0 is expert-major (local expert, then source rank,
// then the source's token order: the grouped GEMM's layout, row offsets in
// Offsets); order 1 is the received order of ep.ExpertPath (source, then
// expert, then token).
type Engine struct {
	b   *cudabackend.Backend
	cfg Config
	sym [NumBufs]*tensor.Tensor
	// peers (NumBufs, 2P) int32 holds every rank's address of each buffer.
	peers *tensor.Tensor

	idx, cnt, rk, sendRow, rowsTo *tensor.Tensor
	hcopy, offsets, tab, pos      *tensor.Tensor
	route, routeExp, routeRecv    *tensor.Tensor
	recvOfExp, expOfRecv, status  *tensor.Tensor

	n                int
	cf               float64
	eTok, eY, eG     uint64
	pendY            bool
	dispatched, comb bool
	dout, grads      bool // the step's CombineBackwardSend and DispatchBackwardSend have been queued
	known            int  // the step's expert rows once ReadCounts read them; −1 before

	fz fusedState // the fused path's (cfg.Fused)

	// BeforeWait, when set, runs before every wait on the peers is queued
	// (outside the backend's lock). The multi-rank emulator tests make it
	// a barrier of the emulated ranks, so that every rank has queued (and,
	// on the emulator, run) its sends before any rank waits.
	BeforeWait func()
}

// New builds rank cfg.Rank's expert path on b over the symmetric buffers
// sym (shapes SymmetricShapes(cfg), on b's device)
// whose copies on rank r start at peers[buf][r]. It zeroes this rank's
// signals and header: the caller must make sure no peer signals before
// every rank has done so (a barrier after a Sync), and that every rank of
// the group builds one with the same cfg (but its own Rank).
func New(b *cudabackend.Backend, cfg Config, sym [NumBufs]*tensor.Tensor, peers [NumBufs][]uint64) (*Engine, error) {
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("cuda: expert dispatch: %w", err)
	}
	if cfg.Deadline == 0 {
		cfg.Deadline = DefaultDeadline
	}
	if errDataChecks != nil {
		return nil, fmt.Errorf("cuda: expert dispatch: %w", errDataChecks)
	}
	shapes := SymmetricShapes(cfg)
	P := cfg.Ranks
	words := make([]int32, 0, 2*int(NumBufs)*P) // the 64-bit addresses as int32 pairs
	for i, t := range sym {
		want := shapes[i]
		if t == nil || t.DType() != want.DType || !t.Shape().Equal(want.Shape) || t.Device() != b.Device() {
			return nil, fmt.Errorf("cuda: expert dispatch: symmetric buffer %d (%v) is %v, expected %v%v on %v", i, Buf(i), t, want.DType, tensor.Shape(want.Shape), b.Device())
		}
		if len(peers[i]) != P {
			return nil, fmt.Errorf("cuda: expert dispatch: %d peer addresses of buffer %d (%v), expected %d (one per rank)", len(peers[i]), i, Buf(i), P)
		}
		for _, p := range peers[i] {
			words = append(words, int32(uint32(p)), int32(uint32(p>>32)))
		}
	}
	d := &Engine{b: b, cfg: cfg, sym: sym, known: -1}
	h, _ := tensor.FromInt32(words, int(NumBufs), 2*P)
	d.peers = b.Zeros(tensor.Int32, int(NumBufs), 2*P)
	b.Upload(d.peers, h)
	E, K, L, Mt, R := cfg.Experts, cfg.TopK, cfg.local(), cfg.MaxTokens, cfg.recvBound()
	i32 := func(shape ...int) *tensor.Tensor { return b.Zeros(tensor.Int32, shape...) }
	d.idx, d.cnt, d.rk, d.sendRow, d.rowsTo = i32(Mt, K), i32(E), i32(Mt*K), i32(Mt*P), i32(P)
	d.hcopy, d.offsets, d.tab, d.pos = i32(P, E+2), i32(L+1), i32(4+3*P*L+L+1), i32(Mt, K)
	d.route, d.routeExp, d.routeRecv = i32(P*Mt*K), i32(max(R, 1), 2), i32(max(R, 1), 2)
	d.recvOfExp, d.expOfRecv, d.status = i32(max(R, 1)), i32(max(R, 1)), i32(4)
	if cfg.Fused {
		if err := d.newFused(); err != nil {
			d.Close()
			return nil, fmt.Errorf("cuda: expert dispatch: %w", err)
		}
	}
	// Zeros are zero on the backend; the symmetric buffers come from
	// another allocator: clear the words peers compare and the header.
	b.Queue("ExpertDispatch", func(dev *cudabackend.Launcher) error {
		if err := dev.Memset8(ptr(sym[Signals]), 0, sym[Signals].Bytes()); err != nil {
			return err
		}
		return dev.Memset8(ptr(sym[Header]), 0, sym[Header].Bytes())
	})
	if err := b.Err(); err != nil {
		d.Close()
		return nil, fmt.Errorf("cuda: expert dispatch: %w", err)
	}
	return d, nil
}

// Close frees the local tables (not the symmetric buffers, which belong to
// their allocator). Drain the device first.
func (d *Engine) Close() {
	for _, t := range []*tensor.Tensor{d.peers, d.idx, d.cnt, d.rk, d.sendRow, d.rowsTo, d.hcopy, d.offsets, d.tab,
		d.pos, d.route, d.routeExp, d.routeRecv, d.recvOfExp, d.expOfRecv, d.status, d.fz.counters, d.fz.done} {
		if t != nil {
			d.b.Free(t)
		}
	}
	d.closeFused()
	*d = Engine{b: d.b, cfg: d.cfg}
}

// Config is the path's configuration.
func (d *Engine) Config() Config { return d.cfg }

// Offsets are the (L+1) int32 expert-major row offsets of the local
// experts, on the device, valid after DispatchRecv (tensor.GroupedGEMM's
// offsets).
func (d *Engine) Offsets() *tensor.Tensor { return d.offsets }

// Pos is the (N, K) int32 slot table of this rank's tokens (slot n·K + j,
// or −1 dropped), valid after DispatchRecv.
func (d *Engine) Pos() *tensor.Tensor {
	v, err := d.pos.Rows(0, d.n)
	if err != nil {
		panic("cuda: expert dispatch: internal error: " + err.Error())
	}
	return v
}

// Tokens is the number of tokens of the current step on this rank.
func (d *Engine) Tokens() int { return d.n }

// RecvBound is the most expert rows a step can bring to this rank: the
// rows of DispatchRecv's output and CombineSend's input.
func (d *Engine) RecvBound() int { return d.cfg.recvBound() }

// peerRow is the device address of buffer buf's peer table.
func (d *Engine) peerRow(buf Buf) cudabackend.Ptr {
	return ptr(d.peers).Offset(int(buf) * d.cfg.Ranks * 8)
}

// words is the address of channel ch's P words in this rank's pad.
func (d *Engine) words(ch int) cudabackend.Ptr {
	return ptr(d.sym[Signals]).Offset(ch * d.cfg.Ranks * 8)
}

// signal raises word (ch, me) to value on every rank.
func (d *Engine) signal(dev *cudabackend.Launcher, ch int, value uint64) error {
	P := d.cfg.Ranks
	return dev.Launch("ep_signal", cudabackend.D1(1), cudabackend.D1(32), 0, d.peerRow(Signals), int32(P),
		int64(ch*P+d.cfg.Rank), int64(value))
}

// wait queues the wait for channel ch's words ≥ target, after BeforeWait.
func (d *Engine) wait(op string, ch int, target uint64, then func(dev *cudabackend.Launcher) error) {
	if d.BeforeWait != nil {
		d.BeforeWait()
	}
	me, dl := d.cfg.Rank, d.cfg.Deadline
	d.b.Queue(op, func(dev *cudabackend.Launcher) error {
		// Every wait shares the flag slot, and the first pending launch
		// explains a flagged one: the channel comes from the value.
		flag := dev.Check(checkWait, func(v int32) error {
			c, peer := splitWaitCode(v)
			what := "a signal"
			if c >= 0 && c < numSigChannels {
				what = sigNames[c]
			}
			return fmt.Errorf("cuda: expert dispatch on rank %d: rank %d never signalled %q within %v", me, peer, what, dl)
		})
		if err := dev.Launch("ep_wait", cudabackend.D1(1), cudabackend.D1(32), 0, d.words(ch), int32(d.cfg.Ranks), int64(target),
			int64(dl), int32(ch), ptr(d.status), flag); err != nil {
			return err
		}
		return then(dev)
	})
}

// flushAcks raises the deferred ack of the combine buffer: its rows serve
// CombineBackward's dweights, so the peers may overwrite them only once the
// step is over (the next dispatch, or Release).
func (d *Engine) flushAcks(dev *cudabackend.Launcher) error {
	if !d.pendY {
		return nil
	}
	d.pendY = false
	return d.signal(dev, sigAckY, d.eY)
}

// Release ends the step for the combine buffer (its deferred ack).
func (d *Engine) Release() {
	d.b.Queue("ExpertDispatch.Release", d.flushAcks)
}

// checkRows checks a (≥ rows, C) tensor of dt; rows = RecvBound() may be
// lowered to the step's expert rows once ReadCounts knows them.
func (d *Engine) checkRows(op, what string, t *tensor.Tensor, rows int, dt tensor.DType) error {
	if rows == d.cfg.recvBound() && d.known >= 0 {
		rows = d.known
	}
	if t == nil || t.DType() != dt || t.Device() != d.b.Device() || len(t.Shape()) != 2 || t.Dim(0) < rows || t.Dim(1) != d.cfg.Cols && dt == d.cfg.DType {
		return fmt.Errorf("cuda: expert dispatch: %s: %s is %v, expected %v(%d, %d) on %v", op, what, t, dt, rows, d.cfg.Cols, d.b.Device())
	}
	return nil
}

// checkOrder checks a row order argument.
func checkOrder(op string, order int) error {
	if order != 0 && order != 1 {
		return fmt.Errorf("cuda: expert dispatch: %s: order %d, expected 0 (expert-major) or 1 (received order)", op, order)
	}
	return nil
}

// checkTokens checks a (N, cols) tensor of dt of the step's tokens.
func (d *Engine) checkTokens(op, what string, t *tensor.Tensor, cols int, dt tensor.DType) error {
	if t == nil || t.DType() != dt || t.Device() != d.b.Device() || !t.Shape().Equal(tensor.Shape{d.n, cols}) {
		return fmt.Errorf("cuda: expert dispatch: %s: %s is %v, expected %v(%d, %d) on %v", op, what, t, dt, d.n, cols, d.b.Device())
	}
	return nil
}

func (d *Engine) grid(rows int) cudabackend.Dim3 { return cudabackend.D1(max(1, min(rows, 2048))) }

// DispatchSend starts a step: x (N, C) this rank's tokens, idx (N, K) int32
// their experts on the device, cf the capacity factor (0: dropless). It
// lays the routing out, waits until every peer has read the previous
// contents of its token buffer, writes this rank's counts into every
// peer's header and each token once into every rank that holds one of its
// experts, and signals them. N > MaxTokens is refused by every rank at
// DispatchRecv (the counts still go out, so that no peer waits in vain).
func (d *Engine) DispatchSend(x, idx *tensor.Tensor, cf float64) error {
	const op = "DispatchSend"
	if x == nil || len(x.Shape()) != 2 {
		return fmt.Errorf("cuda: expert dispatch: %s: x is %v, expected (N, %d)", op, x, d.cfg.Cols)
	}
	N, K := x.Dim(0), d.cfg.TopK
	if err := d.checkRows(op, "x", x, N, d.cfg.DType); err != nil {
		return err
	}
	if idx == nil || idx.DType() != tensor.Int32 || !idx.Shape().Equal(tensor.Shape{N, K}) || idx.Device() != d.b.Device() {
		return fmt.Errorf("cuda: expert dispatch: %s: idx is %v, expected int32(%d, %d) on %v", op, idx, N, K, d.b.Device())
	}
	if !(cf >= 0) || math.IsInf(cf, 0) {
		return fmt.Errorf("cuda: expert dispatch: %s: capacity factor %v, expected a finite value ≥ 0", op, cf)
	}
	d.n, d.cf, d.dispatched, d.comb, d.dout, d.grads, d.known = N, cf, true, false, false, false, -1
	P, E, L, C, Mt, me := d.cfg.Ranks, d.cfg.Experts, d.cfg.local(), d.cfg.Cols, d.cfg.MaxTokens, d.cfg.Rank
	sendN := min(N, Mt) // a rank over the bound sends its header only
	d.b.Queue(op, func(dev *cudabackend.Launcher) error {
		if err := d.joinSide(dev); err != nil { // a fused step left unfinished
			return err
		}
		if err := d.flushAcks(dev); err != nil {
			return err
		}
		if err := dev.Memset32(ptr(d.status), 0, 4); err != nil {
			return err
		}
		if sendN > 0 {
			if err := dev.CopyDtoD(ptr(d.idx), ptr(idx), sendN*K*4); err != nil {
				return err
			}
		}
		flag := dev.Check(checkLayout, func(v int32) error {
			return fmt.Errorf("cuda: expert dispatch: %s: idx contains expert %d, expected [0, %d)", op, v, E)
		})
		return dev.Launch("ep_layout", cudabackend.D1(E+P), cudabackend.D1(threads256), 0, ptr(d.idx), int32(sendN), int32(K),
			int32(E), int32(P), int32(L), ptr(d.cnt), ptr(d.rk), ptr(d.sendRow), ptr(d.rowsTo), flag)
	})
	// The layout of a rank over the bound counts its first Mt tokens only:
	// the header says N, and every receiver refuses the step.
	d.eTok++
	d.wait(op, sigAckTok, d.eTok-1, func(dev *cudabackend.Launcher) error {
		hdr := d.peerRow(Header)
		if d.cfg.Fused {
			// The counts first, on their own channel: every receiver plans
			// the step (and starts its GEMM) while the tokens travel.
			if err := dev.Launch("ep_header", cudabackend.D1(1), cudabackend.D1(128), 0, ptr(d.cnt), ptr(d.rowsTo), int32(N), int32(E),
				int32(P), int32(Mt), int32(me), hdr, ptr(d.status)); err != nil {
				return err
			}
			if err := d.signal(dev, sigReadyHdr, d.eTok); err != nil {
				return err
			}
			hdr = cudabackend.Ptr(0)
		}
		if err := dev.Launch("ep_send"+sfx(d.cfg.DType), cudabackend.D1(max(N, 1)), cudabackend.D1(128), 0,
			ptr(x), ptr(d.idx), ptr(d.rk), ptr(d.sendRow), ptr(d.cnt), ptr(d.rowsTo), int32(N), int32(K), int32(E),
			int32(P), int32(L), int32(C), int32(Mt), int32(me), d.peerRow(Tokens), d.peerRow(Meta),
			hdr, cudabackend.Ptr(0), cudabackend.Ptr(0), cudabackend.Ptr(0), cudabackend.Ptr(0), cudabackend.Ptr(0), ptr(d.status)); err != nil {
			return err
		}
		return d.signal(dev, sigReadyTok, d.eTok)
	})
	return d.sticky(op)
}

func (d *Engine) sticky(op string) error {
	if err := d.b.Err(); err != nil {
		return fmt.Errorf("cuda: expert dispatch: %s: %w", op, err)
	}
	return nil
}

// DispatchRecv waits for every rank's tokens, applies the capacity (the
// same on every rank, from the exchanged counts), and writes the received
// expert rows into out (RecvBound(), C) in the given order (0 expert-major,
// 1 received order); rows past the step's count are left alone. Offsets
// then hold the expert-major row offsets, Pos this rank's slots, and the
// token buffer is acknowledged to its writers.
func (d *Engine) DispatchRecv(out *tensor.Tensor, order int) error {
	const op = "DispatchRecv"
	if !d.dispatched {
		return fmt.Errorf("cuda: expert dispatch: %s without a DispatchSend", op)
	}
	if err := d.checkRows(op, "out", out, d.cfg.recvBound(), d.cfg.DType); err != nil {
		return err
	}
	if err := checkOrder(op, order); err != nil {
		return err
	}
	P, E, L, K, C, Mt, me := d.cfg.Ranks, d.cfg.Experts, d.cfg.local(), d.cfg.TopK, d.cfg.Cols, d.cfg.MaxTokens, d.cfg.Rank
	d.wait(op, sigReadyTok, d.eTok, func(dev *cudabackend.Launcher) error {
		if err := dev.Launch("ep_plan", cudabackend.D1(1), cudabackend.D1(threads256), 0, ptr(d.sym[Header]), ptr(d.idx), ptr(d.rk),
			int32(P), int32(E), int32(L), int32(me), int32(min(d.n, Mt)), int32(K), int32(Mt),
			int64(math.Float64bits(d.cf)), ptr(d.hcopy), ptr(d.offsets), ptr(d.tab), ptr(d.pos), ptr(d.status),
			cudabackend.Ptr(0), int32(0)); err != nil {
			return err
		}
		if err := dev.Launch("ep_recv"+sfx(d.cfg.DType), d.grid(P*Mt), cudabackend.D1(128), 0, ptr(d.sym[Tokens]),
			ptr(d.sym[Meta]), ptr(d.hcopy), ptr(d.tab), int32(P), int32(E), int32(L), int32(K), int32(C), int32(Mt),
			int32(me), int32(order), ptr(out), ptr(d.route), ptr(d.routeExp), ptr(d.routeRecv), ptr(d.recvOfExp),
			ptr(d.expOfRecv), ptr(d.status), int32(-1), cudabackend.Ptr(0), cudabackend.Ptr(0), cudabackend.Ptr(0), int32(0)); err != nil {
			return err
		}
		// The header and the token buffer have been read (the plan copied
		// the header): their writers may reuse them.
		return d.signal(dev, sigAckTok, d.eTok)
	})
	return d.sticky(op)
}

func (d *Engine) routes(order int) cudabackend.Ptr {
	if order == 1 {
		return ptr(d.routeRecv)
	}
	return ptr(d.routeExp)
}

// ReturnSend is CombineSend and DispatchBackwardSend: y (RecvBound(), C)
// expert rows in order go to their homes' buffer buf.
func (d *Engine) returnSend(op string, y *tensor.Tensor, order int, buf Buf, ack, ready int, epoch *uint64) error {
	if !d.dispatched {
		return fmt.Errorf("cuda: expert dispatch: %s without a dispatch", op)
	}
	if err := d.checkRows(op, "rows", y, d.cfg.recvBound(), d.cfg.DType); err != nil {
		return err
	}
	if err := checkOrder(op, order); err != nil {
		return err
	}
	*epoch++
	e := *epoch
	d.b.Queue(op, d.joinSide) // the fused path's routes were written on its side stream
	d.wait(op, ack, e-1, func(dev *cudabackend.Launcher) error {
		if err := dev.Launch("ep_return"+sfx(d.cfg.DType), d.grid(d.cfg.recvBound()), cudabackend.D1(128), 0, ptr(y),
			d.routes(order), ptr(d.tab), int32(d.cfg.Cols), d.peerRow(buf), ptr(d.status)); err != nil {
			return err
		}
		return d.signal(dev, ready, e)
	})
	return d.sticky(op)
}

// CombineSend sends the expert outputs y (RecvBound(), C), in the given
// order, back to their tokens' homes (after the homes have released the
// previous step's combine buffer), and signals them.
func (d *Engine) CombineSend(y *tensor.Tensor, order int) error {
	err := d.returnSend("CombineSend", y, order, Y, sigAckY, sigReadyY, &d.eY)
	d.comb = d.comb || err == nil
	return err
}

// slots is the (N·K, C) view of a slot buffer.
func (d *Engine) slots(buf Buf) *tensor.Tensor {
	v, err := d.sym[buf].Rows(0, d.n*d.cfg.TopK)
	if err != nil {
		panic("cuda: expert dispatch: internal error: " + err.Error())
	}
	return v
}

// CombineRecv waits for every rank's expert outputs and writes out (N, C)
// = Σ_j weights[n, j]·y(n, j) over the kept slots (weights (N, K) in the
// path's dtype), in fp32, the choices in order (deterministic). The
// combine buffer stays this rank's until the next step
// (CombineBackwardSend reads it for dweights).
func (d *Engine) CombineRecv(out, weights *tensor.Tensor) error {
	const op = "CombineRecv"
	if !d.comb {
		return fmt.Errorf("cuda: expert dispatch: %s without a CombineSend", op)
	}
	if err := d.checkTokens(op, "out", out, d.cfg.Cols, d.cfg.DType); err != nil {
		return err
	}
	if err := d.checkTokens(op, "weights", weights, d.cfg.TopK, d.cfg.DType); err != nil {
		return err
	}
	d.b.Queue(op, d.joinSide) // the fused path's side stream: its rows have left
	d.wait(op, sigReadyY, d.eY, func(*cudabackend.Launcher) error { return nil })
	if d.n > 0 && d.n <= d.cfg.MaxTokens {
		d.b.CombineRows(out, d.slots(Y), d.Pos(), weights)
	}
	d.pendY = true
	return d.sticky(op)
}

// CombineBackwardSend sends ∂out (N, C) once to every rank that holds one
// of a token's experts, with the routing weights (N, K), and writes
// dweights (N, K) (nil: skipped) = ⟨∂out[n], y(n, j)⟩ for the kept slots,
// 0 for dropped ones, from the combine buffer.
func (d *Engine) CombineBackwardSend(dout, weights, dweights *tensor.Tensor) error {
	const op = "CombineBackwardSend"
	if !d.comb {
		return fmt.Errorf("cuda: expert dispatch: %s without a combine", op)
	}
	N, K := d.n, d.cfg.TopK
	if err := d.checkTokens(op, "dout", dout, d.cfg.Cols, d.cfg.DType); err != nil {
		return err
	}
	if err := d.checkTokens(op, "weights", weights, K, d.cfg.DType); err != nil {
		return err
	}
	if dweights != nil {
		if err := d.checkTokens(op, "dweights", dweights, K, d.cfg.DType); err != nil {
			return err
		}
	}
	P, E, L, C, Mt, me := d.cfg.Ranks, d.cfg.Experts, d.cfg.local(), d.cfg.Cols, d.cfg.MaxTokens, d.cfg.Rank
	d.eTok++
	d.b.Queue(op, d.joinSide) // a fused step's side stream: its acks and sends
	d.wait(op, sigAckTok, d.eTok-1, func(dev *cudabackend.Launcher) error {
		if err := dev.Launch("ep_send"+sfx(d.cfg.DType), cudabackend.D1(max(N, 1)), cudabackend.D1(128), 0,
			ptr(dout), ptr(d.idx), ptr(d.rk), ptr(d.sendRow), ptr(d.cnt), ptr(d.rowsTo), int32(N), int32(K), int32(E),
			int32(P), int32(L), int32(C), int32(Mt), int32(me), d.peerRow(Tokens), cudabackend.Ptr(0), cudabackend.Ptr(0),
			ptr(weights), d.peerRow(Weights), ptr(d.pos), ptr(d.sym[Y]), ptr(dweights), ptr(d.status)); err != nil {
			return err
		}
		return d.signal(dev, sigReadyTok, d.eTok)
	})
	d.dout = true
	return d.sticky(op)
}

// CombineBackwardRecv waits for every rank's ∂out rows and writes dy
// (RecvBound(), C) = w·∂out for each received expert row, in the given
// order, then acknowledges the token buffer.
func (d *Engine) CombineBackwardRecv(dy *tensor.Tensor, order int) error {
	const op = "CombineBackwardRecv"
	if !d.dout {
		return fmt.Errorf("cuda: expert dispatch: %s without a CombineBackwardSend", op)
	}
	if err := d.checkRows(op, "dy", dy, d.cfg.recvBound(), d.cfg.DType); err != nil {
		return err
	}
	if err := checkOrder(op, order); err != nil {
		return err
	}
	d.b.Queue(op, d.joinSide)
	P, E, K, C, Mt := d.cfg.Ranks, d.cfg.Experts, d.cfg.TopK, d.cfg.Cols, d.cfg.MaxTokens
	remap := cudabackend.Ptr(0)
	if order == 1 {
		remap = ptr(d.recvOfExp)
	}
	d.wait(op, sigReadyTok, d.eTok, func(dev *cudabackend.Launcher) error {
		if err := dev.Launch("ep_scale_recv"+sfx(d.cfg.DType), d.grid(P*Mt), cudabackend.D1(128), 0, ptr(d.sym[Tokens]),
			ptr(d.sym[Weights]), ptr(d.hcopy), ptr(d.route), remap, int32(P), int32(E), int32(K), int32(C), int32(Mt),
			ptr(dy), ptr(d.status), int32(-1), cudabackend.Ptr(0), cudabackend.Ptr(0), cudabackend.Ptr(0), int32(d.cfg.local()), cudabackend.Ptr(0),
			int32(0)); err != nil {
			return err
		}
		return d.signal(dev, sigAckTok, d.eTok)
	})
	return d.sticky(op)
}

// DispatchBackwardSend sends the expert rows' gradients g (RecvBound(), C),
// in the given order, back to their tokens' homes.
func (d *Engine) DispatchBackwardSend(g *tensor.Tensor, order int) error {
	err := d.returnSend("DispatchBackwardSend", g, order, G, sigAckG, sigReadyG, &d.eG)
	d.grads = d.grads || err == nil
	return err
}

// DispatchBackwardRecv waits for every rank's gradient rows and writes dx
// (N, C) = Σ_j g(n, j) over the kept slots, in order, then acknowledges
// the gradient buffer.
func (d *Engine) DispatchBackwardRecv(dx *tensor.Tensor) error {
	const op = "DispatchBackwardRecv"
	if !d.grads {
		return fmt.Errorf("cuda: expert dispatch: %s without a DispatchBackwardSend", op)
	}
	if err := d.checkTokens(op, "dx", dx, d.cfg.Cols, d.cfg.DType); err != nil {
		return err
	}
	d.b.Queue(op, d.joinSide) // the fused path's side stream: its gradient rows have left
	d.wait(op, sigReadyG, d.eG, func(*cudabackend.Launcher) error { return nil })
	if d.n > 0 && d.n <= d.cfg.MaxTokens {
		d.b.CombineRows(dx, d.slots(G), d.Pos(), nil)
	}
	d.b.Queue(op, func(dev *cudabackend.Launcher) error { return d.signal(dev, sigAckG, d.eG) })
	return d.sticky(op)
}

// Counts are what a step's plan found, read back to the host.
type Counts struct {
	// Header (P, E+2): row s = source s's per-expert slots (before any
	// capacity), its tokens, the rows it sent this rank.
	Header [][]int
	// Refused is the source over MaxTokens (−1: none) and Over its tokens.
	Refused, Over int
	// Rows is the number of expert rows this rank received.
	Rows int
}

// RecvOfExp is the (RecvBound()) int32 map from expert-major rows to
// received-order rows of the step; ExpOfRecv its inverse (valid after
// DispatchRecv, for the step's rows).
func (d *Engine) RecvOfExp() *tensor.Tensor { return d.recvOfExp }

// ExpOfRecv: see RecvOfExp.
func (d *Engine) ExpOfRecv() *tensor.Tensor { return d.expOfRecv }

// ReadCounts waits for the device and reads the step's exchanged counts
// (a host synchronisation: the ep.ExpertPath adapter's, whose handle holds
// host counts; the device path itself never needs it).
func (d *Engine) ReadCounts() (*Counts, error) {
	if err := d.b.Sync(); err != nil {
		return nil, fmt.Errorf("cuda: expert dispatch: %w", err)
	}
	P, W := d.cfg.Ranks, d.cfg.Experts+2
	h := tensor.MustHost(tensor.Int32, P, W)
	st, tab := tensor.MustHost(tensor.Int32, 4), tensor.MustHost(tensor.Int32, 4)
	d.b.Download(h, d.hcopy)
	d.b.Download(st, d.status)
	tv, _ := d.tab.Rows(0, 4)
	d.b.Download(tab, tv)
	if err := d.b.Sync(); err != nil {
		return nil, fmt.Errorf("cuda: expert dispatch: %w", err)
	}
	c := &Counts{Header: make([][]int, P), Refused: -1, Rows: int(tab.I32()[0])}
	d.known = c.Rows
	for s := range P {
		c.Header[s] = make([]int, W)
		for i := range W {
			c.Header[s][i] = int(h.I32()[s*W+i])
		}
	}
	switch s := st.I32(); s[0] {
	case 0:
	case 2:
		c.Refused, c.Over = int(s[1]), int(s[2])
	default:
		return nil, fmt.Errorf("cuda: expert dispatch on rank %d: the step failed (status %d) without a reported wait", d.cfg.Rank, s[0])
	}
	return c, nil
}
