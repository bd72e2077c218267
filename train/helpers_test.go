package train

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
	"github.com/asynctp/asynctp/tokens"
)

// bigram is a small fake model: logits[n] = emb[ids[n]] + bias, mean
// softmax cross-entropy. emb decays, bias does not. It computes on the host
// slices of the cpu backend's tensors, in float64, and accumulates grads.
type bigram struct {
	ps        *layers.ParamSet
	emb, bias *layers.Param
	V         int
	// last forward
	ids, targets []int32
	probs        [][]float64
	// nanAt makes Forward return NaN at that call (1-based); infGradAt puts
	// an Inf in a gradient at that Backward.
	calls, nanAt, infGradAt int
}

func newBigram(t testing.TB, b tensor.Backend, V int, dt tensor.DType, seed uint64) *bigram {
	t.Helper()
	ps := layers.NewParamSet(seed)
	emb, err := ps.Add("emb", []int{V, V}, true, layers.Normal(0.5))
	if err != nil {
		t.Fatal(err)
	}
	bias, err := ps.Add("bias", []int{V}, false, layers.Normal(0.1))
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.Materialize(b, dt); err != nil {
		t.Fatal(err)
	}
	return &bigram{ps: ps, emb: emb, bias: bias, V: V}
}

func (m *bigram) Params() *layers.ParamSet { return m.ps }
func (m *bigram) ZeroGrad()                { m.ps.ZeroGrad() }
func (m *bigram) FLOPsPerToken() float64   { return float64(6 * m.V) }

func (m *bigram) Forward(ids, targets *tensor.Tensor) (float64, error) {
	m.calls++
	emb, _ := m.emb.W.Float64s()
	bias, _ := m.bias.W.Float64s()
	m.ids, m.targets = ids.I32(), targets.I32()
	m.probs = m.probs[:0]
	var loss float64
	for n, id := range m.ids {
		row := make([]float64, m.V)
		mx := math.Inf(-1)
		for j := range row {
			row[j] = emb[int(id)*m.V+j] + bias[j]
			mx = math.Max(mx, row[j])
		}
		var s float64
		for j := range row {
			row[j] = math.Exp(row[j] - mx)
			s += row[j]
		}
		for j := range row {
			row[j] /= s
		}
		loss -= math.Log(row[m.targets[n]])
		m.probs = append(m.probs, row)
	}
	loss /= float64(len(m.ids))
	if m.calls == m.nanAt {
		loss = math.NaN()
	}
	return loss, nil
}

func (m *bigram) Backward() error {
	gEmb, _ := m.emb.G.Float64s()
	gBias, _ := m.bias.G.Float64s()
	inv := 1 / float64(len(m.ids))
	for n, id := range m.ids {
		for j, p := range m.probs[n] {
			d := p
			if int32(j) == m.targets[n] {
				d--
			}
			gEmb[int(id)*m.V+j] += d * inv
			gBias[j] += d * inv
		}
	}
	if m.calls == m.infGradAt {
		gBias[0] = math.Inf(1)
	}
	if err := m.emb.G.SetFloat64s(gEmb); err != nil {
		return err
	}
	return m.bias.G.SetFloat64s(gBias)
}

// corpus is a deterministic text of n bytes over a small alphabet with
// structure a bigram can learn.
func corpus(n int) []byte {
	words := []string{"the ", "cat ", "sat ", "on ", "a ", "mat. ", "dog ", "ran "}
	out := make([]byte, 0, n+8)
	x := uint32(7)
	for len(out) < n {
		x = x*1664525 + 1013904223
		out = append(out, words[(x>>24)%uint32(len(words))]...)
	}
	return out[:n]
}

func writeTemp(t testing.TB, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func newCPU() tensor.Backend { return cpu.New() }

func mustLoader(t testing.TB, data []byte, cfg LoaderConfig) *Loader {
	t.Helper()
	l, err := NewLoader(tokens.FromBytes("corpus", data), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// paramValues is the values of ps's parameters, flat.
func paramValues(t testing.TB, ps *layers.ParamSet) []float64 {
	t.Helper()
	w, _ := ps.Flat()
	return testutil.Values(t, w)
}
