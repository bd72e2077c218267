package train

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/safetensors"
	"github.com/asynctp/asynctp/tensor"
)

// LoadCheckpoint reads the checkpoint in dir into opt's parameters and
// moments and returns its state. Everything is validated before anything is
// written, so on error the model and optimizer are unchanged: the state's
// version and fields, each file's sha256, each file's structure, and every
// tensor's presence, dtype and shape against the model (a tensor the model
// does not have is an error too).
func LoadCheckpoint(dir string, b tensor.Backend, opt *optim.AdamW) (*State, error) {
	label := filepath.Base(dir)
	st, err := ReadState(filepath.Join(dir, StateFile))
	if err != nil {
		return nil, fmt.Errorf("train: checkpoint %s: %w", label, err)
	}
	if want := opt.ParamDType().String(); st.ModelDType != want {
		return nil, fmt.Errorf("train: checkpoint %s holds %s parameters, but the model's are %s", label, st.ModelDType, want)
	}
	files := map[string]*safetensors.File{}
	for _, f := range []string{ModelFile, OptimFile} {
		name := label + "/" + f
		// Bound what is read by what the model can need.
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			return nil, fmt.Errorf("train: checkpoint %s: %w", name, err)
		}
		if limit := expectedBytes(opt, f) + 8 + safetensors.MaxHeader; fi.Size() > limit {
			return nil, fmt.Errorf("train: checkpoint %s is %d bytes, more than the %d this model's tensors can take", name, fi.Size(), limit)
		}
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return nil, fmt.Errorf("train: checkpoint %s: %w", name, err)
		}
		sum := sha256.Sum256(data)
		if got := hex.EncodeToString(sum[:]); got != st.Files[f] {
			return nil, fmt.Errorf("train: checkpoint %s is corrupted: sha256 %s, expected %s (from %s)", name, got, st.Files[f], StateFile)
		}
		sf, err := safetensors.Read(data)
		if err != nil {
			return nil, fmt.Errorf("train: checkpoint %s: %w", name, err)
		}
		files[f] = sf
	}

	// Decode everything first: nothing is written unless all of it fits.
	var ups []upload
	take := func(file string, sf *safetensors.File, seen map[string]bool, name string, dst *tensor.Tensor, dt tensor.DType) error {
		e, ok := sf.Entries[name]
		if !ok {
			return fmt.Errorf("train: checkpoint %s/%s has no tensor %q, which the model needs", label, file, name)
		}
		seen[name] = true
		if e.DType != dt {
			return fmt.Errorf("train: checkpoint %s/%s: tensor %q is %v, want %v", label, file, name, e.DType, dt)
		}
		if !e.Shape.Equal(dst.Shape()) {
			return fmt.Errorf("train: checkpoint %s/%s: tensor %q has shape %v, the model's is %v", label, file, name, e.Shape, dst.Shape())
		}
		h, err := e.Tensor()
		if err != nil {
			return fmt.Errorf("train: checkpoint %s/%s: %w", label, file, err)
		}
		ups = append(ups, upload{dst, h})
		return nil
	}
	pieces, err := opt.StatePieces()
	if err != nil {
		return nil, err
	}
	seenModel, seenOptim := map[string]bool{}, map[string]bool{}
	for _, sp := range pieces {
		if err := take(ModelFile, files[ModelFile], seenModel, pieceName("", sp), sp.W, sp.W.DType()); err != nil {
			return nil, err
		}
		if err := take(OptimFile, files[OptimFile], seenOptim, pieceName("m.", sp), sp.M, sp.M.DType()); err != nil {
			return nil, err
		}
		if err := take(OptimFile, files[OptimFile], seenOptim, pieceName("v.", sp), sp.V, sp.V.DType()); err != nil {
			return nil, err
		}
	}
	for _, c := range []struct {
		file string
		seen map[string]bool
	}{{ModelFile, seenModel}, {OptimFile, seenOptim}} {
		for _, n := range files[c.file].Names() {
			if !c.seen[n] {
				return nil, fmt.Errorf("train: checkpoint %s/%s holds tensor %q, which the model does not have", label, c.file, n)
			}
		}
	}

	if err := uploadAll(b, opt, ups); err != nil {
		return nil, fmt.Errorf("train: loading checkpoint %s: %w", label, err)
	}
	return st, nil
}

// upload is a host tensor of a checkpoint and the model's tensor it goes
// to.
type upload struct{ dst, src *tensor.Tensor }

// uploadAll writes the decoded tensors of a checkpoint into the model and
// the optimizer (once all of them are known to fit) and copies the master
// weights into the parameters (optim.AdamW.SyncParams).
func uploadAll(b tensor.Backend, opt *optim.AdamW, ups []upload) error {
	for _, u := range ups {
		b.Upload(u.dst, u.src)
	}
	err := opt.SyncParams()
	if err == nil {
		err = b.Err()
	}
	return err
}

// expectedBytes is the size of the tensor data of file f for opt's state
// (its StatePieces).
func expectedBytes(opt *optim.AdamW, f string) int64 {
	pieces, err := opt.StatePieces()
	if err != nil {
		return 0
	}
	var n int64
	for _, sp := range pieces {
		if f == OptimFile {
			n += int64(sp.M.Numel()*sp.M.DType().Size() + sp.V.Numel()*sp.V.DType().Size())
		} else {
			n += int64(sp.W.Numel() * sp.W.DType().Size())
		}
	}
	return n
}
