package ep_test

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

const (
	seed = 17
	tol  = 1e-5 // float32, relative by norm
)

// scenario is one EP equivalence case: the tokens of the whole group, split
// unevenly over the ranks, and a router tweak applied to the reference and
// to every rank alike.
type scenario struct {
	name    string
	cfg     layers.MoEConfig
	tokens  int
	splits  map[int][]int // EP size → tokens per rank
	starve  []int         // experts the router never picks
	favour  int           // an expert the router prefers (−1: none)
	wantNil []int         // ranks (of EP 4) that must receive no row
}

var baseCfg = layers.MoEConfig{Dim: 8, Hidden: 12, Experts: 8, TopK: 2, AuxLossCoef: 0.1, ZLossCoef: 0.01, Std: 0.5, OutStd: 0.3}

var splits = map[int][]int{1: {16}, 2: {9, 7}, 4: {5, 3, 6, 2}}

func scenarios() []scenario {
	starved := baseCfg
	capped := baseCfg
	capped.CapacityFactor = 1
	top1 := baseCfg
	top1.TopK, top1.CapacityFactor = 1, 1.5
	return []scenario{
		{name: "dropless", cfg: baseCfg, tokens: 16, splits: splits, favour: -1},
		{name: "starved-experts", cfg: starved, tokens: 16, splits: splits, starve: []int{6, 7}, favour: 2, wantNil: []int{3}},
		{name: "capacity", cfg: capped, tokens: 16, splits: splits, favour: 0},
		{name: "top1-capacity", cfg: top1, tokens: 16, splits: splits, starve: []int{5}, favour: 1},
	}
}

// inputs returns the tokens (T, C) of the group: feature 0 is positive, so
// a router column-0 weight steers every token.
func (sc scenario) inputs() []float64 {
	x := testutil.RandFloats(testutil.Rng(3), sc.tokens*sc.cfg.Dim, 0.1, 1)
	for n := range sc.tokens {
		x[n*sc.cfg.Dim] = 1 + math.Abs(x[n*sc.cfg.Dim])
	}
	return x
}

// tweak sets column 0 of the router rows of the starved experts to −6 and
// of the favoured expert to +1.5.
func (sc scenario) tweak(t testing.TB, b tensor.Backend, w *tensor.Tensor) {
	vals := make([]float64, w.Numel())
	h, _ := tensor.FromFloat64(vals, w.Shape()...)
	b.Download(h, w)
	for _, e := range sc.starve {
		vals[e*sc.cfg.Dim] = -6
	}
	if sc.favour >= 0 {
		vals[sc.favour*sc.cfg.Dim] = 1.5
	}
	b.Upload(w, h)
}

// result is what a run produces, gathered over the ranks: outputs and
// input gradients concatenated by token, the router gradient summed, the
// expert gradients and initial weights concatenated by expert.
type result struct {
	out, dx, routerG   []float64
	expertG, expertW0  map[string][]float64
	aux                []float64 // per rank
	stats              []layers.MoEStats
	recvRows, sendRows []int
}

func download(t testing.TB, b tensor.Backend, x *tensor.Tensor) []float64 {
	h := tensor.MustHost(tensor.Float64, x.Shape()...)
	b.Download(h, x)
	if err := b.Err(); err != nil {
		t.Fatal(err)
	}
	return h.F64()
}

func upload(b tensor.Backend, vals []float64, shape ...int) *tensor.Tensor {
	h, _ := tensor.FromFloat64(vals, shape...)
	d := b.Zeros(tensor.Float32, shape...)
	b.Upload(d, h)
	return d
}

// reference runs layers.MoE over all the tokens.
func reference(t *testing.T, sc scenario) result {
	b, ps := cpu.New(), layers.NewParamSet(seed)
	m, err := layers.NewMoE(b, ps, "moe", sc.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.Materialize(b, tensor.Float32); err != nil {
		t.Fatal(err)
	}
	sc.tweak(t, b, m.Router.W.W)
	C, T := sc.cfg.Dim, sc.tokens
	x := upload(b, sc.inputs(), T, C)
	dout := upload(b, testutil.RandFloats(testutil.Rng(4), T*C, 0.1, 1), T, C)
	out, dx := b.Zeros(tensor.Float32, T, C), b.Zeros(tensor.Float32, T, C)
	r := result{expertG: map[string][]float64{}, expertW0: map[string][]float64{}}
	for _, p := range m.Experts.Params() {
		r.expertW0[p.Name] = download(t, b, p.W)
	}
	if err := m.Forward(out, x); err != nil {
		t.Fatal(err)
	}
	if err := m.Backward(dx, dout); err != nil {
		t.Fatal(err)
	}
	r.out, r.dx, r.routerG = download(t, b, out), download(t, b, dx), download(t, b, m.Router.W.G)
	for _, p := range m.Experts.Params() {
		r.expertG[p.Name] = download(t, b, p.G)
	}
	r.aux = []float64{m.AuxLoss()}
	r.stats = []layers.MoEStats{m.Stats()}
	return r
}

// runEP runs ep.MoE over P goroutine ranks, each with its slice of the
// tokens.
func runEP(t *testing.T, sc scenario, P int, opts ...local.Option) result {
	C, T := sc.cfg.Dim, sc.tokens
	xAll := sc.inputs()
	dAll := testutil.RandFloats(testutil.Rng(4), T*C, 0.1, 1)
	split := sc.splits[P]
	lo := make([]int, P+1)
	for r, n := range split {
		lo[r+1] = lo[r] + n
	}
	type rankOut struct {
		out, dx, routerG []float64
		expertG, w0      map[string][]float64
		aux              float64
		stats            layers.MoEStats
		recv, send       int
	}
	outs := make([]rankOut, P)
	err := local.Run(P, func(c comm.Comm) error {
		r := c.Rank()
		b, ps := cpu.New(), layers.NewParamSet(seed)
		m, err := ep.New(b, ps, ep.Parallel{Group: c}, "moe", sc.cfg)
		if err != nil {
			return err
		}
		if err := ps.Materialize(b, tensor.Float32); err != nil {
			return err
		}
		sc.tweak(t, b, m.Router.W.W)
		n := split[r]
		x := upload(b, xAll[lo[r]*C:lo[r+1]*C], n, C)
		dout := upload(b, dAll[lo[r]*C:lo[r+1]*C], n, C)
		out, dx := b.Zeros(tensor.Float32, n, C), b.Zeros(tensor.Float32, n, C)
		o := rankOut{expertG: map[string][]float64{}, w0: map[string][]float64{}}
		for _, p := range m.ExpertParams() {
			o.w0[p.Name] = download(t, b, p.W)
		}
		if err := m.Forward(out, x); err != nil {
			return err
		}
		if err := m.Backward(dx, dout); err != nil {
			return err
		}
		o.out, o.dx, o.routerG = download(t, b, out), download(t, b, dx), download(t, b, m.Router.W.G)
		for _, p := range m.ExpertParams() {
			o.expertG[p.Name] = download(t, b, p.G)
		}
		o.aux, o.stats = m.AuxLoss(), m.Stats()
		o.recv, o.send = m.Handle().RecvRows(), m.Handle().SendRows()
		outs[r] = o
		return nil
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	res := result{expertG: map[string][]float64{}, expertW0: map[string][]float64{}}
	for _, o := range outs {
		res.out = append(res.out, o.out...)
		res.dx = append(res.dx, o.dx...)
		if res.routerG == nil {
			res.routerG = make([]float64, len(o.routerG))
		}
		for i, v := range o.routerG {
			res.routerG[i] += v
		}
		for name, g := range o.expertG {
			res.expertG[name] = append(res.expertG[name], g...)
			res.expertW0[name] = append(res.expertW0[name], o.w0[name]...)
		}
		res.aux = append(res.aux, o.aux)
		res.stats = append(res.stats, o.stats)
		res.recvRows = append(res.recvRows, o.recv)
		res.sendRows = append(res.sendRows, o.send)
	}
	return res
}

// TestEquivalence: for EP 1, 2 and 4, the EP layer over uneven token
// slices gives the outputs, aux loss, statistics and every gradient of the
// single-rank layer over all the tokens.
func TestEquivalence(t *testing.T) {
	for _, sc := range scenarios() {
		ref := reference(t, sc)
		rs := ref.stats[0]
		t.Logf("%s: reference routing %v, dropped %d, aux %.6g", sc.name, rs.TokensPerExpert, rs.Dropped, ref.aux[0])
		for _, e := range sc.starve {
			if rs.TokensPerExpert[e] != 0 {
				t.Fatalf("%s: starved expert %d got %d slots", sc.name, e, rs.TokensPerExpert[e])
			}
		}
		if (sc.cfg.CapacityFactor > 0) != (rs.Dropped > 0) {
			t.Fatalf("%s: %d slots dropped with capacity factor %v", sc.name, rs.Dropped, sc.cfg.CapacityFactor)
		}
		for _, P := range []int{1, 2, 4} {
			t.Run(fmt.Sprintf("%s/ep=%d", sc.name, P), func(t *testing.T) {
				got := runEP(t, sc, P)
				testutil.AllClose(t, "out", got.out, ref.out, tol)
				testutil.AllClose(t, "dx", got.dx, ref.dx, tol)
				testutil.AllClose(t, "router grad (summed)", got.routerG, ref.routerG, tol)
				for name, want := range ref.expertG {
					testutil.AllClose(t, name+" initial shards", got.expertW0[name], ref.expertW0[name], 0)
					testutil.AllClose(t, name+" grad", got.expertG[name], want, tol)
				}
				for r, st := range got.stats {
					if math.Abs(got.aux[r]-ref.aux[0]) > tol*math.Abs(ref.aux[0]) {
						t.Errorf("rank %d: aux loss %v, want %v", r, got.aux[r], ref.aux[0])
					}
					if !slices.Equal(st.TokensPerExpert, rs.TokensPerExpert) || st.Dropped != rs.Dropped || st.Tokens != rs.Tokens {
						t.Errorf("rank %d: stats %+v, want %+v", r, st, rs)
					}
					if math.Abs(st.LoadBalance-rs.LoadBalance) > tol || math.Abs(st.ZLoss-rs.ZLoss) > tol*rs.ZLoss {
						t.Errorf("rank %d: losses %v %v, want %v %v", r, st.LoadBalance, st.ZLoss, rs.LoadBalance, rs.ZLoss)
					}
				}
				if P == 4 {
					for _, r := range sc.wantNil {
						if got.recvRows[r] != 0 {
							t.Errorf("rank %d received %d rows, want none", r, got.recvRows[r])
						}
					}
				}
				t.Logf("rows sent %v, received %v", got.sendRows, got.recvRows)
			})
		}
	}
}

// TestEquivalenceAsync reruns a case with collectives that complete only
// at Wait, so a read before the Work is waited for would show.
func TestEquivalenceAsync(t *testing.T) {
	sc := scenarios()[2]
	ref := reference(t, sc)
	got := runEP(t, sc, 4, local.Async())
	testutil.AllClose(t, "out", got.out, ref.out, tol)
	testutil.AllClose(t, "dx", got.dx, ref.dx, tol)
	testutil.AllClose(t, "router grad (summed)", got.routerG, ref.routerG, tol)
}

// TestDispatchCombineRoundTrip drives the protocol by hand: identity
// experts and weights 1/K give back x; DispatchBackward is the adjoint of
// Dispatch (Σ over ranks of ⟨recv, g⟩ = Σ of ⟨x, dx⟩).
func TestDispatchCombineRoundTrip(t *testing.T) {
	const P, E, K, C = 4, 8, 3, 5
	ns := []int{4, 1, 6, 3}
	dots := make([][2]float64, P)
	err := local.Run(P, func(c comm.Comm) error {
		b := cpu.New()
		d, err := ep.NewDispatcher(b, c, E, nil)
		if err != nil {
			return err
		}
		r, n := c.Rank(), ns[c.Rank()]
		rng := testutil.Rng(uint64(10 + r))
		idx := make([]int32, n*K)
		for i := range n {
			for j, e := range rng.Perm(E)[:K] {
				idx[i*K+j] = int32(e)
			}
		}
		l, err := d.Layout(idx, n, K, 0)
		if err != nil {
			return err
		}
		if sum(l.PerRank) != n*K || sum(l.PerExpert) != n*K {
			return fmt.Errorf("layout counts %v %v for %d slots", l.PerRank, l.PerExpert, n*K)
		}
		xv := testutil.RandFloats(rng, n*C, 0.1, 1)
		x := upload(b, xv, n, C)
		recv, h, w, err := d.Dispatch(x, l)
		if err != nil {
			return err
		}
		if err := w.Wait(nil); err != nil {
			return err
		}
		if sum(h.ExpertCounts) != h.RecvRows() || h.SendRows() != n*K {
			return fmt.Errorf("handle counts: experts %v, recv %d, send %d", h.ExpertCounts, h.RecvRows(), h.SendRows())
		}
		wts := upload(b, slices.Repeat([]float64{1.0 / K}, n*K), n, K)
		out := b.Zeros(tensor.Float32, n, C)
		if err := d.Combine(out, recv, wts, h); err != nil {
			return err
		}
		testutil.AllClose(t, fmt.Sprintf("rank %d round trip", r), download(t, b, out), xv, 1e-6)

		g := upload(b, testutil.RandFloats(rng, recv.Numel(), 0.1, 1), recv.Shape()...)
		dx := b.Zeros(tensor.Float32, n, C)
		if err := d.DispatchBackward(dx, g, h); err != nil {
			return err
		}
		dots[r] = [2]float64{testutil.Dot(download(t, b, recv), download(t, b, g)), testutil.Dot(xv, download(t, b, dx))}
		d.Release(h)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var lhs, rhs float64
	for _, v := range dots {
		lhs, rhs = lhs+v[0], rhs+v[1]
	}
	if math.Abs(lhs-rhs) > 1e-5*math.Abs(lhs) {
		t.Errorf("dispatch and its backward are not adjoint: %v vs %v", lhs, rhs)
	}
}

func sum(v []int) int {
	s := 0
	for _, x := range v {
		s += x
	}
	return s
}

func TestShards(t *testing.T) {
	err := local.Run(2, func(c comm.Comm) error {
		b, ps := cpu.New(), layers.NewParamSet(1)
		m, err := ep.New(b, ps, ep.Parallel{Group: c}, "blocks.0.moe", baseCfg)
		if err != nil {
			return err
		}
		infos := m.Shards()
		if len(infos) != 4 || !infos[0].Replicated() || infos[0].Param.Name != "blocks.0.moe.router.weight" {
			return fmt.Errorf("infos %+v", infos)
		}
		for _, in := range infos {
			if err := in.Check(); err != nil {
				return err
			}
		}
		for _, in := range infos[1:] {
			lo := 4 * c.Rank()
			if in.Over != shard.EP || in.Dim != 0 || in.Lo != lo || in.Hi != lo+4 || in.Full[0] != 8 || in.Param.Shape()[0] != 4 {
				return fmt.Errorf("expert info %+v (shape %v)", in, in.Param.Shape())
			}
		}
		if len(m.ExpertParams()) != 3 || len(m.ReplicatedParams()) != 1 || len(m.Params()) != 4 {
			return fmt.Errorf("param lists")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestErrors(t *testing.T) {
	err := local.Run(3, func(c comm.Comm) error {
		b := cpu.New()
		if _, err := ep.New(b, layers.NewParamSet(1), ep.Parallel{Group: c}, "moe", baseCfg); err == nil || !strings.Contains(err.Error(), "divisible") {
			return fmt.Errorf("8 experts over 3 ranks: %v", err)
		}
		for _, bad := range []struct {
			par  ep.Parallel
			want string
		}{
			{ep.Parallel{}, "nil backend or EP group (Parallel.Group)"},
			{ep.Parallel{Group: c, MaxTokens: -1}, "Parallel.MaxTokens = -1"},
			{ep.Parallel{Group: c, AuxGradScale: math.NaN()}, "Parallel.AuxGradScale = NaN"},
		} {
			if _, err := ep.New(b, layers.NewParamSet(1), bad.par, "moe", baseCfg); err == nil || !strings.Contains(err.Error(), bad.want) {
				return fmt.Errorf("ep.New with %+v: %v, want an error containing %q", bad.par, err, bad.want)
			}
		}
		var plain tensor.Backend = struct{ tensor.Backend }{b}
		cfg := baseCfg
		cfg.Experts = 3
		if _, err := ep.New(plain, layers.NewParamSet(1), ep.Parallel{Group: c}, "moe", cfg); err == nil || !strings.Contains(err.Error(), "MoEOps") {
			return fmt.Errorf("a backend without MoE ops: %v", err)
		}
		ps := layers.NewParamSet(1)
		m, err := ep.New(b, ps, ep.Parallel{Group: c}, "moe", cfg)
		if err != nil {
			return err
		}
		x := b.Zeros(tensor.Float32, 2, 8)
		if err := m.Forward(b.Zeros(tensor.Float32, 2, 8), x); err == nil || !strings.Contains(err.Error(), "not materialized") {
			return fmt.Errorf("Forward before Materialize: %v", err)
		}
		if err := ps.Materialize(b, tensor.Float32); err != nil {
			return err
		}
		if err := m.Backward(x, x); err == nil || !strings.Contains(err.Error(), "without a successful Forward") {
			return fmt.Errorf("Backward before Forward: %v", err)
		}
		if err := m.Forward(b.Zeros(tensor.Float32, 3, 8), x); err == nil || !strings.Contains(err.Error(), "expected 2 rows") {
			return fmt.Errorf("Forward with a bad output: %v", err)
		}
		none := b.Zeros(tensor.Float32, 0, 8)
		if err := m.Forward(none, none); err == nil || !strings.Contains(err.Error(), "no tokens, expected at least 1 row of 8") {
			return fmt.Errorf("Forward of 0 tokens: %v, want an error saying at least 1 row", err)
		}
		d := m.Dispatch
		if _, err := d.Layout([]int32{0, 5}, 1, 2, 0); err == nil || !strings.Contains(err.Error(), "expert 5") {
			return fmt.Errorf("layout with a bad expert: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The dispatcher's row buffers persist across steps (a smaller step reuses
// the larger step's storage and still round-trips), and SetMaxTokens
// refuses a step over the bound, naming both numbers.
func TestPersistentBuffersAndMaxTokens(t *testing.T) {
	const P, E, K, C = 2, 4, 2, 3
	err := local.Run(P, func(c comm.Comm) error {
		b := cpu.New()
		d, err := ep.NewDispatcher(b, c, E, nil)
		if err != nil {
			return err
		}
		d.SetMaxTokens(6)
		var first tensor.Buffer
		for step, n := range []int{6, 4, 7} {
			rng := testutil.Rng(uint64(20 + 3*c.Rank() + step))
			idx := make([]int32, n*K)
			for i := range n {
				for j, e := range rng.Perm(E)[:K] {
					idx[i*K+j] = int32(e)
				}
			}
			l, err := d.Layout(idx, n, K, 0)
			if err != nil {
				return err
			}
			xv := testutil.RandFloats(rng, n*C, 0.1, 1)
			recv, h, w, err := d.Dispatch(upload(b, xv, n, C), l)
			if n > 6 {
				if err == nil || !strings.Contains(err.Error(), "7 tokens on this rank, expected at most 6") {
					return fmt.Errorf("step of 7 tokens with a bound of 6: %v", err)
				}
				return nil
			}
			if err != nil {
				return err
			}
			if err := w.Wait(nil); err != nil {
				return err
			}
			if step == 0 {
				first = recv.Buffer()
			} else if recv.Buffer() != first && h.RecvRows() > 0 {
				return fmt.Errorf("step %d: the received rows are in new storage, want the persistent buffer reused", step)
			}
			out := b.Zeros(tensor.Float32, n, C)
			if err := d.Combine(out, recv, upload(b, slices.Repeat([]float64{1.0 / K}, n*K), n, K), h); err != nil {
				return err
			}
			testutil.AllClose(t, fmt.Sprintf("rank %d step %d round trip", c.Rank(), step), download(t, b, out), xv, 1e-6)
			d.Release(h)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A step that only one rank brings over the bound is refused by every
// rank at once (the bound is checked on the exchanged counts), not left
// waiting in the exchange.
func TestMaxTokensRefusedTogether(t *testing.T) {
	const P, E, K, C = 2, 4, 2, 3
	errs := make([]error, P)
	start := time.Now()
	err := local.Run(P, func(c comm.Comm) error {
		b := cpu.New()
		d, err := ep.NewDispatcher(b, c, E, nil)
		if err != nil {
			return err
		}
		d.SetMaxTokens(4)
		n := []int{7, 3}[c.Rank()]
		idx := make([]int32, n*K)
		for i := range idx {
			idx[i] = int32((i + c.Rank()) % E)
		}
		l, err := d.Layout(idx, n, K, 0)
		if err != nil {
			return err
		}
		_, _, _, errs[c.Rank()] = d.Dispatch(upload(b, testutil.RandFloats(testutil.Rng(5), n*C, 0.1, 1), n, C), l)
		return nil
	}, local.WithTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the refusal took %v: a rank waited for the other", took)
	}
	for r, want := range []string{"7 tokens on this rank, expected at most 4", "7 tokens on token-group rank 0, expected at most 4"} {
		if errs[r] == nil || !strings.Contains(errs[r].Error(), want) {
			t.Errorf("rank %d: %v, want an error with %q", r, errs[r], want)
		}
	}
}
