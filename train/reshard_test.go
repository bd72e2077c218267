package train

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
)

// splitModel is a parameter set of w (4, 6) split along its rows over
// P ranks (this one rank r) and b (6) replicated, with an optimizer whose
// weights and moments are the slices of full's.
type splitModel struct {
	ps     *layers.ParamSet
	opt    *optim.AdamW
	shards []shard.Shard
}

func newSplit(t *testing.T, be tensor.Backend, P, r int) *splitModel {
	t.Helper()
	ps := layers.NewParamSet(1)
	w, err := ps.Add("w", []int{4 / P, 6}, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ps.Add("b", []int{6}, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.Materialize(be, tensor.Float32); err != nil {
		t.Fatal(err)
	}
	opt, err := optim.NewAdamW(be, ps)
	if err != nil {
		t.Fatal(err)
	}
	sw := shard.Shard{Param: w, Full: []int{4, 6}, Over: shard.TP, Dim: 0, Lo: r * 4 / P, Hi: (r + 1) * 4 / P}
	if P == 1 {
		sw = shard.Replicated(w, false)
	}
	return &splitModel{ps: ps, opt: opt, shards: []shard.Shard{sw, shard.Replicated(b, false)}}
}

// values are the model's weights, m and v by name, from the full values
// full (name → the full tensor's values) cut to its slices.
func (m *splitModel) set(t *testing.T, be tensor.Backend, full map[string][]float64) {
	t.Helper()
	moms, _ := m.opt.Moments()
	for i, s := range m.shards {
		sl := s.Slice()
		for k, dst := range []*tensor.Tensor{s.Param.W, moms[i].M, moms[i].V} {
			v := full[[]string{"", "m.", "v."}[k]+s.Param.Name]
			if !sl.Whole() {
				v = testutil.Slice(v, sl.Full, sl.Dim, sl.Lo, sl.Hi)
			}
			f := make([]float32, len(v))
			for j, x := range v {
				f[j] = float32(x)
			}
			h, _ := tensor.FromFloat32(f, dst.Shape()...)
			be.Upload(dst, h)
		}
	}
}

func (m *splitModel) get(t *testing.T, be tensor.Backend) map[string][]float64 {
	t.Helper()
	out := map[string][]float64{}
	moms, _ := m.opt.Moments()
	for i, s := range m.shards {
		out[s.Param.Name] = testutil.Download(be, s.Param.W)
		out["m."+s.Param.Name] = testutil.Download(be, moms[i].M)
		out["v."+s.Param.Name] = testutil.Download(be, moms[i].V)
	}
	return out
}

// TestReshardLoad: the checkpoints of a model whose w is split over 2
// ranks (each recording its slices and the ranks) load into the whole
// model and into rank 1 of 4, each tensor (weights and moments) its slice
// of the full one bit for bit; RunCheckpoints takes the newest step both
// ranks hold; a corrupted file, ranks that disagree on the step and a
// tensor the model does not have are refused, leaving the model as it was.
func TestReshardLoad(t *testing.T) {
	be := newCPU()
	rng := testutil.Rng(4)
	full := map[string][]float64{}
	for _, n := range []string{"w", "m.w", "v.w"} {
		full[n], _ = testutil.Rand(rng, tensor.Float32, 4, 6).Float64s()
	}
	for _, n := range []string{"b", "m.b", "v.b"} {
		full[n], _ = testutil.Rand(rng, tensor.Float32, 6).Float64s()
	}
	for i, v := range full["v.w"] { // second moments are not negative
		full["v.w"][i] = float64(float32(v * v))
	}
	for i, v := range full["v.b"] {
		full["v.b"][i] = float64(float32(v * v))
	}
	dir := t.TempDir()
	save := func(r, step int) {
		m := newSplit(t, be, 2, r)
		m.set(t, be, full)
		snap, err := TakeSnapshot(be, m.opt, nil)
		if err != nil {
			t.Fatal(err)
		}
		snap.slices = slicesOf(m.shards)
		pos := DataPosition{Epoch: 1, Index: 2, Seed: 3, Windows: 9, Seq: 4}
		if _, err := snap.Write(RankDir(dir, r), State{Step: step, Ranks: 2, Data: pos, TrainConfig: DefaultConfig()}); err != nil {
			t.Fatal(err)
		}
	}
	save(0, 3)
	save(1, 3)
	save(0, 5) // rank 1 died before its checkpoint of step 5
	cks, err := RunCheckpoints(dir)
	if err != nil || len(cks) != 2 || filepath.Base(cks[0]) != CheckpointName(3) || filepath.Base(cks[1]) != CheckpointName(3) {
		t.Fatalf("RunCheckpoints: %v, %v; want both ranks' step 3", cks, err)
	}
	for _, c := range []struct{ P, r int }{{1, 0}, {4, 1}, {2, 0}} {
		m := newSplit(t, be, c.P, c.r)
		st, err := loadResharded(cks, be, m.opt, m.shards)
		if err != nil || st.Step != 3 {
			t.Fatalf("P %d rank %d: %v (state %+v)", c.P, c.r, err, st)
		}
		got := m.get(t, be)
		for _, s := range m.shards {
			sl := s.Slice()
			for _, pre := range []string{"", "m.", "v."} {
				n := pre + s.Param.Name
				want := full[n]
				if !sl.Whole() {
					want = testutil.Slice(want, sl.Full, sl.Dim, sl.Lo, sl.Hi)
				}
				if !slices.Equal(got[n], want) {
					t.Fatalf("P %d rank %d: %s differs from its slice of the checkpoint's", c.P, c.r, n)
				}
			}
		}
	}

	m := newSplit(t, be, 1, 0)
	before := m.get(t, be)
	unchanged := func(what string) {
		t.Helper()
		for n, v := range m.get(t, be) {
			if !slices.Equal(v, before[n]) {
				t.Fatalf("%s changed %s", what, n)
			}
		}
	}
	// A model without b.
	ps := layers.NewParamSet(1)
	w, _ := ps.Add("w", []int{4, 6}, true, nil)
	if err := ps.Materialize(be, tensor.Float32); err != nil {
		t.Fatal(err)
	}
	opt, _ := optim.NewAdamW(be, ps)
	_, err = loadResharded(cks, be, opt, []shard.Shard{shard.Replicated(w, false)})
	testutil.ErrorContains(t, err, `holds tensor "b", which the model does not have`)
	// Ranks at different steps.
	_, err = loadResharded([]string{filepath.Join(RankDir(dir, 0), CheckpointName(5)), cks[1]}, be, m.opt, m.shards)
	testutil.ErrorContains(t, err, "disagree", "step 5 and 3")
	unchanged("a refused load")
	// A corrupted file.
	f := filepath.Join(cks[1], OptimFile)
	data, _ := os.ReadFile(f)
	data[len(data)-1] ^= 1
	if err := os.WriteFile(f, data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = loadResharded(cks, be, m.opt, m.shards)
	testutil.ErrorContains(t, err, "corrupted")
	unchanged("a refused load")
}
