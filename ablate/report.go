package ablate

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Report is a whole run: what results.json holds, and what report.md and
// report.html show.
type Report struct {
	Command   string     `json:"command"`
	Started   time.Time  `json:"started"`
	Duration  string     `json:"duration"`
	Matrix    Matrix     `json:"matrix"`
	Env       Env        `json:"env"`
	Results   []Result   `json:"results"`
	Torch     []TorchRow `json:"torch,omitempty"`
	TorchNote string     `json:"torch_note,omitempty"`
	// Stats are the run's significance settings, with the number of its
	// comparisons (Stats.For); Answers the short answer.
	Stats   Stats    `json:"stats"`
	Answers []Answer `json:"answers,omitempty"`
	Cache   string   `json:"autotune_cache,omitempty"`
	Tuned   []Entry  `json:"autotune,omitempty"`
	Charts  []string `json:"charts,omitempty"`
	charts  []Chart
}

// Files names what Write writes.
var Files = []string{"report.md", "report.html", "results.json"}

func f1(v float64) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f", v)
}

func f2(v float64) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", v)
}

func pct(v float64) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f %%", 100*v)
}

func shapeCell(s Shape) string {
	if s.Name == "-" {
		return "–"
	}
	if s.Heads > 0 {
		return s.layerString()
	}
	if s.Experts > 0 {
		return fmt.Sprintf("%s %d×%d E%d top%d", s.Name, s.M, s.N, s.Experts, s.TopK)
	}
	return fmt.Sprintf("%s %d×%d×%d", s.name(), s.M, s.N, s.K)
}

// vsText is a cell's comparison with collective: at world 1 the cost of
// the strategy's machinery, elsewhere the speedup with its interval and
// verdict.
func vsText(x Result) string {
	if x.VsCollective == nil {
		return "–"
	}
	if x.World == 1 {
		return "machinery " + x.VsCollective.CostText()
	}
	return x.VsCollective.SpeedupText() + ", " + x.VsCollective.verdictText()
}

// FusedTable is one row per timed fused cell (see blocks), and a note on
// the fused cells of the run when none was timed.
func (r *Report) FusedTable() (head []string, rows [][]string, note string) {
	head = []string{"op", "shape", "P", "transport", "dtype", "fused µs", "collective µs", "pipelined µs", "GEMM alone µs cuBLASLt / engine",
		"comm alone µs", "overlap eff. cuBLASLt / engine", "ceiling cuBLASLt / engine", "of ceiling cuBLASLt / engine", "note"}
	pipe := map[string]*Result{} // the fastest timed pipelined cell of each group
	count := map[string]int{}
	for i := range r.Results {
		x := &r.Results[i]
		if x.Strategy == Fused {
			count[x.Status]++
		}
		if x.Strategy == Pipelined && x.Timed() {
			if p := pipe[x.Group()]; p == nil || x.MedianUS < p.MedianUS {
				pipe[x.Group()] = x
			}
		}
	}
	for i := range r.Results {
		x := &r.Results[i]
		if x.Strategy != Fused || !x.Timed() {
			continue
		}
		pipeUS := "–"
		if p := pipe[x.Group()]; p != nil {
			pipeUS = fmt.Sprintf("%.1f (%s)", p.MedianUS, p.Strategy)
		}
		n := x.EngineNote
		if x.World == 1 {
			n = strings.TrimPrefix(n+"; ", "; ") + "world 1: nothing to exchange, the strategy runs collective's call"
		}
		rows = append(rows, []string{short(x.Op) + " " + x.Dir, shapeCell(x.Shape), fmt.Sprint(x.World), x.Transport, x.DType,
			fmt.Sprintf("%.1f (%.1f–%.1f)", x.MedianUS, x.P10US, x.P90US), f1(x.CollectiveUS), pipeUS,
			f1(x.GemmUS) + " / " + f1(x.EngineGemmUS), f1(x.CommUS),
			f2(x.OverlapEff) + " / " + f2(x.EngineOverlapEff), f2(x.Ceiling) + " / " + f2(x.EngineCeiling),
			pct(x.CeilingFrac) + " / " + pct(x.EngineCeilingFrac), n})
	}
	if len(rows) == 0 {
		total := 0
		for _, c := range count {
			total += c
		}
		note = fmt.Sprintf("No fused cell was timed in this run: of %d fused cells, %d cannot run here (listed below with the strategy's reason), "+
			"%d were wrong and %d failed.", total, count[StatusNotRun], count[StatusWrong], count[StatusFailed])
	}
	return head, rows, note
}

// AnswerText is the short answer in plain columns (the terminal): world ≥
// 2, then world 1's machinery costs.
func (r *Report) AnswerText() string {
	var b strings.Builder
	for _, w1 := range []bool{false, true} {
		head, rows := answerRows(r.Answers, w1)
		if len(rows) > 0 {
			b.WriteString(columns(head, rows) + "\n")
		}
	}
	b.WriteString(r.statsNote() + "\n")
	return b.String()
}

// columns is a table in plain columns.
func columns(head []string, rows [][]string) string {
	w := make([]int, len(head))
	for i, h := range head {
		w[i] = len([]rune(h))
	}
	for _, row := range rows {
		for i, c := range row {
			w[i] = max(w[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	line := func(cs []string) {
		for i, c := range cs {
			fmt.Fprintf(&b, "%-*s  ", w[i], c)
		}
		b.WriteString("\n")
	}
	line(head)
	for _, row := range rows {
		line(row)
	}
	return b.String()
}

// statsNote says how the answer tells a difference from noise.
func (r *Report) statsNote() string {
	st := r.Stats
	n := fmt.Sprintf("Each figure is the median over %d interleaved rounds (after %d discarded warm-up rounds) of the per-round time ratio to collective, "+
		"with its %.4g %% interval (order statistics of the median; %d comparisons, so all intervals hold together with probability ≥ %.0f %%); "+
		"faster or slower only beyond the interval and by more than %.0f %%, and only when both halves of the rounds, in the order they ran, show it too "+
		"(each half's own %.0f %% interval on that side of 1: the difference held through the run).",
		r.Matrix.Reps, r.Matrix.Warmup, 100*st.Level(), st.Comparisons, 100*(1-st.Alpha), 100*st.MinEffect, 100*(1-st.Alpha))
	if need := MinRounds(st.Alpha, st.Comparisons); r.Matrix.Reps < need {
		n += fmt.Sprintf(" With %d rounds no comparison can be significant at this level: use --reps %d or more.", r.Matrix.Reps, need)
	}
	return n
}

// cacheSummary counts the cache's choices.
func (r *Report) cacheSummary() string {
	if r.Cache == "" {
		return ""
	}
	byChoice := map[string]int{}
	sig, coll, none := 0, 0, 0
	for _, e := range r.Tuned {
		switch {
		case e.Strategy != Collective:
			byChoice[e.Strategy]++
			sig++
		case e.Significant:
			coll++
		default:
			none++
		}
	}
	var parts []string
	for _, n := range sortedInts(byChoice) {
		parts = append(parts, fmt.Sprintf("%d %s", byChoice[n], n))
	}
	chosen := "none chooses another strategy than collective"
	if sig > 0 {
		chosen = strings.Join(parts, ", ") + " (each faster than collective beyond the noise)"
	}
	return fmt.Sprintf("The autotune cache `%s` has %d entries from this run (one per site shape, world ≥ 2): %s; %d choose collective because the others are slower, "+
		"%d because there is no significant difference. `cmd/train --overlap auto --autotune-cache %s` picks from it.", r.Cache, len(r.Tuned), chosen, coll, none, r.Cache)
}

func sortedInts(m map[string]int) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

func (r *Report) blocks() []block {
	var bs []block
	add := func(kind, text string) { bs = append(bs, block{kind: kind, text: text}) }
	table := func(head []string, rows [][]string) { bs = append(bs, block{kind: "table", head: head, rows: rows}) }
	add("h1", "asynctp ablation: which communication strategy to use where")
	add("p", fmt.Sprintf("Command: `%s`. Started %s, took %s.", r.Command, r.Started.Format(time.RFC3339), r.Duration))
	add("h2", "The answer")
	add("p", "Per op, world size P ≥ 2 and transport: the strategy to use and by how much. Each other strategy is compared with collective over "+
		"all the op's cells there (shapes, token counts, directions): the typical speedup (per round the geometric mean of the cells' time ratios) "+
		"and its interval. A strategy is used only where it is faster than collective beyond the noise; otherwise collective, the reference.")
	ah, arows := answerRows(r.Answers, false)
	table(ah, arows)
	add("p", r.statsNote())
	if cs := r.cacheSummary(); cs != "" {
		add("p", cs)
	}
	if h, rows := answerRows(r.Answers, true); len(rows) > 0 {
		add("p", "At P = 1 (no other rank: nothing to exchange) every strategy runs the same math; the figures are the extra time of each "+
			"strategy's machinery over collective, with the same intervals:")
		table(h, rows)
	}
	count := map[string]int{}
	for _, x := range r.Results {
		count[x.Status]++
	}
	add("p", fmt.Sprintf("%d cells: %d verified and timed, %d wrong (not timed), %d failed, %d cannot run here (listed below with why). "+
		"Every timed cell was first checked: collective at sampled elements against the math in float64, every other strategy against collective "+
		"on the same inputs (tolerance bf16 1e-2, f32 1e-5, f64 1e-12). The layer cells (tp-block, moe-layer: forward + backward; train-step: "+
		"forward, backward, gradient reduction and the AdamW update) check their collective against the unsharded layers on one rank "+
		"(same seed, inputs, backend and dtype: outputs, input gradients, parameter gradients; the step's loss, gradients and updated weights), "+
		"tolerance bf16 5e-2, f32 1e-4, f64 1e-10; \"sp\" and \"nosp\" are their sequence parallelism, and the MoE block's expert path stays collective "+
		"while its TP sites take the strategy. Times: the median over %d repetitions (after %d warm-up calls) of the slowest rank's time; "+
		"spread p10–p90; every strategy of a cell group ran in the same rounds, alternating. \"Against collective\" is the median of the per-round "+
		"time ratios as a speedup, with its interval and verdict (at P = 1: the extra time of the strategy's machinery). The ceiling (P ≥ 2) is "+
		"(T_gemm + T_comm) / max(T_gemm, T_comm) with T_gemm the op's GEMMs alone and T_comm its collective alone; \"of ceiling\" is speedup / ceiling; "+
		"overlap efficiency 1 − (T − T_gemm) / T_comm.",
		len(r.Results), count[StatusOK], count[StatusWrong], count[StatusFailed], count[StatusNotRun], r.Matrix.Reps, r.Matrix.Warmup))
	for _, c := range r.charts {
		bs = append(bs, block{kind: "img", text: c.Title, file: c.File, png: c.PNG})
	}
	add("h2", "Every timed cell")
	var trows [][]string
	for _, x := range r.Results {
		if !x.Timed() {
			continue
		}
		trows = append(trows, []string{short(x.Op) + " " + x.Dir, shapeCell(x.Shape), fmt.Sprint(x.World), x.Transport, x.Strategy, x.DType,
			fmt.Sprintf("%.1f (%.1f–%.1f)", x.MedianUS, x.P10US, x.P90US), vsText(x), f2(x.TFLOPS), f1(x.GemmUS), f1(x.CommUS),
			f2(x.AlgBW) + " / " + f2(x.BusBW), f2(x.OverlapEff), f2(x.Ceiling), pct(x.CeilingFrac), fmt.Sprintf("%.1e", x.RelErr)})
	}
	table([]string{"op", "shape", "P", "transport", "strategy", "dtype", "µs median (p10–p90)", "against collective", "TFLOP/s per rank", "GEMM alone µs",
		"comm alone µs", "alg / bus GB/s", "overlap eff.", "ceiling", "of ceiling", "rel. err"}, trows)
	add("h2", "The fused cells")
	add("p", "Per timed fused cell: its time T, the collective's and the fastest pipelined strategy's of the same group, the op's GEMMs alone on "+
		"cuBLASLt (the backend's MatMul) and on our GEMM engine (where the fused strategy runs it: the forward, the backward's dx; the weight "+
		"gradients stay on cuBLASLt), its collective alone, and the ceiling model (docs FUSED.md) with either GEMM time as T_gemm: overlap "+
		"efficiency 1 − (T − T_gemm) / T_comm, ceiling (T_gemm + T_comm) / max(T_gemm, T_comm), and the fraction of it reached (cuBLASLt: the "+
		"speedup over the collective / the ceiling; engine: max(T_engine, T_comm) / T). A fused cell that cannot run is listed under \"Cells "+
		"that cannot run here\" with the strategy's own reason.")
	fh, frows, fnote := r.FusedTable()
	if fnote != "" {
		add("p", fnote)
	}
	table(fh, frows)
	add("h2", "Wrong or failed cells (not timed)")
	var wrows [][]string
	for _, x := range r.Results {
		if x.Status == StatusWrong || x.Status == StatusFailed {
			wrows = append(wrows, []string{x.Status, short(x.Op) + " " + x.Dir, shapeCell(x.Shape), fmt.Sprint(x.World), x.Transport, x.Strategy, x.Reason})
		}
	}
	table([]string{"status", "op", "shape", "P", "transport", "strategy", "why"}, wrows)
	add("h2", "Cells that cannot run here")
	byWhy := map[string][]string{}
	var whys []string
	for _, x := range r.Results {
		if x.Status != StatusNotRun {
			continue
		}
		if byWhy[x.Reason] == nil {
			whys = append(whys, x.Reason)
		}
		byWhy[x.Reason] = append(byWhy[x.Reason], fmt.Sprintf("%s %s P=%d %s %s", short(x.Op)+" "+x.Dir, shapeCell(x.Shape), x.World, x.Transport, x.Strategy))
	}
	var nrows [][]string
	for _, w := range whys {
		nrows = append(nrows, []string{w, fmt.Sprint(len(byWhy[w])), strings.Join(byWhy[w], "; ")})
	}
	table([]string{"why", "cells", "which"}, nrows)
	add("h2", "PyTorch rows (same shapes, world size 1 on one GPU)")
	if r.TorchNote != "" {
		add("p", r.TorchNote)
	}
	var prow [][]string
	for _, t := range r.Torch {
		v := []string{t.Impl, t.Op, fmt.Sprintf("%d×%d×%d", t.M, t.N, t.K), fmt.Sprint(t.World), f1(t.US), f2(t.TFLOPS), f2(t.AlgBW), t.Error}
		prow = append(prow, v)
	}
	table([]string{"impl", "op", "M×N×K", "P", "µs", "TFLOP/s", "alg GB/s", "error"}, prow)
	add("h2", "Autotune cache")
	if r.Cache != "" {
		add("p", fmt.Sprintf("Written to `%s` (merged into what it held): per site (kind, M, spec widths, world ≥ 2, transport, GPU, dtype) a strategy "+
			"verified in every direction and faster than collective beyond the noise (forward + backward, round by round), else collective; "+
			"\"significant\" says whether the choice rests on a significant difference. A group of one rank has no entry: it gets collective. "+
			"`cmd/train --overlap auto --autotune-cache %s` picks from it.", r.Cache, r.Cache))
	}
	var crows [][]string
	for _, e := range r.Tuned {
		var ts []string
		for _, n := range sortedNames(e.TimesUS) {
			ts = append(ts, fmt.Sprintf("%s %.1f", n, e.TimesUS[n]))
		}
		sig := "no"
		if e.Significant {
			sig = "yes"
		}
		crows = append(crows, []string{string(e.Kind), e.Shape, fmt.Sprint(e.World), e.Transport, e.GPU, e.DType, e.Strategy, sig, e.Basis, strings.Join(ts, ", ")})
	}
	table([]string{"kind", "shape", "P", "transport", "GPU", "dtype", "choice", "significant", "basis", "µs fwd+bwd (median)"}, crows)
	add("h2", "Environment")
	table([]string{"what", "value"}, r.Env.rows())
	var worlds []string
	for w := range r.Env.Transport {
		worlds = append(worlds, w)
	}
	sort.Strings(worlds)
	for _, w := range worlds {
		add("p", "NVSHMEM transport report, "+w+":")
		add("pre", r.Env.Transport[w])
	}
	if r.Env.Topology != "" {
		add("p", "nvidia-smi topo -m:")
		add("pre", r.Env.Topology)
	}
	js, _ := json.MarshalIndent(r.Matrix, "", "  ")
	add("p", "Matrix:")
	add("pre", string(js))
	return bs
}

func sortedNames(m map[string]float64) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

// Write derives the metrics and the answer at r.Stats' level (Stats.For
// of the results where Comparisons is not set), draws the charts and writes report.md,
// report.html (the charts inline), results.json and the PNGs into dir.
func (r *Report) Write(dir string) error {
	if r.Stats.Comparisons == 0 {
		r.Stats = r.Stats.For(r.Results)
	}
	Derive(r.Results, r.Stats)
	r.Answers = Answers(r.Results, r.Stats)
	cs, err := Charts(r.Results)
	if err != nil {
		return fmt.Errorf("ablate: charts: %w", err)
	}
	r.charts, r.Charts = cs, nil
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, c := range cs {
		r.Charts = append(r.Charts, c.File)
		if err := os.WriteFile(filepath.Join(dir, c.File), c.PNG, 0o644); err != nil {
			return err
		}
	}
	bs := r.blocks()
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(renderMD(bs)), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.html"), []byte(renderHTML("asynctp ablation", bs)), 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("ablate: results.json: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644)
}
