// atp_exchange.cu: the device half of libasynctp_nvshmem.so: the exchange
// and barrier kernels of the P2P path, the scale kernel of the team path, and
// the put/signal smoke kernels. README.md describes the exchange protocol.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>

#include "atp_internal.h"
#include "atp_nvshmem.h"

namespace {

constexpr int kThreads = 512; // threads per block of the exchange kernel

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// load_acquire reads a signal word written by other PEs (system scope).
__device__ __forceinline__ uint64_t load_acquire(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Fail is where a block that gives up says why.
struct Fail {
  uint32_t *dev;       // the group's device word: nonzero once a block gave up
  atp_nv_errrec *host; // the group's record, in mapped host memory
  int op;
  int64_t timeout_ns;
};

// give_up records the group's first failure; later ones only see it.
__device__ void give_up(const Fail &f, int code, int peer, uint64_t waited) {
  if (atomicCAS(f.dev, 0u, (uint32_t)code) == 0u) {
    volatile atp_nv_errrec *r = f.host;
    r->peer = peer;
    r->op = f.op;
    r->block = (int32_t)blockIdx.x;
    r->waited_ns = waited;
    __threadfence_system();
    r->code = code;
    __threadfence_system();
  }
}

// wait_ge waits (one thread) until *p ≥ v. It returns false when the wait
// gives up: after f.timeout_ns (recording code and peer), or at once when
// another block of the group gave up.
__device__ bool wait_ge(const uint64_t *p, uint64_t v, const Fail &f, int code, int peer) {
  if (load_acquire(p) >= v) return true;
  const uint64_t start = now_ns();
  for (uint32_t i = 1;; i++) {
    __nanosleep(128);
    if (load_acquire(p) >= v) return true;
    if ((i & 63) == 0) {
      if (*(volatile uint32_t *)f.dev != 0u) return false;
      const uint64_t waited = now_ns() - start;
      if (f.timeout_ns > 0 && waited > (uint64_t)f.timeout_ns) {
        give_up(f, code, peer, waited);
        return false;
      }
    }
  }
}

// copy_words copies n words of V with the block's threads, four loads in
// flight per thread; CG reads through L2 only (__ldcg), for data another PE
// wrote since this SM last read the same address.
template <typename V, bool CG>
__device__ __forceinline__ V load(const V *p) {
  if (CG) return __ldcg(p);
  return *p;
}

template <typename V, bool CG>
__device__ void copy_words(V *d, const V *s, int64_t n) {
  const int64_t step = blockDim.x;
  int64_t i = threadIdx.x;
  for (; i + 3 * step < n; i += 4 * step) {
    const V a = load<V, CG>(s + i), b = load<V, CG>(s + i + step), c = load<V, CG>(s + i + 2 * step),
            e = load<V, CG>(s + i + 3 * step);
    d[i] = a;
    d[i + step] = b;
    d[i + 2 * step] = c;
    d[i + 3 * step] = e;
  }
  for (; i < n; i += step) d[i] = load<V, CG>(s + i);
}

// block_copy copies n bytes with the widest words the alignment allows.
template <bool CG>
__device__ void block_copy(char *dst, const char *src, int64_t n) {
  if (n <= 0) return;
  const uint64_t a = (uint64_t)(uintptr_t)dst | (uint64_t)(uintptr_t)src | (uint64_t)n;
  if (a % 16 == 0)
    copy_words<uint4, CG>((uint4 *)dst, (const uint4 *)src, n / 16);
  else if (a % 8 == 0)
    copy_words<uint2, CG>((uint2 *)dst, (const uint2 *)src, n / 8);
  else if (a % 4 == 0)
    copy_words<unsigned int, CG>((unsigned int *)dst, (const unsigned int *)src, n / 4);
  else if (a % 2 == 0)
    copy_words<unsigned short, CG>((unsigned short *)dst, (const unsigned short *)src, n / 2);
  else
    copy_words<unsigned char, CG>((unsigned char *)dst, (const unsigned char *)src, n);
}

__device__ __forceinline__ int64_t lmin(int64_t a, int64_t b) { return a < b ? a : b; }

// slice is block k's share [lo, hi) of n bytes split n ways, in multiples of
// 16 bytes.
__device__ __forceinline__ void slice(int64_t bytes, int k, int n, int64_t *lo, int64_t *hi) {
  const int64_t per = ((bytes + n - 1) / n + 15) / 16 * 16;
  *lo = lmin(bytes, per * k);
  *hi = lmin(bytes, *lo + per);
}

// stage_slot is where round g of sender i lands in a receiver's staging.
__device__ __forceinline__ int64_t stage_slot(const atp_nv_xparams &p, int i, uint64_t g) {
  return ((int64_t)i * p.depth + (int64_t)(g % (uint64_t)p.depth)) * p.cap;
}

// send_part is sender block s for the peer q+1 places after this PE: it
// writes each round's share of the pair's bytes into the peer's staging
// through the P2P mapping, then sets its flag there to the round number.
// Before reusing a staging slot it waits until every receiver block of the
// peer has acknowledged the round that used it last; at the end it waits for
// the acknowledgement of the last round, so that nothing of this op is in
// flight when the kernel ends.
__device__ void send_part(const atp_nv_xparams &p, const Fail &f, int q, int s) {
  __shared__ char *peer_stage;
  const int j = (p.me + 1 + q) % p.npes;
  const int64_t bytes = p.send_bytes[j];
  if (bytes <= 0) return;
  const int64_t nr = (bytes + p.cap - 1) / p.cap;
  uint64_t *rounds = (uint64_t *)p.send_rounds + j * ATP_NV_MAXS + s;
  const uint64_t *acks = (const uint64_t *)p.acks + j * ATP_NV_MAXR; // from j's receiver blocks
  uint64_t *flag = (uint64_t *)p.flags + p.me * ATP_NV_MAXS + s;    // ours, at j
  const uint64_t g0 = *rounds;
  if (threadIdx.x == 0) {
    peer_stage = (char *)nvshmem_ptr((void *)p.stage, p.pe[j]);
    if (peer_stage == nullptr) give_up(f, ATP_NV_ERR_NO_P2P, j, 0);
  }
  __syncthreads();
  if (peer_stage == nullptr) return;
  const char *src = (const char *)p.src + p.send_off[j];
  for (int64_t t = 0; t < nr; t++) {
    const uint64_t g = g0 + t + 1;
    if (g > (uint64_t)p.depth) {
      int ok = 1;
      if ((int)threadIdx.x < p.nrecv) ok = wait_ge(acks + threadIdx.x, g - p.depth, f, ATP_NV_ERR_ACK_TIMEOUT, j);
      if (!__syncthreads_and(ok)) return;
    }
    const int64_t chunk = lmin(p.cap, bytes - t * p.cap);
    int64_t lo, hi;
    slice(chunk, s, p.nsend, &lo, &hi);
    block_copy<false>(peer_stage + stage_slot(p, p.me, g) + lo, src + t * p.cap + lo, hi - lo);
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) nvshmemx_signal_op(flag, g, NVSHMEM_SIGNAL_SET, p.pe[j]);
  }
  const uint64_t last = g0 + nr;
  int ok = 1;
  if ((int)threadIdx.x < p.nrecv) ok = wait_ge(acks + threadIdx.x, last, f, ATP_NV_ERR_ACK_TIMEOUT, j);
  ok = __syncthreads_and(ok);
  if (threadIdx.x == 0 && ok) *rounds = last;
}

// receive_copy is receiver block r in COPY mode: for each sender in turn,
// each round, it waits for the flags of all the sender's blocks, copies its
// share of the round from staging to dst, and acknowledges the round; then
// it copies its share of this PE's own part.
__device__ void receive_copy(const atp_nv_xparams &p, const Fail &f, int r) {
  const char *stage = (const char *)p.stage;
  char *dst = (char *)p.dst;
  for (int q = 1; q < p.npes; q++) {
    const int i = (p.me + p.npes - q) % p.npes; // the peer whose first sender targets us
    const int64_t bytes = p.recv_bytes[i];
    if (bytes <= 0) continue;
    const int64_t nr = (bytes + p.cap - 1) / p.cap;
    uint64_t *rounds = (uint64_t *)p.recv_rounds + i * ATP_NV_MAXR + r;
    const uint64_t *flags = (const uint64_t *)p.flags + i * ATP_NV_MAXS;
    uint64_t *ack = (uint64_t *)p.acks + p.me * ATP_NV_MAXR + r; // ours, at i
    const uint64_t h0 = *rounds;
    for (int64_t t = 0; t < nr; t++) {
      const uint64_t g = h0 + t + 1;
      int ok = 1;
      if ((int)threadIdx.x < p.nsend) ok = wait_ge(flags + threadIdx.x, g, f, ATP_NV_ERR_DATA_TIMEOUT, i);
      if (!__syncthreads_and(ok)) return;
      const int64_t chunk = lmin(p.cap, bytes - t * p.cap);
      int64_t lo, hi;
      slice(chunk, r, p.nrecv, &lo, &hi);
      block_copy<true>(dst + p.recv_off[i] + t * p.cap + lo, stage + stage_slot(p, i, g) + lo, hi - lo);
      __syncthreads(); // every read of the slot is done before it is released
      if (threadIdx.x == 0) nvshmemx_signal_op(ack, g, NVSHMEM_SIGNAL_SET, p.pe[i]);
    }
    if (threadIdx.x == 0) *rounds = h0 + nr;
  }
  const char *own = (const char *)p.src + p.self_src_off;
  char *to = dst + p.self_dst_off;
  if (p.self_bytes > 0 && own != to) {
    int64_t lo, hi;
    slice(p.self_bytes, r, p.nrecv, &lo, &hi);
    block_copy<false>(to + lo, own + lo, hi - lo);
  }
}

// Accumulation: fp32 for f32 and bf16, fp64 for f64, int32 (wrapping) for
// i32.
template <typename T> struct Acc;
template <> struct Acc<float> {
  typedef float A;
  static __device__ A in(float v) { return v; }
  static __device__ float out(A v) { return v; }
};
template <> struct Acc<double> {
  typedef double A;
  static __device__ A in(double v) { return v; }
  static __device__ double out(A v) { return v; }
};
template <> struct Acc<__nv_bfloat16> {
  typedef float A;
  static __device__ A in(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __nv_bfloat16 out(A v) { return __float2bfloat16_rn(v); }
};
template <> struct Acc<int> {
  typedef int A;
  static __device__ A in(int v) { return v; }
  static __device__ int out(A v) { return v; }
};

template <typename A>
__device__ __forceinline__ A combine(A a, A b, bool mx) {
  if (mx) return a > b ? a : b;
  return a + b;
}
template <>
__device__ __forceinline__ int combine<int>(int a, int b, bool mx) {
  if (mx) return max(a, b);
  return (int)((unsigned)a + (unsigned)b);
}

// receive_reduce is receiver block r in REDUCE mode: each round it waits for
// the flags of every sender, reduces its share of the round over the group
// in group-rank order (this PE's own part read from src), writes it to dst
// and acknowledges the round to every sender.
template <typename T>
__device__ void receive_reduce(const atp_nv_xparams &p, const Fail &f, int r) {
  typedef typename Acc<T>::A A;
  __shared__ uint64_t base[ATP_NV_MAXP];
  const int64_t bytes = p.self_bytes;
  if (bytes <= 0) return;
  const int64_t nr = (bytes + p.cap - 1) / p.cap;
  for (int i = threadIdx.x; i < p.npes; i += blockDim.x) base[i] = ((const uint64_t *)p.recv_rounds)[i * ATP_NV_MAXR + r];
  __syncthreads();
  const char *stage = (const char *)p.stage;
  const bool mx = p.redop == ATP_NV_MAX;
  const bool avg = p.redop == ATP_NV_AVG;
  for (int64_t t = 0; t < nr; t++) {
    int ok = 1;
    for (int w = threadIdx.x; w < p.npes * p.nsend; w += blockDim.x) {
      const int i = w / p.nsend, s = w % p.nsend;
      if (i != p.me)
        ok &= wait_ge((const uint64_t *)p.flags + i * ATP_NV_MAXS + s, base[i] + t + 1, f, ATP_NV_ERR_DATA_TIMEOUT, i);
    }
    if (!__syncthreads_and(ok)) return;
    const int64_t chunk = lmin(p.cap, bytes - t * p.cap);
    int64_t lo, hi;
    slice(chunk, r, p.nrecv, &lo, &hi);
    const int64_t n = (hi - lo) / (int64_t)sizeof(T);
    const T *own = (const T *)((const char *)p.src + p.self_src_off + t * p.cap + lo);
    T *out = (T *)((char *)p.dst + p.self_dst_off + t * p.cap + lo);
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
      A acc = 0;
      for (int k = 0; k < p.npes; k++) {
        T v;
        if (k == p.me)
          v = own[e];
        else
          v = __ldcg((const T *)(stage + stage_slot(p, k, base[k] + t + 1) + lo) + e);
        acc = k == 0 ? Acc<T>::in(v) : combine<A>(acc, Acc<T>::in(v), mx);
      }
      if (avg) acc = acc / (A)p.npes;
      out[e] = Acc<T>::out(acc);
    }
    __syncthreads(); // every read of the slots is done before they are released
    for (int i = threadIdx.x; i < p.npes; i += blockDim.x)
      if (i != p.me)
        nvshmemx_signal_op((uint64_t *)p.acks + p.me * ATP_NV_MAXR + r, base[i] + t + 1, NVSHMEM_SIGNAL_SET, p.pe[i]);
  }
  for (int i = threadIdx.x; i < p.npes; i += blockDim.x) ((uint64_t *)p.recv_rounds)[i * ATP_NV_MAXR + r] = base[i] + nr;
}

// exchange_kernel: blocks [0, (npes-1)·nsend) send (nsend per peer), the
// nrecv blocks after them receive.
__global__ void __launch_bounds__(kThreads) exchange_kernel(const __grid_constant__ atp_nv_xparams p) {
  const Fail f = {(uint32_t *)p.errdev, (atp_nv_errrec *)p.errhost, p.op_id, p.timeout_ns};
  const int senders = (p.npes - 1) * p.nsend;
  const int b = blockIdx.x;
  if (b < senders) {
    send_part(p, f, b / p.nsend, b % p.nsend);
    return;
  }
  const int r = b - senders;
  if (p.mode == ATP_NV_COPY) {
    receive_copy(p, f, r);
    return;
  }
  switch (p.dtype) {
    case ATP_NV_F32:
      receive_reduce<float>(p, f, r);
      break;
    case ATP_NV_F64:
      receive_reduce<double>(p, f, r);
      break;
    case ATP_NV_BF16:
      receive_reduce<__nv_bfloat16>(p, f, r);
      break;
    case ATP_NV_I32:
      receive_reduce<int>(p, f, r);
      break;
  }
}

// barrier_kernel: one block; thread i sets this PE's word on PE i to gen and
// waits for PE i's word here to reach gen.
__global__ void barrier_kernel(const __grid_constant__ atp_nv_bparams p) {
  const Fail f = {(uint32_t *)p.errdev, (atp_nv_errrec *)p.errhost, p.op_id, p.timeout_ns};
  uint64_t *bar = (uint64_t *)p.bar;
  const int i = threadIdx.x;
  int ok = 1;
  if (i < p.npes && i != p.me) {
    nvshmemx_signal_op(bar + p.me, p.gen, NVSHMEM_SIGNAL_SET, p.pe[i]);
    ok = wait_ge(bar + i, p.gen, f, ATP_NV_ERR_BARRIER_TIMEOUT, i);
  }
  __syncthreads_and(ok);
}

template <typename T>
__global__ void scale_kernel(T *p, uint64_t n, double f) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    p[i] = (T)((double)p[i] * f);
}

template <>
__global__ void scale_kernel<__nv_bfloat16>(__nv_bfloat16 *p, uint64_t n, double f) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    p[i] = __float2bfloat16_rn(__bfloat162float(p[i]) * (float)f);
}

__global__ void smoke_put_kernel(int *buf, int *src, uint64_t *sig, int n, int value, int pe, uint64_t sigval) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) src[i] = value * 1000 + i;
  __syncthreads();
  nvshmemx_putmem_signal_block(buf, src, (size_t)n * sizeof(int), sig, sigval, NVSHMEM_SIGNAL_SET, pe);
}

__global__ void smoke_wait_kernel(const int *buf, uint64_t *sig, int n, int value, uint64_t sigval, int *bad) {
  if (threadIdx.x == 0) nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, sigval);
  __syncthreads();
  int b = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (__ldcg(buf + i) != value * 1000 + i) b++;
  if (b) atomicAdd(bad, b);
}

} // namespace

int atp_scale(void *p, uint64_t n, int dtype, double f, cudaStream_t st, char *err) {
  if (n == 0) return 0;
  const int threads = 256;
  const unsigned blocks = (unsigned)((n + threads - 1) / threads < 1024 ? (n + threads - 1) / threads : 1024);
  switch (dtype) {
    case ATP_NV_F32:
      scale_kernel<float><<<blocks, threads, 0, st>>>((float *)p, n, f);
      break;
    case ATP_NV_F64:
      scale_kernel<double><<<blocks, threads, 0, st>>>((double *)p, n, f);
      break;
    case ATP_NV_BF16:
      scale_kernel<__nv_bfloat16><<<blocks, threads, 0, st>>>((__nv_bfloat16 *)p, n, f);
      break;
    default:
      return atp_fail(err, "scale: dtype %d is not a float type", dtype);
  }
  CK(cudaGetLastError());
  return 0;
}

extern "C" {

int atp_nv_exchange(const atp_nv_xparams *p, uint64_t stream, char *err) {
  if (atp_use_world_device(err)) return 1;
  if (p->npes < 2 || p->npes > ATP_NV_MAXP || p->me < 0 || p->me >= p->npes)
    return atp_fail(err, "exchange: PE %d of %d: expected 2 ≤ npes ≤ %d", p->me, p->npes, ATP_NV_MAXP);
  if (p->nsend < 1 || p->nsend > ATP_NV_MAXS || p->nrecv < 1 || p->nrecv > ATP_NV_MAXR || p->depth < 1)
    return atp_fail(err, "exchange: %d sender blocks per peer, %d receiver blocks, depth %d: out of range", p->nsend, p->nrecv, p->depth);
  if (p->cap <= 0 || p->cap % 256 != 0) return atp_fail(err, "exchange: round size %lld: expected a positive multiple of 256", (long long)p->cap);
  const int grid = (p->npes - 1) * p->nsend + p->nrecv;
  exchange_kernel<<<grid, kThreads, 0, (cudaStream_t)(uintptr_t)stream>>>(*p);
  CK(cudaGetLastError());
  return 0;
}

int atp_nv_barrier(const atp_nv_bparams *p, uint64_t stream, char *err) {
  if (atp_use_world_device(err)) return 1;
  if (p->npes < 1 || p->npes > ATP_NV_MAXP || p->me < 0 || p->me >= p->npes)
    return atp_fail(err, "barrier: PE %d of %d: expected 1 ≤ npes ≤ %d", p->me, p->npes, ATP_NV_MAXP);
  barrier_kernel<<<1, ATP_NV_MAXP, 0, (cudaStream_t)(uintptr_t)stream>>>(*p);
  CK(cudaGetLastError());
  return 0;
}

int atp_nv_smoke_put(uint64_t buf, uint64_t src, uint64_t sig, int nints, int value, int pe, uint64_t sigval,
                     uint64_t stream, char *err) {
  if (atp_use_world_device(err)) return 1;
  smoke_put_kernel<<<1, 256, 0, (cudaStream_t)(uintptr_t)stream>>>((int *)(uintptr_t)buf, (int *)(uintptr_t)src,
                                                                   (uint64_t *)(uintptr_t)sig, nints, value, pe, sigval);
  CK(cudaGetLastError());
  return 0;
}

int atp_nv_smoke_wait(uint64_t buf, uint64_t sig, int nints, int value, uint64_t sigval, uint64_t bad, uint64_t stream,
                      char *err) {
  if (atp_use_world_device(err)) return 1;
  smoke_wait_kernel<<<1, 256, 0, (cudaStream_t)(uintptr_t)stream>>>((const int *)(uintptr_t)buf, (uint64_t *)(uintptr_t)sig,
                                                                    nints, value, sigval, (int *)(uintptr_t)bad);
  CK(cudaGetLastError());
  return 0;
}

} // extern "C"
