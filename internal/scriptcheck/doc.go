// Package scriptcheck holds the repository's checks of its shell scripts, as
// tests run by go test ./... in CI on a machine without a GPU: every GPU
// script (the ones that source scripts/gpu-env.sh) exits with status 77 and
// one line on stderr where there is no GPU, having run nothing; and the
// scripts' shared convention (scripts/README.md) turns a failed step into
// exit status 1. The tests run bash only, with a fake nvidia-smi and a
// failing nvcc where they need one, so they build nothing and need no GPU.
package scriptcheck
