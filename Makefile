# asynctp: the everyday targets. `make test` is exactly what CI runs.
GO ?= go

.PHONY: build test test-race vet bench cuda gpu-test-binaries clean

build:
	$(GO) build ./...

test:
	$(GO) test ./...

vet:
	$(GO) vet ./...

test-race:
	$(GO) test -race -short ./...

# CPU benchmarks (reference figures; GPU figures come from scripts/gpu.sh).
bench:
	$(GO) test -run '^$$' -bench . -benchtime 2x ./tensor/cpu ./train/...

# The CUDA kernels image; needs nvcc (run on the GPU machine, see scripts/gpu.sh).
cuda:
	bash cuda/kernels/build.sh

# Test binaries and the train command for the GPU machine (built here, no CUDA needed).
gpu-test-binaries:
	bash scripts/build-gpu-artifacts.sh

clean:
	rm -rf build out
