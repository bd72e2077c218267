package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/train"
)

// A resume continues a run with its own settings: every training setting
// (the "train" section: schedule, batch, optimizer, clipping, seed,
// evaluation, checkpoints; the data; the layout) is the checkpoint's
// (state.json: train_config, layout, and run_config, the whole
// configuration the run recorded) unless the file or a flag gives it; a
// value given that differs is used and named at start
// ("resume: ... lr 0.001 → 0.0005 (given)") and recorded in config.json's
// "resumed" list. The model is the checkpoint's too, under a stricter rule
// (adopt: a model field given must equal it). What says how this process
// runs (device, transport, overlap strategies, out dir) is this run's.

// Resume is one resume of a run, as config.json records it: the step and
// checkpoint it started from and the settings it changed.
type Resume struct {
	Step       int      `json:"step"`
	Checkpoint string   `json:"checkpoint"`
	Changes    []Change `json:"changes,omitempty"`
}

// Change is a setting a resume changed: the config field, the
// checkpoint's value and the value given.
type Change struct {
	Field string          `json:"field"`
	From  json.RawMessage `json:"from"`
	To    json.RawMessage `json:"to"`
	Why   string          `json:"why"` // "given", or the rule that followed a value given
}

// resumeNote is what the start of a resumed run says.
type resumeNote struct {
	checkpoint     string
	step, planned  int // the checkpoint's step and its run's planned steps
	changes        []Change
	unrecordedData bool   // the checkpoint (an older format) records no data settings
	layout         string // the layouts, when they differ (checkResume)
}

// keptPaths are the config fields a resume takes from the checkpoint
// unless given: the training section's (but where the run writes and what
// it resumes), the fields of the flags marked keep in trainFlags, and the
// preset's name.
func keptPath(path string) bool {
	switch path {
	case "train.out_dir", "train.resume", "train.seq":
		return false
	case "preset":
		return true
	}
	if strings.HasPrefix(path, "train.") {
		return true
	}
	for _, d := range trainFlags {
		if d.keep && !strings.HasPrefix(path, "model.") && contains(d.paths, path) {
			return true
		}
	}
	return false
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// resumeSettings applies the rule above to cfg (the preset, the file and
// the flags set applied; cfg.explicit filled in) when it resumes: the
// fields it keeps from the checkpoint that were not given are the
// checkpoint's, the ones given that differ are noted, and the run's
// history (Resumed) is the checkpoint's plus this resume. A checkpoint
// that cannot be read is left to the checks that report it (checkResume,
// train.Run). A run started by a launcher or --nproc (procs) takes its
// world from the processes: its dp derives from them unless given.
func resumeSettings(cfg *Config, set map[string]bool, procs bool) error {
	st, ck, err := resumeState(cfg.Train.Resume)
	if err != nil {
		return nil
	}
	rec, history, err := recordedSettings(st)
	if err != nil {
		return fmt.Errorf("resume from %s: %w", ck, err)
	}
	cur, err := flatConfig(cfg)
	if err != nil {
		return err
	}
	note := &resumeNote{checkpoint: ck, step: st.Step, planned: st.TrainConfig.Steps, unrecordedData: len(st.RunConfig) == 0}
	obj := map[string]any{} // the fields to take, decoded over cfg: the others stay as they are
	for path, r := range rec {
		if !keptPath(path) {
			continue
		}
		if path == "parallel.dp" && !cfg.explicit[path] && (procs || cfg.explicit["parallel.world"]) {
			continue // derived from the world of the processes or --world
		}
		if cfg.explicit[path] {
			if now, ok := cur[path]; ok && !sameJSON(now, r) {
				note.changes = append(note.changes, Change{Field: path, From: r, To: now, Why: "given"})
			}
			continue
		}
		sec, field, ok := strings.Cut(path, ".")
		if !ok {
			obj[path] = r
			continue
		}
		if obj[sec] == nil {
			obj[sec] = map[string]json.RawMessage{}
		}
		obj[sec].(map[string]json.RawMessage)[field] = r
	}
	js, err := json.Marshal(obj)
	if err == nil {
		err = json.Unmarshal(js, cfg)
	}
	if err != nil {
		return fmt.Errorf("resume from %s: its settings: %w", ck, err)
	}
	if err := checkLRGiven(cfg, st, ck, note.changes); err != nil {
		return err
	}
	if err := checkWarmupGiven(cfg, st, ck, note.changes); err != nil {
		return err
	}
	if t := &cfg.Train; set["lr"] && !set["min-lr"] && t.MinLR > t.LR {
		from, _ := json.Marshal(t.MinLR)
		t.MinLR = t.LR / 10
		to, _ := json.Marshal(t.MinLR)
		note.changes = append(note.changes, Change{Field: "train.min_lr", From: from, To: to, Why: "a tenth of the lr given, which is below it"})
	}
	sort.Slice(note.changes, func(i, j int) bool { return note.changes[i].Field < note.changes[j].Field })
	cfg.resume = note
	cfg.Resumed = append(history, Resume{Step: st.Step, Checkpoint: ck, Changes: note.changes})
	return nil
}

// checkLRGiven refuses a peak learning rate given to a resume (changes
// holds train.lr) that would change no step: every step from the
// checkpoint's step st.Step on runs at min_lr when the run's decay has
// ended there (optim.Replanned.DecayEnded, with this resume's steps), so
// the lr given would be recorded and printed but never used.
func checkLRGiven(cfg *Config, st *train.State, ck string, changes []Change) error {
	var lr *Change
	for i := range changes {
		if changes[i].Field == "train.lr" {
			lr = &changes[i]
		}
	}
	t := cfg.Train
	sched := optim.Replanned{WarmupCosine: t.Schedule(), Replans: train.Replans(st, t.Steps)}
	if lr == nil || st.Step >= t.Steps || !sched.DecayEnded(st.Step+1) {
		return nil
	}
	return fmt.Errorf("--lr %s: the resume from %s starts at step %d, after the run's learning rate decayed to min_lr %s, where it stays: "+
		"steps %d to %d would all run at min_lr whatever the peak lr, so --lr %s would change none of them (the run's is %s). "+
		"Give --min-lr for the learning rate of these steps, or resume from a checkpoint written before the decay ended with a larger --steps, "+
		"which spreads what is left of the decay over the steps up to it",
		shown(lr.To), ck, st.Step, strconv.FormatFloat(t.MinLR, 'g', -1, 64), st.Step+1, t.Steps, shown(lr.To), shown(lr.From))
}

// checkWarmupGiven refuses a warm-up length given to a resume (changes
// holds train.warmup) that would change no step: the learning rate of every
// step the resume runs (st.Step+1 to the run's steps) is the same with the
// run's warm-up and with the one given (a warm-up that ended before the
// checkpoint's step, or a decay that has ended), so the value would be
// recorded and printed but never used.
func checkWarmupGiven(cfg *Config, st *train.State, ck string, changes []Change) error {
	var w *Change
	for i := range changes {
		if changes[i].Field == "train.warmup" {
			w = &changes[i]
		}
	}
	if w == nil || st.Step >= cfg.Train.Steps {
		return nil
	}
	var from int
	if err := json.Unmarshal(w.From, &from); err != nil {
		return nil // no recorded warm-up to compare with: the given one is used
	}
	given := cfg.Train
	was := given
	was.Warmup = from
	replans := train.Replans(st, given.Steps)
	a := optim.Replanned{WarmupCosine: given.Schedule(), Replans: replans}
	b := optim.Replanned{WarmupCosine: was.Schedule(), Replans: replans}
	for k := st.Step + 1; k <= given.Steps; k++ {
		if a.LR(k) != b.LR(k) {
			return nil
		}
	}
	return fmt.Errorf("--warmup %s: the resume from %s starts at step %d, where the learning rate of steps %d to %d is the same with a warm-up of %d steps (the run's) and of %s: "+
		"--warmup %s would change none of them. Resume from a checkpoint written before step %d to lengthen the warm-up, or leave --warmup out",
		shown(w.To), ck, st.Step, st.Step+1, given.Steps, from, shown(w.To), shown(w.To), max(from, given.Warmup))
}

// recordedSettings are the settings a checkpoint records, as config
// fields ("section.field"): its run's configuration (run_config, when the
// run recorded it), its training config and its layout; and its run's
// history of resumes.
func recordedSettings(st *train.State) (map[string]json.RawMessage, []Resume, error) {
	rec := map[string]json.RawMessage{}
	var history []Resume
	if len(st.RunConfig) > 0 {
		var err error
		if rec, err = flatConfig(st.RunConfig); err != nil {
			return nil, nil, fmt.Errorf("its run_config: %w", err)
		}
		var h struct {
			Resumed []Resume `json:"resumed"`
		}
		if err := json.Unmarshal(st.RunConfig, &h); err != nil {
			return nil, nil, fmt.Errorf("its run_config: resumed: %w", err)
		}
		history = h.Resumed
	}
	tc, err := flatConfig(map[string]any{"train": st.TrainConfig})
	if err != nil {
		return nil, nil, err
	}
	for k, v := range tc {
		rec[k] = v
	}
	l := model.Layout{TP: 1, DP: 1, EP: 1}
	if len(st.Layout) > 0 {
		if err := json.Unmarshal(st.Layout, &l); err != nil {
			return nil, nil, fmt.Errorf("its layout %s: %w", st.Layout, err)
		}
	}
	for k, v := range map[string]any{"parallel.tp": l.TP, "parallel.dp": l.DP, "parallel.ep": max(l.EP, 1), "parallel.sequence_parallel": l.SequenceParallel,
		"parallel.distributed_optimizer": l.DistributedOptimizer} {
		rec[k], _ = json.Marshal(v)
	}
	return rec, history, nil
}

// flatConfig is a config's JSON (v: a value, or JSON) as "section.field"
// for the fields of its sections and "field" for the others.
func flatConfig(v any) (map[string]json.RawMessage, error) {
	top, err := toMap(v)
	if err != nil {
		return nil, err
	}
	out := map[string]json.RawMessage{}
	for k, raw := range top {
		var sec map[string]json.RawMessage
		if len(raw) > 0 && raw[0] == '{' && json.Unmarshal(raw, &sec) == nil {
			for f, r := range sec {
				out[k+"."+f] = r
			}
			continue
		}
		out[k] = raw
	}
	return out, nil
}

// sameJSON reports whether two JSON values are the same, layout aside.
func sameJSON(a, b json.RawMessage) bool {
	var ca, cb bytes.Buffer
	if json.Compact(&ca, a) != nil || json.Compact(&cb, b) != nil {
		return string(a) == string(b)
	}
	return ca.String() == cb.String()
}

// fieldName is how the start line names a config field: its flag's name,
// or the field's path when no flag sets it.
func fieldName(path string) string {
	for _, d := range trainFlags {
		if contains(d.paths, path) {
			return d.name
		}
	}
	return path
}

// shown is a JSON value as the start line shows it: a string without
// quotes ("" as the default), anything else as JSON.
func shown(v json.RawMessage) string {
	var s string
	if json.Unmarshal(v, &s) == nil {
		if s == "" {
			return `""`
		}
		return s
	}
	var b bytes.Buffer
	if json.Compact(&b, v) != nil {
		return string(v)
	}
	return b.String()
}

// line is the start line of a resumed run.
func (n *resumeNote) line() string {
	s := fmt.Sprintf("resume: from %s at step %d (of %d planned)", n.checkpoint, n.step, n.planned)
	if len(n.changes) == 0 {
		s += ", with the checkpoint's settings"
	} else {
		var parts []string
		for _, c := range n.changes {
			parts = append(parts, fmt.Sprintf("%s %s → %s (%s)", fieldName(c.Field), shown(c.From), shown(c.To), c.Why))
		}
		s += "; " + strings.Join(parts, ", ")
	}
	if n.layout != "" {
		s += "; " + n.layout
	}
	if n.unrecordedData {
		s += "; the checkpoint (an older format) records its training config and layout but not its data: --data is this run's"
	}
	return s
}

// printResume prints the start line of a resumed run (nothing for a new
// run).
func printResume(cfg Config) {
	if cfg.resume != nil {
		fmt.Println(cfg.resume.line())
	}
}
