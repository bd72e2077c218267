package ablate

import (
	"bytes"
	"fmt"
	"image/color"
	"sort"

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

func speedupChart(rs []Result) (*Chart, error) {
	type key struct{ line string }
	lines := map[string]plotter.XYs{}
	P := maxWorld(rs)
	for _, r := range rs {
		if !r.Timed() || r.Strategy == Collective || r.Speedup == 0 || r.World != P || r.Op.IsLayer() {
			continue
		}
		name := fmt.Sprintf("%s %s/%s %s", r.Strategy, short(r.Op), r.Dir, r.Shape.Name)
		if len(transportsOf(rs)) > 1 {
			name += " " + r.Transport
		}
		lines[name] = append(lines[name], plotter.XY{X: float64(r.Shape.M), Y: r.Speedup})
	}
	if len(lines) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Speedup over collective vs M (world %d; > 1: faster)", P)
	p.X.Label.Text = "M (tokens)"
	p.Y.Label.Text = "speedup (collective time / strategy time)"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, valueTicks(lines, "%.0f")
	p.Add(plotter.NewGrid())
	one, _ := plotter.NewLine(plotter.XYs{{X: minX(lines), Y: 1}, {X: maxX(lines), Y: 1}})
	one.Color, one.Dashes = color.Gray{Y: 100}, []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(one)
	names := sortedKeys(lines)
	leg := plot.NewLegend()
	leg.Top, leg.Left = true, true
	leg.TextStyle.Font.Size = vg.Points(8)
	for i, n := range names {
		xy := lines[n]
		sort.Slice(xy, func(a, b int) bool { return xy[a].X < xy[b].X })
		l, pts, err := plotter.NewLinePoints(xy)
		if err != nil {
			return nil, err
		}
		l.Color, pts.Color = plotutil.Color(i), plotutil.Color(i)
		pts.Shape = plotutil.Shape(i)
		l.Dashes = plotutil.Dashes(i / 7)
		p.Add(l, pts)
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
			k := string(r.Op) + r.Dir + r.Shape.Name + r.Transport
			maxM[k] = max(maxM[k], r.Shape.M)
		}
	}
	var labels []string
	var compute, exposed, unfused plotter.Values
	for _, r := range rs {
		if !r.Timed() || r.World != P || r.GemmUS == 0 || r.Shape.M != maxM[string(r.Op)+r.Dir+r.Shape.Name+r.Transport] {
			continue
		}
		l := fmt.Sprintf("%s/%s\n%s\n%s", short(r.Op), r.Dir, r.Shape.Name, abbrev(r.Strategy))
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
	p.Y.Label.Text = "µs (median)"
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
// cells (block, MoE block, step), per world, as bars.
func layerChart(rs []Result) (*Chart, error) {
	var labels []string
	var vals plotter.Values
	for _, r := range rs {
		if !r.Timed() || !r.Op.IsLayer() || r.Strategy == Collective || r.Speedup == 0 {
			continue
		}
		l := fmt.Sprintf("%s/%s\nP=%d M=%d\n%s", r.Op, r.Dir, r.World, r.Shape.M, abbrev(r.Strategy))
		if len(transportsOf(rs)) > 1 {
			l += " " + r.Transport
		}
		labels = append(labels, l)
		vals = append(vals, r.Speedup)
	}
	if len(vals) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = "Layer cells: speedup over collective (forward + backward; the step with its update; > 1: faster)"
	p.Y.Label.Text = "speedup (collective time / strategy time)"
	bc, err := plotter.NewBarChart(vals, vg.Points(14))
	if err != nil {
		return nil, err
	}
	bc.Color = color.RGBA{R: 70, G: 130, B: 180, A: 255}
	one, _ := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 1}, {X: float64(len(vals)) - 0.5, Y: 1}})
	one.Color, one.Dashes = color.Gray{Y: 100}, []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(plotter.NewGrid(), bc, one)
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
			coll = map[Op]string{OpAllGatherMatmul: "reduce-scatter", OpMatmulReduceScatter: "all-gather"}[r.Op]
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
	p.X.Label.Text = "message size (bytes; the larger of input and output)"
	p.Y.Label.Text = "bus bandwidth (GB/s)"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
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
