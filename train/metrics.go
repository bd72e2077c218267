package train

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/asynctp/asynctp/internal/atomicfile"
)

// File names of the metrics in the out dir.
const (
	MetricsFile = "metrics.jsonl"
	PlotFile    = "loss.png"
)

// StepMetrics is what one step reports: one line of metrics.jsonl.
type StepMetrics struct {
	Step         int     `json:"step"`
	Loss         float64 `json:"loss"`
	LR           float64 `json:"lr"`
	GradNorm     float64 `json:"grad_norm"`
	TokensPerSec float64 `json:"tokens_per_s"`
	ElapsedS     float64 `json:"elapsed_s"`
	// Extra holds further fields (val_loss, aux_loss...), written at the top
	// level of the JSON object next to the fixed ones. A key that clashes
	// with a fixed field is dropped.
	Extra map[string]any `json:"-"`
}

var fixedKeys = map[string]bool{"step": true, "loss": true, "lr": true, "grad_norm": true, "tokens_per_s": true, "elapsed_s": true}

// MarshalJSON writes the fixed fields, then Extra's keys in sorted order.
// Non-finite numbers (which JSON cannot hold) are written as null.
func (m StepMetrics) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	first := true
	put := func(k string, v any) error {
		if f, ok := v.(float64); ok && (math.IsNaN(f) || math.IsInf(f, 0)) {
			v = nil
		}
		if f, ok := v.(float32); ok && (math.IsNaN(float64(f)) || math.IsInf(float64(f), 0)) {
			v = nil
		}
		vb, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("metrics field %q: %w", k, err)
		}
		kb, _ := json.Marshal(k)
		if !first {
			buf.WriteByte(',')
		}
		first = false
		buf.Write(kb)
		buf.WriteByte(':')
		buf.Write(vb)
		return nil
	}
	for _, kv := range []struct {
		k string
		v any
	}{{"step", m.Step}, {"loss", m.Loss}, {"lr", m.LR}, {"grad_norm", m.GradNorm}, {"tokens_per_s", m.TokensPerSec}, {"elapsed_s", m.ElapsedS}} {
		if err := put(kv.k, kv.v); err != nil {
			return nil, err
		}
	}
	keys := make([]string, 0, len(m.Extra))
	for k := range m.Extra {
		if !fixedKeys[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := put(k, m.Extra[k]); err != nil {
			return nil, err
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// UnmarshalJSON reads a line written by MarshalJSON.
func (m *StepMetrics) UnmarshalJSON(b []byte) error {
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return err
	}
	*m = StepMetrics{}
	num := func(k string, dst *float64) error {
		if r, ok := all[k]; ok && string(r) != "null" {
			return json.Unmarshal(r, dst)
		}
		*dst = math.NaN()
		return nil
	}
	r, ok := all["step"]
	if !ok {
		return fmt.Errorf("metrics line without a step")
	}
	if err := json.Unmarshal(r, &m.Step); err != nil {
		return err
	}
	for k, dst := range map[string]*float64{"loss": &m.Loss, "lr": &m.LR, "grad_norm": &m.GradNorm, "tokens_per_s": &m.TokensPerSec, "elapsed_s": &m.ElapsedS} {
		if err := num(k, dst); err != nil {
			return fmt.Errorf("metrics field %q: %w", k, err)
		}
	}
	for k, r := range all {
		if fixedKeys[k] {
			continue
		}
		var v any
		if err := json.Unmarshal(r, &v); err != nil {
			return err
		}
		if m.Extra == nil {
			m.Extra = map[string]any{}
		}
		m.Extra[k] = v
	}
	return nil
}

// ReadMetrics reads a metrics.jsonl file, skipping lines it cannot parse
// (a torn last line after a crash).
func ReadMetrics(path string) ([]StepMetrics, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []StepMetrics
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var m StepMetrics
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out, sc.Err()
}

// WriteLossPlot draws loss against step (and val_loss where the records
// have it) as a PNG, written to a temporary file and renamed to path.
func WriteLossPlot(path string, records []StepMetrics) error {
	p, err := lossPlot(records)
	if err != nil {
		return err
	}
	wt, err := p.WriterTo(8*vg.Inch, 5*vg.Inch, "png")
	if err != nil {
		return fmt.Errorf("train: loss plot: %w", err)
	}
	return writeFileAtomic(path, func(w io.Writer) error {
		_, err := wt.WriteTo(w)
		return err
	})
}

// lossPlot is WriteLossPlot's plot.
func lossPlot(records []StepMetrics) (*plot.Plot, error) {
	var trainXY, valXY plotter.XYs
	for _, r := range records {
		if !math.IsNaN(r.Loss) && !math.IsInf(r.Loss, 0) {
			trainXY = append(trainXY, plotter.XY{X: float64(r.Step), Y: r.Loss})
		}
		if v, ok := r.Extra["val_loss"].(float64); ok && !math.IsNaN(v) && !math.IsInf(v, 0) {
			valXY = append(valXY, plotter.XY{X: float64(r.Step), Y: v})
		}
	}
	p := plot.New()
	p.Title.Text = "training loss"
	p.X.Label.Text = "step"
	p.X.Tick.Marker = plot.TickerFunc(stepTicks)
	p.Y.Label.Text = "loss"
	if positive(trainXY) && positive(valXY) {
		p.Y.Label.Text = "loss (log scale)"
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.TickerFunc(lossTicks)
	} else {
		p.Y.Tick.Marker = plot.TickerFunc(linearTicks)
	}
	p.Add(plotter.NewGrid())
	p.Legend.Top = true // a falling loss leaves the top right empty
	if len(trainXY) > 0 {
		l, err := plotter.NewLine(trainXY)
		if err != nil {
			return nil, fmt.Errorf("train: loss plot: %w", err)
		}
		p.Add(l)
		p.Legend.Add("train", l)
	}
	if len(valXY) > 0 {
		l, pts, err := plotter.NewLinePoints(valXY)
		if err != nil {
			return nil, fmt.Errorf("train: loss plot: %w", err)
		}
		l.Color = plotutil.Color(1)
		pts.Color = plotutil.Color(1)
		p.Add(l, pts)
		p.Legend.Add("validation", l, pts)
	}
	return p, nil
}

// positive reports whether every y of xys is above zero (a log scale's
// domain).
func positive(xys plotter.XYs) bool {
	for _, p := range xys {
		if !(p.Y > 0) {
			return false
		}
	}
	return true
}

// writeFileAtomic writes path through a temporary file in the same
// directory and a rename, so readers see the old or the new file.
func writeFileAtomic(path string, fill func(io.Writer) error) error {
	if err := atomicfile.Write(path, fill); err != nil {
		return fmt.Errorf("train: writing %s: %w", path, err)
	}
	return nil
}

// metricsSink is rank 0's reporting: metrics.jsonl, the plot, and the log
// lines or progress bar.
type metricsSink struct {
	// mu orders what goes to out: the loop's lines and bar, and the
	// background writer's line of a completed checkpoint.
	mu       sync.Mutex
	outDir   string
	file     *os.File
	out      io.Writer
	bar      *progressbar.ProgressBar
	logEvery int
	steps    int
	history  []StepMetrics
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// newMetricsSink opens outDir/metrics.jsonl. On a resume from startStep it
// keeps the earlier records up to startStep (a resume from an older
// checkpoint drops the records after it); a fresh run starts a new file.
// With outDir "" it writes no file and no plot, only the log lines.
func newMetricsSink(outDir string, startStep, steps, logEvery int, out io.Writer, bar bool) (*metricsSink, error) {
	s := &metricsSink{outDir: outDir, out: out, logEvery: logEvery, steps: steps}
	if outDir == "" {
		s.addBar(bar, startStep)
		return s, nil
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, fmt.Errorf("train: out dir: %w", err)
	}
	path := filepath.Join(outDir, MetricsFile)
	if startStep > 0 {
		if old, err := ReadMetrics(path); err == nil {
			for _, r := range old {
				if r.Step <= startStep {
					s.history = append(s.history, r)
				}
			}
		}
	}
	err := writeFileAtomic(path, func(w io.Writer) error {
		for _, r := range s.history {
			b, err := json.Marshal(r)
			if err != nil {
				return err
			}
			if _, err := w.Write(append(b, '\n')); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if s.file, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return nil, fmt.Errorf("train: metrics: %w", err)
	}
	s.addBar(bar, startStep)
	return s, nil
}

// addBar starts the progress bar when bar is on and steps remain.
func (s *metricsSink) addBar(bar bool, startStep int) {
	steps, out := s.steps, s.out
	if bar && steps > startStep {
		s.bar = progressbar.NewOptions(steps-startStep,
			progressbar.OptionSetWriter(out),
			progressbar.OptionSetDescription(fmt.Sprintf("step %d/%d", startStep, steps)),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetPredictTime(true),
		)
	}
}

func (s *metricsSink) record(m StepMetrics) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.history = append(s.history, m)
	if s.file != nil {
		b, err := json.Marshal(m)
		if err != nil {
			return fmt.Errorf("train: metrics of step %d: %w", m.Step, err)
		}
		if _, err := s.file.Write(append(b, '\n')); err != nil {
			return fmt.Errorf("train: writing %s: %w", MetricsFile, err)
		}
	}
	if s.bar != nil {
		s.bar.Describe(fmt.Sprintf("step %d/%d loss %.4f", m.Step, s.steps, m.Loss))
		s.bar.Add(1)
		return nil
	}
	if m.Step%s.logEvery == 0 || m.Step == s.steps || len(s.history) == 1 {
		line := fmt.Sprintf("step %*d/%d | loss %.4f | lr %.3e | grad_norm %.4f | %.0f tok/s | %.1fs",
			len(fmt.Sprint(s.steps)), m.Step, s.steps, m.Loss, m.LR, m.GradNorm, m.TokensPerSec, m.ElapsedS)
		if v, ok := m.Extra["val_loss"].(float64); ok {
			line += fmt.Sprintf(" | val_loss %.4f", v)
		}
		fmt.Fprintln(s.out, line)
	}
	return nil
}

// logf prints a message line (above the bar when there is one).
func (s *metricsSink) logf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bar != nil {
		s.bar.Clear()
	}
	fmt.Fprintf(s.out, format+"\n", args...)
}

func (s *metricsSink) plot() error {
	if s.outDir == "" {
		return nil
	}
	return WriteLossPlot(filepath.Join(s.outDir, PlotFile), s.history)
}

func (s *metricsSink) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bar != nil {
		s.bar.Finish()
		fmt.Fprintln(s.out)
	}
	if s.file == nil {
		return nil
	}
	return s.file.Close()
}
