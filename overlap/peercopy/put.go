package peercopy

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The transfers of the fused all-gather (Engine.Transfer).
const (
	// TransferPull: every peer's shard is pulled by the copy engine from
	// the peer's symmetric stage into the gathered matrix, each pull
	// followed by a stream-written landed word (exchange.pullWith).
	TransferPull = "pull"
	// TransferPut: every rank stores its own shard into every peer's
	// symmetric gather buffer with a few CTAs (queuePut) and
	// raises each chunk's flag there (putGather).
	TransferPut = "put"
)

// Transfers are the valid values of Engine.Transfer ("" is TransferPull).
var Transfers = []string{TransferPull, TransferPut}

// TransferEnv is the environment variable the programs read the fused
// transfer from when no flag gives it (TransferFromEnv).
const TransferEnv = "ASYNCTP_FUSED_TRANSFER"

// ParseTransfer checks a transfer name: "" (the default, pull), "pull" or
// "put"; anything else is refused, naming the valid ones.
func ParseTransfer(s string) (string, error) {
	switch s {
	case "":
		return TransferPull, nil
	case TransferPull, TransferPut:
		return s, nil
	}
	return "", fmt.Errorf("fused transfer %q: expected one of %s", s, strings.Join(Transfers, ", "))
}

// TransferFromEnv is $ASYNCTP_FUSED_TRANSFER checked by ParseTransfer
// (unset: pull); a bad value is an error naming the variable.
func TransferFromEnv() (string, error) {
	t, err := ParseTransfer(os.Getenv(TransferEnv))
	if err != nil {
		return "", fmt.Errorf("$%s: %w", TransferEnv, err)
	}
	return t, nil
}

// putChunks is the most chunks a shard is put in: the largest divisor of
// the shard's rows up to it is taken, so that chunks never straddle two
// ranks' shards (GEMMWait's one flag per ChunkRows rows of the gathered
// matrix).
const putChunks = 4

// putChunkRows is the chunk of a shard of n rows: n/s for the largest
// s ≤ putChunks that divides n (1 for n = 0).
func putChunkRows(n int) int {
	if n <= 0 {
		return 1 // no rows: no chunk; the kernel still needs a size
	}
	for s := putChunks; s > 1; s-- {
		if n%s == 0 {
			return n / s
		}
	}
	return max(n, 1)
}

// putGather is the put transfer of one fused gather: a symmetric gather
// buffer of P shards on every rank, into which every rank's put kernel
// stores its own shard on every peer (this rank's own rows are copied on
// the compute stream), and, per rank:
//
//	flags[q·chunks + k]  the epoch whose chunk k of rank q's shard has landed here (P·putChunks words)
//	pad[q]               the epoch whose put rank q has started into this rank
//	pad[P + q]           the epoch whose rows (this rank's shard) in q's buffer q has finished
//	                     reading, written by q: this rank may then put the next epoch there
//
// A call is one epoch (every rank makes the same calls). Rank r's call e:
// its side stream, forked after the compute stream's work, runs the put
// kernel (which first waits, with a deadline, for each destination's
// read word of epoch e−1); the compute stream copies the own rows and
// raises their flags and its own started word, waits (one warp, deadline:
// waitSignals) until every peer has started its put, and then
// the caller runs the engine on the buffer with a wait on the flags
// (after which it may read the buffer, e.g. to copy it out); end then
// makes the compute stream wait for the put kernel (it read the caller's
// shard, which later work may overwrite; it always ends: its only wait has
// a deadline) and writes this rank's read word into every peer's pad.
type putGather struct {
	sp         siteEnv
	rows, cols int
	gath       *tensor.Tensor // symmetric (P·rows, cols)
	flags, pad *tensor.Tensor // symmetric 64-bit words (stored as f64)
	padPeer    []uint64
	table      *peerTable
	epoch      uint64
	status     *tensor.Tensor
	fork, done *cuda.Event
	ctas       int
}

func (x *putGather) ensure(rows, cols int, dt tensor.DType) error {
	if x.gath != nil && x.rows >= rows && x.cols == cols && x.gath.DType() == dt {
		return nil
	}
	// The allocations are world collectives (see exchange.ensureRows).
	if err := x.sp.b.SyncAll(); err != nil {
		return fmt.Errorf("%s: before allocating the gather buffer: %w", x.sp.what, err)
	}
	if err := x.release(); err != nil {
		return err
	}
	P := x.sp.g.Size()
	var bufs, flags []uint64
	var err error
	if x.gath, bufs, err = x.sp.allocPeers([]int{P * rows, cols}, dt, fmt.Sprintf("gather buffer (%d×%d)", P*rows, cols)); err != nil {
		return err
	}
	if x.flags, flags, err = x.sp.allocPeers([]int{2 * P * putChunks}, tensor.Int32, "chunk flags"); err != nil {
		return err
	}
	if x.pad, x.padPeer, err = x.sp.allocPeers([]int{2 * 2 * P}, tensor.Int32, "signal pad"); err != nil {
		return err
	}
	x.rows, x.cols, x.epoch = rows, cols, 0
	if x.table, err = newPeerTable(x.sp.b, bufs, flags, x.padPeer, x.gath.Bytes(), P*putChunks); err != nil {
		return fmt.Errorf("%s: %w", x.sp.what, err)
	}
	if x.status == nil {
		x.status = x.sp.b.Zeros(tensor.Int32, 4)
	}
	return nil
}

func (x *putGather) release() error {
	var first error
	for _, t := range []*tensor.Tensor{x.gath, x.flags, x.pad} {
		if t != nil {
			if err := x.sp.sm.FreeSymmetric(t); err != nil && first == nil {
				first = err
			}
		}
	}
	x.table.Close()
	for _, e := range []*cuda.Event{x.fork, x.done} {
		if e != nil {
			_ = x.sp.b.OnDevice(func(*cuda.Stream) error { return e.Destroy() })
		}
	}
	if x.status != nil {
		x.sp.b.Free(x.status)
	}
	x.gath, x.flags, x.pad, x.table, x.fork, x.done, x.status = nil, nil, nil, nil, nil, nil, nil
	return first
}

// gather starts call e: the put of src (this rank's n rows) to every peer
// and the own rows, then the wait for every peer's start. It returns the
// gathered rows (P·n, a view of the symmetric buffer: valid until end) and
// the engine's wait on their chunks.
func (x *putGather) gather(src *tensor.Tensor, timeout time.Duration) (*tensor.Tensor, *cudabackend.GEMMWait, error) {
	g, b := x.sp.g, x.sp.b
	P, r, n := g.Size(), g.Rank(), src.Dim(0)
	if a := cudabackend.DevicePtr(src); a%16 != 0 || src.Dim(1)*src.DType().Size()%16 != 0 {
		return nil, nil, fmt.Errorf("%s: the put transfer's shard %v at %#x: expected 16-byte aligned rows of a multiple of 16 bytes (the put kernel's stores)", x.sp.what, src, a)
	}
	if err := x.ensure(n, src.Dim(1), src.DType()); err != nil {
		return nil, nil, err
	}
	x.epoch++
	epoch, name := x.epoch, g.Name()
	cr := putChunkRows(n)
	chunks := (n + cr - 1) / cr
	err := b.OnDevice(func(compute *cuda.Stream) error {
		for _, e := range []**cuda.Event{&x.fork, &x.done} {
			if *e == nil {
				ev, err := cuda.NewEvent(false)
				if err != nil {
					return err
				}
				*e = ev
			}
		}
		// The put reads src: after the compute stream's work so far.
		if err := x.fork.Record(compute); err != nil {
			return err
		}
		return x.sp.side.WaitEvent(x.fork)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", x.sp.what, err)
	}
	queuePut(b, x.sp.side, x.table, peerPut{Src: src, Rank: r, ChunkRows: cr, Epoch: epoch, Deadline: timeout,
		CTAs: x.ctas, Status: x.status, What: func(q int) error {
			return fmt.Errorf("%s on %s: rank %d never finished reading this rank's rows of call %d within %v", x.sp.what, name, q, epoch-1, timeout)
		}})
	if err := b.OnDevice(func(*cuda.Stream) error { return x.done.Record(x.sp.side) }); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", x.sp.what, err)
	}
	full, _ := x.gath.Rows(0, P*n)
	b.Copy(ownRows(full, r, n), src)
	flags, pad := cudabackend.DevicePtr(x.flags), cudabackend.DevicePtr(x.pad)
	err = b.OnDevice(func(compute *cuda.Stream) error {
		for k := range chunks {
			if err := compute.WriteValue64(cuda.DevicePtr(flags+uint64(r*chunks+k)*wordBytes), epoch); err != nil {
				return err
			}
		}
		// The own started word, which no peer writes, so that one wait
		// covers the P words.
		return compute.WriteValue64(cuda.DevicePtr(pad+uint64(r)*wordBytes), epoch)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", x.sp.what, err)
	}
	// Every peer's put kernel runs: the engine launched after this waits
	// only for kernels already running on the SMs it leaves free (Engine).
	waitSignals(b, pad, P, epoch, timeout, x.status, func(q int) error {
		return fmt.Errorf("%s on %s: rank %d never put its rows of call %d within %v", x.sp.what, name, q, epoch, timeout)
	})
	// PutCTAs, when set, is also the engine's reserve: the put's grid runs
	// on the SMs the engine leaves free (0: the engine's default for both).
	return full, &cudabackend.GEMMWait{Flags: flags, ChunkRows: cr, Target: epoch, Timeout: timeout, ReserveSMs: x.ctas}, nil
}

// join makes the compute stream wait for this call's put kernel, which
// reads the caller's shard (it always ends: its only wait has a deadline).
func (x *putGather) join() error {
	if err := x.sp.b.OnDevice(func(compute *cuda.Stream) error { return compute.WaitEvent(x.done) }); err != nil {
		return fmt.Errorf("%s: %w", x.sp.what, err)
	}
	return nil
}

// end finishes call e once the compute stream's work queued so far has
// read the gathered rows for the last time: the compute stream waits for
// this rank's put kernel (join), then tells every peer its rows here are
// read (markRead).
func (x *putGather) end() error {
	if err := x.join(); err != nil {
		return err
	}
	return x.markRead()
}

// markRead writes this rank's read word of the call into every peer's pad:
// the compute stream's work queued so far has read the gathered rows for
// the last time, and the peers may put the next call's. After join.
func (x *putGather) markRead() error {
	g := x.sp.g
	P, r := g.Size(), g.Rank()
	err := x.sp.b.OnDevice(func(compute *cuda.Stream) error {
		for q := range P {
			if q == r {
				continue
			}
			if err := compute.WriteValue64(cuda.DevicePtr(x.padPeer[q]+uint64(P+r)*wordBytes), x.epoch); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", x.sp.what, err)
	}
	return nil
}
