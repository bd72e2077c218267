package main

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// startCPUProfile starts the Go CPU profile of --cpu-profile: into path, or
// path.rankN when the world has several processes (each rank writes its
// own). The file must not exist: a profile never replaces one already
// written. stop ends the profile and closes the file.
func startCPUProfile(path string, rank, world int) (stop func(), err error) {
	if world > 1 {
		path = fmt.Sprintf("%s.rank%d", path, rank)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		if os.IsExist(err) {
			return nil, fmt.Errorf("--cpu-profile: %s exists; expected a new file (a profile never replaces one)", path)
		}
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("--cpu-profile %s: %w", path, err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "train: --cpu-profile %s: %v\n", path, err)
		}
	}, nil
}
