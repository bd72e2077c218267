// Package atomicfile writes files so that a reader sees the old content or
// the new, never a part: through a temporary file of the same directory,
// fsynced and renamed into place. Files and directories are made as
// os.WriteFile and os.MkdirAll make them, 0644 and 0755 less the umask
// (os.CreateTemp and os.MkdirTemp would make them 0600 and 0700), so the
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
	err = fillSync(f, fill)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// Create creates path, which must not exist yet (mode 0644 less the
// umask), with what fill writes through a buffer, fsynced and closed. It
// does not rename: it writes the files of a directory that is renamed into
// place as a whole (MkdirTemp). On error the file is removed.
func Create(path string, fill func(io.Writer) error) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		return err
	}
	if err := fillSync(f, fill); err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// fillSync writes f with what fill writes through a 1 MiB buffer, fsyncs
// and closes it (f is closed whatever happens) and returns the first
// error.
func fillSync(f *os.File, fill func(io.Writer) error) error {
	bw := bufio.NewWriterSize(f, 1<<20)
	err := fill(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// WriteFile is Write of data.
func WriteFile(path string, data []byte) error {
	return Write(path, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// The modes of os.WriteFile and os.MkdirAll (less the umask).
const (
	fileMode = 0o644
	dirMode  = 0o755
)

// CreateTemp creates a new file dir/prefix<random hex> of mode 0644 less
// the umask, open for reading and writing.
func CreateTemp(dir, prefix string) (*os.File, error) {
	var f *os.File
	err := newTemp(dir, prefix, "file", func(name string) (err error) {
		f, err = os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, fileMode)
		return err
	})
	return f, err
}

// MkdirTemp creates a new directory dir/prefix<random hex> of mode 0755
// less the umask (os.MkdirTemp would make it 0700) and returns its path.
func MkdirTemp(dir, prefix string) (string, error) {
	var name string
	err := newTemp(dir, prefix, "directory", func(n string) error {
		name = n
		return os.Mkdir(n, dirMode)
	})
	return name, err
}

// newTemp calls create with dir/prefix<random hex> names until one does
// not exist yet.
func newTemp(dir, prefix, what string, create func(name string) error) error {
	for range 100 {
		var b [6]byte
		rand.Read(b[:])
		err := create(filepath.Join(dir, prefix+hex.EncodeToString(b[:])))
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return err
	}
	return fmt.Errorf("creating a temporary %s %s* in %s: too many attempts", what, prefix, dir)
}
