// CHECK-ONLY STAND-IN for NVSHMEM's nvshmem.h: the few declarations that
// atp_nvshmem.cu and atp_exchange.cu use, with the signatures of NVSHMEM 3.x
// (read from NVIDIA/nvshmem src/include/host/*.h), so that the sources can be
// syntax-checked with an nvcc that has no NVSHMEM (bash check/check.sh).
// Never used by build.sh, never linked: the real build uses the wheel's
// headers.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

typedef int32_t nvshmem_team_t;
#define NVSHMEM_TEAM_WORLD 0
#define NVSHMEM_TEAM_INVALID -1
#define NVSHMEM_VENDOR_MAJOR_VERSION 3
#define NVSHMEM_VENDOR_MINOR_VERSION 0
#define NVSHMEM_VENDOR_PATCH_VERSION 0

enum { NVSHMEM_CMP_EQ = 0, NVSHMEM_CMP_NE, NVSHMEM_CMP_GT, NVSHMEM_CMP_LE, NVSHMEM_CMP_LT, NVSHMEM_CMP_GE };
enum { NVSHMEM_SIGNAL_SET = 9, NVSHMEM_SIGNAL_ADD = 10 };
enum flags { NVSHMEMX_INIT_WITH_UNIQUEID = 1 << 3 };

typedef struct { int version; char internal[124]; } nvshmemx_uniqueid_t;
#define NVSHMEMX_UNIQUEID_INITIALIZER {0, {0}}
typedef struct { int version; char internal[252]; } nvshmemx_init_attr_t;
#define NVSHMEMX_INIT_ATTR_INITIALIZER {0, {0}}
typedef struct { int num_contexts; } nvshmem_team_config_t;

extern "C" {
int nvshmemx_get_uniqueid(nvshmemx_uniqueid_t *uniqueid);
int nvshmemx_set_attr_uniqueid_args(const int myrank, const int nranks, const nvshmemx_uniqueid_t *uniqueid,
                                    nvshmemx_init_attr_t *attr);
int nvshmemx_init_attr(unsigned int flags, nvshmemx_init_attr_t *attributes);
int nvshmemx_init_status();
void nvshmem_finalize();
__host__ __device__ int nvshmem_my_pe();
__host__ __device__ int nvshmem_n_pes();
void *nvshmem_calloc(size_t, size_t);
void nvshmem_free(void *ptr);
__host__ __device__ void *nvshmem_ptr(const void *ptr, int pe);
__host__ __device__ int nvshmem_team_my_pe(nvshmem_team_t team);
int nvshmem_team_split_strided(nvshmem_team_t parent_team, int PE_start, int PE_stride, int PE_size,
                               const nvshmem_team_config_t *config, long config_mask, nvshmem_team_t *new_team);
void nvshmem_team_destroy(nvshmem_team_t team);
__device__ uint64_t nvshmem_signal_wait_until(uint64_t *sig_addr, int cmp, uint64_t cmp_val);
}
