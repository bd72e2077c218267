package model_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
	"github.com/asynctp/asynctp/train"
)

// The stream contract of the model, as a GPU transport needs it: every
// collective of the model, of its TP and EP layers and of the strategy is
// queued on Options.Stream, and every Work is waited for on that stream
// (Work.Wait(Options.Stream): ordered on the device, no host wait) before
// its buffers are used. comm/local ignores streams and, without Async,
// completes its ops before returning them, so the other tests cannot see a
// dropped Work or a wrong stream; checkedComm can.

// streamSentinel is the compute stream handed to the model: a value no
// transport knows, compared by identity.
type streamSentinel struct{ name string }

// streamChecker is shared by a rank's world and the groups split from it:
// it records every op whose stream is not the sentinel, every Wait on
// another stream, and the Works not waited for yet.
type streamChecker struct {
	want comm.Stream
	// deferred makes every op run only when its Work is waited for: a
	// caller that reads an op's destination (or writes its source) before
	// Wait then computes wrong numbers, and one that never waits for a
	// Work leaves the op undone, deterministically (the ops still run in
	// the same order on every rank, as the ranks run the same code).
	deferred bool

	mu      sync.Mutex
	seq     int
	ops     int
	pending map[*checkedWork]bool
	errs    []string
}

func newStreamChecker(want comm.Stream, deferred bool) *streamChecker {
	return &streamChecker{want: want, deferred: deferred, pending: map[*checkedWork]bool{}}
}

func (k *streamChecker) violation(format string, args ...any) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.errs) < 20 {
		k.errs = append(k.errs, fmt.Sprintf(format, args...))
	}
}

// err returns the violations and the Works never waited for, or nil.
func (k *streamChecker) err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	errs := append([]string(nil), k.errs...)
	var left []string
	for w := range k.pending {
		left = append(left, w.what)
	}
	sort.Strings(left)
	for _, w := range left {
		errs = append(errs, w+": its Work was never waited for")
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%d op(s) checked, stream contract broken:\n  %s", k.ops, strings.Join(errs, "\n  "))
}

// checkedComm wraps a group of a rank's world with its checker.
type checkedComm struct {
	comm.Comm
	k *streamChecker
}

var (
	_ comm.Aborter       = (*checkedComm)(nil)
	_ comm.NamedSplitter = (*checkedComm)(nil)
)

// start checks the stream of an op and returns its checked Work: run has
// queued the op (at once, or at the first Wait when deferred).
func (c *checkedComm) start(op string, s comm.Stream, run func() (comm.Work, error)) (comm.Work, error) {
	k := c.k
	k.mu.Lock()
	k.seq++
	k.ops++
	what := fmt.Sprintf("%s #%d on %s", op, k.seq, c.Name())
	k.mu.Unlock()
	if s != k.want {
		k.violation("%s: queued on stream %#v, want the model's stream", what, s)
	}
	w := &checkedWork{k: k, what: what}
	if k.deferred {
		w.run = run
	} else {
		inner, err := run()
		if err != nil {
			return nil, err
		}
		w.inner = inner
	}
	k.mu.Lock()
	k.pending[w] = true
	k.mu.Unlock()
	return w, nil
}

func (c *checkedComm) AllGather(dst, src *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	return c.start(comm.OpAllGather, s, func() (comm.Work, error) { return c.Comm.AllGather(dst, src, s) })
}

func (c *checkedComm) ReduceScatter(dst, src *tensor.Tensor, op comm.ReduceOp, s comm.Stream) (comm.Work, error) {
	return c.start(comm.OpReduceScatter, s, func() (comm.Work, error) { return c.Comm.ReduceScatter(dst, src, op, s) })
}

func (c *checkedComm) AllReduce(buf *tensor.Tensor, op comm.ReduceOp, s comm.Stream) (comm.Work, error) {
	return c.start(comm.OpAllReduce, s, func() (comm.Work, error) { return c.Comm.AllReduce(buf, op, s) })
}

func (c *checkedComm) AllToAllV(dst, src *tensor.Tensor, sendCounts, recvCounts []int, s comm.Stream) (comm.Work, error) {
	send, recv := append([]int(nil), sendCounts...), append([]int(nil), recvCounts...)
	return c.start(comm.OpAllToAllV, s, func() (comm.Work, error) { return c.Comm.AllToAllV(dst, src, send, recv, s) })
}

func (c *checkedComm) Broadcast(buf *tensor.Tensor, root int, s comm.Stream) (comm.Work, error) {
	return c.start(comm.OpBroadcast, s, func() (comm.Work, error) { return c.Comm.Broadcast(buf, root, s) })
}

func (c *checkedComm) Split(color, key int) (comm.Comm, error) { return c.SplitNamed(color, key, "") }

func (c *checkedComm) SplitNamed(color, key int, label string) (comm.Comm, error) {
	g, err := comm.SplitNamed(c.Comm, color, key, label)
	if err != nil || g == nil {
		return nil, err
	}
	return &checkedComm{Comm: g, k: c.k}, nil
}

func (c *checkedComm) Abort(err error) {
	if a, ok := c.Comm.(comm.Aborter); ok {
		a.Abort(err)
	}
}

// checkedWork is the Work of a checked op.
type checkedWork struct {
	k    *streamChecker
	what string
	run  func() (comm.Work, error) // deferred: queues the op at the first Wait

	once  sync.Once
	inner comm.Work
	err   error
}

func (w *checkedWork) Wait(s comm.Stream) error {
	if s != w.k.want {
		w.k.violation("%s: waited for on stream %#v, want the model's stream", w.what, s)
	}
	w.once.Do(func() {
		if w.run != nil {
			w.inner, w.err = w.run()
		}
		w.k.mu.Lock()
		delete(w.k.pending, w)
		w.k.mu.Unlock()
	})
	if w.err != nil {
		return w.err
	}
	return w.inner.Wait(s)
}

// onCheckedGrid is onGrid over an Async local world whose ranks' worlds are
// checked: the model gets the sentinel stream (l.stream) and each rank's
// checker must find no violation and no Work left unwaited when fn returns.
func onCheckedGrid(l layout, deferred bool, fn func(b tensor.Backend, g *comm.Grid) error) error {
	return local.Run(l.tp*l.dp, func(c comm.Comm) error {
		k := newStreamChecker(l.stream, deferred)
		b := cpu.New(cpu.WithThreads(1))
		g, err := comm.NewGrid(&checkedComm{Comm: c, k: k}, l.dp, l.tp, max(l.ep, 1))
		if err != nil {
			return err
		}
		defer g.Close()
		if err := fn(b, g); err != nil {
			return err
		}
		if err := k.err(); err != nil {
			return err
		}
		return b.Err()
	}, local.Async(), local.WithTimeout(30*time.Second))
}

// TestStreamContract: with collectives that complete only when waited for
// (comm/local's Async, and deferred until Wait), every op of the dense and
// MoE models — forward, backward, gradient reduction, gradient norm, the
// loss over DP, the MoE dispatch, combine, counts and statistics — is
// queued on Options.Stream and waited for on it before its result is used,
// and the numbers still match layers.GPT.
func TestStreamContract(t *testing.T) {
	const B, T = 4, 8
	sentinel := &streamSentinel{name: "compute"}
	cases := []struct {
		cfg layers.GPTConfig
		l   layout
	}{
		{smallConfig(), layout{tp: 2, dp: 2, sp: true}},
		{smallConfig(), layout{tp: 2, dp: 2, sp: false}},
		{moeConfig(), layout{tp: 2, dp: 2, ep: 2, sp: true}},
		{moeConfig(), layout{tp: 2, dp: 2, ep: 4, sp: false}},
		{moeConfig(), layout{tp: 1, dp: 2, ep: 2}},
		{smallConfig(), layout{tp: 2, dp: 2, sp: true, overlap: "pipelined"}},
		{smallConfig(), layout{tp: 4, dp: 1, sp: false, overlap: "pipelined"}},
		{moeConfig(), layout{tp: 2, dp: 2, ep: 2, sp: true, overlap: "pipelined"}},
	}
	for _, c := range cases {
		ids, targets := batch(3, B, T, c.cfg.Vocab)
		ref := runReference(t, c.cfg, tensor.Float32, ids, targets)
		l := c.l
		l.stream = sentinel
		name := l.String()
		if c.cfg.Experts > 0 {
			name = "moe/" + name
		}
		for _, deferred := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/deferred=%v", name, deferred), func(t *testing.T) {
				err := onCheckedGrid(l, deferred, func(b tensor.Backend, g *comm.Grid) error {
					return checkAgainst(b, g, c.cfg, l, tensor.Float32, ids, targets, ref, 1e-5, &worstErr{}, checkHooks{})
				})
				if err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestStreamContractTraining: the same through train.RunSharded (the optimizer
// step, clipping by the global norm, checkpoints, and the resume's
// agreement on the step), with ops deferred until Wait: the losses equal
// those of a run over a synchronous world, bit for bit.
func TestStreamContractTraining(t *testing.T) {
	sentinel := &streamSentinel{name: "compute"}
	for _, c := range []struct {
		cfg layers.GPTConfig
		l   layout
	}{
		{smallConfig(), layout{tp: 2, dp: 2, sp: true}},
		{moeConfig(), layout{tp: 2, dp: 2, ep: 4, sp: true}},
	} {
		t.Run(c.l.String(), func(t *testing.T) {
			ds := corpus(4000, c.cfg.Vocab)
			want, _, err := runSharded(c.l, c.cfg, ds, trainConfig(6, t.TempDir()))
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			tc := trainConfig(6, dir)
			tc.CheckpointEvery = 3
			l := c.l
			l.stream = sentinel
			run := func(tc train.Config) (train.Result, error) {
				var res train.Result
				err := onCheckedGrid(l, true, func(b tensor.Backend, g *comm.Grid) error {
					m, err := newModel(b, g, c.cfg, l, tensor.Float32)
					if err != nil {
						return err
					}
					ld, err := train.NewLoader(ds, train.LoaderConfig{Batch: 4, Seq: 8, Vocab: c.cfg.Vocab, Seed: 5})
					if err != nil {
						return err
					}
					r, err := train.RunSharded(context.Background(), b, m, ld, tc, train.WithOutput(io.Discard), train.WithProgressBar(false))
					if g.World.Rank() == 0 {
						res = r
					}
					return err
				})
				return res, err
			}
			same := func(what string, got []float64, want []float64) {
				t.Helper()
				if len(got) != len(want) {
					t.Fatalf("%s: %d losses, want %d", what, len(got), len(want))
				}
				for i := range got {
					if got[i] != want[i] {
						t.Fatalf("%s: loss %d %v, want %v (a synchronous world's), bit for bit", what, i, got[i], want[i])
					}
				}
			}
			full, err := run(tc)
			if err != nil {
				t.Fatal(err)
			}
			same("6 steps", full.Losses, want.Losses)
			// Back to the checkpoint of step 3 on every rank, and resume.
			for r := range c.l.tp * c.l.dp {
				if err := os.WriteFile(filepath.Join(train.RankDir(dir, r), train.LatestFile), []byte(train.CheckpointName(3)+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			tc.Resume = dir
			resumed, err := run(tc)
			if err != nil {
				t.Fatal(err)
			}
			if resumed.StartStep != 3 {
				t.Fatalf("resumed at step %d, want 3", resumed.StartStep)
			}
			same("resumed at step 3", resumed.Losses, want.Losses[3:])
		})
	}
}
