//go:build asynctp_emu

package dispatch

import (
	"fmt"
	"slices"
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

// tolerance of the sums (fp32 on the device, rounded once to the dtype)
// against the float64 reference; the moves are exact.
func tolerance(dt tensor.DType) float64 {
	if dt == tensor.BFloat16 {
		return 1e-2 // bf16's half ulp is 2⁻⁹ relative
	}
	return 1e-5
}

// mode is how a step runs: pipelined, or fused with the sources landed
// early on the backend's stream (early) or on the side path, and the
// combine's blocks sent from the side launch (early) or the one after
// the GEMM.
type mode struct {
	fused, early bool
}

func (m mode) String() string {
	switch {
	case !m.fused:
		return "pipelined"
	case m.early:
		return "fused/early"
	}
	return "fused/side"
}

// runStep runs one step (forward and backward) of st on rank rk in mode m,
// and checks every output against the reference; a check that fails is
// reported through t (the ranks stay in step), an engine error ends the
// rank. release ends the step with Release, else the next DispatchSend
// hands the combine buffer back. A pipelined step in received order passes
// the rows the step has (the counts read back) as the host-count path
// does, not the whole receive buffer.
func runStep(t *testing.T, rk *emuRank, st *refStep, m mode, release bool, name string) error {
	w, b, d, r := st.w, rk.b, rk.eng, rk.r
	K, C, R, N := w.K, w.C, w.R(), st.tokens[r]
	order := st.order
	if m.fused {
		order = 0
	}
	tol := tolerance(w.dt)
	check := func(what string, err error) {
		if err != nil {
			t.Errorf("%s, rank %d, %s: %v", name, r, what, err)
		}
	}
	if got := d.RecvBound(); got != R {
		return fmt.Errorf("RecvBound %d, want %d", got, R)
	}

	// Dispatch.
	x := upload(b, w.dt, st.x[r], N, C)
	idx := uploadInts(b, st.idx[r], N, K)
	if err := d.DispatchSend(x, idx, st.cf); err != nil {
		return err
	}
	recv := poisoned(b, w.dt, R, C)
	if m.fused {
		if err := d.DispatchRecvFused(recv); err != nil {
			return err
		}
		d.StreamWaitRows() // every block's counter at its target, or an error naming the block
	} else if err := d.DispatchRecv(recv, order); err != nil {
		return err
	}
	got, err := floats(b, recv)
	if err != nil {
		return err
	}
	check("received rows", compare("recv", C, got, st.recv(r, order), 0))
	cnt, err := d.ReadCounts()
	if err != nil {
		return err
	}
	M := len(st.rows(r, order))
	if cnt.Rows != M || cnt.Refused != -1 {
		t.Errorf("%s, rank %d: counts: %d rows, refused %d, want %d rows, none refused", name, r, cnt.Rows, cnt.Refused, M)
	}
	for s := range w.P {
		if !slices.Equal(cnt.Header[s], st.hdr[r][s]) {
			t.Errorf("%s, rank %d: header row of source %d is %v, want %v (slots per expert, tokens, rows sent here)", name, r, s, cnt.Header[s], st.hdr[r][s])
		}
	}
	off, err := ints(b, d.Offsets())
	if err != nil {
		return err
	}
	if want := st.offsets(r); !slices.Equal(off, want) {
		t.Errorf("%s, rank %d: offsets %v, want %v", name, r, off, want)
	}
	if pos, err := ints(b, d.Pos()); err != nil {
		return err
	} else if want := st.pos(r); !slices.Equal(pos, want) {
		t.Errorf("%s, rank %d: slot table %v, want %v", name, r, pos, want)
	}
	roe, err := ints(b, d.RecvOfExp())
	if err != nil {
		return err
	}
	eor, err := ints(b, d.ExpOfRecv())
	if err != nil {
		return err
	}
	at := map[slot]int{}
	for i, sl := range st.recvOrder[r] {
		at[sl] = i
	}
	for i, sl := range st.expMajor[r] {
		if int(roe[i]) != at[sl] || int(eor[at[sl]]) != i {
			t.Errorf("%s, rank %d: expert-major row %d (source %d, token %d, choice %d) maps to received row %d and back to %d, want %d and %d",
				name, r, i, sl.s, sl.n, sl.j, roe[i], eor[at[sl]], at[sl], i)
			break
		}
	}
	if m.fused {
		if err := checkFused(rk, off, m.early); err != nil {
			t.Errorf("%s, rank %d, after the dispatch: %v", name, r, err)
		}
	}

	// Combine: expert outputs y in the step's order go home; out = Σ w·y.
	y := upload(b, w.dt, st.y[r], R, C)
	rows := func(t *tensor.Tensor) (*tensor.Tensor, error) {
		if m.fused || order == 0 {
			return t, nil
		}
		return t.Rows(0, M)
	}
	gemm := func(dst, src *tensor.Tensor) func() error {
		// The down GEMM that writes the rows the send waits for, and its
		// flags (the emulator's GEMM has no epilogue hook).
		return func() error {
			b.Copy(dst, src)
			d.StreamSignalDone()
			return b.Err()
		}
	}
	if m.fused {
		ye := poisoned(b, w.dt, R, C)
		defer b.Free(ye)
		if err := d.CombineSendFused(ye, gemm(ye, y)); err != nil {
			return err
		}
	} else if yv, err := rows(y); err != nil {
		return err
	} else if err := d.CombineSend(yv, order); err != nil {
		return err
	}
	wts := upload(b, w.dt, st.wts[r], N, K)
	out := poisoned(b, w.dt, N, C)
	if err := d.CombineRecv(out, wts); err != nil {
		return err
	}
	if got, err = floats(b, out); err != nil {
		return err
	}
	check("combine", compare("out", C, got, st.combine(r, order), tol))

	// Combine backward: ∂out home → every expert row w·∂out; dweights here.
	dout := upload(b, w.dt, st.dout[r], N, C)
	dw := poisoned(b, w.dt, N, K)
	if err := d.CombineBackwardSend(dout, wts, dw); err != nil {
		return err
	}
	dy := poisoned(b, w.dt, R, C)
	if m.fused {
		if err := d.CombineBackwardRecvFused(dy); err != nil {
			return err
		}
		d.StreamWaitRows()
	} else if err := d.CombineBackwardRecv(dy, order); err != nil {
		return err
	}
	if got, err = floats(b, dw); err != nil {
		return err
	}
	check("dweights", compare("dweights", K, got, st.dweights(r, order), tol))
	if got, err = floats(b, dy); err != nil {
		return err
	}
	check("combine backward rows", compare("dy", C, got, st.dy(r, order), tol))
	if m.fused {
		if err := checkFused(rk, off, m.early); err != nil {
			t.Errorf("%s, rank %d, after the combine backward: %v", name, r, err)
		}
	}

	// Dispatch backward: the rows' gradients g go home; dx = Σ g.
	g := upload(b, w.dt, st.g[r], R, C)
	if m.fused {
		ge := poisoned(b, w.dt, R, C)
		defer b.Free(ge)
		if err := d.DispatchBackwardSendFused(ge, gemm(ge, g)); err != nil {
			return err
		}
	} else if gv, err := rows(g); err != nil {
		return err
	} else if err := d.DispatchBackwardSend(gv, order); err != nil {
		return err
	}
	dx := poisoned(b, w.dt, N, C)
	if err := d.DispatchBackwardRecv(dx); err != nil {
		return err
	}
	if got, err = floats(b, dx); err != nil {
		return err
	}
	check("dispatch backward", compare("dx", C, got, st.dx(r, order), tol))
	if release {
		d.Release()
	}
	for _, v := range []*tensor.Tensor{x, idx, recv, y, wts, out, dout, dw, dy, g, dx} {
		b.Free(v)
	}
	return b.Sync()
}

// checkFused checks the fused path's blocks after its rows landed: the
// block table is Σ ⌈rows_e / 128⌉ over the offsets, every block's counter
// is at its target 128, and every source was landed by the stream mode
// says (the emulated ranks meet before each wait, so with early landing
// every source is already here for the backend's stream).
func checkFused(rk *emuRank, off []int32, early bool) error {
	b, d := rk.b, rk.eng
	blk, err := ints(b, d.FusedBlockTable())
	if err != nil {
		return err
	}
	q := 0
	for e := range len(off) - 1 {
		if int(blk[e]) != q {
			return fmt.Errorf("block table %v over offsets %v: entry %d is %d, want %d", blk, off, e, blk[e], q)
		}
		q += (int(off[e+1]-off[e]) + FusedBlockRows - 1) / FusedBlockRows
	}
	if int(blk[len(off)-1]) != q || q > d.Config().FusedBlocks() {
		return fmt.Errorf("block table %v over offsets %v: %d blocks, want %d (at most %d)", blk, off, blk[len(off)-1], q, d.Config().FusedBlocks())
	}
	cnt, err := u64s(b, d.FusedCounters())
	if err != nil {
		return err
	}
	for i, c := range cnt {
		if c != fusedTarget {
			return fmt.Errorf("block %d's counter is %d, want %d (128 − its rows, +1 per row landed)", i, c, fusedTarget)
		}
	}
	src, err := ints(b, d.FusedSources())
	if err != nil {
		return err
	}
	want := int32(claimSide)
	if early {
		want = claimMain
	}
	for s, v := range src[:d.Config().Ranks] {
		if v != want {
			return fmt.Errorf("source %d landed by stream %d, want %d (land early: %v): %v", s, v, want, early, src)
		}
	}
	return nil
}

// runWorld runs the steps on the world w in mode m and checks each; every
// other step ends without Release.
func runWorld(t *testing.T, w world, m mode, steps []*refStep) {
	t.Helper()
	if m.fused {
		defer SetFusedLandEarly(true)
		defer SetFusedSideSend(true)
		SetFusedLandEarly(m.early)
		SetFusedSideSend(m.early)
	}
	emulated(t, w.config(m.fused), func(rk *emuRank) error {
		for i, st := range steps {
			if err := runStep(t, rk, st, m, i%2 == 0, fmt.Sprintf("%v %v step %d (tokens %v, cf %v)", w, m, i, st.tokens, st.cf)); err != nil {
				return fmt.Errorf("step %d: %w", i, err)
			}
		}
		return nil
	})
}

// engineCases are the worlds and steps of the engine's tests: 2 and 3
// ranks, uneven token counts (a rank without tokens), an expert no token
// chooses in every step, capacity drops, top-1 to top-3, one local expert
// per rank, and steps of different counts back to back on the same
// buffers (their epochs, and rows a smaller step leaves stale).
var engineCases = []struct {
	w     world
	steps []stepCase
}{
	{world{P: 2, E: 4, K: 2, C: 8, Mt: 6, dt: tensor.Float32}, []stepCase{
		{tokens: []int{5, 2}, cf: 0, order: 0},
		{tokens: []int{3, 6}, cf: 1, order: 1},
		{tokens: []int{0, 4}, cf: 0.5, order: 0},
	}},
	{world{P: 3, E: 6, K: 2, C: 8, Mt: 5, dt: tensor.Float32}, []stepCase{
		{tokens: []int{4, 0, 5}, cf: 1, order: 0},
		{tokens: []int{2, 5, 1}, cf: 0, order: 1},
	}},
	{world{P: 3, E: 3, K: 1, C: 4, Mt: 4, dt: tensor.Float32}, []stepCase{
		{tokens: []int{4, 3, 1}, cf: 0.75, order: 1},
	}},
	{world{P: 2, E: 4, K: 3, C: 16, Mt: 4, dt: tensor.BFloat16}, []stepCase{
		{tokens: []int{4, 3}, cf: 0.75, order: 1},
		{tokens: []int{1, 4}, cf: 0, order: 0},
	}},
}

// drawSteps draws the steps of a case, and checks that the draws cover
// what the case is for: a capacity factor drops some slot.
func drawSteps(t *testing.T, w world, cases []stepCase) []*refStep {
	t.Helper()
	var steps []*refStep
	for i, sc := range cases {
		st := newStep(w, sc, uint64(100*w.P+10*w.E+i))
		if sc.cf > 0 && sc.cf < 1 && st.dropped == 0 {
			t.Fatalf("%v step %d: capacity factor %v drops nothing: the draw does not test drops", w, i, sc.cf)
		}
		steps = append(steps, st)
	}
	return steps
}

// TestEmuPipelined: the pipelined engine's dispatch (tokens once per
// rank, expanded into expert rows in either order), combine, combine
// backward (dweights, w·∂out rows) and dispatch backward agree with the
// float64 reference on every rank: the moves bit for bit, the sums within
// the dtype's rounding; the counts, the offsets, the slot table and the
// maps between the two orders match, and no row past the step's is
// written.
func TestEmuPipelined(t *testing.T) {
	for _, tc := range engineCases {
		t.Run(tc.w.String(), func(t *testing.T) {
			runWorld(t, tc.w, mode{}, drawSteps(t, tc.w, tc.steps))
		})
	}
}

// TestEmuFused: the fused engine (counts ahead of the tokens, per-block
// counters, the flag-driven sends) gives the reference's rows and sums
// too, with each source landed on the backend's stream before the GEMM and
// each block sent from the side launch, and with both left to the other
// paths; its block table, counters and landing streams are as the
// protocol says.
func TestEmuFused(t *testing.T) {
	for _, tc := range engineCases {
		steps := drawSteps(t, tc.w, tc.steps)
		for _, early := range []bool{true, false} {
			m := mode{fused: true, early: early}
			t.Run(tc.w.String()+"/"+m.String(), func(t *testing.T) {
				runWorld(t, tc.w, m, steps)
			})
		}
	}
}

// TestEmuFusedBlocks: an expert with more than one 128-row block, another
// with rows, one without: the fused combine sends every 16-row unit of
// every block and the counters reach their target per block.
func TestEmuFusedBlocks(t *testing.T) {
	w := world{P: 2, E: 4, K: 1, C: 4, Mt: 160, dt: tensor.Float32}
	steps := drawSteps(t, w, []stepCase{{tokens: []int{160, 150}}})
	if n := len(steps[0].slotsOf(0, steps[0].hot)) + len(steps[0].slotsOf(1, steps[0].hot)); n <= FusedBlockRows {
		t.Fatalf("the hot expert has %d rows, want more than one block of %d", n, FusedBlockRows)
	}
	for _, early := range []bool{true, false} {
		m := mode{fused: true, early: early}
		t.Run(m.String(), func(t *testing.T) { runWorld(t, w, m, steps) })
	}
}
