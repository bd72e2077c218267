//go:build !linux

package tokens

import (
	"errors"
	"os"
)

// canMap reports whether this system's files are memory-mapped; here they
// are read whole (readWhole).
const canMap = false

func mapFile(*os.File, int64) ([]byte, error) {
	return nil, errors.New("memory-mapped files are only used on Linux")
}

func unmap([]byte) error { return nil }

func release([]byte, int, int) {}
