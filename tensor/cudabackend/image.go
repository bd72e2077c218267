package cudabackend

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// EnvKernels names the environment variable that gives the path of the
// kernels image (a fatbin built from cuda/kernels by build.sh or `make`).
const EnvKernels = "ASYNCTP_KERNELS"

// KernelsFile is the name of the kernels image.
const KernelsFile = "asynctp_kernels.fatbin"

// FindKernels returns the path of the kernels image: $ASYNCTP_KERNELS if
// set (it must exist), else KernelsFile next to the executable, else
// build/KernelsFile in the repository (the first folder above the working
// directory that holds go.mod). The error names every place it looked.
func FindKernels() (string, error) {
	if p := os.Getenv(EnvKernels); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("cudabackend: kernels image: $%s=%s: %w", EnvKernels, p, err)
		}
		return p, nil
	}
	var tried []string
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), KernelsFile)
		if isFile(p) {
			return p, nil
		}
		tried = append(tried, p+" (next to the executable)")
	} else {
		tried = append(tried, "next to the executable ("+err.Error()+")")
	}
	if root, err := repoRoot(); err == nil {
		p := filepath.Join(root, "build", KernelsFile)
		if isFile(p) {
			return p, nil
		}
		tried = append(tried, p+" (the repository's build folder)")
	} else {
		tried = append(tried, "the repository's build folder ("+err.Error()+")")
	}
	return "", fmt.Errorf("cudabackend: kernels image %s not found: $%s is not set, and it is not at %s, nor %s; build it with cuda/kernels/build.sh (nvcc) or `make -C cuda/kernels`, or set $%s to its path",
		KernelsFile, EnvKernels, tried[0], tried[1], EnvKernels)
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// repoRoot walks up from the working directory to the folder holding go.mod.
func repoRoot() (string, error) {
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
