// ep_signals.cu: the expert path's 64-bit epoch signals (ep.cuh): the waits
// with a deadline (ep_wait, ep_wait_one, ep_wait_raise), the fused path's
// claim of a source (ep_claim), and the release of a word on every rank
// (ep_signal). overlap/peercopy's fused sites wait with ep_wait and
// ep_wait_raise too.
#include "ep.cuh" // defines: the protocol's buffers and helpers, every ep_* entry point declared

// ---- signals ------------------------------------------------------------------
// ep_wait: grid 1, block 32. Waits until words[i] ≥ target for i < n (the
// ready or ack words the P peers raise in this rank's pad), each for at
// most deadline_ns; a word still short sets status[0] = 1 and reports
// code·65536 + its index (the peer's rank) through err. status[0] already
// set: no wait.
// ep_wait_raise is ep_wait that then sets every word still short to target
// (also when status[0] was already set): stream memory waits queued on the
// same words elsewhere (which cannot give up) then pass, and the step's
// error is the one reported here. For words in this rank's own pad only.
__device__ __forceinline__ void ep_wait_words(unsigned long long* words, int n, long long target, long long deadline_ns,
                                              int code, int* status, int* err, bool raise, int base = 0) {
    bool failed = status[0] != 0;
    if (failed && !raise) return;
    long long start = ep_now_ns();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        while (ep_load_acquire(words + i) < (u64)target) {
            if (failed || ep_now_ns() - start > deadline_ns) {
                if (!failed) {
                    status[0] = 1;
                    report_error(err, code * 65536 + base + i);
                }
                if (raise) ep_store_release(words + i, (u64)target);
                break;
            }
#if !defined(ASYNCTP_EMU)
            __nanosleep(64);
#endif
        }
    }
}

KERNEL void ep_wait(unsigned long long* words, int n, long long target, long long deadline_ns, int code, int* status,
                    int* err) {
    ep_wait_words(words, n, target, deadline_ns, code, status, err, false);
}

// ep_wait_one: grid 1, block 32. ep_wait of the one word words[idx]
// (reported as code·65536 + idx): the fused path waits for each source's
// tokens alone, own first.
KERNEL void ep_wait_one(unsigned long long* words, int idx, long long target, long long deadline_ns, int code,
                        int* status, int* err) {
    ep_wait_words(words + idx, 1, target, deadline_ns, code, status, err, false, idx);
}

// ep_claim: grid 1, block 32. The fused path lands each source's rows on
// whichever stream gets to them first: the backend's stream before the
// GEMM takes every source whose tokens are already here (only < 0: each s
// with words[s] ≥ target), the side stream each source in turn once its
// wait has passed (only = s). claims[s] goes 0 → who once (atomicCAS), and
// the landing kernels of a source run only on the stream that won it
// (ep_recv's and ep_scale_recv's claims, want).
KERNEL void ep_claim(const unsigned long long* words, int P, long long target, int only, int* claims, int who) {
    if (threadIdx.x != 0) return;
    const int lo = only >= 0 ? only : 0, hi = only >= 0 ? only + 1 : P;
    for (int s = lo; s < hi; s++) {
        if (only < 0 && ep_load_acquire(words + s) < (u64)target) continue;
        atomicCAS(claims + s, 0, who);
    }
}

KERNEL void ep_wait_raise(unsigned long long* words, int n, long long target, long long deadline_ns, int code,
                          int* status, int* err) {
    ep_wait_words(words, n, target, deadline_ns, code, status, err, true);
}

// ep_signal: grid 1, block 32. Stores value into word `word` of each of the
// n ranks' signal pads (peers: their base addresses), with release
// semantics at system scope after a system fence (see ep.cuh).
// It runs even when the step failed, so that no peer waits for it in vain.
KERNEL void ep_signal(const unsigned long long* peers, int n, long long word, long long value) {
    ep_fence_system();
    for (int r = threadIdx.x; r < n; r += blockDim.x) ep_store_release(ep_peer<u64>(peers, r) + word, (u64)value);
}
