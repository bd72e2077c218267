# Sourced (not run) by the GPU scripts, from the repository root: the
# environment every command on a GPU machine keeps (no NVLink multicast for
# NCCL, NVSHMEM or PyTorch's symmetric memory) and the default paths of the
# kernels image and libasynctp_nvshmem.so in build/ (a value already set is
# kept).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export ASYNCTP_KERNELS=${ASYNCTP_KERNELS:-$PWD/build/asynctp_kernels.fatbin}
export ASYNCTP_LIBNVSHMEM=${ASYNCTP_LIBNVSHMEM:-$PWD/build/libasynctp_nvshmem.so}

# kernels_stale: true when the kernels image is missing or older than a
# kernel source (the scripts then rebuild it with cuda/kernels/build.sh).
kernels_stale() {
  [ ! -f "$ASYNCTP_KERNELS" ] || [ -n "$(find cuda/kernels -name '*.cu*' -newer "$ASYNCTP_KERNELS" 2>/dev/null | head -1)" ]
}
