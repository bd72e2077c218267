// Package atomicfile writes files so that a reader sees the old content or
// the new, never a part: through a temporary file of the same directory,
// fsynced and renamed into place. Files are made as os.WriteFile makes
// them, 0644 less the umask (os.CreateTemp would make them 0600), so the
// other users of a shared directory can read them.
package atomicfile

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Write creates path with what fill writes through a buffer: into
// dir/.tmp-<name>-<random>, fsynced, closed and renamed over path. On error
// the temporary file is removed and path is left as it was.
func Write(path string, fill func(io.Writer) error) error {
	f, err := CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	bw := bufio.NewWriterSize(f, 1<<20)
	err = fill(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// WriteFile is Write of data.
func WriteFile(path string, data []byte) error {
	return Write(path, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// CreateTemp creates a new file dir/prefix<random hex> of mode 0644 less
// the umask, open for reading and writing.
func CreateTemp(dir, prefix string) (*os.File, error) {
	for range 100 {
		var b [6]byte
		rand.Read(b[:])
		f, err := os.OpenFile(filepath.Join(dir, prefix+hex.EncodeToString(b[:])), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, err
	}
	return nil, fmt.Errorf("creating a temporary file %s* in %s: too many attempts", prefix, dir)
}
