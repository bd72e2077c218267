//go:build asynctp_emu

package peercopy

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/internal/testing/emuworld"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// putWorld is P emulated ranks on one emulated device: rank d's gather
// buffer, chunk flags and signal pad are separate device buffers, and the
// table's addresses stand in for the peer pointers (the emulator's device
// addresses are one address space).
type putWorld struct {
	b                  *cudabackend.Backend
	P, rows, cols, chn int
	gath, flags, pads  []*tensor.Tensor
	status             []*tensor.Tensor
	pt                 *peerTable
}

const putSentinel = int32(-0x5a5a5a5b)

func newPutWorld(t *testing.T, b *cudabackend.Backend, P, rows, cols, chunkRows int) *putWorld {
	t.Helper()
	w := &putWorld{b: b, P: P, rows: rows, cols: cols, chn: (rows + chunkRows - 1) / chunkRows}
	var bufs, flags, pads []uint64
	for range P {
		g := b.Zeros(tensor.Int32, P*rows, cols)
		fill := make([]int32, P*rows*cols)
		for i := range fill {
			fill[i] = putSentinel
		}
		upload(t, b, g, fill)
		// Two words past the table's flags: a put must never reach them.
		f := b.Zeros(tensor.Int32, 2*(P*w.chn+2))
		p := b.Zeros(tensor.Int32, 2*2*P)
		w.gath, w.flags, w.pads = append(w.gath, g), append(w.flags, f), append(w.pads, p)
		w.status = append(w.status, b.Zeros(tensor.Int32, 4))
		bufs, flags, pads = append(bufs, cudabackend.DevicePtr(g)), append(flags, cudabackend.DevicePtr(f)), append(pads, cudabackend.DevicePtr(p))
	}
	pt, err := newPeerTable(b, bufs, flags, pads, P*rows*cols*4, P*w.chn)
	if err != nil {
		t.Fatal(err)
	}
	w.pt = pt
	return w
}

func upload(t *testing.T, b *cudabackend.Backend, d *tensor.Tensor, v []int32) {
	t.Helper()
	h, err := tensor.FromInt32(v, d.Shape()...)
	if err != nil {
		t.Fatal(err)
	}
	b.Upload(d, h)
}

// rawInt32s reads a tensor back, also after a wait that ran out (its error,
// a data check's, is cleared first: the tests read what the kernels left).
func rawInt32s(t *testing.T, b *cudabackend.Backend, d *tensor.Tensor) []int32 {
	t.Helper()
	if err := b.ClearErr(); err != nil {
		t.Fatal(err)
	}
	h := tensor.MustHost(tensor.Int32, d.Shape()...)
	b.Download(h, d)
	if err := b.Err(); err != nil {
		t.Fatal(err)
	}
	return h.I32()
}

// word is 64-bit word i of an int32 tensor read back.
func word(v []int32, i int) uint64 { return uint64(uint32(v[2*i])) | uint64(uint32(v[2*i+1]))<<32 }

// setWord sets 64-bit word i of d (int32 pairs) to val.
func setWord(t *testing.T, b *cudabackend.Backend, d *tensor.Tensor, i int, val uint64) {
	t.Helper()
	v := rawInt32s(t, b, d)
	v[2*i], v[2*i+1] = int32(uint32(val)), int32(uint32(val>>32))
	upload(t, b, d, v)
}

func randShard(rng *rand.Rand, n int) []int32 {
	v := make([]int32, n)
	for i := range v {
		v[i] = int32(rng.Uint32())
		if v[i] == putSentinel {
			v[i]++
		}
	}
	return v
}

// put queues rank me's put of src in epoch e.
func (w *putWorld) put(me int, src *tensor.Tensor, chunkRows, ctas int, e uint64, dl time.Duration) {
	queuePut(w.b, nil, w.pt, peerPut{Src: src, Rank: me, ChunkRows: chunkRows, Epoch: e, Deadline: dl, CTAs: ctas,
		Status: w.status[me], What: func(q int) error { return fmt.Errorf("rank %d never freed its gather buffer", q) }})
}

// check verifies destination d after epoch e: the rows of every rank q in
// want[q] (nil: the sentinel, untouched), the flag of each of q's chunks at
// flagWant[q], the started word of q at startWant[q], and the words past
// the table at zero.
func (w *putWorld) check(t *testing.T, d int, want [][]int32, flagWant, startWant []uint64) {
	t.Helper()
	g, f, p := rawInt32s(t, w.b, w.gath[d]), rawInt32s(t, w.b, w.flags[d]), rawInt32s(t, w.b, w.pads[d])
	n := w.rows * w.cols
	for q := range w.P {
		rows := g[q*n : (q+1)*n]
		for i, v := range rows {
			exp := putSentinel
			if want[q] != nil {
				exp = want[q][i]
			}
			if v != exp {
				t.Fatalf("rank %d's buffer, rows of rank %d: element %d (row %d, col %d) is %#x, expected %#x", d, q, i, i/w.cols, i%w.cols, v, exp)
			}
		}
		for k := range w.chn {
			if got := word(f, q*w.chn+k); got != flagWant[q] {
				t.Fatalf("rank %d's flag of rank %d's chunk %d is %d, expected %d", d, q, k, got, flagWant[q])
			}
		}
		if got := word(p, q); got != startWant[q] {
			t.Fatalf("rank %d's started word of rank %d is %d, expected %d", d, q, got, startWant[q])
		}
	}
	for i := w.P * w.chn; i < w.P*w.chn+2; i++ {
		if got := word(f, i); got != 0 {
			t.Fatalf("rank %d: flag word %d past the table's %d is %d, expected 0 (untouched)", d, i, w.P*w.chn, got)
		}
	}
}

// TestEmuPut: every rank of P puts a random shard, in chunks of several
// ragged sizes and grids, into every other rank's gather buffer, over two
// epochs (the second after every reader's "read" word): each destination
// holds exactly every other rank's rows at their place and its own rows
// untouched, every chunk flag of the other ranks is at the epoch, its own
// at zero, and no word past the table is written.
func TestEmuPut(t *testing.T) {
	cases := []struct{ P, rows, cols, chunkRows, ctas int }{
		{2, 1, 4, 1, 1}, {2, 37, 12, 8, 3}, {3, 7, 4, 3, 2}, {3, 50, 8, 16, 4}, {4, 64, 4, 64, 1}, {4, 20, 8, 6, 5}, {3, 9, 4, 9, 2},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("P%d_rows%d_cols%d_chunk%d_ctas%d", c.P, c.rows, c.cols, c.chunkRows, c.ctas), func(t *testing.T) {
			b := emuworld.Backend(t)
			w := newPutWorld(t, b, c.P, c.rows, c.cols, c.chunkRows)
			rng := rand.New(rand.NewPCG(uint64(c.P*1000+c.rows), uint64(c.chunkRows)))
			srcs := make([]*tensor.Tensor, c.P)
			for q := range srcs {
				srcs[q] = b.Zeros(tensor.Int32, c.rows, c.cols)
			}
			for e := uint64(1); e <= 2; e++ {
				vals := make([][]int32, c.P)
				for q := range c.P {
					vals[q] = randShard(rng, c.rows*c.cols)
					upload(t, b, srcs[q], vals[q])
				}
				if e > 1 { // every reader has read epoch e−1: its word in each writer's pad
					for me := range c.P {
						for d := range c.P {
							if d != me {
								setWord(t, b, w.pads[me], c.P+d, e-1)
							}
						}
					}
				}
				for me := range c.P {
					w.put(me, srcs[me], c.chunkRows, c.ctas, e, time.Second)
				}
				if err := b.Sync(); err != nil {
					t.Fatalf("epoch %d: %v", e, err)
				}
				for d := range c.P {
					want, fl, st := make([][]int32, c.P), make([]uint64, c.P), make([]uint64, c.P)
					for q := range c.P {
						if q != d {
							want[q], fl[q], st[q] = vals[q], e, e
						}
					}
					w.check(t, d, want, fl, st)
				}
			}
		})
	}
}

// TestEmuPutDeadline: a destination whose "read" word of the previous
// epoch never comes is skipped at the deadline (its rows and flags keep the
// previous epoch's) and the next Sync names it; the other destinations get
// this epoch's rows and flags.
func TestEmuPutDeadline(t *testing.T) {
	const P, rows, cols, chunkRows = 3, 10, 4, 4
	b := emuworld.Backend(t)
	w := newPutWorld(t, b, P, rows, cols, chunkRows)
	rng := rand.New(rand.NewPCG(3, 4))
	src := b.Zeros(tensor.Int32, rows, cols)
	first := randShard(rng, rows*cols)
	upload(t, b, src, first)
	w.put(0, src, chunkRows, 2, 1, time.Second)
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	second := randShard(rng, rows*cols)
	upload(t, b, src, second)
	setWord(t, b, w.pads[0], P+1, 1) // rank 1 has read epoch 1; rank 2 never says so
	const dl = 30 * time.Millisecond
	start := time.Now()
	w.put(0, src, chunkRows, 2, 2, dl)
	err := b.Sync()
	el := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "rank 2 never freed its gather buffer") {
		t.Fatalf("Sync after a put whose destination 2 never freed its buffer: %v, expected an error naming rank 2", err)
	}
	if el < dl || el > dl+5*time.Second {
		t.Errorf("the put gave up after %v, expected about its deadline %v", el, dl)
	}
	if st := rawInt32s(t, b, w.status[0]); st[0] != 0 {
		t.Errorf("status after the put's deadline is %v, expected it untouched (the put's own wait does not set it)", st)
	}
	w.check(t, 1, [][]int32{second, nil, nil}, []uint64{2, 0, 0}, []uint64{2, 0, 0})
	w.check(t, 2, [][]int32{first, nil, nil}, []uint64{1, 0, 0}, []uint64{2, 0, 0})
}

// TestEmuPutRefused: arguments the kernel cannot take are refused
// before anything is queued, saying what was expected.
func TestEmuPutRefused(t *testing.T) {
	for _, c := range []struct {
		name           string
		rows, cols     int
		chunkRows      int
		epoch          uint64
		want, tableErr string
	}{
		{"odd row bytes", 4, 3, 2, 1, "rows of a multiple of 16 bytes", ""},
		{"zero chunk", 4, 4, 0, 1, "chunk rows 0: expected > 0", ""},
		{"epoch 0", 4, 4, 2, 0, "epoch 0: expected 1 ≤ epoch", ""},
		{"too many rows", 9, 4, 2, 1, "exceeds the gather buffers' 256 bytes", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := emuworld.Backend(t)
			w := newPutWorld(t, b, 2, 8, 4, 8) // buffers of 2·8 rows of 16 bytes, 2 flags
			src := b.Zeros(tensor.Int32, c.rows, c.cols)
			queuePut(w.b, nil, w.pt, peerPut{Src: src, Rank: 0, ChunkRows: c.chunkRows, Epoch: c.epoch, Deadline: time.Second,
				Status: w.status[0], What: func(q int) error { return fmt.Errorf("rank %d", q) }})
			if err := b.Sync(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%s: %v, expected an error saying %q", c.name, err, c.want)
			}
		})
	}
	b := emuworld.Backend(t)
	if _, err := newPeerTable(b, []uint64{16, 8}, []uint64{8, 8}, []uint64{8, 8}, 64, 2); err == nil || !strings.Contains(err.Error(), "gather buffer of rank 1 at 0x8: expected a non-nil 16-byte aligned address") {
		t.Fatalf("a misaligned gather buffer: %v, expected a refusal naming rank 1", err)
	}
	if _, err := newPeerTable(b, []uint64{16}, []uint64{8, 8}, []uint64{8, 8}, 64, 2); err == nil || !strings.Contains(err.Error(), "expected the same number") {
		t.Fatalf("tables of different lengths: %v, expected a refusal", err)
	}
}
