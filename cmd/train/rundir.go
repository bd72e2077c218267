package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/asynctp/asynctp/launch"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/train"
)

// prepare applies the rules that need the file system, after the flags and
// the file are read (loadConfigIn) and before anything is written:
//
//   - --resume DIR writes to DIR's run (DIR, or the out dir that holds the
//     checkpoint DIR) unless the out dir is given explicitly;
//   - on a resume, the model is the checkpoint's: a field given explicitly
//     (a flag, the file, or a named preset) must equal it, and the error
//     names each one that differs; the others are taken from it;
//   - with --init-from, the model is the Hugging Face directory's, under
//     the same rule.
func prepare(cfg *Config, l origin) error {
	if err := adopt(cfg); err != nil {
		return err
	}
	cfg.adopted = true
	cfg.Train.Seq = cfg.Model.Seq
	return cfg.validate(l)
}

// modelKnown reports whether the config's model is the run's: a resume's
// and --init-from's is known once prepare has taken it.
func (c *Config) modelKnown() bool {
	return c.adopted || c.Train.Resume == "" && c.InitFrom == ""
}

// adopt is prepare's part that takes the model of a resume or --init-from.
func adopt(cfg *Config) error {
	t := &cfg.Train
	if t.Resume != "" && cfg.InitFrom != "" {
		return fmt.Errorf("--resume %s and --init-from %s: a run continues its own checkpoint or starts from a model's weights, not both", t.Resume, cfg.InitFrom)
	}
	var want layers.GPTConfig
	var from string
	switch {
	case t.Resume != "":
		if !cfg.explicit["train.out_dir"] {
			t.OutDir = resumeOutDir(t.Resume)
		}
		st, ck, err := resumeState(t.Resume)
		if err != nil {
			return nil // train and model.Run report a missing or broken checkpoint themselves
		}
		if len(st.ModelConfig) == 0 {
			return nil
		}
		if err := json.Unmarshal(st.ModelConfig, &want); err != nil {
			return fmt.Errorf("resume from %s: its model_config: %w", ck, err)
		}
		from = "checkpoint " + ck
	case cfg.InitFrom != "":
		m, err := initFromModel(cfg)
		if err != nil {
			return err
		}
		want, from = m, "model "+cfg.InitFrom
	default:
		return nil
	}
	explicit := cfg.explicitModel()
	given := cfg.Model
	cfg.Model = want.WithDefaults()
	// With --init-from, these stay the run's own: the seed (the
	// initialisation is replaced), the sequence length, the MoE loss
	// weights and capacity, the init std.
	own := map[string]bool{}
	kind := "checkpoint's"
	if cfg.InitFrom != "" {
		own = map[string]bool{"seed": true, "seq": true, "aux_loss_coef": true, "z_loss_coef": true, "capacity_factor": true, "init_std": true}
		kind = "model's"
	}
	diffs, err := fieldDiffs(given, cfg.Model, "given", "the "+kind, func(f string) bool { return !own[f] && (explicit["*"] || explicit[f]) })
	if err != nil {
		return err
	}
	if len(diffs) > 0 {
		how := "leave them out (or give the run's own config.json with --config) to take the checkpoint's"
		if cfg.InitFrom != "" {
			how = "leave them out to take the model's"
		}
		return fmt.Errorf("%s: its model differs from the one this run asks for in %s; %s", from, strings.Join(diffs, "; "), how)
	}
	if cfg.InitFrom != "" {
		cfg.Model.Seed, cfg.Model.CapacityFactor, cfg.Model.ZLossCoef, cfg.Model.InitStd = given.Seed, given.CapacityFactor, given.ZLossCoef, given.InitStd
		if explicit["aux_loss_coef"] || cfg.Model.Experts == 0 {
			cfg.Model.AuxLossCoef = given.AuxLossCoef
		}
	}
	return nil
}

// resumeOutDir is the out dir of the run --resume names: the directory
// itself, or the parent of a checkpoint directory (step-NNNNNN, which
// holds a state.json).
func resumeOutDir(resume string) string {
	if _, err := os.Stat(filepath.Join(resume, train.StateFile)); err == nil {
		return filepath.Dir(filepath.Clean(resume))
	}
	return resume
}

// resumeState reads the state.json a resume from dir starts from: rank
// 0's of the run's newest state (train.RunCheckpoints, which the resume
// loads), or, where that refuses (a run of several ranks of format 1, one
// rank's checkpoint of such a run), rank 0's latest of a parallel run's
// out dir or the single rank's.
func resumeState(dir string) (*train.State, string, error) {
	if cks, err := train.RunCheckpoints(dir); err == nil {
		st, err := train.ReadState(filepath.Join(cks[0], train.StateFile))
		return st, cks[0], err
	}
	path := dir
	if fi, err := os.Stat(train.RankDir(dir, 0)); err == nil && fi.IsDir() {
		path = train.RankDir(dir, 0)
	}
	ck, err := train.ResolveCheckpoint(path)
	if err != nil {
		return nil, "", err
	}
	st, err := train.ReadState(filepath.Join(ck, train.StateFile))
	return st, ck, err
}

// The entries of an out dir that belong to a run: what --overwrite
// removes. Anything else in the directory is the user's and stays.
func runEntry(name string) bool {
	switch name {
	case train.MetricsFile, train.PlotFile, "config.json", train.LatestFile, tokenizerDir:
		return true
	}
	return strings.HasPrefix(name, "step-") || strings.HasPrefix(name, "rank-") || strings.HasPrefix(name, ".tmp-") || strings.HasPrefix(name, ".old-")
}

// claimOutDir makes this process the only run writing to the out dir (a
// lock file naming the pid and host; a lock whose process is gone on this
// host is taken over) and applies the rule of new runs: a new run into a
// directory that holds a run is refused, unless --overwrite (which deletes
// that run's files first) or it resumes that very run. It returns the
// release of the lock.
func claimOutDir(cfg Config) (func(), error) {
	out := cfg.Train.OutDir
	_, statErr := os.Stat(out)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	unlock, err := lockDir(out)
	if err != nil {
		return nil, err
	}
	release := func() {
		unlock()
		if statErr != nil {
			os.Remove(out) // made here: gone again if the run wrote nothing (os.Remove keeps a non-empty dir)
		}
	}
	ents, err := os.ReadDir(out)
	if err != nil {
		release()
		return nil, err
	}
	var held []string
	for _, e := range ents {
		if runEntry(e.Name()) && !strings.HasPrefix(e.Name(), ".") {
			held = append(held, e.Name())
		}
	}
	resumesHere := cfg.Train.Resume != "" && sameDir(resumeOutDir(cfg.Train.Resume), out)
	switch {
	case len(held) == 0 || resumesHere && !cfg.overwrite:
	case resumesHere:
		release()
		return nil, fmt.Errorf("--overwrite with --resume %s would delete the checkpoints the run resumes from; resume without --overwrite, or give another --out", cfg.Train.Resume)
	case !cfg.overwrite:
		release()
		return nil, fmt.Errorf("out dir %s already holds a run (%s); resume it with --resume %s, start the new run in another --out, or replace it with --overwrite", out, strings.Join(clipList(held, 4), ", "), out)
	default:
		for _, e := range ents {
			if runEntry(e.Name()) {
				if err := os.RemoveAll(filepath.Join(out, e.Name())); err != nil {
					release()
					return nil, fmt.Errorf("--overwrite: %w", err)
				}
			}
		}
		fmt.Printf("overwrite: removed the run in %s (%s)\n", out, strings.Join(clipList(held, 4), ", "))
	}
	return release, nil
}

func clipList(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], fmt.Sprintf("and %d more", len(s)-n))
	}
	return s
}

func sameDir(a, b string) bool {
	fa, ea := os.Stat(a)
	fb, eb := os.Stat(b)
	if ea == nil && eb == nil {
		return os.SameFile(fa, fb)
	}
	return filepath.Clean(a) == filepath.Clean(b)
}

// LockFile is the lock of an out dir.
const LockFile = ".lock"

type lockInfo struct {
	PID     int    `json:"pid"`
	Host    string `json:"host"`
	Started string `json:"started"`
}

// lockDir takes dir/.lock: created exclusively, holding the pid, host and
// start time. A lock of a process of this host that no longer runs is
// stale and taken over; any other lock is an error naming its holder.
func lockDir(dir string) (func(), error) {
	path := filepath.Join(dir, LockFile)
	host, _ := os.Hostname()
	me := lockInfo{PID: os.Getpid(), Host: host, Started: time.Now().Format(time.RFC3339)}
	js, _ := json.Marshal(me)
	for attempt := 0; ; attempt++ {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			_, err = f.Write(append(js, '\n'))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				os.Remove(path)
				return nil, fmt.Errorf("locking %s: %w", dir, err)
			}
			return func() { os.Remove(path) }, nil
		}
		if !errors.Is(err, fs.ErrExist) || attempt > 3 {
			return nil, fmt.Errorf("locking %s: %w", dir, err)
		}
		data, rerr := os.ReadFile(path)
		var held lockInfo
		if rerr != nil || json.Unmarshal(data, &held) != nil || held.PID <= 0 {
			if rerr != nil && errors.Is(rerr, fs.ErrNotExist) {
				continue // released meanwhile
			}
			return nil, fmt.Errorf("out dir %s is locked by %s, which cannot be read (%q); remove it if no run uses the directory", dir, path, strings.TrimSpace(string(data)))
		}
		if held.Host == host && !processAlive(held.PID) {
			fmt.Fprintf(os.Stderr, "train: taking over the stale lock of pid %d (no longer running) on %s\n", held.PID, dir)
			os.Remove(path)
			continue
		}
		return nil, fmt.Errorf("out dir %s is in use by the run of pid %d on host %s since %s (lock file %s); wait for it to end, use another --out, or remove the lock file if that run is gone", dir, held.PID, held.Host, held.Started, path)
	}
}

// holdsLock reports whether this process is the one that claims the out
// dir: a process started on its own (also --nproc's launcher), or rank 0
// of another launcher's world. The ranks of --nproc run under their
// launcher's lock.
func holdsLock(l origin, rank int) bool {
	if !l.launched {
		return true
	}
	return os.Getenv(launch.EnvStore) != "launcher" && rank == 0
}
