#!/usr/bin/env bash
# Builds, on the dev machine (no CUDA needed), everything the GPU machine runs:
# the train command and the test binaries of every package with GPU tests.
# The GPU machine has no Go; carry build/ there and run scripts/gpu.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
FLAGS=(-trimpath -ldflags=-s\ -w)
go build "${FLAGS[@]}" -o build/train ./cmd/train
go build "${FLAGS[@]}" -o build/ablate ./cmd/ablate
for pkg in $(go list ./... | sed 's|^github.com/asynctp/asynctp/||;s|^github.com/asynctp/asynctp$||'); do
  case "$pkg" in
    cuda|tensor/cudabackend|comm/nccl|comm/nvshmem|comm/tcp|overlap/peercopy|parallel/ep/peerep|bench|bench/*)
      if [ -n "$(ls "$pkg"/*_test.go 2>/dev/null)" ]; then
        go test "${FLAGS[@]}" -c -o "build/$(echo "$pkg" | tr / _).test" "./$pkg"
      fi ;;
  esac
done
ls -la build
