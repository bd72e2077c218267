package train

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/safetensors"
	"github.com/asynctp/asynctp/tensor"
)

// trainedBigram returns a bigram model and optimizer after a few steps, so
// that parameters and moments are all non-trivial.
func trainedBigram(t *testing.T, dt tensor.DType, V int) (*bigram, *optim.AdamW, tensor.Backend) {
	t.Helper()
	b := newCPU()
	m := newBigram(t, b, V, dt, 11)
	opt, err := optim.NewAdamWWithConfig(b, m.Params(), optim.AdamWConfig{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	rng := testutil.Rng(2)
	for step := 1; step <= 3; step++ {
		m.ZeroGrad()
		ids := testutil.RandInts(rng, V, 2, 5)
		tg := testutil.RandInts(rng, V, 2, 5)
		if _, err := m.Forward(ids, tg); err != nil {
			t.Fatal(err)
		}
		if err := m.Backward(); err != nil {
			t.Fatal(err)
		}
		if err := opt.Step(step, 0.01, 1); err != nil {
			t.Fatal(err)
		}
	}
	return m, opt, b
}

func optState(t *testing.T, opt *optim.AdamW) []float64 {
	m, v := opt.Flat()
	return append(testutil.Values(t, m), testutil.Values(t, v)...)
}

func TestCheckpointRoundTrip(t *testing.T) {
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64} {
		t.Run(dt.String(), func(t *testing.T) {
			out := t.TempDir()
			m, opt, b := trainedBigram(t, dt, 6)
			st := State{Step: 3, Data: DataPosition{Epoch: 1, Index: 2, Seed: 5, Windows: 9, Seq: 4}, Loss: 1.25, TrainConfig: DefaultConfig()}
			dir, err := SaveCheckpoint(out, b, opt, st)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Base(dir) != "step-000003" {
				t.Errorf("checkpoint dir %s", dir)
			}
			for _, f := range []string{ModelFile, OptimFile, StateFile} {
				if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
					t.Errorf("missing %s: %v", f, err)
				}
			}
			if ents, _ := filepath.Glob(filepath.Join(out, ".tmp-*")); len(ents) > 0 {
				t.Errorf("temporary files left: %v", ents)
			}
			if l, err := LatestCheckpoint(out); err != nil || l != dir {
				t.Errorf("latest = %q, %v; want %s", l, err, dir)
			}
			// The model file holds the parameters by name, in the model's dtype.
			data, _ := os.ReadFile(filepath.Join(dir, ModelFile))
			sf, err := safetensors.Read(data)
			if err != nil {
				t.Fatal(err)
			}
			if e := sf.Entries["emb"]; e == nil || e.DType != dt || !e.Shape.Equal(tensor.Shape{6, 6}) {
				t.Errorf("model.safetensors entry emb: %+v", e)
			}

			// Load into a fresh model with other initial values: exact copy.
			m2, opt2, _ := trainedBigram(t, dt, 6)
			m2.Params().Params()[0].W.SetFloat64s(make([]float64, 36))
			got, err := LoadCheckpoint(dir, b, opt2)
			if err != nil {
				t.Fatal(err)
			}
			if got.Step != 3 || got.Data != st.Data || got.Loss != 1.25 || got.ModelDType != dt.String() {
				t.Errorf("state %+v", got)
			}
			if !reflect.DeepEqual(paramValues(t, m2.Params()), paramValues(t, m.Params())) {
				t.Errorf("parameters differ after load")
			}
			if !reflect.DeepEqual(optState(t, opt2), optState(t, opt)) {
				t.Errorf("moments differ after load")
			}
		})
	}
}

func TestCheckpointLoadErrors(t *testing.T) {
	out := t.TempDir()
	_, opt, b := trainedBigram(t, tensor.Float32, 6)
	dir, err := SaveCheckpoint(out, b, opt, State{Step: 100, TrainConfig: DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	// copyCkpt makes a damaged copy of the checkpoint.
	copyCkpt := func(t *testing.T, damage func(d string)) string {
		d := filepath.Join(t.TempDir(), "step-000100")
		os.Mkdir(d, 0o755)
		for _, f := range []string{ModelFile, OptimFile, StateFile} {
			data, _ := os.ReadFile(filepath.Join(dir, f))
			os.WriteFile(filepath.Join(d, f), data, 0o644)
		}
		damage(d)
		return d
	}
	// fixSha rewrites state.json's sha256 of file f to match its bytes, so
	// the structural checks behind the hash are reached.
	fixSha := func(d, f string) {
		data, _ := os.ReadFile(filepath.Join(d, f))
		sum := sha256.Sum256(data)
		st, _ := ReadState(filepath.Join(d, StateFile))
		st.Files[f] = hex.EncodeToString(sum[:])
		js, _ := marshalState(st)
		os.WriteFile(filepath.Join(d, StateFile), js, 0o644)
	}
	editState := func(d string, from, to string) {
		p := filepath.Join(d, StateFile)
		js, _ := os.ReadFile(p)
		os.WriteFile(p, []byte(strings.Replace(string(js), from, to, 1)), 0o644)
	}
	for _, tc := range []struct {
		name   string
		damage func(d string)
		want   []string
	}{
		{"flipped byte", func(d string) {
			p := filepath.Join(d, ModelFile)
			data, _ := os.ReadFile(p)
			data[len(data)-1] ^= 1
			os.WriteFile(p, data, 0o644)
		}, []string{"checkpoint step-000100/model.safetensors is corrupted: sha256", "expected"}},
		{"truncated", func(d string) {
			p := filepath.Join(d, OptimFile)
			data, _ := os.ReadFile(p)
			os.WriteFile(p, data[:len(data)-10], 0o644)
			fixSha(d, OptimFile)
		}, []string{"step-000100/optim.safetensors", "out of range"}},
		{"garbage header", func(d string) {
			os.WriteFile(filepath.Join(d, ModelFile), []byte("\x05\x00\x00\x00\x00\x00\x00\x00{nope"), 0o644)
			fixSha(d, ModelFile)
		}, []string{"model.safetensors", "bad header JSON"}},
		{"missing file", func(d string) { os.Remove(filepath.Join(d, OptimFile)) }, []string{"optim.safetensors", "no such file"}},
		{"version", func(d string) { editState(d, `"format_version": 2`, `"format_version": 7`) }, []string{"unsupported format version 7"}},
		{"state json", func(d string) { os.WriteFile(filepath.Join(d, StateFile), []byte("{"), 0o644) }, []string{"state.json", "bad JSON"}},
		{"dtype", func(d string) { editState(d, `"model_dtype": "f32"`, `"model_dtype": "f64"`) }, []string{"holds f64 parameters", "model's are f32"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, opt2, b2 := trainedBigram(t, tensor.Float32, 6)
			before := paramValues(t, opt2.Params())
			_, err := LoadCheckpoint(copyCkpt(t, tc.damage), b2, opt2)
			testutil.ErrorContains(t, err, tc.want...)
			if !reflect.DeepEqual(paramValues(t, opt2.Params()), before) {
				t.Errorf("a failed load changed the parameters")
			}
		})
	}

	// A model of another shape, or with other names.
	_, optV, bV := trainedBigram(t, tensor.Float32, 7)
	_, err = LoadCheckpoint(dir, bV, optV)
	testutil.ErrorContains(t, err, "model.safetensors", `tensor "emb" has shape (6, 6), the model's is (7, 7)`)

	other := newBigram(t, bV, 6, tensor.Float32, 1)
	other.Params().Params()[1].Name = "bias2" // what a renamed layer looks like
	optO, err := optim.NewAdamW(bV, other.Params())
	if err != nil {
		t.Fatal(err)
	}
	_, err = LoadCheckpoint(dir, bV, optO)
	testutil.ErrorContains(t, err, `has no tensor "bias2"`)
}

func TestLatestResolveAndPrune(t *testing.T) {
	out := t.TempDir()
	_, opt, b := trainedBigram(t, tensor.Float32, 4)
	var dirs []string
	for _, s := range []int{10, 20, 30, 40} {
		d, err := SaveCheckpoint(out, b, opt, State{Step: s, TrainConfig: DefaultConfig()})
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d)
	}
	if got, err := ResolveCheckpoint(out); err != nil || got != dirs[3] {
		t.Errorf("ResolveCheckpoint(out dir) = %q, %v; want %s", got, err, dirs[3])
	}
	if got, err := ResolveCheckpoint(dirs[1]); err != nil || got != dirs[1] {
		t.Errorf("ResolveCheckpoint(checkpoint) = %q, %v", got, err)
	}
	_, err := ResolveCheckpoint(filepath.Join(out, "nope"))
	testutil.ErrorContains(t, err, "no such directory")
	_, err = ResolveCheckpoint(t.TempDir())
	testutil.ErrorContains(t, err, "neither a checkpoint")

	if err := PruneCheckpoints(out, 2); err != nil {
		t.Fatal(err)
	}
	left, _ := ListCheckpoints(out)
	if !reflect.DeepEqual(left, dirs[2:]) {
		t.Errorf("after pruning to 2: %v, want %v", left, dirs[2:])
	}
	// Rewriting an existing step replaces it.
	if _, err := SaveCheckpoint(out, b, opt, State{Step: 30, Loss: 9, TrainConfig: DefaultConfig()}); err != nil {
		t.Fatal(err)
	}
	st, err := ReadState(filepath.Join(dirs[2], StateFile))
	if err != nil || st.Loss != 9 {
		t.Errorf("replaced checkpoint: %+v, %v", st, err)
	}
	if l, _ := LatestCheckpoint(out); l != dirs[2] {
		t.Errorf("latest = %s, want %s", l, dirs[2])
	}
	os.WriteFile(filepath.Join(out, LatestFile), []byte("../../etc\n"), 0o644)
	_, err = LatestCheckpoint(out)
	testutil.ErrorContains(t, err, "not a checkpoint directory")
}

// TestMasterCopyBF16 covers the mixed-precision hook: bf16 parameters get
// an fp32 master copy; the checkpoint stores the master as F32 and a load
// restores it and rounds it into the parameters.
func TestMasterCopyBF16(t *testing.T) {
	m, opt, b := trainedBigram(t, tensor.BFloat16, 5)
	if opt.Master() == nil || opt.Master().DType() != tensor.Float32 || opt.MomentDType() != tensor.Float32 {
		t.Fatalf("bf16 params: master %v, moments %v", opt.Master(), opt.MomentDType())
	}
	master := testutil.Values(t, opt.Master())
	for i, w := range paramValues(t, m.Params()) {
		if want := float64(tensor.RoundBF16(float32(master[i]))); w != want {
			t.Fatalf("param %d = %v, want the master %v rounded to bf16 (%v)", i, w, master[i], want)
		}
	}
	out := t.TempDir()
	dir, err := SaveCheckpoint(out, b, opt, State{Step: 3, TrainConfig: DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(dir, ModelFile))
	sf, err := safetensors.Read(data)
	if err != nil || sf.Entries["emb"].DType != tensor.Float32 {
		t.Fatalf("bf16 model checkpoint: %v %+v", err, sf)
	}
	m2 := newBigram(t, b, 5, tensor.BFloat16, 99)
	opt2, err := optim.NewAdamW(b, m2.Params())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCheckpoint(dir, b, opt2); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(testutil.Values(t, opt2.Master()), master) || !reflect.DeepEqual(paramValues(t, m2.Params()), paramValues(t, m.Params())) {
		t.Errorf("master or parameters differ after load")
	}
}
