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

# The GPU artefacts; need nvcc (run on the GPU machine, see scripts/gpu.sh):
# build/asynctp_kernels.fatbin (our kernels, loaded with the driver API) and
# build/libasynctp_nvshmem.so (comm/nvshmem's native half, device-linked with
# libnvshmem_device.a; skipped with a message where NVSHMEM is not installed).
cuda:
	bash cuda/kernels/build.sh
	bash cuda/nvshmem/build.sh || echo "make cuda: libasynctp_nvshmem.so not built (NVSHMEM missing?); --comm nvshmem needs it"

# Test binaries and the train command for the GPU machine (built here, no CUDA needed).
gpu-test-binaries:
	bash scripts/build-gpu-artifacts.sh

clean:
	rm -rf build out
