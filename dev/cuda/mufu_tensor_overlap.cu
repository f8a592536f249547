/* Scratch bench: do Hopper's tensor cores (wgmma) and its special-function units (MUFU.EX2) run at once?
 *
 *   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o mufu_tensor_overlap mufu_tensor_overlap.cu && ./mufu_tensor_overlap
 *
 * Why: the fp8 attention kernel (src/cuda/attn_fp8.cuh) keeps its tensor pipe and its special-function pipe each about
 * 45% busy, and its time is close to the sum of the two (bench/NOTES.md, "Do the tensor cores and the exponentials
 * run at once?", has what this measured and what followed from it). This measures the two units alone and together,
 * with nothing else in the way: one block per SM, warpgroup 0 issues wgmma back to back (m64n128k32: e4m3 with both operands in shared memory, e4m3 with A in registers as the
 * kernel's P·V, or s8 as its Q·Kᵀ), warpgroups 1 (and 2) run independent ex2.approx chains (32 a thread, one warp per
 * scheduler a warpgroup, as the kernel's softmax). Each warpgroup times itself with clock64; a unit's rate is its work
 * over its own cycles. If both run at once, "together" keeps both rates; if they share something, the rates drop.
 * The cvt rows convert pairs to e4m3x2 as the kernel packs P (alone: conversions a cycle; with ex2: exponentials a
 * cycle, one conversion per two of them), to see whether the conversions share the exponentials' unit. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

enum { K_E4M3_SS = 0, K_E4M3_RS = 1, K_S8_SS = 2 };

__device__ __forceinline__ uint64_t desc(const void *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

#define D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
            "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "  \
            "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "  \
            "%62, %63}"
#define O64(c, d)                                                                                                    \
    c(d[0]), c(d[1]), c(d[2]), c(d[3]), c(d[4]), c(d[5]), c(d[6]), c(d[7]), c(d[8]), c(d[9]), c(d[10]), c(d[11]),    \
        c(d[12]), c(d[13]), c(d[14]), c(d[15]), c(d[16]), c(d[17]), c(d[18]), c(d[19]), c(d[20]), c(d[21]), c(d[22]), \
        c(d[23]), c(d[24]), c(d[25]), c(d[26]), c(d[27]), c(d[28]), c(d[29]), c(d[30]), c(d[31]), c(d[32]), c(d[33]), \
        c(d[34]), c(d[35]), c(d[36]), c(d[37]), c(d[38]), c(d[39]), c(d[40]), c(d[41]), c(d[42]), c(d[43]), c(d[44]), \
        c(d[45]), c(d[46]), c(d[47]), c(d[48]), c(d[49]), c(d[50]), c(d[51]), c(d[52]), c(d[53]), c(d[54]), c(d[55]), \
        c(d[56]), c(d[57]), c(d[58]), c(d[59]), c(d[60]), c(d[61]), c(d[62]), c(d[63])

template <int KIND> __device__ __forceinline__ void mma(uint32_t *d, uint64_t da, uint64_t db, uint32_t a) {
    if (KIND == K_E4M3_SS)
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " D64 ", %64, %65, 1, 1, 1;\n"
                     : O64("+r", d)
                     : "l"(da), "l"(db));
    else if (KIND == K_E4M3_RS)
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " D64 ", {%64, %65, %66, %67}, %68, 1, 1, 1;\n"
                     : O64("+r", d)
                     : "r"(a), "r"(a), "r"(a), "r"(a), "l"(db));
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 " D64 ", %64, %65, 1;\n"
                     : O64("+r", d)
                     : "l"(da), "l"(db));
}

/* mode bit 0: warpgroup 0 runs the tensor cores; bit 1: warpgroup 1 the exponentials; bit 2: warpgroup 2 too;
 * bit 3: those warpgroups also convert pairs to e4m3x2; bit 4: they convert only (no exponentials) */
template <int KIND>
__global__ void __launch_bounds__(384, 1) k_overlap(int mode, int iters_t, int iters_m, long long *cyc, float *sink) {
    extern __shared__ __align__(1024) unsigned char sm_raw[];
    unsigned char *sm = (unsigned char *)(((uintptr_t)sm_raw + 1023) & ~(uintptr_t)1023);
    const int tid = threadIdx.x, wg = tid >> 7;
    /* operands: bytes in e4m3's finite range (no exponent 1111) and varied, as real data */
    for (int i = tid; i < 24 * 1024 / 4; i += blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ (blockIdx.x * 40503u);
        ((uint32_t *)sm)[i] = x & 0xF7F7F7F7u;
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    long long t0 = clock64();
    if (wg == 0 && (mode & 1)) {
        uint32_t d[64];
        for (int i = 0; i < 64; i++) d[i] = 0;
        const uint64_t da = desc(sm), db = desc(sm + 8192);
        const uint32_t a = 0x38383838u ^ (uint32_t)tid;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        for (int it = 0; it < iters_t; it++) {
#pragma unroll
            for (int kk = 0; kk < 4; kk++) mma<KIND>(d, da + 2 * kk, db + 2 * kk, a);
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        float s = 0;
        for (int i = 0; i < 64; i++) s += __uint_as_float(d[i]);
        if (s == 1234.5f) sink[tid] = s;
    } else if ((wg == 1 && (mode & 2)) || (wg == 2 && (mode & 4))) {
        float x[32];
        uint32_t acc = 0;
#pragma unroll
        for (int j = 0; j < 32; j++) x[j] = 0.001f * (tid + j);
        for (int it = 0; it < iters_m; it++) {
            if (!(mode & 16)) {
#pragma unroll
                for (int j = 0; j < 32; j++) asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(x[j]) : "f"(-x[j]));
            }
            if (mode & 24) { /* pairs to e4m3x2, as the kernel packs P: one cvt per two values */
#pragma unroll
                for (int j = 0; j < 32; j += 2) {
                    uint16_t h;
                    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(h) : "f"(x[j]), "f"(x[j + 1]));
                    acc += h;
                    if (mode & 16) x[j] = __uint_as_float(__float_as_uint(x[j]) ^ (h & 1u)); /* no cvt hoisted */
                }
            }
        }
        float s = (float)acc;
#pragma unroll
        for (int j = 0; j < 32; j++) s += x[j];
        if (s == 1234.5f) sink[tid] = s;
    }
    long long t1 = clock64();
    if ((tid & 127) == 0) cyc[blockIdx.x * 3 + wg] = t1 - t0;
}

template <int KIND> static void run(const char *name, int nsm, long long *dcyc, float *sink) {
    const int smem = 120 * 1024, it = 20000;
    CK(cudaFuncSetAttribute(k_overlap<KIND>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const struct {
        int mode;
        const char *what;
    } modes[] = {{1, "tensor alone"}, {2, "ex2 alone (1 warpgroup)"}, {6, "ex2 alone (2 warpgroups)"},
                 {3, "tensor + ex2 (1 warpgroup)"}, {7, "tensor + ex2 (2 warpgroups)"},
                 {2 | 16, "cvt e4m3x2 alone (1 wg)"}, {2 | 8, "ex2 + cvt (1 wg)"}, {3 | 8, "tensor + ex2 + cvt (1 wg)"}};
    for (auto &m : modes) {
        for (int rep = 0; rep < 2; rep++) {
            CK(cudaMemset(dcyc, 0, (size_t)nsm * 3 * sizeof(long long)));
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            CK(cudaEventRecord(e0));
            k_overlap<KIND><<<nsm, 384, smem>>>(m.mode, it, it, dcyc, sink);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            long long *h = (long long *)malloc((size_t)nsm * 3 * sizeof(long long));
            CK(cudaMemcpy(h, dcyc, (size_t)nsm * 3 * sizeof(long long), cudaMemcpyDeviceToHost));
            double ct = 0, cm = 0;
            int nm = 0;
            for (int b = 0; b < nsm; b++) {
                ct += h[b * 3];
                if (m.mode & 2) cm += h[b * 3 + 1], nm++;
                if (m.mode & 4) cm += h[b * 3 + 2], nm++;
            }
            ct /= nsm;
            if (nm) cm /= nm;
            const double macs = 4.0 * 64 * 128 * 32 * it;                 /* per SM */
            /* per SM: exponentials, or conversions (two values each) where no exponential runs */
            const double ex2 = (m.mode & 16 ? 16.0 : 32.0) * 128 * it * ((m.mode & 2 ? 1 : 0) + (m.mode & 4 ? 1 : 0));
            if (rep == 1)
                printf("%-8s %-28s %8.3f ms  tensor %6.0f MAC/clk/SM (%9.0f cycles)  ex2|cvt %5.2f /clk/SM (%9.0f cycles)\n",
                       name, m.what, ms, (m.mode & 1) ? macs / ct : 0.0, ct, nm ? ex2 / cm : 0.0, cm);
            free(h);
            CK(cudaEventDestroy(e0));
            CK(cudaEventDestroy(e1));
        }
    }
}

int main(void) {
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("%s, %d SMs\n", p.name, p.multiProcessorCount);
    long long *dcyc;
    float *sink;
    CK(cudaMalloc(&dcyc, (size_t)p.multiProcessorCount * 3 * sizeof(long long)));
    CK(cudaMalloc(&sink, 384 * sizeof(float)));
    run<K_E4M3_SS>("e4m3 SS", p.multiProcessorCount, dcyc, sink);
    run<K_E4M3_RS>("e4m3 RS", p.multiProcessorCount, dcyc, sink);
    run<K_S8_SS>("s8 SS", p.multiProcessorCount, dcyc, sink);
    return 0;
}
