"""torch SDPA and torch matmul at the shapes h3run's CUDA kernels are measured at (run on the GPU machine).

    python3 bench/attention_sdpa.py [rows]

Prints a table: SDPA bf16 at (rows, 56 heads, 128) non-causal, 8192^3 bf16 matmul, and the DiT's four GEMMs."""
import sys

import torch


def median_ms(fn, reps=7):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    if not torch.cuda.is_available():
        print("attention_sdpa: skipped: no CUDA device")
        return
    S = int(sys.argv[1]) if len(sys.argv) > 1 else 19412
    H, D = 56, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    print(f"{'kernel':44s} {'ms':>10s} {'rate':>12s}")
    ms = median_ms(lambda: sdpa(q, k, v))
    print(f"{'torch sdpa bf16 S%d H56 D128' % S:44s} {ms:10.3f} {4 * S * S * H * D / ms * 1e-9:9.1f} TFLOP/s")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16, generator=g)
    ms = median_ms(lambda: a @ a)
    print(f"{'torch matmul bf16 8192^3':44s} {ms:10.3f} {2 * 8192 ** 3 / ms * 1e-9:9.1f} TFLOP/s")
    for name, n, kk in (("qkv_proj", 21504, 5376), ("out_proj", 5376, 7168), ("fc1", 28672, 5376), ("fc2", 5376, 14336)):
        x = torch.randn(S, kk, device="cuda", dtype=torch.bfloat16, generator=g)
        w = torch.randn(n, kk, device="cuda", dtype=torch.bfloat16, generator=g)
        ms = median_ms(lambda: torch.nn.functional.linear(x, w))
        print(f"{'torch linear bf16 %s M%d N%d K%d' % (name, S, n, kk):44s} {ms:10.3f} {2 * S * n * kk / ms * 1e-9:9.1f} TFLOP/s")
        del x, w


if __name__ == "__main__":
    main()
