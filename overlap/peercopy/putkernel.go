package peercopy

import (
	"fmt"
	"math"
	"time"

	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The put transfer of the fused all-gather∘matmul (cuda/kernels/peerput.cu):
// a small kernel on a side stream stores this rank's shard through peer
// pointers into every peer's symmetric gather buffer, chunk by chunk, and
// raises each chunk's 64-bit epoch flag there with a release at system
// scope, where the peer's GEMM engine waits for it (GEMMWait). It is the
// other half of the choice the copy-engine pulls make (Engine.Transfer).

// peerTable is the device table of the 3P addresses a put reaches (peer_put
// in peerput.cu): every rank's gather buffer, chunk flags and signal pad.
// Build it once per buffer set; Close frees it.
type peerTable struct {
	b                   *cudabackend.Backend
	t                   *tensor.Tensor // int32 (3P·2): the addresses as little-endian pairs
	ranks               int
	bufBytes, flagWords int
}

// newPeerTable uploads the addresses of a put transfer over len(bufs)
// ranks: bufs[r] is rank r's gather buffer (bufBytes bytes, 16-byte
// aligned), flags[r] its chunk flags (flagWords 64-bit words), pads[r] its
// signal pad (2P 64-bit words: word q = the epoch whose put rank q has
// started into r, word P + q = the epoch whose rows of r's buffer rank q
// has finished reading). Each address is reachable from this rank (peer
// pointers; this rank's own at its index).
func newPeerTable(b *cudabackend.Backend, bufs, flags, pads []uint64, bufBytes, flagWords int) (*peerTable, error) {
	P := len(bufs)
	switch {
	case P < 1 || len(flags) != P || len(pads) != P:
		return nil, fmt.Errorf("cuda: peer table: %d gather buffers, %d flag arrays, %d pads: expected the same number ≥ 1 of each", len(bufs), len(flags), len(pads))
	case bufBytes <= 0 || flagWords <= 0:
		return nil, fmt.Errorf("cuda: peer table: gather buffers of %d bytes and %d flag words: expected positive sizes", bufBytes, flagWords)
	}
	words := make([]int32, 0, 6*P)
	for i, set := range [][]uint64{bufs, flags, pads} {
		align := uint64(16)
		if i > 0 {
			align = 8
		}
		for r, a := range set {
			if a == 0 || a%align != 0 {
				return nil, fmt.Errorf("cuda: peer table: %s of rank %d at %#x: expected a non-nil %d-byte aligned address",
					[]string{"gather buffer", "chunk flags", "signal pad"}[i], r, a, align)
			}
			words = append(words, int32(uint32(a)), int32(uint32(a>>32)))
		}
	}
	h, err := tensor.FromInt32(words, 6*P)
	if err != nil {
		return nil, fmt.Errorf("cuda: peer table: %w", err)
	}
	t := b.Zeros(tensor.Int32, 6*P)
	b.Upload(t, h)
	if err := b.Err(); err != nil {
		return nil, fmt.Errorf("cuda: peer table: %w", err)
	}
	return &peerTable{b: b, t: t, ranks: P, bufBytes: bufBytes, flagWords: flagWords}, nil
}

// Ranks is the number of ranks the table reaches.
func (pt *peerTable) Ranks() int { return pt.ranks }

// Close frees the device table (not the buffers it points to). The
// caller makes sure no queued put still reads it (drain first).
func (pt *peerTable) Close() {
	if pt != nil && pt.t != nil {
		pt.b.Free(pt.t)
		pt.t = nil
	}
}

// peerPut is one put of this rank's shard.
type peerPut struct {
	// Src is this rank's shard: (rows, cols) contiguous, 16-byte aligned,
	// rows of a multiple of 16 bytes. It lands in rows [Rank·rows,
	// (Rank+1)·rows) of every peer's gather buffer.
	Src *tensor.Tensor
	// Rank is this rank's index in the table.
	Rank int
	// ChunkRows is the rows of one chunk (the last one of the shard may be
	// shorter): chunk k of rank q raises flag word q·chunks + k, chunks =
	// ceil(rows/ChunkRows). With ChunkRows dividing rows that is
	// GEMMWait's layout with ChunkRows rows per flag.
	ChunkRows int
	// Epoch is this call's epoch (≥ 1): the flags and the started words
	// are raised to it, after waiting for each destination's "read" word ≥
	// Epoch−1 in this rank's pad.
	Epoch uint64
	// Deadline bounds the wait for each destination's read word.
	Deadline time.Duration
	// CTAs is the kernel's grid (0: the SMs the GEMM engine leaves free
	// while it waits, GEMMWait.ReserveSMs's default; at least 1).
	CTAs int
	// Status is an Int32 tensor (≥ 1 element, zero at first) shared with the
	// site's other waits (waitSignals): once one of them ran out, a put
	// queued after it does nothing. The put's own wait does not set it.
	Status *tensor.Tensor
	// What names the failure of a destination rank that never freed its
	// buffer (the error of the next Sync).
	What func(peer int) error
}

// peerPutThreads is peer_put's block.
const peerPutThreads = 256

// checkPut is peer_put's data check: err[1] = the destination rank that
// never freed its gather buffer.
var checkPut, errCheckPut = cudabackend.NewDataCheck("peercopy: put")

// queuePut queues the put p on stream (nil: the backend's stream; the
// emulator has only that one) through the addresses of pt (peer_put,
// cuda/kernels/peerput.cu). A destination whose read word stays below
// Epoch−1 for Deadline is skipped and reported by the next Sync (p.What);
// the kernel waits on nothing else, so it always ends.
func queuePut(b *cudabackend.Backend, stream *cuda.Stream, pt *peerTable, p peerPut) {
	const op = "PeerPut"
	c := b.Check(op)
	if pt == nil || pt.t == nil {
		c.Failf("peer table %v: expected one of newPeerTable, not closed", pt)
	}
	if p.Src == nil {
		c.Failf("src is nil: expected this rank's shard")
	}
	c.Own("src", p.Src)
	c.Own("status", p.Status)
	c.DType("status", p.Status, tensor.Int32)
	if !c.OK() {
		return
	}
	P, src := pt.ranks, p.Src
	rows, rowBytes := 0, 0
	if len(src.Shape()) == 2 {
		rows, rowBytes = src.Dim(0), src.Dim(1)*src.DType().Size()
	}
	chunks := 0
	if p.ChunkRows > 0 {
		chunks = (rows + p.ChunkRows - 1) / p.ChunkRows
	}
	switch {
	case len(src.Shape()) != 2 || rowBytes%16 != 0 || cudabackend.DevicePtr(src)%16 != 0:
		c.Failf("src %v at %#x: expected (rows, cols) with rows of a multiple of 16 bytes, 16-byte aligned", src, cudabackend.DevicePtr(src))
	case p.Rank < 0 || p.Rank >= P:
		c.Failf("rank %d: expected 0 ≤ rank < %d (the table's ranks)", p.Rank, P)
	case p.ChunkRows <= 0:
		c.Failf("chunk rows %d: expected > 0", p.ChunkRows)
	case p.Epoch == 0 || p.Epoch > math.MaxInt64:
		c.Failf("epoch %d: expected 1 ≤ epoch < 2⁶³", p.Epoch)
	case p.Deadline <= 0:
		c.Failf("deadline %v: expected > 0", p.Deadline)
	case p.What == nil:
		c.Failf("no What: expected a function naming a destination that never freed its buffer")
	case int64(P)*int64(rows)*int64(rowBytes) > int64(pt.bufBytes):
		c.Failf("%d ranks × %d rows of %d bytes: exceeds the gather buffers' %d bytes", P, rows, rowBytes, pt.bufBytes)
	case P*chunks > pt.flagWords:
		c.Failf("%d ranks × %d chunks of %d rows: exceeds the %d flag words", P, chunks, p.ChunkRows, pt.flagWords)
	case rows > math.MaxInt32:
		c.Failf("rows = %d does not fit the kernel's 32-bit sizes", rows)
	}
	if !c.OK() {
		return
	}
	b.Queue(op, func(l *cudabackend.Launcher) error {
		ctas := p.CTAs
		if ctas <= 0 {
			ctas = max(l.ReserveSMs(), 1)
		}
		what := p.What
		flag := l.Check(checkPut, func(v int32) error { return what(int(v)) })
		args := []any{cudabackend.PtrOf(src), int32(rows), int64(rowBytes), int32(p.ChunkRows), int32(p.Rank), int32(P),
			cudabackend.PtrOf(pt.t), int64(p.Epoch), int64(p.Deadline), cudabackend.PtrOf(p.Status), flag}
		if stream == nil {
			return l.Launch("peer_put", cudabackend.D1(ctas), cudabackend.D1(peerPutThreads), 0, args...)
		}
		return l.OnStream(stream, func() error {
			return l.Launch("peer_put", cudabackend.D1(ctas), cudabackend.D1(peerPutThreads), 0, args...)
		})
	})
}
