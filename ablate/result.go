package ablate

import (
	"math"
	"sort"
)

// Statuses of a result.
const (
	StatusOK     = "ok"      // verified, then timed
	StatusWrong  = "wrong"   // its numbers differ from the reference: not timed
	StatusNotRun = "not-run" // cannot run here (Reason says why)
	StatusFailed = "failed"  // an error while building or running it
)

// Result is one cell's outcome. Times are in microseconds: each timed
// round's call is the slowest rank's time of it; MedianUS is their median.
type Result struct {
	Cell
	Status   string `json:"status"`
	Reason   string `json:"reason,omitempty"`
	Verified string `json:"verified,omitempty"` // what it was checked against
	// Via is how the cell's group moved its data, and over which
	// transport: the group's collectives, or its symmetric memory (a
	// hybrid world's cells differ by strategy).
	Via    string  `json:"via,omitempty"`
	RelErr float64 `json:"rel_err"` // ‖out − ref‖ / ‖ref‖
	Tol    float64 `json:"tol"`

	Reps int `json:"reps,omitempty"` // timed rounds
	// TimesUS are the timed rounds, in order: round i of every strategy of
	// the group ran in the same round, so they pair.
	TimesUS  []float64 `json:"times_us,omitempty"`
	MedianUS float64   `json:"median_us,omitempty"`
	P10US    float64   `json:"p10_us,omitempty"` // the spread: 10th and 90th percentiles
	P90US    float64   `json:"p90_us,omitempty"`
	GemmUS   float64   `json:"gemm_us,omitempty"` // the op's GEMMs alone (same shape, world, transport)
	CommUS   float64   `json:"comm_us,omitempty"` // its collective alone
	// EngineGemmUS is the GEMMs alone with the fused strategy's GEMM
	// engine where it uses it (the backend's cuBLASLt for the rest), fused
	// cells only; EngineNote says why there is none.
	EngineGemmUS float64 `json:"engine_gemm_us,omitempty"`
	EngineNote   string  `json:"engine_note,omitempty"`

	Flops     float64 `json:"flops_per_rank,omitempty"`
	CommBytes float64 `json:"comm_bytes,omitempty"` // the collective's message (nccl-tests: the larger of input and output)
	BusFactor float64 `json:"bus_factor,omitempty"` // busbw = algbw · this

	// Spec is the site's shape as overlap sees it (the autotune key).
	SpecK    int `json:"spec_k,omitempty"`
	SpecOuts int `json:"spec_outs,omitempty"`

	Metrics
}

// Metrics are the figures derived from the times (Derive).
type Metrics struct {
	TFLOPS      float64 `json:"tflops,omitempty"`       // per rank
	AlgBW       float64 `json:"algbw_gbps,omitempty"`   // of the collective alone
	BusBW       float64 `json:"busbw_gbps,omitempty"`   //
	Speedup     float64 `json:"speedup,omitempty"`      // collective's median / this median (same transport and world ≥ 2)
	OverlapEff  float64 `json:"overlap_eff,omitempty"`  // 1 − (T − T_gemm) / T_comm
	Ceiling     float64 `json:"ceiling,omitempty"`      // (T_gemm + T_comm) / max(T_gemm, T_comm)
	CeilingFrac float64 `json:"ceiling_frac,omitempty"` // Speedup / Ceiling
	// CollectiveUS is the collective cell's time of the group.
	CollectiveUS float64 `json:"collective_us,omitempty"`
	// VsCollective compares this cell's rounds with the collective's,
	// round by round (non-collective cells with both timed): at world 1
	// the cost of the strategy's machinery, elsewhere whether it is faster.
	VsCollective *Interval `json:"vs_collective,omitempty"`
	// The same model with the GEMM engine's time alone as T_gemm (fused
	// cells with EngineGemmUS): how well the fused cell hides the comm
	// behind its own GEMM, whatever that GEMM's speed. The unfused time is
	// then T_engine + T_comm, so the fraction of the ceiling is
	// max(T_engine, T_comm) / T.
	EngineOverlapEff  float64 `json:"engine_overlap_eff,omitempty"`
	EngineCeiling     float64 `json:"engine_ceiling,omitempty"`
	EngineCeilingFrac float64 `json:"engine_ceiling_frac,omitempty"`
}

// ceilingModel is FUSED.md's model of a cell of time t whose GEMMs alone
// take gemm and whose collective alone takes comm, against an unfused time
// unfused (0: none measured): the overlap efficiency 1 − (t − gemm)/comm,
// the ceiling (gemm + comm)/max(gemm, comm) and the fraction of it that
// the speedup unfused/t reaches; zeros without both parts.
func ceilingModel(t, gemm, comm, unfused float64) (eff, ceiling, frac float64) {
	if gemm <= 0 || comm <= 0 || t <= 0 {
		return 0, 0, 0
	}
	eff = 1 - (t-gemm)/comm
	ceiling = (gemm + comm) / math.Max(gemm, comm)
	if unfused > 0 {
		frac = unfused / t / ceiling
	}
	return eff, ceiling, frac
}

// Timed says whether the result has times.
func (r Result) Timed() bool { return r.Status == StatusOK && r.MedianUS > 0 }

// Derive fills the metrics of the timed results: the speedup is over the
// collective cell of the same group, and the comparison of their rounds
// is at st's level.
func Derive(rs []Result, st Stats) {
	coll := map[string]float64{}
	collTimes := map[string][]float64{}
	for _, r := range rs {
		if r.Strategy == Collective && r.Timed() {
			coll[r.Group()] = r.MedianUS
			collTimes[r.Group()] = r.TimesUS
		}
	}
	for i := range rs {
		r := &rs[i]
		if !r.Timed() {
			continue
		}
		m := Metrics{}
		if r.Flops > 0 {
			m.TFLOPS = r.Flops / (r.MedianUS * 1e-6) / 1e12
		}
		if r.CommUS > 0 && r.CommBytes > 0 {
			m.AlgBW = r.CommBytes / (r.CommUS * 1e-6) / 1e9
			m.BusBW = m.AlgBW * r.BusFactor
		}
		if c, ok := coll[r.Group()]; ok {
			m.CollectiveUS = c
			if r.World > 1 { // world 1 exchanges nothing: no speedup to speak of
				m.Speedup = c / r.MedianUS
			}
			if r.Strategy != Collective && len(r.TimesUS) > 0 {
				iv := st.compare(r.TimesUS, collTimes[r.Group()])
				m.VsCollective = &iv
			}
		}
		if r.World > 1 {
			m.OverlapEff, m.Ceiling, m.CeilingFrac = ceilingModel(r.MedianUS, r.GemmUS, r.CommUS, m.CollectiveUS)
			m.EngineOverlapEff, m.EngineCeiling, m.EngineCeilingFrac = ceilingModel(r.MedianUS, r.EngineGemmUS, r.CommUS, r.EngineGemmUS+r.CommUS)
		}
		r.Metrics = m
	}
}

// percentile of sorted values (nearest rank).
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Round(p * float64(len(sorted)-1)))
	return sorted[i]
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return medianSorted(s)
}
