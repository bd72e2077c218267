package train

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"

	"github.com/asynctp/asynctp/optim"
)

// FormatVersion is the checkpoint format this package writes. It reads
// this one and version 1, whose files record no slices and whose states
// record no ranks: a checkpoint of version 1 of a run of several ranks
// resumes at its own layout only.
const FormatVersion = 2

// oldestFormat is the oldest format this package reads.
const oldestFormat = 1

// MaxStateSize bounds the state.json a reader accepts.
const MaxStateSize = 16 << 20

// The files of a checkpoint directory.
const (
	ModelFile = "model.safetensors"
	OptimFile = "optim.safetensors"
	StateFile = "state.json"
	// LatestFile, in an out dir, holds the name of the newest checkpoint.
	LatestFile = "latest"
)

// State is the content of state.json: everything besides the tensors that a
// resume needs, and what a reader needs to trust the tensors.
type State struct {
	FormatVersion int          `json:"format_version"`
	Step          int          `json:"step"` // optimizer steps done
	Data          DataPosition `json:"data"` // where the next batch starts
	// RNG is the state of any random generator of the loop (none yet: the
	// data order is a function of the data position).
	RNG        json.RawMessage `json:"rng,omitempty"`
	Loss       float64         `json:"loss"`      // loss of the last step
	ElapsedS   float64         `json:"elapsed_s"` // wall time of training up to this step, over all runs
	ModelDType string          `json:"model_dtype"`
	// ModelConfig is the model's own configuration, as JSON (informative).
	ModelConfig json.RawMessage `json:"model_config,omitempty"`
	TrainConfig Config          `json:"train_config"`
	// Replans are the changes of the run's length made by resumes before
	// this checkpoint: the learning-rate schedule is
	// optim.Replanned{TrainConfig.Schedule(), Replans}.
	Replans []optim.Replan `json:"replans,omitempty"`
	// RunConfig is the configuration of the program that ran the training
	// (WithRunConfig; cmd/train's), as JSON: what a resume takes its
	// settings from beyond TrainConfig. train does not read it.
	RunConfig json.RawMessage `json:"run_config,omitempty"`
	// Files maps each .safetensors file to the hex sha256 of its bytes.
	Files map[string]string `json:"files"`
	// Layout is free-form: the parallel code records how tensors are
	// sharded over ranks.
	Layout json.RawMessage `json:"layout,omitempty"`
	// Ranks is the number of ranks whose checkpoints of this step make up
	// the model, one per rank dir (RunSharded); 0 for a model of one rank.
	// Their files record each tensor's slice of the full tensor
	// (shard.SlicesKey), so the checkpoint resumes at any layout.
	Ranks int `json:"ranks,omitempty"`
	// Tokenizer says what the token ids mean (WithTokenizer; empty when
	// not recorded).
	Tokenizer string `json:"tokenizer,omitempty"`
}

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ParseState decodes and validates a state.json.
func ParseState(data []byte) (*State, error) {
	if len(data) > MaxStateSize {
		return nil, fmt.Errorf("state.json is %d bytes, over the limit of %d", len(data), MaxStateSize)
	}
	// Look at the version first, so a future format gets a clear error
	// rather than a complaint about a field.
	var v struct {
		FormatVersion *int `json:"format_version"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("state.json: bad JSON: %v", err)
	}
	if v.FormatVersion == nil {
		return nil, fmt.Errorf("state.json has no format_version")
	}
	if *v.FormatVersion < oldestFormat || *v.FormatVersion > FormatVersion {
		return nil, fmt.Errorf("state.json has unsupported format version %d (this build reads versions %d to %d)", *v.FormatVersion, oldestFormat, FormatVersion)
	}
	var st State
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return nil, fmt.Errorf("state.json: bad JSON: %v", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("state.json: unexpected data after the JSON object")
	}
	if err := st.validate(); err != nil {
		return nil, fmt.Errorf("state.json: %v", err)
	}
	return &st, nil
}

func (st *State) validate() error {
	switch {
	case st.Step < 0:
		return fmt.Errorf("step %d is negative", st.Step)
	case st.Data.Epoch < 0 || st.Data.Index < 0 || st.Data.Windows < 0 || st.Data.Seq < 0:
		return fmt.Errorf("data position %+v has a negative field", st.Data)
	case st.Data.Index >= st.Data.Windows && st.Data.Windows > 0:
		return fmt.Errorf("data position index %d is not below the %d windows", st.Data.Index, st.Data.Windows)
	case math.IsNaN(st.Loss) || math.IsInf(st.Loss, 0):
		return fmt.Errorf("loss %v is not finite", st.Loss)
	case !(st.ElapsedS >= 0):
		return fmt.Errorf("elapsed_s %v is negative", st.ElapsedS)
	case st.Ranks < 0 || st.Ranks > maxRanks:
		return fmt.Errorf("ranks %d, want 0 to %d", st.Ranks, maxRanks)
	}
	at := 0
	for _, r := range st.Replans {
		if r.At < at || r.At > st.Step || r.Steps < r.At || r.Steps <= 0 {
			return fmt.Errorf("replans %+v: expected steps increasing up to the step %d, each within the length planned before it", st.Replans, st.Step)
		}
		at = r.At
	}
	if _, ok := modelDTypes[st.ModelDType]; !ok {
		return fmt.Errorf("model_dtype %q, want f32, f64 or bf16", st.ModelDType)
	}
	for _, f := range []string{ModelFile, OptimFile} {
		h, ok := st.Files[f]
		if !ok {
			return fmt.Errorf("files has no sha256 for %s", f)
		}
		if !sha256Hex.MatchString(h) {
			return fmt.Errorf("files: sha256 of %s is %q, want 64 lowercase hex digits", f, clip([]byte(h), 70))
		}
	}
	for f := range st.Files {
		if f != ModelFile && f != OptimFile {
			return fmt.Errorf("files names unknown file %q", clip([]byte(f), 70))
		}
	}
	return nil
}

// maxRanks bounds State.Ranks.
const maxRanks = 1 << 20

var modelDTypes = map[string]bool{"f32": true, "f64": true, "bf16": true}

// ReadState reads and validates dir/state.json.
func ReadState(path string) (*State, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxStateSize+1))
	if err != nil {
		return nil, err
	}
	st, err := ParseState(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}

// marshalState encodes st for writing.
func marshalState(st *State) ([]byte, error) {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
