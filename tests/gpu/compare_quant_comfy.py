#!/usr/bin/env python3
"""h3run's quantized formats against ComfyUI's own implementations (comfy-kitchen, ComfyUI-GGUF, gguf-py).

    COMFY_SRC=/path/to/comfy-kitchen python3 tests/gpu/compare_quant_comfy.py
    # optional: GGUF_PY_SRC=/path/to/llama.cpp/gguf-py  COMFY_GGUF_SRC=/path/to/ComfyUI-GGUF  OUT=/dir

The public source is fetched by whoever runs this (never committed here): COMFY_SRC is a folder that holds the
comfy_kitchen package (a comfy-kitchen checkout, or a ComfyUI environment's site-packages). Without it the script
says so and exits 0; each part without its source is skipped with a message.

What it compares, on the data of tests/fixtures/quant/ (written by tools/reference/quant_reference.py, whose
decoding h3run matches bit for bit in tests/test_quant.c and tests/test_gguf.c):
  1. comfy-kitchen eager (CPU and, with a GPU, CUDA tensors): dequantize_int8_convrot_weight, dequantize_int8_simple,
     dequantize_per_tensor_fp8, dequantize_nvfp4 (+ AWQ's pre_quant_scale as ComfyUI applies it),
     dequantize_int8_embedding on every layer of formats.safetensors, against "<layer>.expected": bit-exact where
     the computation is one rounding per value (int8, fp8, nvfp4), |Δ| <= 1e-6·max|row| for the ConvRot matmul.
     Then their quantizers on "<layer>.orig" (float32 inputs) against the stored bytes: fp8 and nvfp4 byte-exact,
     int8 without rotation byte-exact, with rotation at most 0.5% of the codes off by one (their matmul and the
     reference's round the rotated values separately).
  2. comfy-kitchen's CUDA backend (with a GPU): the same dequantizations with output float32.
  3. gguf-py (GGUF_PY_SRC): gguf.quants.dequantize on every tensor of gguf_types.gguf against
     gguf_expected.safetensors, bit-exact.
  4. ComfyUI-GGUF (COMFY_GGUF_SRC, needs gguf-py too): dequant.dequantize_tensor, bit-exact.
Exit status 1 when any comparison fails.
"""

import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
FIX = os.path.join(ROOT, "tests", "fixtures", "quant")
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import quant_reference as ref  # noqa: E402

results, failures = [], []


def report(part, name, ok, detail):
    results.append({"part": part, "name": name, "ok": bool(ok), "detail": detail})
    print("%-4s %-22s %-10s %s" % ("ok" if ok else "FAIL", part, name, detail))
    if not ok:
        failures.append((part, name))


def skip(part, why):
    results.append({"part": part, "skipped": why})
    print("skip %-22s %s" % (part, why))


def compare(part, name, got, want, exact, tol=1e-6):
    got = np.asarray(got, dtype=np.float32)
    want = np.asarray(want, dtype=np.float32)
    if got.shape != want.shape:
        report(part, name, False, "shape %s vs %s" % (got.shape, want.shape))
        return
    if exact:
        n = int(np.sum(got.view(np.uint32) != want.view(np.uint32)))
        report(part, name, n == 0, "%d of %d values differ in their bits" % (n, got.size))
    else:
        rmax = np.maximum(np.abs(want).max(axis=-1, keepdims=True), 1e-30)
        worst = float((np.abs(got - want) / rmax).max())
        report(part, name, worst <= tol, "max |Δ| / max|row| = %.2e (tol %.0e)" % (worst, tol))


def layers():
    t = ref.read_st(os.path.join(FIX, "formats.safetensors"))
    out = {}
    for k in t:
        if k.endswith(".weight"):
            out[k[:-7]] = {s: t[k[:-7] + s] for s in [".weight", ".weight_scale", ".weight_scale_2", ".pre_quant_scale",
                                                      ".comfy_quant", ".expected", ".orig"] if k[:-7] + s in t}
    return out


def kitchen_part(ck, torch, device, part):
    for name, L in sorted(layers().items()):
        mk = json.loads(bytes(L[".comfy_quant"][1]).decode())
        exp = L[".expected"][1]
        orig = torch.from_numpy(L[".orig"][1]).to(device)
        q = torch.from_numpy(L[".weight"][1]).to(device)
        if mk["format"] == "int8_tensorwise":
            s = torch.from_numpy(np.asarray(L[".weight_scale"][1], dtype=np.float32)).to(device)
            g = mk.get("convrot_groupsize", 256) if mk.get("convrot") else 0
            if name == "embed":
                idx = torch.arange(q.shape[0], device=device)
                got = ck.dequantize_int8_embedding(q, s, idx, 0, 0)
            elif g:
                got = ck.dequantize_int8_convrot_weight(q, s, g)
            else:
                got = ck.dequantize_int8_simple(q, s)
            compare(part, name, got.float().cpu().numpy(), exp, exact=not g)
            if device == "cpu":
                if g:
                    qq, ss = ck.quantize_int8_convrot_weight(orig, g)
                elif s.dim() == 0:  # one scale for the tensor
                    qq, ss = ck.quantize_int8_tensorwise(orig)
                else:
                    qq, ss = ck.quantize_int8_rowwise(orig)
                qq = qq.cpu().numpy().astype(np.int32)
                diff = np.abs(qq - L[".weight"][1].astype(np.int32))
                nd, big = int((diff > 0).sum()), int((diff > 1).sum())
                ok = big == 0 and (nd * 200 <= diff.size if g else nd == 0)
                report(part, name + " quantize", ok, "%d of %d int8 codes differ (%d by more than one)" % (nd, diff.size, big))
        elif mk["format"] == "float8_e4m3fn":
            s = torch.tensor(float(L[".weight_scale"][1]), device=device)
            got = ck.dequantize_per_tensor_fp8(q.view(torch.float8_e4m3fn), s, torch.float32)
            compare(part, name, got.cpu().numpy(), exp, exact=True)
            if device == "cpu":
                qq = ck.quantize_per_tensor_fp8(orig, s).view(torch.uint8).cpu().numpy()
                nd = int((qq != L[".weight"][1]).sum())
                report(part, name + " quantize", nd == 0, "%d of %d fp8 bytes differ" % (nd, qq.size))
        elif mk["format"] == "nvfp4":
            s2 = torch.tensor(float(L[".weight_scale_2"][1]), device=device)
            bs = torch.from_numpy(L[".weight_scale"][1]).to(device).view(torch.float8_e4m3fn)
            got = ck.dequantize_nvfp4(q, s2, bs, torch.float32)
            if ".pre_quant_scale" in L:  # ComfyUI: x * pre_quant_scale.to(x.dtype) before the matmul
                got = got * torch.from_numpy(ref.bf16_to_f32(L[".pre_quant_scale"][1])).to(device)
            compare(part, name, got.cpu().numpy(), exp, exact=True)
            if device == "cpu":
                w = L[".orig"][1]
                if ".pre_quant_scale" in L:
                    w = (w / ref.bf16_to_f32(L[".pre_quant_scale"][1])).astype(np.float32)
                pq, pbs = ck.quantize_nvfp4(torch.from_numpy(w), s2)
                nd = int((pq.cpu().numpy() != L[".weight"][1]).sum())
                nb = int((pbs.view(torch.uint8).cpu().numpy().reshape(-1) != L[".weight_scale"][1].reshape(-1)).sum())
                report(part, name + " quantize", nd == 0 and nb == 0, "%d packed bytes and %d block scales differ" % (nd, nb))


def gguf_part():
    src = os.environ.get("GGUF_PY_SRC")
    if not src:
        skip("gguf-py", "GGUF_PY_SRC is not set")
        return None
    sys.path.insert(0, src)
    try:
        import gguf
    except Exception as e:  # noqa: BLE001
        skip("gguf-py", "cannot import gguf from %s: %s" % (src, e))
        return None
    exp = ref.read_st(os.path.join(FIX, "gguf_expected.safetensors"))
    r = gguf.GGUFReader(os.path.join(FIX, "gguf_types.gguf"))
    for t in r.tensors:
        if t.name not in exp:
            continue
        got = gguf.quants.dequantize(t.data, t.tensor_type)
        compare("gguf-py", t.name, np.asarray(got, dtype=np.float32).reshape(-1), exp[t.name][1].reshape(-1), exact=True)
    return gguf, r


def comfy_gguf_part(gg):
    src = os.environ.get("COMFY_GGUF_SRC")
    if not src or gg is None:
        skip("ComfyUI-GGUF", "COMFY_GGUF_SRC (and GGUF_PY_SRC) are not set")
        return
    sys.path.insert(0, src)
    try:
        import torch
        import dequant  # city96/ComfyUI-GGUF/dequant.py
    except Exception as e:  # noqa: BLE001
        skip("ComfyUI-GGUF", "cannot import dequant from %s: %s" % (src, e))
        return
    gguf, r = gg
    exp = ref.read_st(os.path.join(FIX, "gguf_expected.safetensors"))
    for t in r.tensors:
        if t.name not in exp:
            continue
        data = torch.from_numpy(np.array(t.data))
        data.tensor_type = t.tensor_type
        data.tensor_shape = torch.Size(exp[t.name][1].shape)
        got = dequant.dequantize_tensor(data, torch.float32)
        compare("ComfyUI-GGUF", t.name, got.float().numpy().reshape(-1), exp[t.name][1].reshape(-1), exact=True)


def main():
    src = os.environ.get("COMFY_SRC")
    if not src:
        print("COMFY_SRC is not set: nothing of ComfyUI's to compare against (set it to a comfy-kitchen checkout)")
    else:
        sys.path.insert(0, src)
        try:
            import torch
            from comfy_kitchen.backends.eager import quantization as ck
        except Exception as e:  # noqa: BLE001
            ck = None
            skip("comfy-kitchen eager", "cannot import comfy_kitchen from %s: %s" % (src, e))
        if ck is not None:
            kitchen_part(ck, torch, "cpu", "comfy-kitchen eager")
            if torch.cuda.is_available():
                kitchen_part(ck, torch, "cuda", "eager on cuda")
                try:
                    from comfy_kitchen.backends import cuda as ckc
                    kitchen_part(ckc, torch, "cuda", "comfy-kitchen CUDA")
                except Exception as e:  # noqa: BLE001
                    skip("comfy-kitchen CUDA", "cannot import the CUDA backend: %s" % e)
            else:
                skip("comfy-kitchen CUDA", "no GPU")
    gg = gguf_part()
    comfy_gguf_part(gg)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "compare_quant_comfy.json"), "w") as f:
            json.dump(results, f, indent=1)
    print("%d comparisons, %d failed" % (sum(1 for r in results if "ok" in r), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
