//go:build asynctp_emu

package peerep

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/testing/emuworld"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/parallel/ep/peerep/internal/dispatch"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// fusedRun runs steps of the EP MoE layer's device step on P emulated ranks
// with strategy st (built with the barrier's wait), and returns each rank's
// results; check, when set, runs on each rank after the steps.
func fusedRun(t *testing.T, P int, cfg layers.MoEConfig, dt tensor.DType, tokens []int, maxTok, steps int,
	st func(bar *emuworld.Barrier) overlap.Strategy, check func(rank int, b *cudabackend.Backend, m *ep.MoE) error) []moeResult {
	t.Helper()
	return moeRun(t, P, cfg, dt, tokens, maxTok, steps, moeRunOpts{st: st, check: check, params: 21, rng: [2]uint64{41, 9}})
}

// moeRunOpts: what moeRun's ranks differ in.
type moeRunOpts struct {
	st     func(bar *emuworld.Barrier) overlap.Strategy // the expert path's strategy; nil: the collective dispatcher
	check  func(rank int, b *cudabackend.Backend, m *ep.MoE) error
	wrap   func(c *emuworld.Sym) comm.Comm // the rank's communicator around its emulated world; nil: that world
	aux    float64                         // ep.Parallel.AuxGradScale (0: its default)
	params uint64                          // the parameter set's seed
	rng    [2]uint64                       // the inputs' seeds (rank r: rng[0] + r, rng[1])
}

// moeRun runs steps of the EP MoE layer on P emulated ranks with the
// grouped GEMM on and returns each rank's results. With a strategy the
// layer must take its device step, without one the host-count step.
func moeRun(t *testing.T, P int, cfg layers.MoEConfig, dt tensor.DType, tokens []int, maxTok, steps int, o moeRunOpts) []moeResult {
	t.Helper()
	C := cfg.Dim
	res := make([]moeResult, P)
	var mu sync.Mutex
	emulatedWith(t, P, 180*time.Second, []cudabackend.Option{cudabackend.WithGroupedGEMM(true)}, func(sc *emuworld.Sym, bar *emuworld.Barrier) error {
		b := sc.B
		var c comm.Comm = sc
		if o.wrap != nil {
			c = o.wrap(sc)
		}
		par := ep.Parallel{Group: c, MaxTokens: maxTok, Stream: b.Stream(), AuxGradScale: o.aux}
		if o.st != nil {
			par.Overlap = overlap.Single(o.st(bar))
		}
		ps := layers.NewParamSet(o.params)
		m, err := ep.New(b, ps, par, "moe", cfg)
		if err != nil {
			return err
		}
		if err := ps.Materialize(b, dt); err != nil {
			return err
		}
		if m.DeviceStep() != (o.st != nil) {
			return fmt.Errorf("expert path %T: device step %v, want %v", m.Dispatch, m.DeviceStep(), o.st != nil)
		}
		r := c.Rank()
		rng := rand.New(rand.NewPCG(uint64(r)+o.rng[0], o.rng[1]))
		var x, dout []float64
		for range tokens[r] * C {
			x = append(x, rng.NormFloat64())
			dout = append(dout, rng.NormFloat64())
		}
		out, err := moeSteps(b, m, ps, dt, x, dout, tokens[r], C, steps, func() {}, func() {})
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		if o.check != nil {
			if err := o.check(r, b, m); err != nil {
				return fmt.Errorf("rank %d: %w", r, err)
			}
		}
		mu.Lock()
		res[r] = out
		mu.Unlock()
		return nil
	})
	return res
}

// ints reads an int32 tensor.
func ints(b tensor.Backend, t *tensor.Tensor) []int32 {
	h := tensor.MustHost(tensor.Int32, t.Shape()...)
	b.Download(h, t)
	return h.I32()
}

// u64s reads a tensor of little-endian int32 pairs as uint64 words.
func u64s(b tensor.Backend, t *tensor.Tensor) []uint64 {
	v := ints(b, t)
	w := make([]uint64, len(v)/2)
	for i := range w {
		w[i] = uint64(uint32(v[2*i])) | uint64(uint32(v[2*i+1]))<<32
	}
	return w
}

// TestEmuFusedMatchesPipelined: the fused strategy's protocol (counts on
// their own signal, the plan's per-block counter targets, each source's
// rows expanded one after the other — own first — raising the counters,
// the first GEMM's wait on every counter, the down GEMM's per-block flags
// and the flag-driven combine send) gives the pipelined path's outputs,
// input gradients and parameter gradients bit for bit, at EP 2 and 4, top-k
// 1, 2 and 8, with and without capacity drops, uneven token counts and
// experts without tokens — forward and backward (the combine backward's rows
// raising the counters again for dh = dy·W_down, the dispatch backward sent
// from the last dx GEMM's flags); and after each step every block's counter
// is at its target 128 and every block's done flag at ⌈C/256⌉ (1), with the
// plan's block table the prefix of ⌈rows_e / 128⌉ over the step's offsets.
// Stream hooks: the emulator has no GEMM engine (WithStreamHooks).
func TestEmuFusedMatchesPipelined(t *testing.T) {
	for _, tc := range []struct {
		P, E, K int
		cf      float64
		tokens  []int
	}{
		{2, 8, 2, 0, []int{5, 3}},
		{2, 8, 1, 1, []int{6, 1}},
		{2, 8, 8, 0, []int{4, 4}},
		{4, 8, 2, 1, []int{3, 1, 6, 2}},
		{4, 8, 8, 0.5, []int{2, 5, 1, 4}},
	} {
		for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
			t.Run(fmt.Sprintf("P%d/K%d/cf%v/%v", tc.P, tc.K, tc.cf, dt), func(t *testing.T) {
				cfg := layers.MoEConfig{Dim: 8, Hidden: 16, Experts: tc.E, TopK: tc.K, CapacityFactor: tc.cf,
					AuxLossCoef: 0.01, ZLossCoef: 0.001, Std: 0.5, OutStd: 0.3}
				const maxTok, steps = 6, 2
				pip := fusedRun(t, tc.P, cfg, dt, tc.tokens, maxTok, steps, func(bar *emuworld.Barrier) overlap.Strategy {
					return pipelinedStrategy(WithBeforeWait(bar.Wait))
				}, nil)
				defer dispatch.SetFusedLandEarly(true)
				defer dispatch.SetFusedSideSend(true)
				// early: the sources land on the backend's stream and the
				// side launch sends every block; else the side stream
				// lands them and the launch after the GEMM sends them.
				for _, early := range []bool{true, false} {
					dispatch.SetFusedLandEarly(early)
					dispatch.SetFusedSideSend(early)
					checked := 0
					var cmu sync.Mutex
					fus := fusedRun(t, tc.P, cfg, dt, tc.tokens, maxTok, steps, func(bar *emuworld.Barrier) overlap.Strategy {
						return fusedStrategy(WithBeforeWait(bar.Wait), WithStreamHooks())
					}, func(rank int, b *cudabackend.Backend, m *ep.MoE) error {
						p, ok := m.Dispatch.(*Path)
						if !ok || !p.Fused() {
							return fmt.Errorf("expert path %T is not the fused Path", m.Dispatch)
						}
						if !m.DeviceStep() {
							return fmt.Errorf("the fused layer does not run the device step")
						}
						if f, b := p.FusedSteps(); f != steps || b != steps {
							return fmt.Errorf("%d forward and %d backward steps ran from the GEMM hooks, want %d each", f, b, steps)
						}
						d := p.engine()
						nblk := d.Config().FusedBlocks()
						cnt, done := u64s(b, d.FusedCounters()), u64s(b, d.FusedDone())
						if len(cnt) != nblk || len(done) != nblk {
							return fmt.Errorf("%d counters and %d flags, want %d", len(cnt), len(done), nblk)
						}
						off := ints(b, d.Offsets())
						blk := ints(b, d.FusedBlockTable())
						if err := b.Err(); err != nil {
							return err
						}
						q := 0
						for e := range len(off) - 1 {
							if int(blk[e]) != q {
								return fmt.Errorf("block table %v over offsets %v: entry %d is %v, want %d", blk, off, e, blk[e], q)
							}
							q += (int(off[e+1]-off[e]) + 127) / 128
						}
						if int(blk[len(off)-1]) != q {
							return fmt.Errorf("block table %v over offsets %v: %v blocks, want %d", blk, off, blk[len(off)-1], q)
						}
						// The emulated ranks meet before each wait, so every
						// source is here when the backend's stream claims.
						want := int32(2)
						if early {
							want = 1
						}
						if src := ints(b, d.FusedSources()); len(src) < tc.P || slices.ContainsFunc(src[:tc.P], func(v int32) bool { return v != want }) {
							return fmt.Errorf("sources landed by streams %v, want %d for each of %d (land early: %v)", src, want, tc.P, early)
						}
						for i := range nblk {
							if cnt[i] != 128 {
								return fmt.Errorf("block %d's counter is %d after the step, want 128 (rows landed + 128 − rows)", i, cnt[i])
							}
							if i < q && done[i] != 1 {
								return fmt.Errorf("block %d's done flag is %d, want 1", i, done[i])
							}
						}
						cmu.Lock()
						checked++
						cmu.Unlock()
						return nil
					})
					if checked != tc.P {
						t.Fatalf("%d ranks checked the counters, want %d", checked, tc.P)
					}
					nonzero := false
					for r := range tc.P {
						same := func(what string, got, want []float64) {
							if len(got) != len(want) {
								t.Fatalf("rank %d %s: %d values, pipelined %d", r, what, len(got), len(want))
							}
							for i := range got {
								if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
									t.Errorf("rank %d %s[%d] = %v, pipelined %v (expected identical bits)", r, what, i, got[i], want[i])
									return
								}
								if got[i] != 0 {
									nonzero = true
								}
							}
						}
						same("out", fus[r].out, pip[r].out)
						same("dx", fus[r].dx, pip[r].dx)
						for i := range pip[r].grads {
							same(fmt.Sprintf("grad %d", i), fus[r].grads[i], pip[r].grads[i])
						}
					}
					if !nonzero {
						t.Fatal("every output and gradient is zero: the comparison proves nothing")
					}
					t.Logf("land early %v: routing %v, dropped %d", early, pip[0].stats.TokensPerExpert, pip[0].stats.Dropped)
				}
			})
		}
	}
}

// TestEmuFusedCombineDeadline: a fused combine whose down GEMM never
// signals its blocks fails at the deadline with an error naming the block,
// instead of hanging.
func TestEmuFusedCombineDeadline(t *testing.T) {
	emulated(t, 2, func(c *emuworld.Sym, bar *emuworld.Barrier) error {
		p, err := New(ep.ExpertConfig{Name: "moe", Backend: c.B, Group: c, Experts: 2, Cols: 8, MaxTokens: 4},
			WithDeadline(50*time.Millisecond), WithBeforeWait(bar.Wait), withFused(), WithStreamHooks())
		if err != nil {
			return err
		}
		x := upload(c.B, tensor.Float32, []float64{1, 2, 3, 4, 5, 6, 7, 8, 8, 7, 6, 5, 4, 3, 2, 1}, 2, 8)
		idx := c.B.Zeros(tensor.Int32, 2, 1)
		h, _ := tensor.FromInt32([]int32{0, 1}, 2, 1)
		c.B.Upload(idx, h)
		xe, hd, hooks, err := p.DispatchFused(x, idx, 0)
		if err != nil {
			return err
		}
		if hooks == nil || hooks.First == nil || hooks.Down == nil {
			return fmt.Errorf("the fused dispatch gave no hooks: %+v", hooks)
		}
		ye := c.B.Zeros(tensor.Float32, hd.Bound, 8)
		c.B.Copy(ye, xe)
		// The down GEMM that never stores (no signal): the combine's send
		// waits on the first block's flag until the deadline.
		err = p.eng.CombineSendFused(ye, func() error { return nil })
		if err == nil {
			err = c.B.Sync()
		}
		if err == nil || !strings.Contains(err.Error(), "block 0 of the down projection's rows") || !strings.Contains(err.Error(), fmt.Sprintf("rank %d", c.Rank())) {
			return fmt.Errorf("a combine whose blocks are never stored: %v, expected an error naming block 0 and this rank", err)
		}
		t.Logf("rank %d: %v", c.Rank(), err)
		return nil
	})
}

// TestEmuFusedRefusesF32WithoutStreamHooks: the engine form of the fused
// path takes bf16 only, and says so.
func TestEmuFusedRefusesF32WithoutStreamHooks(t *testing.T) {
	emulated(t, 1, func(c *emuworld.Sym, bar *emuworld.Barrier) error {
		p, err := New(ep.ExpertConfig{Name: "moe", Backend: c.B, Group: c, Experts: 2, Cols: 8, MaxTokens: 4}, withFused())
		if err != nil {
			return err
		}
		x := c.B.Zeros(tensor.Float32, 2, 8)
		idx := c.B.Zeros(tensor.Int32, 2, 1)
		_, _, _, err = p.DispatchFused(x, idx, 0)
		if err == nil || !strings.Contains(err.Error(), "tensors are f32, expected bf16") {
			return fmt.Errorf("an f32 fused dispatch: %v, expected a refusal naming f32 and bf16", err)
		}
		return nil
	})
}

// TestEmuFusedCombineFollowsFlags: the fused combine's send stores a block
// of expert rows home only once the down GEMM's flag of that block says it
// is stored: with block 0 of expert 0's 200 rows flagged and block 1 not,
// the home's slots of rows 0–127 hold the rows, those of rows 128–199 stay
// untouched, and the send fails at the deadline naming block 1.
func TestEmuFusedCombineFollowsFlags(t *testing.T) {
	emulated(t, 1, func(c *emuworld.Sym, bar *emuworld.Barrier) error {
		const N, C = 200, 8
		p, err := New(ep.ExpertConfig{Name: "moe", Backend: c.B, Group: c, Experts: 2, Cols: C, MaxTokens: N},
			WithDeadline(50*time.Millisecond), withFused(), WithStreamHooks())
		if err != nil {
			return err
		}
		vals := make([]float64, N*C)
		for i := range vals {
			vals[i] = float64(i%97) + 1
		}
		x := upload(c.B, tensor.Float32, vals, N, C)
		idx := c.B.Zeros(tensor.Int32, N, 1) // every token on expert 0: blocks of 128 and 72 rows
		xe, hd, _, err := p.DispatchFused(x, idx, 0)
		if err != nil {
			return err
		}
		p.eng.Join()
		ye := c.B.Zeros(tensor.Float32, hd.Bound, C)
		c.B.Copy(ye, xe)
		if err := c.B.Sync(); err != nil {
			return fmt.Errorf("the dispatch: %w", err)
		}
		if got := ints(c.B, p.eng.FusedBlockTable()); fmt.Sprint(got) != "[0 2 2]" {
			return fmt.Errorf("block table %v, want [0 2 2] (expert 0: 2 blocks, expert 1: none)", got)
		}
		err = p.eng.CombineSendFused(ye, func() error {
			h, _ := tensor.FromInt32([]int32{1, 0}, 2) // block 0 stored (one column tile), block 1 not
			v, err := p.eng.FusedDone().View(0, 2)
			if err != nil {
				return err
			}
			c.B.Upload(v, h)
			return nil
		})
		if err != nil {
			return fmt.Errorf("CombineSendFused: %v (the missed flag is reported at the next Sync)", err)
		}
		// The slots (token n, choice 0) of this rank's combine buffer, read
		// by another emulated backend (emulated device memory is host
		// memory): this one fails at its next read, which reports the
		// missed flag, and then reads nothing.
		v, err := p.sym[dispatch.Y].Rows(0, N)
		if err != nil {
			return err
		}
		rd, err := cudabackend.NewEmulated()
		if err != nil {
			return err
		}
		defer rd.Close()
		fv, err := tensor.New(&foreignBuf{dev: v.Device(), ptr: cudabackend.DevicePtr(v), dt: tensor.Float32, n: N * C}, 0, N, C)
		if err != nil {
			return err
		}
		got := hostVals(rd, fv)
		if err := rd.Err(); err != nil {
			return fmt.Errorf("reading the combine buffer: %w", err)
		}
		err = c.B.Sync()
		if err == nil || !strings.Contains(err.Error(), "block 1 of the down projection's rows") {
			return fmt.Errorf("a combine whose block 1 is never stored: %v, expected an error naming block 1", err)
		}
		for n := range N {
			for j := range C {
				w := 0.0
				if n < 128 {
					w = vals[n*C+j]
				}
				if got[n*C+j] != w {
					return fmt.Errorf("slot of token %d col %d = %v, want %v (block %d)", n, j, got[n*C+j], w, n/128)
				}
			}
		}
		return nil
	})
}

// foreignBuf names emulated device memory of another emulated backend as a
// cudabackend.DeviceBuffer (same device, another allocator), so a backend
// can read it.
type foreignBuf struct {
	dev tensor.Device
	ptr uint64
	dt  tensor.DType
	n   int
}

func (f *foreignBuf) Device() tensor.Device { return f.dev }
func (f *foreignBuf) DType() tensor.DType   { return f.dt }
func (f *foreignBuf) Len() int              { return f.n }
func (f *foreignBuf) Ptr() uint64           { return f.ptr }

// TestEmuFusedDeadline: a peer that never sends its counts makes the fused
// dispatch fail at the deadline naming it ("counts ready"), and the failed
// step's block counters are all at their target, so that no GEMM waits in
// vain for rows that will never land.
func TestEmuFusedDeadline(t *testing.T) {
	emulated(t, 2, func(c *emuworld.Sym, bar *emuworld.Barrier) error {
		p, err := New(ep.ExpertConfig{Name: "moe", Backend: c.B, Group: c, Experts: 2, Cols: 8, MaxTokens: 4},
			WithDeadline(50*time.Millisecond), withFused(), WithStreamHooks())
		if err != nil {
			return err
		}
		if c.Rank() == 1 {
			if err := p.ensure(1, 8, tensor.Float32); err != nil {
				return err
			}
			return c.Barrier()
		}
		x := upload(c.B, tensor.Float32, make([]float64, 32), 4, 8)
		idx := c.B.Zeros(tensor.Int32, 4, 1)
		h, _ := tensor.FromInt32([]int32{0, 1, 0, 1}, 4, 1)
		c.B.Upload(idx, h)
		_, _, _, err = p.DispatchFused(x, idx, 0)
		if err != nil {
			return fmt.Errorf("DispatchFused: %v (a missed signal is reported at the next Sync)", err)
		}
		rd, err := cudabackend.NewEmulated()
		if err != nil {
			return err
		}
		defer rd.Close()
		cnt := p.eng.FusedCounters()
		fv, err := tensor.New(&foreignBuf{dev: cnt.Device(), ptr: cudabackend.DevicePtr(cnt), dt: tensor.Int32, n: cnt.Numel()}, 0, cnt.Numel())
		if err != nil {
			return err
		}
		words := u64s(rd, fv)
		err = c.B.Sync()
		if err == nil || !strings.Contains(err.Error(), `rank 1 never signalled "counts ready"`) {
			return fmt.Errorf("a fused dispatch whose peer never sends: %v, expected an error naming rank 1's counts", err)
		}
		for q, v := range words {
			if v != 128 {
				return fmt.Errorf("block %d's counter is %d after the failed plan, want 128 (nothing to wait for)", q, v)
			}
		}
		t.Logf("rank 0: %v", err)
		return c.Barrier()
	})
}

// TestEmuFusedNeedsDeviceStep: where the backend's grouped GEMM is off the
// fused strategy is unavailable for the expert path, saying why (a default
// keeps collective); and a layer that gets a fused path anyway (a strategy
// that skips the check) refuses its forward, saying what it needs, instead
// of running the host-count path under the fused name.
func TestEmuFusedNeedsDeviceStep(t *testing.T) {
	emulated(t, 1, func(c *emuworld.Sym, bar *emuworld.Barrier) error {
		b, err := cudabackend.NewEmulated(cudabackend.WithGroupedGEMM(false))
		if err != nil {
			return err
		}
		c.Reg.Keep(b)
		c2 := newSymComm(c.Comm, b, c.Reg)
		f := fusedStrategy(WithStreamHooks())
		sp := overlap.Spec{Kind: overlap.KindExpert, Name: "moe", Group: c2, Backend: b, Rows: 4, K: 8, Outs: []int{8}}
		if err := f.Supports(sp); !errors.Is(err, overlap.ErrUnavailable) || !strings.Contains(err.Error(), "WithGroupedGEMM(true)") {
			return fmt.Errorf("Supports without the grouped GEMM: %v, expected ErrUnavailable naming WithGroupedGEMM(true)", err)
		}
		ps := layers.NewParamSet(3)
		cfg := layers.MoEConfig{Dim: 8, Hidden: 8, Experts: 2, TopK: 1, Std: 0.5, OutStd: 0.3}
		m, err := ep.New(b, ps, ep.Parallel{Group: c2, MaxTokens: 4, Stream: b.Stream(), Overlap: overlap.Single(unchecked{f})}, "moe", cfg)
		if err != nil {
			return err
		}
		if p, ok := m.Dispatch.(*Path); !ok || !p.Fused() {
			return fmt.Errorf("expert path %T, expected the fused Path", m.Dispatch)
		}
		if err := ps.Materialize(b, tensor.Float32); err != nil {
			return err
		}
		x, out := b.Zeros(tensor.Float32, 4, 8), b.Zeros(tensor.Float32, 4, 8)
		err = m.Forward(out, x)
		if err == nil || !strings.Contains(err.Error(), "runs only as the MoE device step") || !strings.Contains(err.Error(), "WithGroupedGEMM(true)") {
			return fmt.Errorf("a fused layer without the grouped GEMM: %v, expected a refusal naming the device step and WithGroupedGEMM(true)", err)
		}
		return nil
	})
}

// unchecked is a strategy that skips Expert's Supports.
type unchecked struct{ named }

func (unchecked) Supports(overlap.Spec) error { return nil }
