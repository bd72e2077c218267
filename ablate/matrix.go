package ablate

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Op is an operation of the matrix.
type Op string

const (
	OpAllGatherMatmul     Op = "all-gather-matmul"     // the SP entry: out = AG(x)·Wᵀ
	OpMatmulReduceScatter Op = "matmul-reduce-scatter" // the SP exit: out = RS(x·Wᵀ)
	OpMatmulAllReduce     Op = "matmul-all-reduce"     // the exit without SP: out = AR(x·Wᵀ)
	OpMoEDispatchCombine  Op = "moe-dispatch-combine"  // parallel/ep: layout, dispatch, combine
	OpMoELayer            Op = "moe-layer"             // parallel/model's MoE block: TP attention, parallel/ep MoE (forward + backward)
	OpTPBlock             Op = "tp-block"              // parallel/tp Block (forward + backward)
	OpTrainStep           Op = "train-step"            // parallel/model + optim.AdamW: forward, backward, gradient reduction, update
)

// Ops lists every op, in report order.
var Ops = []Op{OpAllGatherMatmul, OpMatmulReduceScatter, OpMatmulAllReduce, OpMoEDispatchCombine, OpMoELayer, OpTPBlock, OpTrainStep}

// notCovered says why an op has no cells yet.
var notCovered = map[Op]string{}

// IsLayer says whether the op is a layer cell (a block, the MoE block, a
// training step): forward and backward of whole layers, with every TP site
// taking the cell's strategy.
func (o Op) IsLayer() bool { return o == OpTPBlock || o == OpMoELayer || o == OpTrainStep }

// Dirs are the directions of the TP ops: the forward and the backward (its
// adjoint). matmul-all-reduce has two forms, each one direction and a site
// of its own: "fwd", the row-parallel exit out = AR(x·Wᵀ), and "bwd", the
// backward of a column-parallel entry dx = AR(dy·W) (Shape.DirsOf says
// which a shape has); the MoE op has one ("fwd"). The layer cells time
// forward and backward together; their "direction" is the sequence
// parallelism: "sp" on, "nosp" off (the block has both).
func (o Op) Dirs() []string {
	switch o {
	case OpAllGatherMatmul, OpMatmulReduceScatter, OpMatmulAllReduce:
		return []string{"fwd", "bwd"}
	case OpTPBlock:
		return []string{"sp", "nosp"}
	case OpMoELayer, OpTrainStep:
		return []string{"sp"}
	}
	return []string{"fwd"}
}

// Shape is a cell's global problem: M tokens (rows of the whole sequence),
// N output features, K inner features, before TP splits them over the
// world (all-gather-matmul: N/P outputs per rank; the two exits: K/P inner
// features per rank; every op: M/P rows per rank where it is sharded).
// For the MoE op N is the hidden width and Experts, TopK the routing. For
// the layer cells N is the model width, K the FFN width (of each expert),
// Heads, Seq (M = batch·Seq) and, for the step, Vocab and Layers.
type Shape struct {
	Name string `json:"name"`
	// Site is the layer of the model this shape is ("attn.qkv",
	// "mlp.w_down", "lm_head"; "" for a model's one shape per op, or an
	// explicit one).
	Site    string `json:"site,omitempty"`
	M       int    `json:"m"`
	N       int    `json:"n"`
	K       int    `json:"k"`
	Experts int    `json:"experts,omitempty"`
	TopK    int    `json:"topk,omitempty"`
	Heads   int    `json:"heads,omitempty"`
	Seq     int    `json:"seq,omitempty"`
	Vocab   int    `json:"vocab,omitempty"`
	Layers  int    `json:"layers,omitempty"`
}

func (s Shape) String() string {
	if s.Heads > 0 {
		return s.layerString()
	}
	if s.Experts > 0 {
		return fmt.Sprintf("%s M=%d d=%d E=%d top%d", s.Name, s.M, s.N, s.Experts, s.TopK)
	}
	return fmt.Sprintf("%s M=%d N=%d K=%d", s.name(), s.M, s.N, s.K)
}

// name is the model's name and the site's.
func (s Shape) name() string {
	if s.Site == "" {
		return s.Name
	}
	return s.Name + " " + s.Site
}

// entrySites are the column-parallel linears of a model, whose entry site
// without sequence parallelism is matmul-all-reduce's backward form.
var entrySites = map[string]bool{"attn.qkv": true, "mlp.gate_up": true, "lm_head": true}

// DirsOf are the directions of op at shape s: matmul-all-reduce's one form
// of the site (the backward of a column-parallel entry, the forward of a
// row-parallel exit and of a shape of no named site), every other op's
// Dirs.
func (s Shape) DirsOf(op Op) []string {
	if op != OpMatmulAllReduce {
		return op.Dirs()
	}
	if entrySites[s.Site] {
		return []string{"bwd"}
	}
	return []string{"fwd"}
}

// Model is a named model's widths, from which each op's shape follows.
type Model struct {
	Name      string
	Dim       int   // hidden width
	QKV       int   // q, k and v outputs together (the all-gather-matmul of attention)
	FFN       int   // MLP hidden width (the inner width of the down projection)
	Experts   int   // 0: dense
	TopK      int   //
	Ms        []int // default token counts
	MoEHidden int   // the MoE op's row width (Dim where 0)
	// The layer cells: heads (multi-head attention; GQA models are
	// approximated), vocabulary, sequence length, default token counts,
	// and the blocks of the training step's (dense) model.
	Heads, Vocab, Seq int
	LayerMs           []int
	StepLayers        int
	// Sites: the TP ops take one shape per site of the model (the
	// entries q·k·v, gate·up and the LM head; the exits attention out and
	// down), the keys cmd/train's sites look up in the autotune cache;
	// else one shape per op (QKV for the entry, the FFN's down for the
	// exits).
	Sites bool
}

// Models are the shape presets. "tiny" is cmd/train's tiny and tiny-moe
// (width 64, 4 heads, SwiGLU 192, vocabulary 256, sequences of 64, batch
// 8: 512 tokens a step, 256 a replica's at --dp 2; tiny-moe's 8 experts,
// top 2), every site of it.
// The others' widths as published; deepseek-v3-moe's attention is MLA,
// approximated by 128 heads of 192 for q, k and v.
var Models = map[string]Model{
	"tiny": {Name: "tiny", Dim: 64, QKV: 192, FFN: 192, Experts: 8, TopK: 2, Ms: []int{256, 512},
		Heads: 4, Vocab: 256, Seq: 64, LayerMs: []int{256}, StepLayers: 2, Sites: true},
	"gpt2-124m": {Name: "gpt2-124m", Dim: 768, QKV: 3 * 768, FFN: 3072, Ms: []int{2048, 8192},
		Heads: 12, Vocab: 50304, Seq: 1024, LayerMs: []int{2048}, StepLayers: 2},
	"llama-7b": {Name: "llama-7b", Dim: 4096, QKV: 3 * 4096, FFN: 11008, Ms: []int{2048, 8192},
		Heads: 32, Vocab: 32000, Seq: 2048, LayerMs: []int{2048}, StepLayers: 1},
	"llama-70b": {Name: "llama-70b", Dim: 8192, QKV: 8192 + 2*1024, FFN: 28672, Ms: []int{2048, 8192},
		Heads: 64, Vocab: 32000, Seq: 2048, LayerMs: []int{2048}, StepLayers: 1},
	"mixtral-8x7b": {Name: "mixtral-8x7b", Dim: 4096, QKV: 4096 + 2*1024, FFN: 14336, Experts: 8, TopK: 2, Ms: []int{2048, 8192},
		Heads: 32, Vocab: 32000, Seq: 2048, LayerMs: []int{2048}, StepLayers: 1},
	"deepseek-v3-moe": {Name: "deepseek-v3-moe", Dim: 7168, QKV: 3 * 128 * 192, FFN: 18432, Experts: 256, TopK: 8, Ms: []int{2048, 8192},
		Heads: 128, Vocab: 129280, Seq: 2048, LayerMs: []int{2048}, StepLayers: 1},
}

// ModelNames are the presets' names, sorted.
func ModelNames() []string {
	var n []string
	for k := range Models {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// ShapesFor are the op's shapes in the model at m tokens: one per site of
// the op's kind for a model with Sites, else ShapeFor's one (none where
// the op does not apply).
func (md Model) ShapesFor(op Op, m int) []Shape {
	if !md.Sites || op.IsLayer() || op == OpMoEDispatchCombine {
		if s, ok := md.ShapeFor(op, m); ok {
			return []Shape{s}
		}
		return nil
	}
	site := func(name string, n, k int) Shape { return Shape{Name: md.Name, Site: name, M: m, N: n, K: k} }
	entries := []Shape{site("attn.qkv", md.QKV, md.Dim), site("mlp.gate_up", 2*md.FFN, md.Dim), site("lm_head", md.Vocab, md.Dim)}
	exits := []Shape{site("attn.wo", md.Dim, md.Dim), site("mlp.w_down", md.Dim, md.FFN)}
	switch op {
	case OpAllGatherMatmul:
		return entries
	case OpMatmulReduceScatter:
		return exits
	case OpMatmulAllReduce:
		return append(entries, exits...)
	}
	return nil
}

// ShapeFor is the op's shape in the model at m tokens; ok is false when the
// op does not apply (the MoE op of a dense model).
func (md Model) ShapeFor(op Op, m int) (Shape, bool) {
	s := Shape{Name: md.Name, M: m}
	switch op {
	case OpAllGatherMatmul:
		s.N, s.K = md.QKV, md.Dim
	case OpMatmulReduceScatter, OpMatmulAllReduce:
		s.N, s.K = md.Dim, md.FFN
	case OpMoEDispatchCombine:
		if md.Experts == 0 {
			return s, false
		}
		s.N, s.Experts, s.TopK = md.Dim, md.Experts, md.TopK
		if md.MoEHidden > 0 {
			s.N = md.MoEHidden
		}
	case OpTPBlock, OpMoELayer, OpTrainStep:
		if op == OpMoELayer && md.Experts == 0 || md.Heads == 0 {
			return s, false
		}
		s.N, s.K, s.Heads, s.Seq = md.Dim, md.FFN, md.Heads, min(md.Seq, m)
		if op == OpMoELayer {
			s.Experts, s.TopK = md.Experts, md.TopK
		}
		if op == OpTrainStep {
			s.Vocab, s.Layers = md.Vocab, max(1, md.StepLayers)
		}
	default:
		return s, false
	}
	return s, true
}

// ParseMNK reads explicit shapes "M,N,K" separated by ";" or spaces.
func ParseMNK(s string) ([]Shape, error) {
	var out []Shape
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == ' ' }) {
		p := strings.Split(f, ",")
		if len(p) != 3 {
			return nil, fmt.Errorf("shape %q: expected M,N,K", f)
		}
		var v [3]int
		for i, x := range p {
			n, err := strconv.Atoi(strings.TrimSpace(x))
			if err != nil || n < 1 {
				return nil, fmt.Errorf("shape %q: %q: expected a positive integer", f, x)
			}
			v[i] = n
		}
		out = append(out, Shape{Name: "mnk", M: v[0], N: v[1], K: v[2]})
	}
	return out, nil
}

// Strategy names of the matrix: --overlap's (overlap/strategies), each one
// type that picks its implementation from the cell's group and backend
// (pipelined: copy-engine pulls over symmetric memory where the group has
// it, exchanges on its collectives elsewhere); Result.Via says which.
const (
	Collective = "collective"
	Pipelined  = "pipelined"
	Fused      = "fused"
)

// Strategies lists the strategy names, in report order.
var Strategies = []string{Collective, Pipelined, Fused}

// Transports: local (goroutine ranks), tcp (CPU processes), nccl and
// nvshmem (GPU processes).
var Transports = []string{"local", "tcp", "nccl", "nvshmem", "nccl+nvshmem"}

// Matrix is what one run measures: the product of its lists.
type Matrix struct {
	Ops        []Op     `json:"ops"`
	Models     []string `json:"models"`           // shape presets
	Ms         []int    `json:"ms,omitempty"`     // token counts; empty: each model's
	Explicit   []Shape  `json:"shapes,omitempty"` // explicit M,N,K (TP ops)
	Worlds     []int    `json:"worlds"`
	Transports []string `json:"transports"`
	Strategies []string `json:"strategies"`
	DType      string   `json:"dtype"` // f32, bf16 (f64 on the CPU)
	// Warmup rounds are run and discarded, then Reps rounds are timed: in
	// each round every strategy of a cell group runs once, in an order
	// that rotates from round to round.
	Warmup int `json:"warmup"`
	Reps   int `json:"reps"`
	// Alpha and MinEffect: what counts as a difference (Stats).
	Alpha     float64 `json:"alpha"`
	MinEffect float64 `json:"min_effect"`
}

// Stats are the matrix's significance settings.
func (m Matrix) Stats() Stats { return Stats{Alpha: m.Alpha, MinEffect: m.MinEffect} }

// Validate checks the names and sizes.
func (m Matrix) Validate() error {
	for _, o := range m.Ops {
		if !slices.Contains(Ops, o) {
			return fmt.Errorf("op %q: expected one of %v", o, Ops)
		}
	}
	for _, n := range m.Models {
		if _, ok := Models[n]; !ok {
			return fmt.Errorf("shape preset %q: expected one of %s", n, strings.Join(ModelNames(), ", "))
		}
	}
	for _, w := range m.Worlds {
		if w < 1 {
			return fmt.Errorf("world size %d: expected ≥ 1", w)
		}
	}
	for _, t := range m.Transports {
		if !slices.Contains(Transports, t) {
			return fmt.Errorf("transport %q: expected one of %s", t, strings.Join(Transports, ", "))
		}
	}
	for _, s := range m.Strategies {
		if !slices.Contains(Strategies, s) {
			return fmt.Errorf("strategy %q: expected one of %s", s, strings.Join(Strategies, ", "))
		}
	}
	switch m.DType {
	case "f32", "bf16", "f64":
	default:
		return fmt.Errorf("dtype %q: expected f32, bf16 or f64", m.DType)
	}
	if m.Reps < 1 || m.Warmup < 0 {
		return fmt.Errorf("reps %d, warm-up %d: expected reps ≥ 1 and warm-up ≥ 0", m.Reps, m.Warmup)
	}
	if err := m.Stats().Check(); err != nil {
		return err
	}
	if len(m.Ops) == 0 || len(m.Worlds) == 0 || len(m.Transports) == 0 || len(m.Strategies) == 0 || len(m.Models)+len(m.Explicit) == 0 {
		return fmt.Errorf("matrix %+v: expected at least one op, shape, world, transport and strategy", m)
	}
	return nil
}

// Cell is one measurement: an op in one direction at one shape, world,
// transport and strategy.
type Cell struct {
	Op        Op     `json:"op"`
	Dir       string `json:"dir"`
	Shape     Shape  `json:"shape"`
	World     int    `json:"world"`
	Transport string `json:"transport"`
	Strategy  string `json:"strategy"`
	DType     string `json:"dtype"`
}

// ID names the cell uniquely.
func (c Cell) ID() string {
	return fmt.Sprintf("%s/%s %v P=%d %s %s %s", c.Op, c.Dir, c.Shape, c.World, c.Transport, c.Strategy, c.DType)
}

// Group is the cell without its strategy: the cells of one group share
// inputs, the collective reference and the GEMM-alone and comm-alone times.
func (c Cell) Group() string {
	return fmt.Sprintf("%s/%s %v P=%d %s %s", c.Op, c.Dir, c.Shape, c.World, c.Transport, c.DType)
}

// Cells expands the matrix, in order: transport, world, op, shape,
// direction, strategy (collective first in each group, so a group's
// reference is computed before its other cells).
func (m Matrix) Cells() []Cell {
	strats := append([]string(nil), m.Strategies...)
	sort.SliceStable(strats, func(i, j int) bool { return strats[i] == Collective && strats[j] != Collective })
	var out []Cell
	for _, tr := range m.Transports {
		for _, w := range m.Worlds {
			for _, op := range m.Ops {
				for _, sh := range m.shapes(op) {
					for _, d := range sh.DirsOf(op) {
						for _, s := range strats {
							out = append(out, Cell{Op: op, Dir: d, Shape: sh, World: w, Transport: tr, Strategy: s, DType: m.DType})
						}
					}
				}
			}
		}
	}
	return out
}

func (m Matrix) shapes(op Op) []Shape {
	if _, ok := notCovered[op]; ok {
		return []Shape{{Name: "-"}}
	}
	var out []Shape
	for _, name := range m.Models {
		md := Models[name]
		ms := m.Ms
		if len(ms) == 0 {
			ms = md.Ms
			if op.IsLayer() && len(md.LayerMs) > 0 {
				ms = md.LayerMs
			}
		}
		for _, mm := range ms {
			out = append(out, md.ShapesFor(op, mm)...)
		}
	}
	if op != OpMoEDispatchCombine && !op.IsLayer() {
		out = append(out, m.Explicit...)
	}
	return out
}

// Runnable says why a cell cannot run on a machine with gpus GPUs (0: no
// usable GPU, gpuWhy saying why), or "" when it can. It checks what the
// matrix alone decides: the op, the strategy on the transport, the
// divisibility of the shape by the world.
func Runnable(c Cell, gpus int, gpuWhy string) string {
	if why, ok := notCovered[c.Op]; ok {
		return why
	}
	switch c.Transport {
	case "local", "tcp":
		if c.Transport == "tcp" && c.World == 1 {
			return "world 1 over tcp sends no message: it is local's world 1"
		}
		if c.DType == "bf16" {
			return fmt.Sprintf("bf16 on the CPU: run f32 or f64 on %s", c.Transport)
		}
	case "nccl", "nvshmem", "nccl+nvshmem":
		if gpus == 0 {
			return fmt.Sprintf("%s needs a GPU: %s", c.Transport, gpuWhy)
		}
		if c.DType == "f64" {
			return "f64 on the GPU: run bf16 or f32"
		}
		if c.Transport != "nvshmem" && c.World > gpus {
			return fmt.Sprintf("%s world %d needs %d GPUs (this machine has %d; NCCL refuses two ranks on one GPU)", c.Transport, c.World, c.World, gpus)
		}
	}
	// The fused strategy says itself which cells it cannot run (its
	// Supports, checked on the cell's ranks: the transport, the dtype, the
	// site kind, the GPU's GEMM engine); the reason is its own.
	if c.Op == OpMoEDispatchCombine && c.Strategy != Collective && c.Strategy != Fused {
		return fmt.Sprintf("%s: the expert path has no %s dispatcher yet", c.Strategy, c.Strategy)
	}
	P, s := c.World, c.Shape
	if c.Op.IsLayer() {
		return layerRunnable(c)
	}
	switch {
	case s.M%P != 0:
		return fmt.Sprintf("M %d is not divisible by world %d", s.M, P)
	case (c.Op == OpAllGatherMatmul || c.Op == OpMatmulAllReduce && c.Dir == "bwd") && s.N%P != 0:
		return fmt.Sprintf("N %d is not divisible by world %d", s.N, P)
	case (c.Op == OpMatmulReduceScatter || c.Op == OpMatmulAllReduce && c.Dir != "bwd") && s.K%P != 0:
		return fmt.Sprintf("K %d is not divisible by world %d", s.K, P)
	case c.Op == OpMoEDispatchCombine && s.Experts%P != 0:
		return fmt.Sprintf("%d experts are not divisible by world %d", s.Experts, P)
	}
	return ""
}
