// emu.cc: the coroutine scheduler behind emu.h, the registry of kernels and
// the C entry points used by tensor/cudabackend/internal/emu (cgo). Compiled
// as one translation unit with every kernel (asynctp_kernels.cu).
#include "emu.h"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

dim3 threadIdx, blockIdx, blockDim, gridDim;

#include "../asynctp_kernels.cu"

// ---- context switching -----------------------------------------------------
// A minimal x86-64 System V stack switch: saves the callee-saved registers on
// the current stack, stores the stack pointer in *save, and resumes the
// coroutine whose stack pointer is next.
#if !defined(__x86_64__)
#error "the asynctp kernel emulator supports x86-64 only"
#endif
extern "C" void emu_switch(void** save, void* next);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch,@function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");

namespace {

enum State { READY, AT_BLOCK, AT_WARP, DONE };

constexpr size_t kStack = 256 * 1024; // per emulated thread
constexpr size_t kSlot = 64;          // bytes a lane may contribute to a warp exchange

struct Thread {
    void* sp;
    State state;
    unsigned x, y, z;
};

struct Sched {
    void* main_sp = nullptr;
    std::vector<Thread> th;
    std::vector<char*> stacks;
    int cur = 0;
    int n = 0;
    std::function<void()> body;
    std::vector<unsigned char> dyn;
    std::vector<unsigned char> slots; // kSlot bytes per thread
    std::string err;
};
Sched S;
int g_reverse = 0; // run the ready threads last to first (exposes missing barriers)

void yield_to_scheduler() { emu_switch(&S.th[S.cur].sp, S.main_sp); }

[[noreturn]] void thread_entry() {
    S.body();
    S.th[S.cur].state = DONE;
    emu_switch(&S.th[S.cur].sp, S.main_sp);
    std::abort(); // never resumed
}

void init_thread(int i) {
    char* top = S.stacks[i] + kStack;
    uintptr_t a = reinterpret_cast<uintptr_t>(top) & ~uintptr_t(15);
    uintptr_t* sp = reinterpret_cast<uintptr_t*>(a);
    *--sp = 0; // a dummy return address of thread_entry (it never returns)
    // `ret` in emu_switch pops this address (at a - 16, ≡ 0 mod 16), leaving
    // rsp ≡ 8 (mod 16) at entry, as after a call.
    *--sp = reinterpret_cast<uintptr_t>(&thread_entry);
    for (int k = 0; k < 6; k++) *--sp = 0; // rbp, rbx, r12..r15
    --sp;                                  // mxcsr and x87 control word
    unsigned mx = 0x1f80;                  // default MXCSR: all exceptions masked, round to nearest
    unsigned short cw = 0x037f;            // default x87 control word
    std::memcpy(reinterpret_cast<char*>(sp), &mx, 4);
    std::memcpy(reinterpret_cast<char*>(sp) + 4, &cw, 2);
    S.th[i].sp = sp;
    S.th[i].state = READY;
}

bool run_block() {
    for (int i = 0; i < S.n; i++) init_thread(i);
    for (;;) {
        for (int k = 0; k < S.n; k++) {
            int i = g_reverse ? S.n - 1 - k : k;
            if (S.th[i].state != READY) continue;
            S.cur = i;
            threadIdx = dim3{S.th[i].x, S.th[i].y, S.th[i].z};
            emu_switch(&S.main_sp, S.th[i].sp);
        }
        int done = 0, atBlock = 0;
        for (int i = 0; i < S.n; i++) {
            done += S.th[i].state == DONE;
            atBlock += S.th[i].state == AT_BLOCK;
        }
        if (done == S.n) return true;
        bool released = false;
        for (int w = 0; w * 32 < S.n; w++) {
            int lo = w * 32, hi = lo + 32 < S.n ? lo + 32 : S.n;
            bool all = true, any = false;
            for (int i = lo; i < hi; i++) {
                all = all && (S.th[i].state == AT_WARP || S.th[i].state == DONE);
                any = any || S.th[i].state == AT_WARP;
            }
            if (all && any) {
                for (int i = lo; i < hi; i++)
                    if (S.th[i].state == AT_WARP) S.th[i].state = READY;
                released = true;
            }
        }
        if (released) continue;
        if (atBlock + done == S.n) {
            for (int i = 0; i < S.n; i++)
                if (S.th[i].state == AT_BLOCK) S.th[i].state = READY;
            continue;
        }
        char buf[160];
        std::snprintf(buf, sizeof buf,
                      "deadlock in block (%u,%u,%u): threads wait at different barriers (warp vs block)",
                      blockIdx.x, blockIdx.y, blockIdx.z);
        S.err = buf;
        return false;
    }
}

struct Entry {
    std::function<void(void**)> call;
    std::vector<size_t> sizes;
};

std::map<std::string, Entry>& registry() {
    static std::map<std::string, Entry> r;
    return r;
}

template <typename... A, size_t... I>
void call_impl(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(args[I])...);
}

template <typename... A> Entry make_entry(void (*f)(A...)) {
    Entry e;
    e.call = [f](void** args) { call_impl(f, args, std::index_sequence_for<A...>{}); };
    e.sizes = {sizeof(A)...};
    return e;
}

struct Registrar {
    Registrar() {
#define EMU_KERNEL(name) registry()[#name] = make_entry(&name);
#include "kernels.inc"
#undef EMU_KERNEL
    }
};
Registrar registrar;

} // namespace

void __syncthreads() {
    S.th[S.cur].state = AT_BLOCK;
    yield_to_scheduler();
}

void __syncwarp(unsigned) {
    S.th[S.cur].state = AT_WARP;
    yield_to_scheduler();
}

void* emu_dynamic_smem() { return S.dyn.data(); }
size_t emu_dynamic_smem_size() { return S.dyn.size(); }

int emu_lane() { return S.cur & 31; }

// ---- wgmma's asynchrony (see emu.h) ------------------------------------------
namespace {
struct WgPending {
    float* d;
    std::vector<float> result;
    const uint32_t* a;
    uint32_t a_was[4];
    long group; // -1: not committed yet
    uint64_t (*smem_sum)(const uint64_t*); // null: no check
    uint64_t sum_args[4];
    uint64_t sum;
};
struct WgThread {
    std::vector<WgPending> pending;
    long groups = 0; // committed groups so far
};
std::vector<WgThread> g_wg; // one per thread of the running block
} // namespace

void emu_wg_issue(float* d, int n, const float* result, const uint32_t* a, uint64_t (*smem_sum)(const uint64_t*),
                  const uint64_t* sum_args, uint64_t sum) {
    WgThread& t = g_wg[(size_t)S.cur];
    WgPending p{d, std::vector<float>(result, result + n), a, {0, 0, 0, 0}, -1, smem_sum, {0, 0, 0, 0}, sum};
    if (a) std::memcpy(p.a_was, a, sizeof p.a_was);
    if (smem_sum) std::memcpy(p.sum_args, sum_args, sizeof p.sum_args);
    t.pending.push_back(std::move(p));
    for (int i = 0; i < n; i++) d[i] = NAN;
}

const float* emu_wg_pending(const float* d) {
    WgThread& t = g_wg[(size_t)S.cur];
    for (size_t i = t.pending.size(); i-- > 0;)
        if (t.pending[i].d == d) return t.pending[i].result.data();
    return nullptr;
}

void emu_wg_commit() {
    WgThread& t = g_wg[(size_t)S.cur];
    bool any = false;
    for (auto& p : t.pending)
        if (p.group < 0) p.group = t.groups, any = true;
    if (any) t.groups++;
}

void emu_wg_wait(int n) {
    WgThread& t = g_wg[(size_t)S.cur];
    std::vector<WgPending> keep;
    for (auto& p : t.pending) {
        if (p.group < 0 || p.group >= t.groups - n) {
            keep.push_back(std::move(p));
            continue;
        }
        if (p.a && std::memcmp(p.a, p.a_was, sizeof p.a_was) != 0) {
            std::fprintf(stderr, "emu: thread %d rewrote a wgmma's A registers before the wait that retires it\n", S.cur);
            std::abort();
        }
        if (p.smem_sum && p.smem_sum(p.sum_args) != p.sum) {
            std::fprintf(stderr,
                         "emu: thread %d: the shared memory a wgmma reads changed before the wait that retires it\n",
                         S.cur);
            std::abort();
        }
        std::copy(p.result.begin(), p.result.end(), p.d);
    }
    t.pending.swap(keep);
}

void emu_warp_allgather(const void* in, void* out, size_t bytes) {
    if (bytes > kSlot) {
        std::fprintf(stderr, "emu: warp exchange of %zu bytes (max %zu)\n", bytes, kSlot);
        std::abort();
    }
    std::memcpy(&S.slots[(size_t)S.cur * kSlot], in, bytes);
    __syncwarp(0xffffffffu);
    int base = S.cur & ~31;
    for (int l = 0; l < 32; l++) {
        int i = base + l;
        if (i < S.n)
            std::memcpy(static_cast<char*>(out) + l * bytes, &S.slots[(size_t)i * kSlot], bytes);
        else
            std::memset(static_cast<char*>(out) + l * bytes, 0, bytes);
    }
    __syncwarp(0xffffffffu); // nobody overwrites a slot before everyone has read it
}

extern "C" {

// emu_set_reverse chooses the order in which the threads of a block run
// between barriers: 0 first to last, 1 last to first. A kernel that reads
// shared memory another thread writes without a barrier in between gives
// different results in the two orders.
void emu_set_reverse(int r) { g_reverse = r; }

// emu_kernel_args returns the number of arguments of a kernel, or -1 when the
// kernel is unknown.
int emu_kernel_args(const char* name) {
    auto it = registry().find(name);
    if (it == registry().end()) return -1;
    return (int)it->second.sizes.size();
}

// emu_launch runs a kernel to completion. args[i] points at the value of
// argument i, sizes[i] is its size in bytes. Returns 0, or -1 with a message
// in err.
int emu_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
               unsigned smem, void** args, const long long* sizes, int nargs, char* err, int errlen) {
    auto fail = [&](const std::string& m) {
        std::snprintf(err, (size_t)errlen, "%s: %s", name, m.c_str());
        return -1;
    };
    auto it = registry().find(name);
    if (it == registry().end()) return fail("no such kernel in the emulated image");
    const Entry& e = it->second;
    if ((size_t)nargs != e.sizes.size())
        return fail("launched with " + std::to_string(nargs) + " arguments, the kernel takes " +
                    std::to_string(e.sizes.size()));
    for (int i = 0; i < nargs; i++)
        if ((size_t)sizes[i] != e.sizes[i])
            return fail("argument " + std::to_string(i) + " has " + std::to_string(sizes[i]) +
                        " bytes, the kernel expects " + std::to_string(e.sizes[i]));
    long long nthreads = (long long)bx * by * bz;
    if (nthreads < 1 || nthreads > 1024) return fail("block of " + std::to_string(nthreads) + " threads");
    if (gx < 1 || gy < 1 || gz < 1 || gy > 65535 || gz > 65535) return fail("bad grid");
    if (smem > 227 * 1024) return fail("dynamic shared memory of " + std::to_string(smem) + " bytes");

    S.n = (int)nthreads;
    S.th.resize(S.n);
    while ((int)S.stacks.size() < S.n) S.stacks.push_back(static_cast<char*>(std::malloc(kStack)));
    S.slots.assign((size_t)S.n * kSlot, 0);
    g_wg.assign((size_t)S.n, WgThread{});
    S.dyn.assign(smem > 0 ? smem : 16, 0xff); // garbage, as on the GPU
    int i = 0;
    for (unsigned z = 0; z < bz; z++)
        for (unsigned y = 0; y < by; y++)
            for (unsigned x = 0; x < bx; x++, i++) S.th[i].x = x, S.th[i].y = y, S.th[i].z = z;
    blockDim = dim3{bx, by, bz};
    gridDim = dim3{gx, gy, gz};
    S.body = [&]() { e.call(args); };
    S.err.clear();
    for (unsigned z = 0; z < gz; z++)
        for (unsigned y = 0; y < gy; y++)
            for (unsigned x = 0; x < gx; x++) {
                blockIdx = dim3{x, y, z};
                std::fill(S.dyn.begin(), S.dyn.end(), 0xff);
                if (!run_block()) return fail(S.err);
                for (auto& t : g_wg)
                    if (!t.pending.empty()) return fail("a thread ended with a wgmma group it never waited for");
            }
    return 0;
}

// emu_gemm: C = alpha·op(A)·op(B) + beta·C, row-major, packed, batched;
// type 0: f32, 1: bf16 (fp32 accumulation, one rounding of the result).
int emu_gemm(int type, int transA, int transB, int M, int N, int K, int batch, float alpha, float beta,
             const void* A, const void* B, void* C) {
    if (M < 0 || N < 0 || K < 0 || batch < 1) return -1;
    auto ld = [&](const void* p, long long i) -> float {
        return type == 0 ? static_cast<const float*>(p)[i] : __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    };
    for (int bt = 0; bt < batch; bt++) {
        long long oa = (long long)bt * M * K, ob = (long long)bt * K * N, oc = (long long)bt * M * N;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float acc = 0.0f;
                for (int k = 0; k < K; k++) {
                    float a = ld(A, oa + (transA ? (long long)k * M + i : (long long)i * K + k));
                    float b = ld(B, ob + (transB ? (long long)j * K + k : (long long)k * N + j));
                    acc += a * b;
                }
                float r = alpha * acc;
                if (beta != 0.0f) r += beta * ld(C, oc + (long long)i * N + j);
                if (type == 0)
                    static_cast<float*>(C)[oc + (long long)i * N + j] = r;
                else
                    static_cast<__nv_bfloat16*>(C)[oc + (long long)i * N + j] = __float2bfloat16_rn(r);
            }
    }
    return 0;
}

} // extern "C"
