package ablate

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Chart is a PNG of the report.
type Chart struct {
	File  string // its file name next to report.md
	Title string
	PNG   []byte
}

func png(p *plot.Plot, w, h vg.Length) ([]byte, error) {
	wt, err := p.WriterTo(w, h, "png")
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if _, err := wt.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// pngBeside draws p with the legend leg in a strip of its own to the
// right of the plot area (so no entry covers a line), the whole w+legend
// width wide and h high.
func pngBeside(p *plot.Plot, leg plot.Legend, w, h vg.Length) ([]byte, error) {
	lr := leg.Rectangle(draw.Canvas{Rectangle: vg.Rectangle{Max: vg.Point{X: w, Y: h}}})
	lw := lr.Max.X - lr.Min.X + vg.Points(16)
	h = max(h, lr.Max.Y-lr.Min.Y+vg.Points(60))
	img := vgimg.New(w+lw, h)
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	p.BackgroundColor = nil
	p.Draw(draw.Crop(dc, 0, -lw, 0, 0))
	legArea := draw.Crop(dc, w+vg.Points(8), 0, 0, 0)
	leg.YOffs = -vg.Points(30) // below the title
	leg.Draw(legArea)
	var b bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func maxWorld(rs []Result) int {
	w := 0
	for _, r := range rs {
		if r.Timed() && r.World > w {
			w = r.World
		}
	}
	return w
}

// Charts draws the report's charts from the timed results: the speedup
// over collective against M per strategy (at the largest world of each
// transport), stacked time bars (compute, exposed communication) at the
// largest M, and bus bandwidth against message size per transport. A
// chart with nothing to draw is left out.
func Charts(rs []Result) ([]Chart, error) {
	var out []Chart
	for _, f := range []func([]Result) (*Chart, error){speedupChart, breakdownChart, bandwidthChart, layerChart} {
		c, err := f(rs)
		if err != nil {
			return nil, err
		}
		if c != nil {
			out = append(out, *c)
		}
	}
	return out, nil
}

// speedupChart is the speedup over collective against M per strategy, op,
// direction and site, at the largest world, each point with its interval.
func speedupChart(rs []Result) (*Chart, error) {
	lines := map[string]plotter.XYs{}
	errs := map[string]plotter.YErrors{}
	P := maxWorld(rs)
	if P < 2 {
		return nil, nil
	}
	for _, r := range rs {
		if !r.Timed() || r.Strategy == Collective || r.Speedup == 0 || r.World != P || r.Op.IsLayer() || r.VsCollective == nil {
			continue
		}
		name := fmt.Sprintf("%s %s/%s %s", r.Strategy, short(r.Op), r.Dir, r.Shape.name())
		if len(transportsOf(rs)) > 1 {
			name += " " + r.Transport
		}
		s, lo, hi := r.VsCollective.Speedup()
		lines[name] = append(lines[name], plotter.XY{X: float64(r.Shape.M), Y: s})
		e := struct{ Low, High float64 }{}
		if hi > 0 {
			e.Low, e.High = s-lo, hi-s
		}
		errs[name] = append(errs[name], e)
	}
	if len(lines) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Speedup over collective vs M, world %d (> 1: faster; bars: the interval)", P)
	p.X.Label.Text = "M (tokens, log scale)"
	p.Y.Label.Text = "speedup over collective (×)"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, valueTicks(lines, "%.0f")
	p.Y.Tick.Marker = linTicks{n: 8}
	p.Add(plotter.NewGrid())
	one, _ := plotter.NewLine(plotter.XYs{{X: minX(lines), Y: 1}, {X: maxX(lines), Y: 1}})
	one.Color, one.Dashes = color.Gray{Y: 100}, []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(one)
	names := sortedKeys(lines)
	leg := plot.NewLegend()
	leg.Top, leg.Left = true, true
	leg.TextStyle.Font.Size = vg.Points(8)
	for i, n := range names {
		idx := make([]int, len(lines[n]))
		for j := range idx {
			idx[j] = j
		}
		sort.Slice(idx, func(a, b int) bool { return lines[n][idx[a]].X < lines[n][idx[b]].X })
		xy := make(plotter.XYs, len(idx))
		ye := make(plotter.YErrors, len(idx))
		for j, k := range idx {
			xy[j], ye[j] = lines[n][k], errs[n][k]
		}
		l, pts, err := plotter.NewLinePoints(xy)
		if err != nil {
			return nil, err
		}
		l.Color, pts.Color = plotutil.Color(i), plotutil.Color(i)
		pts.Shape = plotutil.Shape(i)
		l.Dashes = plotutil.Dashes(i / 7)
		eb, err := plotter.NewYErrorBars(struct {
			plotter.XYs
			plotter.YErrors
		}{xy, ye})
		if err != nil {
			return nil, err
		}
		eb.Color = plotutil.Color(i)
		p.Add(l, pts, eb)
		leg.Add(n, l, pts)
	}
	b, err := pngBeside(p, leg, 9*vg.Inch, 5.5*vg.Inch)
	if err != nil {
		return nil, err
	}
	return &Chart{File: "speedup.png", Title: "speedup vs M per strategy", PNG: b}, nil
}

func breakdownChart(rs []Result) (*Chart, error) {
	P := maxWorld(rs)
	maxM := map[string]int{} // op/dir → largest M timed at P
	for _, r := range rs {
		if r.Timed() && r.World == P && r.GemmUS > 0 {
			k := string(r.Op) + r.Dir + r.Shape.name() + r.Transport
			maxM[k] = max(maxM[k], r.Shape.M)
		}
	}
	var labels []string
	var compute, exposed, unfused plotter.Values
	for _, r := range rs {
		if !r.Timed() || r.World != P || r.GemmUS == 0 || r.Shape.M != maxM[string(r.Op)+r.Dir+r.Shape.name()+r.Transport] {
			continue
		}
		l := fmt.Sprintf("%s/%s\n%s\n%s", short(r.Op), r.Dir, r.Shape.name(), abbrev(r.Strategy))
		if len(transportsOf(rs)) > 1 {
			l += " " + r.Transport
		}
		labels = append(labels, l)
		c := min(r.GemmUS, r.MedianUS)
		compute = append(compute, c)
		exposed = append(exposed, r.MedianUS-c)
		unfused = append(unfused, r.GemmUS+r.CommUS)
	}
	if len(labels) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Time per op at the largest M, world %d: compute (GEMM alone) + exposed communication", P)
	p.Y.Label.Text = "time per call (µs, median of the rounds)"
	p.Y.Tick.Marker = linTicks{n: 8}
	w := vg.Points(14)
	bc, err := plotter.NewBarChart(compute, w)
	if err != nil {
		return nil, err
	}
	bc.Color = color.RGBA{R: 70, G: 130, B: 180, A: 255}
	be, err := plotter.NewBarChart(exposed, w)
	if err != nil {
		return nil, err
	}
	be.Color = color.RGBA{R: 230, G: 120, B: 50, A: 255}
	be.StackOn(bc)
	p.Add(plotter.NewGrid(), bc, be)
	var xy plotter.XYs
	for i, v := range unfused {
		xy = append(xy, plotter.XY{X: float64(i), Y: v})
	}
	sc, err := plotter.NewScatter(xy)
	if err != nil {
		return nil, err
	}
	sc.Shape, sc.Color, sc.Radius = draw.PyramidGlyph{}, color.Black, vg.Points(3)
	p.Add(sc)
	p.Legend.Add("compute (GEMM alone)", bc)
	p.Legend.Add("exposed communication (T − T_gemm)", be)
	p.Legend.Add("T_gemm + T_comm (nothing hidden)", sc)
	p.Legend.Top = true
	top := 0.0
	for i := range compute {
		top = max(top, compute[i]+exposed[i], unfused[i])
	}
	p.Y.Min, p.Y.Max = 0, 1.3*top // room for the legend
	p.NominalX(labels...)
	p.X.Tick.Label.Font.Size = vg.Points(6)
	width := vg.Length(max(9, len(labels)/2+2)) * vg.Inch
	b, err := png(p, min(width, 20*vg.Inch), 6*vg.Inch)
	if err != nil {
		return nil, err
	}
	return &Chart{File: "breakdown.png", Title: "stacked time: compute, exposed communication", PNG: b}, nil
}

// layerChart is the speedup of each strategy over collective in the layer
// cells (block, MoE block, step), per world ≥ 2, as bars with their
// intervals (world 1 has nothing to exchange: no speedup to show).
func layerChart(rs []Result) (*Chart, error) {
	var labels []string
	var vals plotter.Values
	var xy plotter.XYs
	var ye plotter.YErrors
	for _, r := range rs {
		if !r.Timed() || !r.Op.IsLayer() || r.Strategy == Collective || r.Speedup == 0 || r.World < 2 || r.VsCollective == nil {
			continue
		}
		l := fmt.Sprintf("%s/%s\nP=%d M=%d\n%s", r.Op, r.Dir, r.World, r.Shape.M, abbrev(r.Strategy))
		if len(transportsOf(rs)) > 1 {
			l += " " + r.Transport
		}
		s, lo, hi := r.VsCollective.Speedup()
		e := struct{ Low, High float64 }{}
		if hi > 0 {
			e.Low, e.High = s-lo, hi-s
		}
		xy = append(xy, plotter.XY{X: float64(len(vals)), Y: s})
		ye = append(ye, e)
		labels = append(labels, l)
		vals = append(vals, s)
	}
	if len(vals) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = "Layer cells: speedup over collective (forward + backward; the step with its update; > 1: faster; bars: the interval)"
	p.Y.Label.Text = "speedup over collective (×)"
	p.X.Label.Text = "layer cell: op/sequence parallelism, world P, tokens M, strategy"
	p.Y.Tick.Marker = linTicks{n: 8}
	bc, err := plotter.NewBarChart(vals, vg.Points(14))
	if err != nil {
		return nil, err
	}
	bc.Color = color.RGBA{R: 70, G: 130, B: 180, A: 255}
	one, _ := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 1}, {X: float64(len(vals)) - 0.5, Y: 1}})
	one.Color, one.Dashes = color.Gray{Y: 100}, []vg.Length{vg.Points(4), vg.Points(3)}
	eb, err := plotter.NewYErrorBars(struct {
		plotter.XYs
		plotter.YErrors
	}{xy, ye})
	if err != nil {
		return nil, err
	}
	p.Add(plotter.NewGrid(), bc, one, eb)
	p.Y.Min = 0
	p.NominalX(labels...)
	p.X.Tick.Label.Font.Size = vg.Points(6)
	width := vg.Length(max(9, len(labels)/2+2)) * vg.Inch
	b, err := png(p, min(width, 20*vg.Inch), 5*vg.Inch)
	if err != nil {
		return nil, err
	}
	return &Chart{File: "layers.png", Title: "layer cells: speedup per strategy", PNG: b}, nil
}

func bandwidthChart(rs []Result) (*Chart, error) {
	lines := map[string]plotter.XYs{}
	seen := map[string]bool{}
	for _, r := range rs {
		if !r.Timed() || r.Strategy != Collective || r.BusBW == 0 || r.World < 2 {
			continue
		}
		coll := map[Op]string{OpAllGatherMatmul: "all-gather", OpMatmulReduceScatter: "reduce-scatter", OpMatmulAllReduce: "all-reduce"}[r.Op]
		if r.Dir == "bwd" {
			coll = map[Op]string{OpAllGatherMatmul: "reduce-scatter", OpMatmulReduceScatter: "all-gather", OpMatmulAllReduce: "all-reduce"}[r.Op]
		}
		name := fmt.Sprintf("%s %s P=%d", r.Transport, coll, r.World)
		k := fmt.Sprint(name, r.CommBytes)
		if seen[k] {
			continue
		}
		seen[k] = true
		lines[name] = append(lines[name], plotter.XY{X: r.CommBytes, Y: r.BusBW})
	}
	if len(lines) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = "Bus bandwidth of the collective alone vs message size, per transport"
	p.X.Label.Text = "message size (bytes, the larger of input and output; log scale)"
	p.Y.Label.Text = "bus bandwidth (GB/s)"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, logTicks{format: bytesLabel}
	p.Y.Tick.Marker = linTicks{n: 8}
	p.Add(plotter.NewGrid())
	for i, n := range sortedKeys(lines) {
		xy := lines[n]
		sort.Slice(xy, func(a, b int) bool { return xy[a].X < xy[b].X })
		l, pts, err := plotter.NewLinePoints(xy)
		if err != nil {
			return nil, err
		}
		l.Color, pts.Color, pts.Shape = plotutil.Color(i), plotutil.Color(i), plotutil.Shape(i)
		p.Add(l, pts)
		p.Legend.Add(n, l, pts)
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	b, err := png(p, 9*vg.Inch, 5.5*vg.Inch)
	if err != nil {
		return nil, err
	}
	return &Chart{File: "bandwidth.png", Title: "bandwidth vs message size per transport", PNG: b}, nil
}

func short(o Op) string {
	switch o {
	case OpAllGatherMatmul:
		return "AG+MM"
	case OpMatmulReduceScatter:
		return "MM+RS"
	case OpMatmulAllReduce:
		return "MM+AR"
	case OpMoEDispatchCombine:
		return "MoE d+c"
	}
	return string(o)
}

func abbrev(s string) string {
	switch s {
	case Collective:
		return "coll"
	case Pipelined:
		return "pipe"
	}
	return s
}

func transportsOf(rs []Result) map[string]bool {
	m := map[string]bool{}
	for _, r := range rs {
		if r.Timed() {
			m[r.Transport] = true
		}
	}
	return m
}

func sortedKeys(m map[string]plotter.XYs) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

func minX(m map[string]plotter.XYs) float64 {
	v := 0.0
	for _, xy := range m {
		for _, p := range xy {
			if v == 0 || p.X < v {
				v = p.X
			}
		}
	}
	return v
}

func maxX(m map[string]plotter.XYs) float64 {
	v := 0.0
	for _, xy := range m {
		for _, p := range xy {
			v = max(v, p.X)
		}
	}
	return v
}

// valueTicks labels the x values that occur in the lines.
func valueTicks(m map[string]plotter.XYs, format string) plot.ConstantTicks {
	seen := map[float64]bool{}
	var t plot.ConstantTicks
	for _, xy := range m {
		for _, p := range xy {
			if !seen[p.X] {
				seen[p.X] = true
				t = append(t, plot.Tick{Value: p.X, Label: fmt.Sprintf(format, p.X)})
			}
		}
	}
	sort.Slice(t, func(i, j int) bool { return t[i].Value < t[j].Value })
	return t
}

// linTicks labels about n round values (1, 2, 2.5 or 5 × 10^k apart)
// across a linear axis, with a minor tick between each two.
type linTicks struct{ n int }

func (t linTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return []plot.Tick{{Value: lo, Label: numLabel(lo, 1)}}
	}
	step := niceStep((hi - lo) / float64(max(1, t.n)))
	var out []plot.Tick
	for i := math.Ceil(lo/step - 1e-9); i*step <= hi+step*1e-9; i++ {
		v := i * step
		if math.Abs(v) < step*1e-9 {
			v = 0
		}
		out = append(out, plot.Tick{Value: v, Label: numLabel(v, step)})
		if m := v + step/2; m <= hi {
			out = append(out, plot.Tick{Value: m})
		}
	}
	return out
}

// niceStep is the least of 1, 2, 2.5, 5 × 10^k not below raw.
func niceStep(raw float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5} {
		if m*p >= raw*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// numLabel writes v with the decimals a step of step needs, thousands
// separated by a thin space.
func numLabel(v, step float64) string {
	d := 0
	for d < 6 && math.Abs(step*math.Pow(10, float64(d))-math.Round(step*math.Pow(10, float64(d)))) > 1e-6*math.Pow(10, float64(d)) {
		d++
	}
	s := strconv.FormatFloat(v, 'f', d, 64)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	intPart, frac, _ := strings.Cut(s, ".")
	var b strings.Builder
	for i, c := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 && len(intPart) > 4 {
			b.WriteString("\u2009")
		}
		b.WriteRune(c)
	}
	out := b.String()
	if frac != "" {
		out += "." + frac
	}
	if neg {
		out = "−" + out
	}
	return out
}

// logTicks labels 1, 2 and 5 × 10^k across a log axis (each power of ten
// alone where the axis spans more than three decades; every multiple of
// the power where that leaves fewer than three labels), format writing a
// value.
type logTicks struct{ format func(float64) string }

func (t logTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(lo > 0 && hi > lo) {
		return []plot.Tick{{Value: lo, Label: t.format(lo)}}
	}
	mults := []float64{1, 2, 5}
	if math.Log10(hi/lo) > 3 {
		mults = []float64{1}
	}
	var out []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		p := math.Pow(10, e)
		for _, m := range []float64{1, 2, 3, 4, 5, 6, 7, 8, 9} {
			v := m * p
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			tk := plot.Tick{Value: v}
			if slices.Contains(mults, m) {
				tk.Label = t.format(v)
			}
			out = append(out, tk)
		}
	}
	labelled := 0
	for _, tk := range out {
		if tk.Label != "" {
			labelled++
		}
	}
	if labelled < 3 { // a narrow axis: label every tick
		labelled = 0
		for i := range out {
			out[i].Label = t.format(out[i].Value)
			labelled++
		}
	}
	if labelled < 3 { // narrower still: the ends too
		out = append(out, plot.Tick{Value: lo, Label: t.format(lo)}, plot.Tick{Value: hi, Label: t.format(hi)})
	}
	return out
}

// bytesLabel writes a size in bytes with a decimal prefix: "512 B",
// "20 kB", "1.5 MB".
func bytesLabel(v float64) string {
	for _, u := range []struct {
		f float64
		s string
	}{{1e12, "TB"}, {1e9, "GB"}, {1e6, "MB"}, {1e3, "kB"}} {
		if v >= u.f {
			return strconv.FormatFloat(v/u.f, 'g', 3, 64) + " " + u.s
		}
	}
	return strconv.FormatFloat(v, 'g', 3, 64) + " B"
}
