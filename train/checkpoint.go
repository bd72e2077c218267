package train

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/asynctp/asynctp/internal/atomicfile"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/safetensors"
	"github.com/asynctp/asynctp/tensor"
)

// CheckpointName is the directory name of the checkpoint after step steps:
// "step-000100".
func CheckpointName(step int) string { return fmt.Sprintf("step-%06d", step) }

var ckptName = regexp.MustCompile(`^step-([0-9]{6,})$`)

// checkpointStep parses a checkpoint directory name.
func checkpointStep(name string) (int, bool) {
	m := ckptName.FindStringSubmatch(name)
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	return n, err == nil
}

// SaveCheckpoint writes the parameters and moments of opt and the state st
// as outDir/step-NNNNNN (NNNNNN = st.Step), then points outDir/latest at
// it. The directory is written under a temporary name, fsynced and renamed
// into place, so a crash leaves either the old or the new checkpoint, never
// a half-written one. st.FormatVersion, st.ModelDType and st.Files are
// filled in here. It returns the checkpoint's path. Run saves the same
// way, in two parts: the tensors are copied to the host at the step
// boundary (Snapshot), and written by a background writer while training
// goes on (Snapshot.Write).
func SaveCheckpoint(outDir string, b tensor.Backend, opt *optim.AdamW, st State) (string, error) {
	snap, err := TakeSnapshot(b, opt, nil)
	if err != nil {
		return "", fmt.Errorf("train: checkpoint %s: %w", CheckpointName(st.Step), err)
	}
	return snap.Write(outDir, st)
}

// Snapshot is the tensors of a checkpoint copied to the host: the
// parameters (the fp32 master copy when there is one) and the AdamW
// moments, named for the checkpoint's files; for a rank of a distributed
// optimizer the runs of them it holds (optim.StatePiece). Taking it is the
// part of a save that must happen at the step boundary; writing it can go
// on while the next steps run, since nothing of the model or optimizer is
// read any more.
type Snapshot struct {
	params, moments []safetensors.Named
	dtype           string // the parameters' dtype (State.ModelDType)
	// runs records the tensors that are runs of a parameter's elements,
	// by their name in the files (RunsKey).
	runs map[string]runRecord
	// slices are the parameters' slices of the full ones, by name, for a
	// model sharded over ranks (Resharder): recorded in both files.
	slices map[string]shard.Slice
}

// RunsKey is the metadata key under which a checkpoint file records, as
// JSON, the tensors that are a run of a parameter's elements (a rank of a
// distributed optimizer holds runs of the flat buffers): for each such
// tensor, named "<tensor>[lo:hi]", the tensor it is a run of ("w", or
// "m.w", "v.w" in the moments' file), the run [lo, hi) of its elements in
// row-major order, their number, and the slice of the full tensor the
// rank's whole tensor is (absent: whole).
const RunsKey = "asynctp.runs"

// runRecord is RunsKey's record of one tensor.
type runRecord struct {
	Tensor string       `json:"tensor"`
	Lo     int          `json:"lo"`
	Hi     int          `json:"hi"`
	Numel  int          `json:"numel"`
	Slice  *shard.Slice `json:"slice,omitempty"`
}

// pieceName is the name of a state piece's tensor (prefix "", "m." or
// "v.") in a checkpoint's files: the parameter's, with its run when the
// piece is not all of it.
func pieceName(prefix string, sp optim.StatePiece) string {
	if sp.Whole() {
		return prefix + sp.Param.Name
	}
	return fmt.Sprintf("%s%s[%d:%d]", prefix, sp.Param.Name, sp.Lo, sp.Hi)
}

// TakeSnapshot copies opt's parameters and moments (its StatePieces) to
// the host. With reuse (a snapshot of the same optimizer that is no
// longer being written) its host tensors are filled again instead of new
// ones.
func TakeSnapshot(b tensor.Backend, opt *optim.AdamW, reuse *Snapshot) (*Snapshot, error) {
	pieces, err := opt.StatePieces()
	if err != nil {
		return nil, err
	}
	snap := &Snapshot{dtype: opt.ParamDType().String(), runs: map[string]runRecord{}}
	if reuse != nil && len(reuse.params) == len(pieces) && len(reuse.moments) == 2*len(pieces) {
		snap.params, snap.moments = reuse.params, reuse.moments
	} else {
		snap.params, snap.moments = make([]safetensors.Named, len(pieces)), make([]safetensors.Named, 2*len(pieces))
	}
	for i, sp := range pieces {
		for _, c := range []struct {
			dst    *safetensors.Named
			prefix string
			src    *tensor.Tensor
		}{{&snap.params[i], "", sp.W}, {&snap.moments[2*i], "m.", sp.M}, {&snap.moments[2*i+1], "v.", sp.V}} {
			name := pieceName(c.prefix, sp)
			h := c.dst.Tensor
			if c.dst.Name != name || h == nil || h.DType() != c.src.DType() || !h.Shape().Equal(c.src.Shape()) {
				if h, err = tensor.Host(c.src.DType(), c.src.Shape()...); err != nil {
					return nil, fmt.Errorf("%s: %w", name, err)
				}
			}
			b.Download(h, c.src)
			*c.dst = safetensors.Named{Name: name, Tensor: h}
			if !sp.Whole() {
				snap.runs[name] = runRecord{Tensor: c.prefix + sp.Param.Name, Lo: sp.Lo, Hi: sp.Hi, Numel: sp.Param.Numel()}
			}
		}
	}
	if err := b.Err(); err != nil {
		return nil, fmt.Errorf("copying the checkpoint's tensors to the host: %w", err)
	}
	return snap, nil
}

// Write writes the snapshot and the state st as outDir/step-NNNNNN, as
// SaveCheckpoint does, and returns the checkpoint's path.
func (snap *Snapshot) Write(outDir string, st State) (string, error) {
	return snap.write(outDir, st, nil)
}

// write is Write with a hook called after the files are written, before
// the rename (where a crash in the middle of a save would strike: the
// kill tests use it, WithSaveHook).
func (snap *Snapshot) write(outDir string, st State, beforeRename func(step int)) (string, error) {
	name := CheckpointName(st.Step)
	if err := os.MkdirAll(outDir, dirMode); err != nil {
		return "", fmt.Errorf("train: checkpoint %s: %w", name, err)
	}
	tmp, err := atomicfile.MkdirTemp(outDir, ".tmp-"+name+"-")
	if err != nil {
		return "", fmt.Errorf("train: checkpoint %s: %w", name, err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()

	st.FormatVersion = FormatVersion
	st.ModelDType = snap.dtype
	st.Files = map[string]string{}
	for _, f := range []struct {
		name    string
		tensors []safetensors.Named
	}{{ModelFile, snap.params}, {OptimFile, snap.moments}} {
		meta := map[string]string{"format": "asynctp", "step": strconv.Itoa(st.Step)}
		if err := snap.metadata(meta, f.tensors); err != nil {
			return "", fmt.Errorf("train: checkpoint %s/%s: %w", name, f.name, err)
		}
		sum, err := writeFileSync(filepath.Join(tmp, f.name), func(w io.Writer) error {
			return safetensors.Write(w, f.tensors, meta)
		})
		if err != nil {
			return "", fmt.Errorf("train: checkpoint %s/%s: %w", name, f.name, err)
		}
		st.Files[f.name] = sum
	}
	js, err := marshalState(&st)
	if err != nil {
		return "", fmt.Errorf("train: checkpoint %s/%s: %w", name, StateFile, err)
	}
	if _, err := writeFileSync(filepath.Join(tmp, StateFile), func(w io.Writer) error {
		_, err := w.Write(js)
		return err
	}); err != nil {
		return "", fmt.Errorf("train: checkpoint %s/%s: %w", name, StateFile, err)
	}
	if err := syncDir(tmp); err != nil {
		return "", fmt.Errorf("train: checkpoint %s: %w", name, err)
	}
	if beforeRename != nil {
		beforeRename(st.Step)
	}

	final := filepath.Join(outDir, name)
	// A checkpoint of the same step from an earlier run (a resume from an
	// older checkpoint) is replaced: moved aside first, removed after.
	var old string
	if _, err := os.Stat(final); err == nil {
		old = filepath.Join(outDir, ".old-"+name+"-"+filepath.Base(tmp))
		if err := os.Rename(final, old); err != nil {
			return "", fmt.Errorf("train: replacing checkpoint %s: %w", name, err)
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		if old != "" {
			os.Rename(old, final)
		}
		return "", fmt.Errorf("train: checkpoint %s: %w", name, err)
	}
	done = true
	if old != "" {
		os.RemoveAll(old)
	}
	if err := syncDir(outDir); err != nil {
		return "", fmt.Errorf("train: checkpoint %s: %w", name, err)
	}
	if err := writeLatest(outDir, name); err != nil {
		return "", err
	}
	return final, nil
}

// metadata records in meta what the file of these tensors needs beyond
// them: the slice of each whole split tensor (shard.SlicesKey, as
// shard.SaveWeights records it) and each run's record (RunsKey).
func (snap *Snapshot) metadata(meta map[string]string, tensors []safetensors.Named) error {
	slices, runs := map[string]shard.Slice{}, map[string]runRecord{}
	for _, t := range tensors {
		param := strings.TrimPrefix(strings.TrimPrefix(t.Name, "m."), "v.")
		if rec, ok := snap.runs[t.Name]; ok {
			param = strings.TrimPrefix(strings.TrimPrefix(rec.Tensor, "m."), "v.")
			if sl, ok := snap.slices[param]; ok {
				rec.Slice = &sl
			}
			runs[t.Name] = rec
			continue
		}
		if sl, ok := snap.slices[param]; ok {
			slices[t.Name] = sl
		}
	}
	for key, m := range map[string]any{shard.SlicesKey: slices, RunsKey: runs} {
		if reflect.ValueOf(m).Len() == 0 {
			continue
		}
		js, err := json.Marshal(m)
		if err != nil {
			return err
		}
		meta[key] = string(js)
	}
	return nil
}

// writeFileSync creates path with what fill writes, fsynced
// (atomicfile.Create), and returns the hex sha256 of what was written.
func writeFileSync(path string, fill func(io.Writer) error) (string, error) {
	h := sha256.New()
	if err := atomicfile.Create(path, func(w io.Writer) error { return fill(io.MultiWriter(w, h)) }); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeLatest points outDir/latest at the checkpoint called name (temp file,
// fsync, rename, fsync of the directory).
func writeLatest(outDir, name string) error {
	if err := atomicfile.WriteFile(filepath.Join(outDir, LatestFile), []byte(name+"\n")); err != nil {
		return fmt.Errorf("train: updating %s: %w", LatestFile, err)
	}
	if err := syncDir(outDir); err != nil {
		return fmt.Errorf("train: updating %s: %w", LatestFile, err)
	}
	return nil
}

// ListCheckpoints returns the paths of the checkpoints in outDir, oldest
// (lowest step) first.
func ListCheckpoints(outDir string) ([]string, error) {
	ents, err := os.ReadDir(outDir)
	if err != nil {
		return nil, err
	}
	type ck struct {
		step int
		path string
	}
	var cks []ck
	for _, e := range ents {
		if s, ok := checkpointStep(e.Name()); ok && e.IsDir() {
			cks = append(cks, ck{s, filepath.Join(outDir, e.Name())})
		}
	}
	sort.Slice(cks, func(i, j int) bool { return cks[i].step < cks[j].step })
	out := make([]string, len(cks))
	for i, c := range cks {
		out[i] = c.path
	}
	return out, nil
}

// PruneCheckpoints removes all but the newest keep checkpoints of outDir
// (keep <= 0 keeps all). The one named by latest is never removed.
func PruneCheckpoints(outDir string, keep int) error {
	if keep <= 0 {
		return nil
	}
	cks, err := ListCheckpoints(outDir)
	if err != nil {
		return fmt.Errorf("train: pruning checkpoints: %w", err)
	}
	latest, _ := LatestCheckpoint(outDir)
	for _, c := range cks[:max(len(cks)-keep, 0)] {
		if c == latest {
			continue
		}
		if err := os.RemoveAll(c); err != nil {
			return fmt.Errorf("train: pruning checkpoint %s: %w", c, err)
		}
	}
	return nil
}

// LatestCheckpoint reads outDir/latest and returns the checkpoint it names.
func LatestCheckpoint(outDir string) (string, error) {
	f, err := os.Open(filepath.Join(outDir, LatestFile))
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 256))
	if err != nil {
		return "", err
	}
	name := strings.TrimSpace(string(b))
	if _, ok := checkpointStep(name); !ok {
		return "", fmt.Errorf("train: %s names %q, not a checkpoint directory like step-000100", filepath.Join(outDir, LatestFile), clip([]byte(name), 40))
	}
	return filepath.Join(outDir, name), nil
}

// ResolveCheckpoint turns a resume argument into a checkpoint directory:
// path itself when it holds a state.json, else the checkpoint named by
// path/latest.
func ResolveCheckpoint(path string) (string, error) {
	if _, err := os.Stat(filepath.Join(path, StateFile)); err == nil {
		return path, nil
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("train: resume from %s: no such directory", path)
	}
	ck, err := LatestCheckpoint(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("train: resume from %s: neither a checkpoint (no %s) nor an out dir (no %s file)", path, StateFile, LatestFile)
	}
	if err != nil {
		return "", fmt.Errorf("train: resume from %s: %w", path, err)
	}
	if _, err := os.Stat(filepath.Join(ck, StateFile)); err != nil {
		return "", fmt.Errorf("train: resume from %s: %s names %s, which has no %s", path, LatestFile, filepath.Base(ck), StateFile)
	}
	return ck, nil
}
