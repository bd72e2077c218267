package ablate

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
)

// Rank is one rank's side of a batch of cells, all of one world and
// transport: every rank of the group calls Run with the same cells.
type Rank struct {
	Group   comm.Comm
	Backend tensor.Backend
	Stream  comm.Stream // the backend's stream (nil on the CPU)
	Timer   Timer
	// Strategies by matrix name (Collective, Pipelined, …); collective
	// must be there. A test can put a broken one under any name.
	Strategies map[string]overlap.Strategy
	Seed       uint64
	Warmup     int
	Reps       int
	// Engine, when not nil, is the GEMM engine of the fused strategy
	// (cudabackend.EngineMatMul; it refuses the calls the engine cannot
	// run): the GEMMs alone of a group with a fused cell are also timed on
	// it, for the fused cells' ceiling.
	Engine MatMulFunc
	// Done, when not nil, is called on every rank after each cell.
	Done func(Result)
	// Transports name the transports of the group's collectives and of
	// its symmetric memory, for Result.Via ("" where there is none).
	Collectives, Symmetric string
}

// Run verifies and times the cells, group by group (Cell.Group): the
// group's inputs are made once; the collective runs first and is checked
// at sampled elements against the math in float64; every other strategy
// is checked against the collective's outputs on the same inputs (a wrong
// one is reported, not timed); then the GEMMs alone and the collective
// alone are timed for the ceiling. Cells Runnable refuses are returned as
// not run. An error is returned only when the ranks cannot go on together.
func (r *Rank) Run(cells []Cell) ([]Result, error) {
	var out []Result
	for i := 0; i < len(cells); {
		j := i
		for j < len(cells) && cells[j].Group() == cells[i].Group() {
			j++
		}
		rs, err := r.group(cells[i:j])
		out = append(out, rs...)
		if err != nil {
			return out, err
		}
		i = j
	}
	return out, nil
}

func (r *Rank) done(res Result) Result {
	if r.Done != nil {
		r.Done(res)
	}
	return res
}

// group runs the cells of one group: each strategy's site is built and
// checked (collective first, against the math; the others against
// collective), then the verified ones are timed together in interleaved
// rounds (timeRounds), then the collective's GEMMs alone and collective
// alone.
func (r *Rank) group(cells []Cell) ([]Result, error) {
	cells = append([]Cell(nil), cells...)
	sort.SliceStable(cells, func(i, j int) bool { return cells[i].Strategy == Collective && cells[j].Strategy != Collective })
	dt := DTypeOf(cells[0].DType)
	tol := TolFor(cells[0].Op, dt)
	out := make([]Result, 0, len(cells))
	finish := func() []Result {
		for _, x := range out {
			r.done(x)
		}
		return out
	}
	fail := func(c Cell, status, why string) {
		out = append(out, Result{Cell: c, Status: status, Reason: why, Tol: tol})
	}
	oc, err := newCase(cells[0], gen{seed: r.Seed, dt: dt}, r.Backend, r.Group, r.Stream)
	if err != nil {
		for _, c := range cells {
			fail(c, StatusFailed, err.Error())
		}
		return finish(), nil
	}
	var ref [][]float64
	fused := false // a fused cell the strategy supports: time the engine alone too
	for _, c := range cells {
		if s, ok := r.Strategies[c.Strategy]; ok && c.Strategy == Fused && supports(s, oc) == nil {
			fused = true
		}
	}
	var timed []int // indices into out of the verified cells
	var runs []func() error
	var closers []func() error
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	for _, c := range cells {
		s, ok := r.Strategies[c.Strategy]
		if !ok {
			fail(c, StatusNotRun, fmt.Sprintf("strategy %s is not built in this run", c.Strategy))
			continue
		}
		// The strategy's own refusal first: it is why the cell cannot run,
		// whatever happened to the collective.
		if err := supports(s, oc); err != nil {
			res := Result{Cell: c, Status: StatusNotRun, Reason: err.Error(), Tol: tol}
			res.SpecK, res.SpecOuts = specWidths(oc.spec())
			out = append(out, res)
			continue
		}
		if c.Strategy != Collective && ref == nil {
			fail(c, StatusNotRun, "no collective reference for this group (the collective cell did not pass)")
			continue
		}
		res, run, closeSite, err := r.check(c, s, oc, &ref, tol)
		if closeSite != nil {
			closers = append(closers, closeSite)
		}
		if err != nil {
			out = append(out, res)
			return finish(), err
		}
		if run != nil {
			timed = append(timed, len(out))
			runs = append(runs, run)
		}
		out = append(out, res)
	}
	if len(timed) == 0 {
		return finish(), nil
	}
	ts, err := r.timeRounds(runs)
	if err != nil {
		for _, i := range timed {
			out[i].Status, out[i].Reason = StatusFailed, err.Error()
		}
		return finish(), nil
	}
	for k, i := range timed {
		out[i].setTimes(ts[k])
	}
	var gemmUS, commUS float64
	var eng engineTime
	if out[timed[0]].Strategy == Collective {
		if gemmUS, commUS, err = r.alone(oc); err != nil {
			return finish(), err
		}
		if fused {
			if eng, err = r.engineAlone(oc); err != nil {
				return finish(), err
			}
		}
	}
	for _, i := range timed {
		out[i].GemmUS, out[i].CommUS = gemmUS, commUS
		if out[i].Strategy == Fused {
			out[i].EngineGemmUS, out[i].EngineNote = eng.us, eng.note
		}
	}
	return finish(), nil
}

// setTimes records the cell's timed rounds (µs, the slowest rank's of
// each, to the ns): the samples, their median and spread.
func (res *Result) setTimes(ts []float64) {
	res.Status, res.Reps = StatusOK, len(ts)
	res.TimesUS = make([]float64, len(ts))
	for i, t := range ts {
		res.TimesUS[i] = math.Round(t*1000) / 1000
	}
	sorted := append([]float64(nil), res.TimesUS...)
	sort.Float64s(sorted)
	res.MedianUS, res.P10US, res.P90US = medianSorted(sorted), percentile(sorted, 0.1), percentile(sorted, 0.9)
}

// timeRounds times the runs of one group together: Warmup rounds, then
// Reps rounds, each running every run once in an order that rotates from
// round to round (run k first in round k mod n), each call after a sync
// and a barrier. It returns per run the timed rounds' µs, each the slowest
// rank's time of that call; the warm-up rounds are discarded.
func (r *Rank) timeRounds(runs []func() error) ([][]float64, error) {
	n := len(runs)
	total := r.Warmup + r.Reps
	flat := make([]float64, n*r.Reps)
	for round := range total {
		for j := range n {
			k := (round + j) % n
			if err := r.Backend.Sync(); err != nil {
				return nil, err
			}
			if err := r.Group.Barrier(); err != nil {
				return nil, err
			}
			d, err := r.Timer.Time(runs[k])
			if err != nil {
				return nil, err
			}
			if round >= r.Warmup {
				flat[k*r.Reps+round-r.Warmup] = float64(d) / float64(time.Microsecond)
			}
		}
	}
	flat, err := r.maxEach(flat)
	if err != nil {
		return nil, err
	}
	out := make([][]float64, n)
	for k := range out {
		out[k] = flat[k*r.Reps : (k+1)*r.Reps]
	}
	return out, nil
}

// specWidths are the spec's K and the sum of its output widths (the
// autotune key's).
func specWidths(sp overlap.Spec) (k, outs int) {
	for _, o := range sp.Outs {
		outs += o
	}
	return sp.K, outs
}

// layerSites is an op whose cells hold many sites (the layer cells): the
// site kinds its direction has.
type layerSites interface{ siteKinds() []overlap.Kind }

// supports is s.Supports of the op's spec; for a layer cell (many sites,
// one strategy, the others falling back to collective where s has no form)
// s must support one of its site kinds.
func supports(s overlap.Strategy, oc opCase) error {
	sp := oc.spec()
	ls, ok := oc.(layerSites)
	if !ok || sp.Kind != "" {
		return s.Supports(sp)
	}
	var first error
	for _, k := range ls.siteKinds() {
		sp.Kind = k
		err := s.Supports(sp)
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// engineTime is the GEMMs alone of a group on the GEMM engine: µs, or why
// there is no time.
type engineTime struct {
	us   float64
	note string
}

// engineAlone times the op's GEMMs with r.Engine where the fused strategy
// runs them on the engine (engineGemmer.gemmWith).
func (r *Rank) engineAlone(oc opCase) (engineTime, error) {
	eg, ok := oc.(engineGemmer)
	switch {
	case r.Engine == nil:
		return engineTime{note: "no GEMM engine in this run"}, nil
	case !ok:
		return engineTime{note: "this op has no GEMM alone"}, nil
	}
	// A refusal (the engine's shape rules) is the same on every rank: the
	// ranks have the same shapes.
	if err := eg.gemmWith(r.Engine); err != nil {
		return engineTime{note: "the engine refuses this op's GEMMs: " + err.Error()}, nil
	}
	ts, err := r.time(func() error { return eg.gemmWith(r.Engine) })
	if err != nil {
		return engineTime{}, err
	}
	return engineTime{us: median(ts)}, nil
}

// via says how the site of sp moves its data with s, and over which
// transport (overlap.Describer).
func (r *Rank) via(s overlap.Strategy, sp overlap.Spec) string {
	how, sym := "the group's collectives", false
	if d, ok := s.(overlap.Describer); ok {
		if h, y := d.Via(sp); h != "" {
			how, sym = h, y
		}
	}
	switch {
	case sym && r.Symmetric != "":
		how += " over " + r.Symmetric
	case !sym && r.Collectives != "":
		how += " over " + r.Collectives
	}
	return how
}

// check builds the cell's site and checks one call of it; run is the
// call, for the timing, when the cell passed (nil otherwise); closeSite,
// when not nil, releases the site (after the timing).
func (r *Rank) check(c Cell, s overlap.Strategy, oc opCase, ref *[][]float64, tol float64) (res Result, run, closeSite func() error, err error) {
	sp := oc.spec()
	res = Result{Cell: c, Tol: tol, Flops: oc.flops(), CommBytes: oc.bytes(), BusFactor: oc.busFactor()}
	res.SpecK, res.SpecOuts = specWidths(sp)
	res.Via = r.via(s, sp)
	run, closeSite, err = oc.site(s)
	if err != nil {
		res.Status, res.Reason = StatusFailed, err.Error()
		return res, nil, nil, nil
	}
	oc.reset()
	var got [][]float64
	var e float64
	runErr := run()
	if runErr == nil {
		if ho, ok := oc.(hostOutputter); ok {
			if got, err = ho.hostOutputs(); err != nil {
				return res, nil, closeSite, err
			}
		}
		for _, o := range oc.outputs() {
			v, err := download(r.Backend, o)
			if err != nil {
				return res, nil, closeSite, err
			}
			got = append(got, v)
		}
		if c.Strategy == Collective {
			res.Verified = "sampled elements against the math in float64"
			if c.Op == OpMoEDispatchCombine {
				res.Verified = "combine(dispatch(x)) with identity experts = x·Σw, in float64"
			}
			if v, ok := oc.(verifier); ok {
				res.Verified = v.verified()
			}
			e = oc.sampled(got)
		} else {
			res.Verified = "against collective on the same inputs"
			for i := range got {
				e = math.Max(e, relErr(got[i], (*ref)[i]))
			}
		}
		if math.IsInf(e, 1) || math.IsNaN(e) {
			e = nanErr
		}
	} else {
		e = failedErr
	}
	// Every rank learns the worst error, or that one failed.
	e, err = r.maxOver(e)
	if err != nil {
		return res, nil, closeSite, err
	}
	switch {
	case e >= failedErr:
		res.Status, res.Reason = StatusFailed, "another rank failed"
		if runErr != nil {
			res.Reason = runErr.Error()
		}
		return res, nil, closeSite, nil
	case e >= nanErr:
		res.RelErr, res.Status, res.Reason = e, StatusWrong, "its output has NaN (unwritten elements)"
		return res, nil, closeSite, nil
	}
	res.RelErr = e
	if !(e <= tol) {
		res.Status, res.Reason = StatusWrong, fmt.Sprintf("relative error %.3g against the reference: expected ≤ %.0e", e, tol)
		return res, nil, closeSite, nil
	}
	if c.Strategy == Collective {
		*ref = got
	}
	return res, run, closeSite, nil
}

// alone times the op's GEMMs and its collective separately (the ceiling
// model's parts: medians of at most aloneReps calls).
func (r *Rank) alone(oc opCase) (gemmUS, commUS float64, err error) {
	if err := oc.gemm(); errors.Is(err, errNoSplit) {
		return 0, 0, nil
	}
	g, err := r.time(oc.gemm)
	if err != nil {
		return 0, 0, err
	}
	c, err := r.time(oc.comm)
	if err != nil {
		return 0, 0, err
	}
	return median(g), median(c), nil
}

// aloneReps bounds the calls time makes: the parts alone feed only the
// ceiling model, no comparison.
const aloneReps = 10

// time runs fn once to warm up (when the matrix has warm-up rounds), then
// min(Reps, aloneReps) times, each after a barrier, and returns per call
// the slowest rank's time in µs.
func (r *Rank) time(fn func() error) ([]float64, error) {
	if r.Warmup > 0 {
		if err := fn(); err != nil {
			return nil, err
		}
	}
	ts := make([]float64, min(r.Reps, aloneReps))
	for i := range ts {
		if err := r.Backend.Sync(); err != nil {
			return nil, err
		}
		if err := r.Group.Barrier(); err != nil {
			return nil, err
		}
		d, err := r.Timer.Time(fn)
		if err != nil {
			return nil, err
		}
		ts[i] = float64(d) / float64(time.Microsecond)
	}
	return r.maxEach(ts)
}

// Sentinels of maxOver: an output with a NaN, and a rank whose run failed.
const (
	nanErr    = 1e30
	failedErr = math.MaxFloat32
)

// maxOver is the largest v of the group's ranks.
func (r *Rank) maxOver(v float64) (float64, error) {
	m, err := r.maxEach([]float64{v})
	if err != nil {
		return 0, err
	}
	return m[0], nil
}

// maxEach is the elementwise maximum of vs over the group (in float32).
func (r *Rank) maxEach(vs []float64) ([]float64, error) {
	if r.Group.Size() == 1 {
		return vs, nil
	}
	h := tensor.MustHost(tensor.Float32, len(vs))
	for i, v := range vs {
		h.F32()[i] = float32(math.Min(v, math.MaxFloat32))
	}
	d := r.Backend.Zeros(tensor.Float32, len(vs))
	defer r.Backend.Free(d)
	r.Backend.Upload(d, h)
	if err := waitOn(r.Stream)(r.Group.AllReduce(d, comm.Max, r.Stream)); err != nil {
		return nil, fmt.Errorf("ablate: agreeing on the times: %w", err)
	}
	r.Backend.Download(h, d)
	if err := r.Backend.Sync(); err != nil {
		return nil, err
	}
	out := make([]float64, len(vs))
	for i := range out {
		out[i] = float64(h.F32()[i])
	}
	return out, nil
}
