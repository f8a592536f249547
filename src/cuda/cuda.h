/* The CUDA backend's entry points, callable from C whether or not the build has CUDA (no_cuda.c stands in). */
#ifndef H3_CUDA_CUDA_H
#define H3_CUDA_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "tensor/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this build has the CUDA backend compiled in. */
int h3_cuda_compiled(void);
/* Number of usable CUDA devices (0 without a driver, a device, or CUDA in the build). Never fails. */
int h3_cuda_device_count(void);
/* Name and memory of a device. */
h3_status h3_cuda_device_info(int device, char *name, size_t name_len, int64_t *total_bytes, int64_t *free_bytes);
/* The low-bit attention kernels device `device` runs (bf16 q, k, v of head size 128): H3_CUDA_ATTN_FP8 (H3_ATTN_FP8:
 * sm_89+, Ada and Blackwell on mma.sync, Hopper), with H3_CUDA_ATTN_FP8_HOPPER where that is Hopper's wgmma kernel
 * (sm_90 and a build with the sm_90a kernels), H3_CUDA_ATTN_INT8 (H3_ATTN_INT8: sm_75+); 0 without a device or
 * CUDA. Never fails. */
#define H3_CUDA_ATTN_FP8 1u
#define H3_CUDA_ATTN_FP8_HOPPER 2u
#define H3_CUDA_ATTN_INT8 4u
/* Block-sparse attention (h3_op_attention_sparse): Hopper (sm_90) with the sm_90a kernels in the build. */
#define H3_CUDA_ATTN_SPARSE 8u
unsigned h3_cuda_lowbit_attention(int device);
struct h3_comm;
/* A sequence-parallel group over NCCL (comm_nccl.cu; tensor/comm.h), one rank per process and GPU: rank 0 makes the
 * group's id (128 bytes) and hands it to the others out of band; each rank then joins with its exec (the CUDA
 * backend, initialized on its GPU). NCCL is opened at run time: H3_ERR_UNSUPPORTED naming libnccl.so.2 where it is
 * missing. Collectives run on the exec's compute stream. */
h3_status h3_cuda_comm_unique_id(unsigned char id[128]);
h3_status h3_cuda_comm_create(h3_exec *ex, int rank, int size, const unsigned char id[128], struct h3_comm *out);
void h3_cuda_comm_destroy(struct h3_comm *c);
/* Tests: with on set, low-bit attention on Hopper runs the mma.sync fp8 kernel (Ada's) instead of the wgmma one,
 * so the H200 checks both. Process-wide; off by default. */
void h3_cuda_attention_prefer_mma8(int on);
/* flags (H3_ATTN_*) with H3_ATTN_FP8_K192 set or cleared as this device's fp8 kernel tiles its keys, for bf16 q, k, v
 * of head size 128 on 16-byte boundaries: the flags under which the CPU's attention reproduces the device's (tests). */
unsigned h3_cuda_attention_ref_flags(h3_exec *ex, unsigned flags);
/* Selects the device, reserves the device budget (budget bytes; 0 = the free memory less a 512 MiB margin) as
 * one arena from which every device tensor and workspace is carved, creates the streams and BLAS handles in
 * ex->cuda, and registers the device and pinned allocators and the device backend with the op API.
 * H3_ERR_UNSUPPORTED with a clear message when there is no device. One device per process. */
h3_status h3_cuda_init(h3_exec *ex, int device, int64_t budget);
void h3_cuda_shutdown(h3_exec *ex);
/* Bytes of the arena in use now, the most in use since the last reset, and the arena's size. */
void h3_cuda_mem_stats(h3_exec *ex, int64_t *used, int64_t *peak, int64_t *capacity);
void h3_cuda_reset_peak(h3_exec *ex);
/* The size of this process's arena while a backend is up (0 when none is): device memory the process holds
 * for itself, which the device's free memory no longer shows. Any thread may ask. */
int64_t h3_cuda_arena_bytes(void);

/* ---- streams, events and copies for the weight streamer (src/mem/streamer.c) ---------------------------------
 * Handles are opaque (cudaStream_t, cudaEvent_t). Without CUDA in the build every call fails with
 * H3_ERR_UNSUPPORTED (the streamer then runs its host emulation). */
typedef void *h3_cuda_stream_h;
typedef void *h3_cuda_event_h;
/* The exec's compute stream (every op runs on it) and its copy stream. NULL without a device. */
h3_cuda_stream_h h3_cuda_compute_stream(h3_exec *ex);
h3_cuda_stream_h h3_cuda_copy_stream(h3_exec *ex);
/* A further non-blocking stream (the streamer's reads into pinned staging run on one). */
h3_status h3_cuda_stream_create(h3_cuda_stream_h *out);
void h3_cuda_stream_destroy(h3_cuda_stream_h s);
h3_status h3_cuda_stream_sync(h3_cuda_stream_h s);
/* timing 0: an ordering-only event (cheaper); 1: one cudaEventElapsedTime can read. */
h3_status h3_cuda_event_create(h3_cuda_event_h *out, int timing);
void h3_cuda_event_destroy(h3_cuda_event_h e);
h3_status h3_cuda_event_record(h3_cuda_event_h e, h3_cuda_stream_h s);
/* Work queued on s after this waits until e (as last recorded) has completed; an event never recorded is done. */
h3_status h3_cuda_stream_wait(h3_cuda_stream_h s, h3_cuda_event_h e);
h3_status h3_cuda_event_sync(h3_cuda_event_h e);
/* 1 done, 0 not yet. */
int h3_cuda_event_done(h3_cuda_event_h e);
h3_status h3_cuda_event_elapsed_ms(h3_cuda_event_h start, h3_cuda_event_h end, double *ms);
/* Host to device, queued on s; src must be pinned host memory for the copy to be asynchronous. */
h3_status h3_cuda_copy_h2d_async(void *dst, const void *src, size_t bytes, h3_cuda_stream_h s);
/* fn(arg) runs on a CUDA thread once the work queued on s before it is done; later work on s waits for it. fn must
 * not call CUDA. */
h3_status h3_cuda_host_fn(h3_cuda_stream_h s, void (*fn)(void *), void *arg);

/* Observer of the device arena: called after every allocation (delta > 0) and free (delta < 0) with the block's
 * address and the bytes in use after it. One observer per process; NULL removes it. Called on the allocating
 * thread. */
typedef void (*h3_cuda_alloc_observer)(void *user, const void *ptr, int64_t delta, int64_t used);
void h3_cuda_set_alloc_observer(h3_cuda_alloc_observer fn, void *user);
/* Bytes the backend itself takes from the arena at h3_cuda_init (cuBLASLt workspace). */
#define H3_CUDA_BACKEND_BYTES ((int64_t)32 << 20)
/* Scratch of the GEMMs with quantized weights (int8 activations and int32 products, fp8 activations, or
 * dequantized weight tiles), taken from the arena once, at the first such GEMM or by h3_cuda_qgemm_reserve,
 * and held until h3_cuda_shutdown. The planner counts it with the backend's bytes when a stage has quantized
 * weights. */
#define H3_CUDA_QGEMM_SCRATCH_BYTES ((int64_t)128 << 20)
h3_status h3_cuda_qgemm_reserve(h3_exec *ex);
/* The e4m3 quantization of a device bf16 or f32 matrix w [N, K] (contiguous rows) with one scale, on the device:
 * the rule and bytes of the host's h3_quantize_fp8_scale and h3_quantize_fp8 (scale = max|w| / 448, 1 when 0;
 * e4m3(w · (1 / scale)) saturated at ±448, not-finite values 0x7f) into q [N·K] bytes on the device; *scale set on
 * return (the call waits for the maximum). Uses the quantized GEMMs' scratch (reserving it). */
h3_status h3_cuda_quantize_fp8(h3_exec *ex, const h3_tensor *w, void *q, float *scale);
/* Gives the quantized GEMMs' scratch back to the arena (after the work queued on the compute stream is done):
 * a stage whose weights are quantized returns it when it ends, so the next stage of the run finds only the
 * backend's own H3_CUDA_BACKEND_BYTES in use. A later quantized GEMM reserves it again. */
void h3_cuda_qgemm_release(h3_exec *ex);
/* Tests and benchmarks: 1 makes every quantized GEMM take the dequantized-tile path; 2 makes Hopper's fp8 GEMMs
 * scale their activations as Ada's do (one scale a chunk of rows instead of one a row); 0: the fastest the GPU
 * and weight allow. Or'ed with H3_QGEMM_FP8_EXACT: cuBLASLt's fp8 GEMMs promote their partial sums to fp32 every
 * few k-steps instead of keeping them in the tensor cores' accumulator (fast accumulation, the default:
 * bench/NOTES.md has the A/B). */
#define H3_QGEMM_FP8_EXACT 4
void h3_cuda_qgemm_set_mode(h3_exec *ex, int mode);
/* Whether this device's fp8 GEMM (in the current mode) takes one activation scale a row (1, Hopper on) or one
 * a chunk of rows (0): the rule h3_qbench_act_quant_fp8 must state for a test to compare. */
int h3_cuda_fp8_act_rows(h3_exec *ex);
/* The arena's allocation granule: every block is rounded up to it. */
#define H3_CUDA_ARENA_ALIGN 256
/* Bytes an allocation of b bytes takes from the arena (0 for none): what every planner adds up. */
static inline int64_t h3_cuda_granule(int64_t b) {
    return b <= 0 ? 0 : (b + H3_CUDA_ARENA_ALIGN - 1) / H3_CUDA_ARENA_ALIGN * H3_CUDA_ARENA_ALIGN;
}

/* ---- convolutions (cuda_conv.cu) ----------------------------------------------------------------------------
 * conv1d and conv_transpose1d take their im2col columns from the arena for the length of one call (and give them
 * back before it returns; work queued later on the compute stream reuses the bytes in order). These functions are
 * that arithmetic, for the memory planners (bytes before h3_cuda_granule). */
/* Bytes of one column chunk at most (all batch items and rows of a chunk of time steps together). */
#define H3_CUDA_CONV_COL_BYTES ((int64_t)64 << 20)
/* Time steps per column chunk when one step takes step_bytes: as many as fit H3_CUDA_CONV_COL_BYTES, at least 64,
 * at most len. */
static inline int64_t h3_cuda_conv_col_steps(int64_t step_bytes, int64_t len) {
    int64_t tc = step_bytes > 0 ? H3_CUDA_CONV_COL_BYTES / step_bytes : len;
    if (tc < 64) tc = 64;
    return tc > len ? len : tc;
}
/* h3_op_attention on the device for a bf16 head size the flash kernel lacks (other than 64 and 128, at most 128, a
 * multiple of 8): the size it is zero-padded to (64 or 128); 0 when none is needed or possible. */
static inline int h3_cuda_attention_pad_dim(h3_dtype dt, int64_t D) {
    if (dt != H3_BF16 || D == 64 || D == 128 || D > 128 || D < 8 || D % 8) return 0;
    return D < 64 ? 64 : 128;
}
/* Its arena scratch for one call: q, o [Sq, Hq, P] and k, v [Sk, Hk, P] in bf16; 0 without padding. */
static inline int64_t h3_cuda_attention_scratch_bytes(h3_dtype dt, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hk,
                                                      int64_t D) {
    const int64_t P = h3_cuda_attention_pad_dim(dt, D);
    return P ? 2 * (Sq * Hq + Sk * Hk) * P * 2 : 0;
}
/* Keys a tile of Hopper's fp8 kernel (attn_fp8.cuh FP8_BK): k's scale blocks and the softmax's key blocks there. */
#define H3_CUDA_WGMMA_FP8_BK 192
/* The arena scratch of one low-bit attention call (head size 128; 0 when flags hold neither mode), each piece 256-byte
 * aligned as cuda_attn.cu takes them: q, k in int8; v in e4m3 transposed with its keys padded to a multiple of the
 * key block (H3_ATTN_FP8) or in f16 (H3_ATTN_INT8); the scales of q and k (per 128 rows for fp8, 64 for int8, k's
 * per H3_CUDA_WGMMA_FP8_BK rows on Hopper: the larger of both kernels' needs); v's scales and channel maxima, and k's
 * channel sums. */
static inline int64_t h3_cuda_attention_lowbit_scratch_bytes(unsigned flags, int64_t Sq, int64_t Sk, int64_t Hq,
                                                            int64_t Hk) {
#define H3_A256(x) (((x) + 255) / 256 * 256)
    if (!(flags & (H3_ATTN_FP8 | H3_ATTN_INT8))) return 0;
    const int fp8 = (flags & H3_ATTN_FP8) != 0;
    const int64_t blk = fp8 ? 128 : 64, nqb = (Sq + blk - 1) / blk, nkb = (Sk + blk - 1) / blk;
    const int64_t kpad = (Sk + 127) / 128 * 128, kpad2 = (Sk + H3_CUDA_WGMMA_FP8_BK - 1) / H3_CUDA_WGMMA_FP8_BK *
                                                         H3_CUDA_WGMMA_FP8_BK;
    const int64_t v = fp8 ? Hk * 128 * (kpad > kpad2 ? kpad : kpad2) : Sk * Hk * 128 * 2;
    return H3_A256(Sq * Hq * 128) + H3_A256(Sk * Hk * 128) + H3_A256(v) + H3_A256(Hq * nqb * 4) +
           H3_A256(Hk * nkb * 4) + 3 * H3_A256(Hk * 128 * 4);
#undef H3_A256
}
/* The arena scratch of one sparse attention call (h3_op_attention_sparse, Hopper) over S rows and H heads of 128,
 * each piece 256-byte aligned as attn_sm90a.cu takes them: the q and k tile centroids in double, the bf16 centroid
 * matrices of k and v (tiles padded to a multiple of 128), the exact-tile lists (16 bits an entry), counts and bits,
 * and the exact-tile flags. */
static inline int64_t h3_cuda_attention_sparse_scratch_bytes(int64_t S, int64_t H) {
#define H3_A256(x) (((x) + 255) / 256 * 256)
    const int64_t nt = (S + 127) / 128, ntpad = (nt + 127) / 128 * 128, ntw = ntpad / 32;
    return 2 * H3_A256(H * nt * 128 * 8) + 2 * H3_A256(ntpad * H * 128 * 2) + H3_A256(H * nt * nt * 2) +
           H3_A256(H * nt * 8) + H3_A256(H * nt * ntw * 4) + H3_A256(nt);
#undef H3_A256
}
/* ---- attention: the kernel and its tiles for a device ---------------------------------------------------------
 * What cuda_attn.cu runs, as a pure function of the device (unit-tested per architecture in test_ops): major.minor
 * the compute capability, smem the per-block shared-memory limit (opt-in), sm90a whether the build carries the
 * Hopper kernels, aligned whether q, k, v, o start and stride on 16 bytes.
 *   fp8 (H3_ATTN_FP8), bf16 q/k/v of head size 128, aligned: Hopper's fp8 kernel on sm_90 with the Hopper build,
 *   else the mma.sync fp8 kernel on sm_89+ (Ada, Blackwell; K/V tiles of 128 keys, two stages where they fit),
 *   else none (refused);
 *   int8 (H3_ATTN_INT8), the same operands: the mma.sync int8 kernel on sm_75+ (K/V tiles of 64 keys), else none;
 *   bf16 at head size 128 or 64 on sm_90 with the Hopper build and room for its tiles: the wgmma kernel (TMA, K/V
 *   tiles of 128 rows, two stages: H3_CUDA_WGMMA_SMEM bytes, H3_CUDA_WGMMA64_SMEM at 64);
 *   bf16 at 64 or 128 on sm_80+: the mma.sync flash kernel, 128 query rows a block, K/V tiles of 64 rows in two
 *   stages where they fit the limit, else one (a 64 KB Turing-class limit), else none (refused);
 *   other bf16 head sizes up to 128 (multiples of 8) on sm_80+: zero-padded to 64 or 128 (pad), then as above;
 *   anything else up to head size 256 (f32, f16, Turing, which has no bf16 MMA): the plain kernel. */
typedef enum {
    H3_ATTN_K_NONE = 0, /* no kernel: the op refuses */
    H3_ATTN_K_PLAIN,
    H3_ATTN_K_FLASH,
    H3_ATTN_K_WGMMA,
    H3_ATTN_K_WGMMA_FP8,
    H3_ATTN_K_MMA_FP8, /* attn_mma8.cuh, int8 QK and e4m3 PV on mma.sync (sm_89+) */
    H3_ATTN_K_MMA_INT8 /* attn_mma8.cuh, int8 QK and f16 PV on mma.sync (sm_75+) */
} h3_attn_kernel;
typedef struct {
    h3_attn_kernel kernel;
    int kblock;   /* low-bit kernels: keys a tile (k's scale blocks, the softmax's key blocks) */
    int stages;   /* K/V stages in shared memory */
    int pad;      /* the head size the inputs are zero-padded to; 0: none */
    int64_t smem; /* dynamic shared memory a block */
} h3_attn_choice;
#define H3_CUDA_WGMMA_SMEM ((128 + 2 * 2 * 128) * 128 * 2 + 1024 + 256)
#define H3_CUDA_WGMMA64_SMEM ((128 + 2 * 2 * 128) * 64 * 2 + 1024 + 256)
/* Hopper's fp8 kernel: Q, two stages of K and V tiles, its rows of ones, barriers, and 64 KB of O's f32 sums */
#define H3_CUDA_WGMMA_FP8_SMEM ((128 + 2 * 2 * H3_CUDA_WGMMA_FP8_BK) * 128 + 1024 + 1024 + 256 + 65536)
static inline int64_t h3_cuda_flash_smem(int64_t D, int stages) {
    return (128 + 2 * 64 * (int64_t)stages) * D * 2;
}
/* attn_mma8's shared memory (attn_mma8.cuh, mma8_smem): a 64-row Q tile of 128 bytes a row and per stage a K tile
 * (128 keys for fp8, 64 for int8) and a V tile (fp8: 128 channels x 128 keys; int8: 64 keys x 128 f16). */
static inline int64_t h3_cuda_mma8_smem(int fp8, int stages) {
    return 64 * 128 + (int64_t)stages * (fp8 ? 128 * 128 + 128 * 128 : 64 * 128 + 64 * 128 * 2);
}
static inline h3_attn_choice h3_cuda_attn_choose(int major, int minor, int64_t smem, int sm90a, h3_dtype dt,
                                                 int64_t D, int aligned, unsigned flags) {
    h3_attn_choice c = {H3_ATTN_K_NONE, 0, 0, 0, 0};
    const int hopper = sm90a && major == 9 && minor == 0;
    const int cc = major * 10 + minor;
    if (flags & (H3_ATTN_FP8 | H3_ATTN_INT8)) {
        if (dt != H3_BF16 || D != 128 || !aligned) return c;
        const int fp8 = (flags & H3_ATTN_FP8) != 0;
        if (fp8 && hopper && smem >= H3_CUDA_WGMMA_FP8_SMEM) {
            c.kernel = H3_ATTN_K_WGMMA_FP8, c.stages = 2, c.smem = H3_CUDA_WGMMA_FP8_SMEM;
            c.kblock = H3_CUDA_WGMMA_FP8_BK;
            return c;
        }
        if (cc < (fp8 ? 89 : 75)) return c;
        for (int st = 2; st >= 1; st--)
            if (h3_cuda_mma8_smem(fp8, st) <= smem) {
                c.kernel = fp8 ? H3_ATTN_K_MMA_FP8 : H3_ATTN_K_MMA_INT8, c.stages = st, c.smem = h3_cuda_mma8_smem(fp8, st);
                c.kblock = fp8 ? 128 : 64;
                return c;
            }
        return c;
    }
    int64_t P = D;
    if (major >= 8 && h3_cuda_attention_pad_dim(dt, D)) { /* padded copies: contiguous, aligned */
        P = h3_cuda_attention_pad_dim(dt, D);
        c.pad = (int)P;
        aligned = 1;
    }
    if (dt == H3_BF16 && (P == 128 || P == 64) && aligned && hopper &&
        smem >= (P == 128 ? H3_CUDA_WGMMA_SMEM : H3_CUDA_WGMMA64_SMEM)) {
        c.kernel = H3_ATTN_K_WGMMA, c.stages = 2, c.smem = P == 128 ? H3_CUDA_WGMMA_SMEM : H3_CUDA_WGMMA64_SMEM;
        return c;
    }
    if (dt == H3_BF16 && (P == 64 || P == 128) && major >= 8 && aligned) {
        for (int st = 2; st >= 1; st--)
            if (h3_cuda_flash_smem(P, st) <= smem) {
                c.kernel = H3_ATTN_K_FLASH, c.stages = st, c.smem = h3_cuda_flash_smem(P, st);
                return c;
            }
        c.pad = 0;
        return c; /* none: not even one stage fits */
    }
    c.pad = 0;
    if (D <= 256) c.kernel = H3_ATTN_K_PLAIN;
    return c;
}

/* h3_op_conv1d on the device, x [batch, cin, ·] of elem_size-byte values, w [·, cin/groups, K], tout output
 * steps: the im2col chunk [batch][cin·K][steps]; 0 for depthwise filters (cin/groups 1: a direct kernel) and
 * pointwise convs (K 1, stride 1, no padding: x is its own column matrix). */
static inline int64_t h3_cuda_conv1d_scratch_bytes(int64_t batch, int64_t cin, int64_t K, int64_t tout,
                                                   const h3_conv1d_params *p, int64_t elem_size) {
    const int64_t g = p->groups > 0 ? p->groups : 1;
    if (cin / g == 1 || (K == 1 && p->stride == 1 && p->pad_left == 0 && p->pad_right == 0)) return 0;
    const int64_t step = batch * cin * K * elem_size;
    return step * h3_cuda_conv_col_steps(step, tout);
}
/* h3_op_conv_transpose1d on the device, x [batch, cin, tin], y [batch, cout, ·], kernel K: the GEMM's output
 * chunk [batch][cout·K][steps]; 0 for depthwise filters (cin/groups 1: a direct kernel). */
static inline int64_t h3_cuda_convt1d_scratch_bytes(int64_t batch, int64_t cin, int64_t cout, int64_t K, int64_t tin,
                                                    int groups, int64_t elem_size) {
    const int64_t g = groups > 0 ? groups : 1;
    if (cin / g == 1) return 0;
    const int64_t step = batch * cout * K * elem_size;
    return step * h3_cuda_conv_col_steps(step, tin);
}
/* The arithmetic of the f32 convolutions' GEMMs, per kind, process-wide (tests and benchmarks change it):
 *   H3_CONV_1D, the 1-D convolutions (the audio VAE's): H3_CONV_EXACT by default (no TF32, pedantic), or
 *   H3_CONV_F32 (cuBLAS's plain f32 compute type) or H3_CONV_TF32 (10-bit mantissas: to measure what exact costs);
 *   H3_CONV_3D, the 3-D convolutions (the video VAE encoder's): H3_CONV_TF32 by default (as torch runs convolutions
 *   on Ampere and later: diffusers' encoder on the GPU), or H3_CONV_EXACT (H3_CONV_F32 runs as exact there). */
typedef enum { H3_CONV_1D = 0, H3_CONV_3D = 1 } h3_conv_kind;
typedef enum { H3_CONV_EXACT = 0, H3_CONV_F32 = 1, H3_CONV_TF32 = 2 } h3_conv_math;
void h3_cuda_conv_set_math(h3_conv_kind kind, h3_conv_math math);
h3_conv_math h3_cuda_conv_math(h3_conv_kind kind);
/* Tests and benchmarks: with on set, the f32 3-D convolutions on TF32 skip the implicit GEMM (sm_80 and
 * later) for im2col and cuBLASLt, the path older GPUs and exact f32 take. Process-wide; off by default. */
void h3_cuda_conv3d_prefer_im2col(int on);

/* Test hooks (tests/test_streamer.c): spin on s for about `us` microseconds, then add every 32-bit word of
 * data[0..words) into *sum (device memory, one uint64); each call one thread block. */
h3_status h3_cuda_debug_spin_sum(h3_cuda_stream_h s, const void *data, size_t words, uint64_t *sum, int us);

#ifdef __cplusplus
}
#endif
#endif
