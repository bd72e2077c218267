package train

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/safetensors"
	"github.com/asynctp/asynctp/tensor"
)

// Resharder is an optional interface of a Model sharded over ranks
// (parallel/model.Model has it) whose checkpoints resume at any layout:
// every checkpoint records each tensor's slice of the full tensor, and a
// resume at another layout assembles each rank's part from the pieces the
// ranks of the checkpoint's layout saved (shard.Assemble). A model without
// it is whole: every parameter the full one.
type Resharder interface {
	// Shards describes each parameter of this rank as a part of the full
	// model's parameter of its name (shard.Shard).
	Shards() []shard.Shard
	// WorldSize is the number of ranks of the world: recorded in each
	// checkpoint (State.Ranks), so that a resume finds every rank's part.
	WorldSize() int
}

// shardsOf describes model's parameters: a Resharder's own description,
// else each parameter whole.
func shardsOf(model Model) []shard.Shard {
	if r, ok := model.(Resharder); ok {
		return r.Shards()
	}
	return shard.Whole(model.Params().Params())
}

// slicesOf maps the split parameters of shards to their slices (the
// replicated ones are whole, recorded by their absence).
func slicesOf(shards []shard.Shard) map[string]shard.Slice {
	out := map[string]shard.Slice{}
	for _, s := range shards {
		if !s.Replicated() {
			out[s.Param.Name] = s.Slice()
		}
	}
	return out
}

// errNoRanks is RunCheckpoints' error for a run of several ranks whose
// checkpoints record no number of ranks.
var errNoRanks = errors.New("the checkpoint records no number of ranks (format 1): its run resumes at its own layout only")

// RunCheckpoints returns the checkpoints that make up the newest state of
// the run in dir, one per rank of the run that wrote it, rank 0's first:
// dir itself when it is the checkpoint of a model of one rank; the
// checkpoint that dir/latest names for a run of one rank; and for a run of
// several ranks (dir/rank-00000, ...), the checkpoints of the newest step
// that every one of its ranks holds. The ranks are the number the
// checkpoints record (State.Ranks): a run of several ranks of format 1,
// which records none, is refused. An out dir with both (a run of several
// ranks resumed in place at one rank, or the reverse) gives the one whose
// latest step is newer: the one-rank checkpoint when its step is past
// rank 0's latest.
func RunCheckpoints(dir string) ([]string, error) {
	cks, err := runCheckpoints(dir)
	if !isRunOfRanks(dir) {
		return cks, err
	}
	one, lerr := LatestCheckpoint(dir)
	if lerr != nil {
		return cks, err // no run of one rank here
	}
	oneStep, _ := checkpointStep(filepath.Base(one))
	if ck0, rerr := ResolveCheckpoint(RankDir(dir, 0)); rerr == nil {
		if s, ok := checkpointStep(filepath.Base(ck0)); ok && s >= oneStep {
			return cks, err
		}
	}
	if _, serr := os.Stat(filepath.Join(one, StateFile)); serr != nil {
		return nil, fmt.Errorf("train: resume from %s: %s names %s, which has no %s", dir, LatestFile, filepath.Base(one), StateFile)
	}
	return []string{one}, nil
}

// runCheckpoints is RunCheckpoints without the choice between a run of one
// rank and one of several in the same out dir: the rank dirs win.
func runCheckpoints(dir string) ([]string, error) {
	if _, err := os.Stat(filepath.Join(dir, StateFile)); err == nil {
		st, err := ReadState(filepath.Join(dir, StateFile))
		if err != nil {
			return nil, err
		}
		if st.Ranks > 1 {
			return nil, fmt.Errorf("train: %s is one rank's checkpoint of a run of %d ranks: resume from the run's out dir (the parent of %s)", dir, st.Ranks, RankDir("", 0))
		}
		return []string{dir}, nil
	}
	if !isRunOfRanks(dir) {
		ck, err := ResolveCheckpoint(dir)
		if err != nil {
			return nil, err
		}
		return []string{ck}, nil
	}
	ck0, err := ResolveCheckpoint(RankDir(dir, 0))
	if err != nil {
		return nil, err
	}
	st0, err := ReadState(filepath.Join(ck0, StateFile))
	if err != nil {
		return nil, err
	}
	// The ranks of rank 0's latest checkpoint; if the newest step all of
	// them hold was written by a run of another size (an earlier layout),
	// that run's ranks.
	ranks := st0.Ranks
	for range 3 {
		if ranks < 1 {
			return nil, fmt.Errorf("train: %s: %w", ck0, errNoRanks)
		}
		step := -1
		for r := range ranks {
			ck, err := ResolveCheckpoint(RankDir(dir, r))
			if err != nil {
				return nil, fmt.Errorf("train: rank %d of the %d of %s: %w", r, ranks, dir, err)
			}
			s, ok := checkpointStep(filepath.Base(ck))
			if !ok {
				return nil, fmt.Errorf("train: rank %d of %s: %s is not a checkpoint", r, dir, ck)
			}
			if step < 0 || s < step {
				step = s
			}
		}
		var cks []string
		again := false
		for r := range ranks {
			ck := filepath.Join(RankDir(dir, r), CheckpointName(step))
			st, err := ReadState(filepath.Join(ck, StateFile))
			if err != nil {
				return nil, fmt.Errorf("train: the newest step every one of the %d ranks of %s holds is %d, but rank %d's: %w", ranks, dir, step, r, err)
			}
			if st.Ranks != ranks {
				if r == 0 {
					ranks, again = st.Ranks, true
					break
				}
				return nil, fmt.Errorf("train: %s records %d ranks, rank 0's checkpoint of the same step %d", ck, st.Ranks, ranks)
			}
			cks = append(cks, ck)
		}
		if !again {
			return cks, nil
		}
	}
	return nil, fmt.Errorf("train: the ranks of %s's checkpoints do not agree on their number", dir)
}

// loadResharded reads the checkpoints of every rank of a run (cks, rank
// 0's first: RunCheckpoints), of any layout, into this rank's parameters
// and moments, as described by shards: each tensor's part assembled from
// the pieces the checkpoint's ranks hold (their recorded slices;
// shard.Assemble). As LoadCheckpoint, it validates everything before
// anything is written: the states (one step, one dtype, one data
// position), each file's sha256, every tensor's dtype and full shape, and
// that every tensor of the files is one the model has. It returns rank 0's
// state. The files are read one at a time, each keeping only the pieces
// this rank needs.
func loadResharded(cks []string, b tensor.Backend, opt *optim.AdamW, shards []shard.Shard) (*State, error) {
	if len(cks) == 0 {
		return nil, errors.New("train: resume: no checkpoint")
	}
	label := filepath.Dir(cks[0])
	if len(cks) == 1 {
		label = cks[0]
	}
	var st0 *State
	states := make([]*State, len(cks))
	for i, ck := range cks {
		st, err := ReadState(filepath.Join(ck, StateFile))
		if err != nil {
			return nil, fmt.Errorf("train: checkpoint %s: %w", ck, err)
		}
		if i == 0 {
			st0 = st
		} else if st.Step != st0.Step || st.ModelDType != st0.ModelDType || st.Data != st0.Data {
			return nil, fmt.Errorf("train: checkpoints %s and %s of one run disagree: step %d and %d, dtype %s and %s, data position %+v and %+v",
				cks[0], ck, st0.Step, st.Step, st0.ModelDType, st.ModelDType, st0.Data, st.Data)
		}
		states[i] = st
	}
	if want := opt.ParamDType().String(); st0.ModelDType != want {
		return nil, fmt.Errorf("train: checkpoint %s holds %s parameters, but the model's are %s", label, st0.ModelDType, want)
	}

	// What this rank needs, by tensor ("w", "m.w", "v.w"): its slice of
	// the full tensor, its dtype, and the runs of it this rank's state
	// holds (all of it, for a whole optimizer).
	type dstRun struct {
		lo, hi int
		dst    *tensor.Tensor
	}
	type runGroup struct {
		slice  shard.Slice
		numel  int
		pieces []shard.Piece // runs of the flattened tensor
	}
	type need struct {
		slice  shard.Slice
		dtype  tensor.DType
		dsts   []dstRun
		pieces []shard.Piece        // whole tensors of the checkpoint's ranks
		runs   map[string]*runGroup // runs of them (a distributed optimizer's), by the tensor's slice
	}
	byParam := map[string]shard.Shard{}
	for _, s := range shards {
		byParam[s.Param.Name] = s
	}
	sps, err := opt.StatePieces()
	if err != nil {
		return nil, err
	}
	needs := map[string]map[string]*need{ModelFile: {}, OptimFile: {}}
	for _, s := range shards { // every tensor of the model, held by this rank or not
		for _, c := range []struct{ file, prefix string }{{ModelFile, ""}, {OptimFile, "m."}, {OptimFile, "v."}} {
			needs[c.file][c.prefix+s.Param.Name] = &need{slice: s.Slice(), runs: map[string]*runGroup{}}
		}
	}
	for _, sp := range sps {
		s, ok := byParam[sp.Param.Name]
		if !ok {
			return nil, fmt.Errorf("train: resume: parameter %q has no shard description", sp.Param.Name)
		}
		for _, c := range []struct {
			file, prefix string
			dst          *tensor.Tensor
		}{{ModelFile, "", sp.W}, {OptimFile, "m.", sp.M}, {OptimFile, "v.", sp.V}} {
			nd := needs[c.file][c.prefix+sp.Param.Name]
			nd.slice, nd.dtype = s.Slice(), c.dst.DType()
			nd.dsts = append(nd.dsts, dstRun{sp.Lo, sp.Hi, c.dst})
		}
	}

	for i, ck := range cks {
		for _, f := range []string{ModelFile, OptimFile} {
			name := filepath.Join(ck, f)
			data, err := os.ReadFile(name)
			if err != nil {
				return nil, fmt.Errorf("train: checkpoint %s: %w", name, err)
			}
			sum := sha256.Sum256(data)
			if got := hex.EncodeToString(sum[:]); got != states[i].Files[f] {
				return nil, fmt.Errorf("train: checkpoint %s is corrupted: sha256 %s, expected %s (from %s)", name, got, states[i].Files[f], StateFile)
			}
			sf, err := safetensors.Read(data)
			if err != nil {
				return nil, fmt.Errorf("train: checkpoint %s: %w", name, err)
			}
			recorded, err := shard.RecordedSlices(name, sf)
			if err != nil {
				return nil, fmt.Errorf("train: checkpoint %s: %w", name, err)
			}
			runs := map[string]runRecord{}
			if js, ok := sf.Metadata[RunsKey]; ok {
				if err := json.Unmarshal([]byte(js), &runs); err != nil {
					return nil, fmt.Errorf("train: checkpoint %s: metadata %s: %w", name, RunsKey, err)
				}
			}
			for _, n := range sf.Names() {
				e := sf.Entries[n]
				t, run := n, runs[n]
				isRun := run.Tensor != ""
				if isRun {
					t = run.Tensor
				}
				nd, ok := needs[f][t]
				if !ok {
					return nil, fmt.Errorf("train: checkpoint %s holds tensor %q, which the model does not have", name, t)
				}
				if len(nd.dsts) > 0 && e.DType != nd.dtype {
					return nil, fmt.Errorf("train: checkpoint %s: tensor %q is %v, want %v", name, n, e.DType, nd.dtype)
				}
				var sl shard.Slice
				switch {
				case isRun && run.Slice != nil:
					sl = *run.Slice
				case isRun:
					sl = shard.Slice{Full: nd.slice.Full.Clone(), Dim: -1}
				default:
					var split bool
					if sl, split = recorded[n]; !split {
						sl = shard.Slice{Full: e.Shape.Clone(), Dim: -1}
					}
				}
				if !sl.Full.Equal(nd.slice.Full) {
					return nil, fmt.Errorf("train: checkpoint %s: tensor %q is a part of %v, the model's is of %v", name, n, sl.Full, nd.slice.Full)
				}
				if isRun && (run.Numel != sl.Shape().Numel() || run.Lo < 0 || run.Hi > run.Numel || run.Hi-run.Lo != e.Shape.Numel()) {
					return nil, fmt.Errorf("train: checkpoint %s: tensor %q is recorded as the run [%d, %d) of %d elements of %q, which does not fit its %d elements or the slice %v", name, n, run.Lo, run.Hi, run.Numel, t, e.Shape.Numel(), sl)
				}
				if len(nd.dsts) == 0 || !sl.Overlaps(nd.slice) {
					continue // this rank holds none of it
				}
				v, err := e.Tensor()
				if err != nil {
					return nil, fmt.Errorf("train: checkpoint %s: %w", name, err)
				}
				if !isRun {
					nd.pieces = append(nd.pieces, shard.Piece{Name: t, Slice: sl, Tensor: v})
					continue
				}
				key := fmt.Sprint(sl)
				g := nd.runs[key]
				if g == nil {
					g = &runGroup{slice: sl, numel: run.Numel}
					nd.runs[key] = g
				}
				flat, err := v.Reshape(run.Hi - run.Lo)
				if err != nil {
					return nil, err
				}
				g.pieces = append(g.pieces, shard.Piece{Name: t, Slice: shard.Slice{Full: tensor.Shape{run.Numel}, Dim: 0, Lo: run.Lo, Hi: run.Hi}, Tensor: flat})
			}
		}
	}

	var ups []upload
	for _, f := range []string{ModelFile, OptimFile} {
		names := make([]string, 0, len(needs[f]))
		for n := range needs[f] {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			nd := needs[f][n]
			if len(nd.dsts) == 0 {
				continue
			}
			// A distributed optimizer's runs of a tensor make it whole first.
			for _, g := range nd.runs {
				flat, err := shard.Assemble(shard.Slice{Full: tensor.Shape{g.numel}, Dim: -1}, g.pieces)
				if err != nil {
					return nil, fmt.Errorf("resharding the checkpoints of %s: the runs of %q: %w", label, n, err)
				}
				t, err := flat.Reshape(g.slice.Shape()...)
				if err != nil {
					return nil, err
				}
				nd.pieces = append(nd.pieces, shard.Piece{Name: n, Slice: g.slice, Tensor: t})
			}
			if len(nd.pieces) == 0 {
				return nil, fmt.Errorf("train: the checkpoints of %s hold no %q, which the model needs (%s)", label, n, f)
			}
			local, err := shard.Assemble(nd.slice, nd.pieces)
			if err != nil {
				return nil, fmt.Errorf("train: resharding the checkpoints of %s: %w", label, err)
			}
			for _, d := range nd.dsts {
				src := local
				if whole := d.lo == 0 && d.hi == local.Numel(); !whole {
					flat, err := local.Reshape(local.Numel())
					if err == nil {
						src, err = shard.Cut(flat, shard.Slice{Full: tensor.Shape{local.Numel()}, Dim: 0, Lo: d.lo, Hi: d.hi})
					}
					if err != nil {
						return nil, fmt.Errorf("train: resharding the checkpoints of %s: the run [%d, %d) of %q: %w", label, d.lo, d.hi, n, err)
					}
				}
				if src.Numel() != d.dst.Numel() {
					return nil, fmt.Errorf("train: resharding the checkpoints of %s: %q assembled to %v, the model's is %v", label, n, src.Shape(), d.dst.Shape())
				}
				if !src.Shape().Equal(d.dst.Shape()) {
					if src, err = src.Reshape(d.dst.Shape()...); err != nil {
						return nil, err
					}
				}
				ups = append(ups, upload{d.dst, src})
			}
		}
	}
	if err := uploadAll(b, opt, ups); err != nil {
		return nil, fmt.Errorf("train: loading the checkpoints of %s: %w", label, err)
	}
	return st0, nil
}

// isRunOfRanks reports whether dir is the out dir of a run of several
// ranks (it holds rank-00000).
func isRunOfRanks(dir string) bool {
	fi, err := os.Stat(RankDir(dir, 0))
	return err == nil && fi.IsDir()
}
