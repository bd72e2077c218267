package cudabackend

import (
	"fmt"
	"os"

	"github.com/asynctp/asynctp/internal/nativebuild"
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
	p, tried := nativebuild.Find(KernelsFile)
	if p != "" {
		return p, nil
	}
	return "", fmt.Errorf("cudabackend: kernels image %s not found: $%s is not set, and it is not at %s, nor %s; build it with cuda/kernels/build.sh (nvcc) or `make -C cuda/kernels`, or set $%s to its path",
		KernelsFile, EnvKernels, tried[0], tried[1], EnvKernels)
}
