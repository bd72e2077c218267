package train

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/optim"
)

func sampleState() State {
	return State{
		FormatVersion: FormatVersion,
		Step:          100,
		Data:          DataPosition{Epoch: 2, Index: 5, Seed: 7, Windows: 30, Seq: 64},
		Loss:          2.5,
		ElapsedS:      12.5,
		ModelDType:    "f32",
		ModelConfig:   json.RawMessage(`{"Layers":2}`),
		TrainConfig:   DefaultConfig(),
		Files: map[string]string{
			ModelFile: strings.Repeat("ab", 32),
			OptimFile: strings.Repeat("0f", 32),
		},
		Layout: json.RawMessage(`{"tp":1}`),
	}
}

func TestStateRoundTrip(t *testing.T) {
	st := sampleState()
	b, err := marshalState(&st)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseState(b)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := marshalState(got)
	if string(b) != string(b2) {
		t.Errorf("state changed in a round trip:\n%s\n%s", b, b2)
	}
}

func TestParseStateErrors(t *testing.T) {
	enc := func(mod func(*State)) []byte {
		st := sampleState()
		mod(&st)
		b, _ := marshalState(&st)
		return b
	}
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"not json", []byte("{"), "bad JSON"},
		{"no version", []byte(`{"step":1}`), "no format_version"},
		{"future version", enc(func(s *State) { s.FormatVersion = 3 }), "unsupported format version 3 (this build reads versions 1 to 2)"},
		{"negative step", enc(func(s *State) { s.Step = -1 }), "step -1"},
		{"bad position", enc(func(s *State) { s.Data.Index = 30 }), "index 30"},
		{"replan past the step", enc(func(s *State) { s.Replans = []optim.Replan{{At: 200, Steps: 300}} }), "replans"},
		{"replans out of order", enc(func(s *State) { s.Replans = []optim.Replan{{At: 50, Steps: 300}, {At: 40, Steps: 400}} }), "replans"},
		{"bad dtype", enc(func(s *State) { s.ModelDType = "i8" }), `model_dtype "i8"`},
		{"missing sha", enc(func(s *State) { delete(s.Files, OptimFile) }), "no sha256 for optim.safetensors"},
		{"bad sha", enc(func(s *State) { s.Files[ModelFile] = "xyz" }), "64 lowercase hex"},
		{"unknown file", enc(func(s *State) { s.Files["x"] = strings.Repeat("0", 64) }), `unknown file "x"`},
		{"unknown field", []byte(`{"format_version":1,"bogus":1}`), "unknown field"},
		{"trailing", append(enc(func(*State) {}), []byte(`{}`)...), "bad JSON"},
		{"too big", make([]byte, MaxStateSize+1), "over the limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseState(tc.data)
			testutil.ErrorContains(t, err, tc.want)
		})
	}
}

func FuzzReadState(f *testing.F) {
	st := sampleState()
	b, _ := marshalState(&st)
	f.Add(b)
	f.Add([]byte(`{"format_version":1}`))
	f.Add([]byte(`{"format_version":2}`))
	f.Add([]byte(`{"format_version":1,"step":1e400}`))
	f.Add([]byte(`{"format_version":1,"data":{"epoch":-1}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := ParseState(data)
		if err != nil {
			return
		}
		// A state that parses is valid and survives a round trip.
		if err := st.validate(); err != nil {
			t.Fatalf("parsed state does not validate: %v", err)
		}
		b, err := marshalState(st)
		if err != nil {
			t.Fatalf("re-encoding: %v", err)
		}
		st2, err := ParseState(b)
		if err != nil {
			t.Fatalf("re-encoded state does not parse: %v\n%s", err, b)
		}
		if st2.Step != st.Step || st2.Data != st.Data || st2.TrainConfig != st.TrainConfig {
			t.Fatalf("state changed in a round trip")
		}
	})
}
