//go:build asynctp_emu

package dispatch

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// refused checks that err is an error containing every fragment of want
// (what was found and what was expected), and that the engine refused
// before queuing anything: the backend has no error.
func refused(rk *emuRank, call string, err error, want ...string) error {
	if err == nil {
		return fmt.Errorf("%s: accepted, expected an error with %q", call, want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			return fmt.Errorf("%s: %q, expected it to contain %q", call, err, w)
		}
	}
	if e := rk.b.Err(); e != nil {
		return fmt.Errorf("%s: refused (%v), but the backend has failed: %v", call, err, e)
	}
	return nil
}

// argCase is one call of a test of the engine's refusals: want nil, a
// call that must succeed (a step of the sequence); else the fragments of
// the error it must be refused with (refused).
type argCase struct {
	call string
	run  func() error
	want []string
}

// runCases runs cases in order: a refusal that is not as wanted is a test
// error; a failed call that must succeed is returned.
func runCases(t *testing.T, rk *emuRank, cases []argCase) error {
	t.Helper()
	for _, c := range cases {
		err := c.run()
		if c.want == nil {
			if err != nil {
				return err
			}
			continue
		}
		if err := refused(rk, c.call, err, c.want...); err != nil {
			t.Error(err)
		}
	}
	return nil
}

// TestEmuNewRefuses: New refuses a configuration, a symmetric buffer or a
// peer table that does not fit, naming the buffer, what it is and what it
// should be, and queues nothing.
func TestEmuNewRefuses(t *testing.T) {
	w := world{P: 1, E: 2, K: 1, C: 4, Mt: 3, dt: tensor.Float32}
	emulated(t, w.config(false), func(rk *emuRank) error {
		cfg, b := rk.eng.Config(), rk.b
		peers := func() (p [NumBufs][]uint64) {
			for i, s := range rk.sym {
				p[i] = []uint64{cudabackend.DevicePtr(s)}
			}
			return p
		}
		bad := cfg
		bad.TopK = 3
		_, err := New(b, bad, rk.sym, peers())
		if err := refused(rk, "New of top-3 of 2 experts", err, "top-3 of 2 experts", "expected 1 ≤ K ≤ E"); err != nil {
			return err
		}
		sym := rk.sym
		sym[Tokens] = b.Zeros(tensor.Float32, 2, 4)
		_, err = New(b, cfg, sym, peers())
		if err := refused(rk, "New with a short token buffer", err, "symmetric buffer 1 (tokens) is f32(2, 4)", "expected f32(3, 4)"); err != nil {
			return err
		}
		sym = rk.sym
		sym[Y] = b.Zeros(tensor.BFloat16, 3, 4)
		_, err = New(b, cfg, sym, peers())
		if err := refused(rk, "New with a bf16 combine buffer", err, "symmetric buffer 4 (combine rows) is bf16(3, 4)", "expected f32(3, 4)"); err != nil {
			return err
		}
		sym = rk.sym
		sym[Signals] = nil
		_, err = New(b, cfg, sym, peers())
		if err := refused(rk, "New without a signal pad", err, "symmetric buffer 6 (signals) is <nil>", "expected i32(14)"); err != nil {
			return err
		}
		p := peers()
		p[Meta] = nil
		_, err = New(b, cfg, rk.sym, p)
		return refused(rk, "New with no peer of the meta buffer", err, "0 peer addresses of buffer 2 (meta)", "expected 1")
	})
}

// TestEmuRefusesBadArguments: every call of the pipelined engine refuses
// operands of the wrong shape, dtype or order, and calls out of the
// step's order, with an error naming what it got and what it expected,
// before it queues anything (the backend stays sound); a full step then
// still gives the reference's answers.
func TestEmuRefusesBadArguments(t *testing.T) {
	w := world{P: 1, E: 2, K: 1, C: 4, Mt: 3, dt: tensor.Float32}
	emulated(t, w.config(false), func(rk *emuRank) error {
		b, d := rk.b, rk.eng
		R, C := d.RecvBound(), w.C
		f32 := func(shape ...int) *tensor.Tensor { return b.Zeros(tensor.Float32, shape...) }
		x, idx := upload(b, tensor.Float32, []float64{1, 2, 3, 4, 5, 6, 7, 8}, 2, C), uploadInts(b, []int32{0, 1}, 2, 1)
		rows, out, wts := f32(R, C), f32(2, C), upload(b, tensor.Float32, []float64{0.5, 0.25}, 2, 1)
		cases := []argCase{
			// Out of the step's order.
			{"DispatchRecv first", func() error { return d.DispatchRecv(rows, 0) }, []string{"DispatchRecv without a DispatchSend"}},
			{"CombineSend first", func() error { return d.CombineSend(rows, 0) }, []string{"CombineSend without a dispatch"}},
			{"CombineRecv first", func() error { return d.CombineRecv(out, wts) }, []string{"CombineRecv without a CombineSend"}},
			{"CombineBackwardSend first", func() error { return d.CombineBackwardSend(out, wts, nil) }, []string{"CombineBackwardSend without a combine"}},
			{"CombineBackwardRecv first", func() error { return d.CombineBackwardRecv(rows, 0) }, []string{"CombineBackwardRecv without a CombineBackwardSend"}},
			{"DispatchBackwardSend first", func() error { return d.DispatchBackwardSend(rows, 0) }, []string{"DispatchBackwardSend without a dispatch"}},
			{"DispatchBackwardRecv first", func() error { return d.DispatchBackwardRecv(out) }, []string{"DispatchBackwardRecv without a DispatchBackwardSend"}},
			// The fused calls on a pipelined engine.
			{"DispatchRecvFused", func() error { return d.DispatchRecvFused(rows) }, []string{"DispatchRecvFused", "built without Config.Fused"}},
			{"CombineSendFused", func() error { return d.CombineSendFused(rows, func() error { return nil }) }, []string{"built without Config.Fused"}},
			{"CombineBackwardRecvFused", func() error { return d.CombineBackwardRecvFused(rows) }, []string{"built without Config.Fused"}},
			{"DispatchBackwardSendFused", func() error { return d.DispatchBackwardSendFused(rows, func() error { return nil }) }, []string{"built without Config.Fused"}},
			// DispatchSend's operands.
			{"DispatchSend nil x", func() error { return d.DispatchSend(nil, idx, 0) }, []string{"x is <nil>", "expected (N, 4)"}},
			{"DispatchSend 1-D x", func() error { return d.DispatchSend(f32(8), idx, 0) }, []string{"x is f32(8)", "expected (N, 4)"}},
			{"DispatchSend x of 5 columns", func() error { return d.DispatchSend(f32(2, 5), idx, 0) }, []string{"x is f32(2, 5)", "expected f32(2, 4)"}},
			{"DispatchSend bf16 x", func() error { return d.DispatchSend(b.Zeros(tensor.BFloat16, 2, C), idx, 0) }, []string{"x is bf16(2, 4)", "expected f32(2, 4)"}},
			{"DispatchSend idx of 2 choices", func() error { return d.DispatchSend(x, b.Zeros(tensor.Int32, 2, 2), 0) }, []string{"idx is i32(2, 2)", "expected int32(2, 1)"}},
			{"DispatchSend idx of other tokens", func() error { return d.DispatchSend(x, b.Zeros(tensor.Int32, 3, 1), 0) }, []string{"idx is i32(3, 1)", "expected int32(2, 1)"}},
			{"DispatchSend f32 idx", func() error { return d.DispatchSend(x, f32(2, 1), 0) }, []string{"idx is f32(2, 1)", "expected int32(2, 1)"}},
			{"DispatchSend cf −1", func() error { return d.DispatchSend(x, idx, -1) }, []string{"capacity factor -1", "expected a finite value ≥ 0"}},
			{"DispatchSend cf NaN", func() error { return d.DispatchSend(x, idx, math.NaN()) }, []string{"capacity factor NaN", "expected a finite value ≥ 0"}},
			{"DispatchSend cf +Inf", func() error { return d.DispatchSend(x, idx, math.Inf(1)) }, []string{"capacity factor +Inf", "expected a finite value ≥ 0"}},
			// A step: the dispatch.
			{"", func() error { return d.DispatchSend(x, idx, 0) }, nil},
			{"DispatchRecv short out", func() error { return d.DispatchRecv(f32(R-1, C), 0) }, []string{fmt.Sprintf("out is f32(%d, 4)", R-1), fmt.Sprintf("expected f32(%d, 4)", R)}},
			{"DispatchRecv order 2", func() error { return d.DispatchRecv(rows, 2) }, []string{"order 2", "expected 0 (expert-major) or 1 (received order)"}},
			{"", func() error { return d.DispatchRecv(rows, 0) }, nil},
			// The combine.
			{"CombineSend order -1", func() error { return d.CombineSend(rows, -1) }, []string{"order -1", "expected 0 (expert-major) or 1 (received order)"}},
			{"CombineSend bf16 rows", func() error { return d.CombineSend(b.Zeros(tensor.BFloat16, R, C), 0) }, []string{fmt.Sprintf("rows is bf16(%d, 4)", R), fmt.Sprintf("expected f32(%d, 4)", R)}},
			{"", func() error { return d.CombineSend(rows, 0) }, nil},
			{"CombineRecv out of 3 tokens", func() error { return d.CombineRecv(f32(3, C), wts) }, []string{"out is f32(3, 4)", "expected f32(2, 4)"}},
			{"CombineRecv out of 5 columns", func() error { return d.CombineRecv(f32(2, 5), wts) }, []string{"out is f32(2, 5)", "expected f32(2, 4)"}},
			{"CombineRecv weights of 2 choices", func() error { return d.CombineRecv(out, f32(2, 2)) }, []string{"weights is f32(2, 2)", "expected f32(2, 1)"}},
			{"CombineRecv nil weights", func() error { return d.CombineRecv(out, nil) }, []string{"weights is <nil>", "expected f32(2, 1)"}},
			{"", func() error { return d.CombineRecv(out, wts) }, nil},
			// Its backward.
			{"CombineBackwardSend dout of 3 columns", func() error { return d.CombineBackwardSend(f32(2, 3), wts, nil) }, []string{"dout is f32(2, 3)", "expected f32(2, 4)"}},
			{"CombineBackwardSend nil weights", func() error { return d.CombineBackwardSend(out, nil, nil) }, []string{"weights is <nil>", "expected f32(2, 1)"}},
			{"CombineBackwardSend bf16 weights", func() error { return d.CombineBackwardSend(out, b.Zeros(tensor.BFloat16, 2, 1), nil) }, []string{"weights is bf16(2, 1)", "expected f32(2, 1)"}},
			{"CombineBackwardSend dweights of 3 tokens", func() error { return d.CombineBackwardSend(out, wts, f32(3, 1)) }, []string{"dweights is f32(3, 1)", "expected f32(2, 1)"}},
			{"", func() error { return d.CombineBackwardSend(out, wts, f32(2, 1)) }, nil},
			{"CombineBackwardRecv short dy", func() error { return d.CombineBackwardRecv(f32(1, C), 0) }, []string{"dy is f32(1, 4)", fmt.Sprintf("expected f32(%d, 4)", R)}},
			{"CombineBackwardRecv order 3", func() error { return d.CombineBackwardRecv(rows, 3) }, []string{"order 3", "expected 0 (expert-major) or 1 (received order)"}},
			{"", func() error { return d.CombineBackwardRecv(rows, 0) }, nil},
			// The dispatch backward.
			{"DispatchBackwardSend order 2", func() error { return d.DispatchBackwardSend(rows, 2) }, []string{"order 2", "expected 0 (expert-major) or 1 (received order)"}},
			{"", func() error { return d.DispatchBackwardSend(rows, 0) }, nil},
			{"DispatchBackwardRecv dx of 1 token", func() error { return d.DispatchBackwardRecv(f32(1, C)) }, []string{"dx is f32(1, 4)", "expected f32(2, 4)"}},
			{"DispatchBackwardRecv bf16 dx", func() error { return d.DispatchBackwardRecv(b.Zeros(tensor.BFloat16, 2, C)) }, []string{"dx is bf16(2, 4)", "expected f32(2, 4)"}},
			{"", func() error { return d.DispatchBackwardRecv(out) }, nil},
		}
		if err := runCases(t, rk, cases); err != nil {
			return err
		}
		d.Release()
		if err := b.Sync(); err != nil {
			return err
		}
		// The engine is still in step: a whole step against the reference.
		st := newStep(w, stepCase{tokens: []int{3}, order: 1}, 5)
		return runStep(t, rk, st, mode{}, true, "the step after the refusals")
	})
}

// TestEmuRefusesBadExpert: an expert id outside [0, E) fails the step at
// the next synchronisation, naming the id and the range.
func TestEmuRefusesBadExpert(t *testing.T) {
	w := world{P: 1, E: 2, K: 1, C: 4, Mt: 3, dt: tensor.Float32}
	emulated(t, w.config(false), func(rk *emuRank) error {
		b, d := rk.b, rk.eng
		x := upload(b, tensor.Float32, make([]float64, 3*w.C), 3, w.C)
		if err := d.DispatchSend(x, uploadInts(b, []int32{0, 2, 1}, 3, 1), 0); err != nil {
			return fmt.Errorf("DispatchSend: %v (the kernel's check is read at the next Sync)", err)
		}
		if err := d.DispatchRecv(b.Zeros(tensor.Float32, d.RecvBound(), w.C), 0); err != nil {
			return fmt.Errorf("DispatchRecv: %v (the kernel's check is read at the next Sync)", err)
		}
		_, err := d.ReadCounts()
		if err == nil || !strings.Contains(err.Error(), "idx contains expert 2, expected [0, 2)") {
			return fmt.Errorf("a dispatch to expert 2 of 2: %v, expected an error naming expert 2 and [0, 2)", err)
		}
		t.Logf("%v", err)
		return nil
	})
}

// TestEmuRefusesOverMaxTokens: a rank with more tokens than MaxTokens
// sends its counts only, and every rank refuses the step (ReadCounts names
// the rank and its tokens; nothing is received, no slot kept, the fused
// path's counters at their target so that no GEMM waits); the next step
// runs as the reference says.
func TestEmuRefusesOverMaxTokens(t *testing.T) {
	w := world{P: 2, E: 4, K: 2, C: 4, Mt: 3, dt: tensor.Float32}
	next := newStep(w, stepCase{tokens: []int{3, 2}, cf: 1, order: 1}, 9)
	for _, m := range []mode{{}, {fused: true, early: true}, {fused: true}} {
		t.Run(m.String(), func(t *testing.T) {
			if m.fused {
				defer SetFusedLandEarly(true)
				SetFusedLandEarly(m.early)
			}
			emulated(t, w.config(m.fused), func(rk *emuRank) error {
				b, d := rk.b, rk.eng
				N := []int{2, w.Mt + 2}[rk.r]
				x := upload(b, tensor.Float32, slices.Repeat([]float64{1}, N*w.C), N, w.C)
				idx := make([]int32, N*w.K)
				for i := range idx {
					idx[i] = int32(i % w.E)
				}
				if err := d.DispatchSend(x, uploadInts(b, idx, N, w.K), 0); err != nil {
					return err
				}
				recv := poisoned(b, w.dt, d.RecvBound(), w.C)
				if m.fused {
					if err := d.DispatchRecvFused(recv); err != nil {
						return err
					}
					d.StreamWaitRows()
				} else if err := d.DispatchRecv(recv, 0); err != nil {
					return err
				}
				cnt, err := d.ReadCounts()
				if err != nil {
					return err
				}
				if cnt.Refused != 1 || cnt.Over != w.Mt+2 || cnt.Rows != 0 {
					t.Errorf("rank %d: refused %d with %d tokens, %d rows, want rank 1 with %d tokens, 0 rows", rk.r, cnt.Refused, cnt.Over, cnt.Rows, w.Mt+2)
				}
				got, err := floats(b, recv)
				if err != nil {
					return err
				}
				if err := compare("recv", w.C, got, nan(len(got)), 0); err != nil {
					t.Errorf("rank %d, the refused step: %v", rk.r, err)
				}
				off, err := ints(b, d.Offsets())
				if err != nil {
					return err
				}
				if slices.ContainsFunc(off, func(v int32) bool { return v != 0 }) {
					t.Errorf("rank %d: offsets %v of the refused step, want zeros", rk.r, off)
				}
				if rk.r == 0 {
					pos, err := ints(b, d.Pos())
					if err != nil {
						return err
					}
					if slices.ContainsFunc(pos, func(v int32) bool { return v != -1 }) {
						t.Errorf("rank 0: slot table %v of the refused step, want every slot dropped (−1)", pos)
					}
				}
				if m.fused {
					c, err := u64s(b, d.FusedCounters())
					if err != nil {
						return err
					}
					if slices.ContainsFunc(c, func(v uint64) bool { return v != fusedTarget }) {
						t.Errorf("rank %d: counters %v of the refused step, want every one at %d", rk.r, c, fusedTarget)
					}
				}
				return runStep(t, rk, next, m, true, fmt.Sprintf("%v: the step after the refused one", m))
			})
		})
	}
}

// TestEmuFusedRefusesBadArguments: the fused calls refuse what the
// pipelined ones do (out of the step's order, short buffers) before they
// queue anything; a whole fused step then gives the reference's answers.
func TestEmuFusedRefusesBadArguments(t *testing.T) {
	w := world{P: 1, E: 2, K: 1, C: 4, Mt: 3, dt: tensor.Float32}
	emulated(t, w.config(true), func(rk *emuRank) error {
		b, d := rk.b, rk.eng
		R, C := d.RecvBound(), w.C
		rows := b.Zeros(tensor.Float32, R, C)
		nop := func() error { return nil }
		x, idx := upload(b, tensor.Float32, []float64{1, 2, 3, 4, 5, 6, 7, 8}, 2, C), uploadInts(b, []int32{0, 1}, 2, 1)
		cases := []argCase{
			{"DispatchRecvFused first", func() error { return d.DispatchRecvFused(rows) }, []string{"DispatchRecvFused without a DispatchSend"}},
			{"CombineSendFused first", func() error { return d.CombineSendFused(rows, nop) }, []string{"CombineSendFused without a dispatch"}},
			{"CombineBackwardRecvFused first", func() error { return d.CombineBackwardRecvFused(rows) }, []string{"CombineBackwardRecvFused without a CombineBackwardSend"}},
			{"DispatchBackwardSendFused first", func() error { return d.DispatchBackwardSendFused(rows, nop) }, []string{"DispatchBackwardSendFused without a dispatch"}},
			{"", func() error { return d.DispatchSend(x, idx, 0) }, nil},
			{"DispatchRecvFused short out", func() error { return d.DispatchRecvFused(b.Zeros(tensor.Float32, R-1, C)) }, []string{fmt.Sprintf("out is f32(%d, 4)", R-1), fmt.Sprintf("expected f32(%d, 4)", R)}},
			{"", func() error { return d.DispatchRecvFused(rows) }, nil},
			{"CombineSendFused bf16 rows", func() error { return d.CombineSendFused(b.Zeros(tensor.BFloat16, R, C), nop) }, []string{fmt.Sprintf("rows is bf16(%d, 4)", R), fmt.Sprintf("expected f32(%d, 4)", R)}},
			{"CombineBackwardRecvFused before its send", func() error { return d.CombineBackwardRecvFused(rows) }, []string{"without a CombineBackwardSend"}},
		}
		if err := runCases(t, rk, cases); err != nil {
			return err
		}
		if err := b.Sync(); err != nil {
			return err
		}
		st := newStep(w, stepCase{tokens: []int{3}}, 6)
		return runStep(t, rk, st, mode{fused: true, early: true}, true, "the fused step after the refusals")
	})
}

// TestEmuDeadlineNamesPeer: a peer that never sends fails the step at the
// deadline, with an error naming the rank, the peer and what it never
// signalled (the fused path waits for the counts first), instead of
// hanging.
func TestEmuDeadlineNamesPeer(t *testing.T) {
	w := world{P: 2, E: 2, K: 1, C: 4, Mt: 3, dt: tensor.Float32}
	for _, m := range []mode{{}, {fused: true, early: true}} {
		t.Run(m.String(), func(t *testing.T) {
			cfg := w.config(m.fused)
			cfg.Deadline = 50 * time.Millisecond
			emulated(t, cfg, func(rk *emuRank) error {
				if rk.r == 1 {
					return nil // silent; its memory stays until every rank has returned
				}
				b, d := rk.b, rk.eng
				d.BeforeWait = nil // no one to meet
				x := upload(b, tensor.Float32, make([]float64, 2*w.C), 2, w.C)
				if err := d.DispatchSend(x, uploadInts(b, []int32{0, 1}, 2, 1), 0); err != nil {
					return err
				}
				recv := b.Zeros(tensor.Float32, d.RecvBound(), w.C)
				want := `rank 1 never signalled "tokens ready" within 50ms`
				if m.fused {
					want = `rank 1 never signalled "counts ready" within 50ms`
					if err := d.DispatchRecvFused(recv); err != nil {
						return err
					}
				} else if err := d.DispatchRecv(recv, 0); err != nil {
					return err
				}
				err := b.Sync()
				if err == nil || !strings.Contains(err.Error(), "expert dispatch on rank 0") || !strings.Contains(err.Error(), want) {
					return fmt.Errorf("a dispatch whose peer never sends: %v, expected an error naming rank 0 and %q", err, want)
				}
				t.Logf("%v", err)
				return nil
			})
		})
	}
}
