// Package nativebuild finds a file that the repository's native build makes
// (the kernels image, the NVSHMEM transport library): next to the
// executable, else in the repository's build folder.
package nativebuild

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// Find returns the path of the regular file name next to the executable,
// else in the build folder of the repository (the first folder above the
// working directory that holds go.mod). When it is in neither, path is ""
// and tried says where it looked, in that order: "<path> (next to the
// executable)" or "next to the executable (<why not>)", then "<path> (the
// repository's build folder)" or "the repository's build folder (<why
// not>)".
func Find(name string) (path string, tried [2]string) {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), name)
		if isFile(p) {
			return p, tried
		}
		tried[0] = p + " (next to the executable)"
	} else {
		tried[0] = "next to the executable (" + err.Error() + ")"
	}
	if root, err := RepoRoot(); err == nil {
		p := filepath.Join(root, "build", name)
		if isFile(p) {
			return p, tried
		}
		tried[1] = p + " (the repository's build folder)"
	} else {
		tried[1] = "the repository's build folder (" + err.Error() + ")"
	}
	return "", tried
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// RepoRoot walks up from the working directory to the folder holding go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
