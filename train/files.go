package train

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// dirMode is the mode of an out dir, as os.MkdirAll makes it: 0755 less
// the umask, so that under the usual umask 022 the other users of a shared
// out dir (the ranks of other nodes) can read it. Its files and temporary
// directories are made alike by internal/atomicfile.
const dirMode = 0o755

// clip is b as a string, trimmed and cut to n bytes (for error messages
// that quote a file's content).
func clip(b []byte, n int) string {
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// WriteFileAtomic writes data to path through a temporary file of the same
// directory (mode 0644 less the umask), fsynced and renamed into place, so
// that readers see the old file or the new one, never a part.
func WriteFileAtomic(path string, data []byte) error {
	return writeFileAtomic(path, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// CleanStale tidies outDir after a run that was killed: the temporary
// files and directories a write leaves until its rename (".tmp-*"; a
// checkpoint's is ".tmp-step-NNNNNN-*") are removed, and a checkpoint that
// was moved aside to be replaced (".old-step-NNNNNN-*") is put back when
// the replacement never arrived, else removed. Call it only while no other
// run writes to outDir (cmd/train holds the directory's lock). A missing
// outDir is not an error.
func CleanStale(outDir string) error {
	ents, err := os.ReadDir(outDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("train: cleaning %s: %w", outDir, err)
	}
	for _, e := range ents {
		name := e.Name()
		path := filepath.Join(outDir, name)
		switch {
		case strings.HasPrefix(name, ".tmp-"):
			err = os.RemoveAll(path)
		case strings.HasPrefix(name, ".old-step-"):
			ck := strings.TrimPrefix(name, ".old-")
			if i := strings.Index(ck[len("step-"):], "-"); i >= 0 {
				ck = ck[:len("step-")+i]
			}
			if _, ok := checkpointStep(ck); ok {
				if _, serr := os.Stat(filepath.Join(outDir, ck)); errors.Is(serr, fs.ErrNotExist) {
					err = os.Rename(path, filepath.Join(outDir, ck))
					break
				}
			}
			err = os.RemoveAll(path)
		}
		if err != nil {
			return fmt.Errorf("train: cleaning %s: %w", outDir, err)
		}
	}
	return nil
}
