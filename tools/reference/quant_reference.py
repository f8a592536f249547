"""The project's reference implementations of the quantized weight formats h3run reads, and the fixtures written
with them (tests/fixtures/quant/).

    /usr/bin/python3 tools/reference/quant_reference.py [OUT_DIR]     # default: tests/fixtures/quant

Written from the format facts (../shared/docs/H3-FILE-FORMATS.md §1, §4; docs/QUANT.md), in numpy with float32
arithmetic where the public implementations compute in float32, one rounding per operation as they do:

  int8_tensorwise (+ ConvRot)  q = clamp(rint(x_rot / s), -128, 127), s = max|x_rot| / 127 per row, x_rot the row
                               times the regular Hadamard H_G = (H4 ⊗ ... ⊗ H4) / sqrt(G) per group of G columns;
                               W = (q · s) @ H_G per group (H symmetric, its own inverse).
  float8_e4m3fn                s = max|x| / 448; q = e4m3(clamp(x · (1/s), ±448)); W = f32(q) · s.
  nvfp4 (+ AWQ)                scale_2 = max|x| / 2688; per 16 columns bs = e4m3(min(max|block| / 6 / scale_2, 448)),
                               codes = e2m1(clamp(x / (scale_2 · bs), ±6)), high nibble first; block scales in
                               cuBLAS's 128×4 swizzled order; W = LUT[code] · (bs · scale_2).
                               AWQ: y = (x ⊙ pre_quant_scale) @ Wᵀ.
  GGUF blocks                  F32/F16/BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K decoded
                               from ggml's block structs (ggml-common.h) with ggml's float32 formulas.

Fixtures (deterministic: the same bytes every time):
  formats.safetensors      ComfyUI-form layers quantized here from random weights: "<l>.weight", "<l>.weight_scale",
                           "<l>.weight_scale_2", "<l>.pre_quant_scale", "<l>.comfy_quant"; with "<l>.orig" (f32, the
                           weights before quantization) and "<l>.expected" (f32, the dequantized weights; with AWQ,
                           times pre_quant_scale per column).
  gguf_types.gguf          one tensor per GGUF type (random valid blocks), plus a tensor flattened ComfyUI-GGUF-style
                           with comfy.gguf.orig_shape; gguf_expected.safetensors: each decoded to f32.
  dit.gguf                 the tiny DiT of tests/fixtures/dit/comfy_pruned.safetensors in GGUF (sd.cpp's
                           "model.diffusion_model." prefix), linears in Q8_0/Q4_K/Q5_0/Q4_1/Q5_1/Q4_0, a flattened F16
                           and a flattened Q8_0 matrix.
  te.gguf                  the tiny text encoder of tests/fixtures/text_encoder/comfy.safetensors in GGUF with
                           llama.cpp's names (token_embd, blk.N.attn_q, ...), Q8_0/Q4_0/Q5_1/Q5_0/Q4_1 linears.
  te_nvfp4_awq.safetensors the same text encoder as ComfyUI's qwen3vl_32b_minimax_h3_nvfp4_awq: nvfp4 linears with
                           the 55-byte marker, AWQ pre_quant_scale on o_proj and down_proj, the int8 embedding with
                           per-row scales and the 29-byte marker, bf16 norms.
"""

import json
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
F32 = np.float32

# ---- safetensors (numpy) ---------------------------------------------------------------------------------------

ST_DT = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
         "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "F8_E4M3": np.uint8}


def read_st(path):
    """{name: (dtype string, numpy array of the raw values)}; BF16 and F8_E4M3 stay raw (uint16 / uint8)."""
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        a = np.frombuffer(b[8 + n + s:8 + n + e], dtype=ST_DT[v["dtype"]]).reshape(v["shape"])
        out[k] = (v["dtype"], a.copy())
    return out


def write_st(path, tensors, metadata=None):
    """tensors: {name: (dtype string, array)}. Largest elements first so every offset is aligned to its dtype."""
    names = sorted(tensors, key=lambda k: (-np.dtype(ST_DT[tensors[k][0]]).itemsize, k))
    header, blobs, off = {}, [], 0
    for k in names:
        dt, a = tensors[k]
        raw = np.ascontiguousarray(a.astype(ST_DT[dt], copy=False)).tobytes()
        header[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bf16_to_f32(u):
    return (u.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    u = np.ascontiguousarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def to_f32(dt, a):
    if dt == "BF16":
        return bf16_to_f32(a)
    if dt == "F8_E4M3":
        return e4m3_decode(a)
    return a.astype(F32)


# ---- element formats -------------------------------------------------------------------------------------------

def _e4m3_table():
    v = np.zeros(256, dtype=F32)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 15, c & 7
        if e == 15 and m == 7:
            f = np.nan
        elif e == 0:
            f = (m / 8.0) * 2.0 ** -6
        else:
            f = (1 + m / 8.0) * 2.0 ** (e - 7)
        v[c] = -f if s else f
    return v


E4M3 = _e4m3_table()
E4M3_POS = E4M3[:127]  # codes 0..126: 0 .. 448, increasing


def e4m3_decode(q):
    return E4M3[np.asarray(q, dtype=np.uint8)]


def e4m3_encode(x):
    """Round to nearest, ties to the even code, saturating at 448 (inputs are clamped first by every caller)."""
    x = np.asarray(x, dtype=F32)
    a = np.minimum(np.abs(x), F32(448.0))
    hi = np.clip(np.searchsorted(E4M3_POS, a, side="left"), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    dlo, dhi = a - E4M3_POS[lo], E4M3_POS[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    return code | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)


E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=F32)


def e2m1_encode(x):
    """Nearest of the 8 magnitudes, ties to the even code, saturating at 6 (torchao's _f32_to_floatx_unpacked)."""
    x = np.asarray(x, dtype=F32)
    a = np.minimum(np.abs(x), F32(6.0))
    d = np.abs(a[..., None] - E2M1[:8])
    cand = d == d.min(axis=-1, keepdims=True)
    even = cand & (np.arange(8) % 2 == 0)
    code = np.where(even.any(axis=-1), np.argmax(even, axis=-1), np.argmax(cand, axis=-1)).astype(np.uint8)
    return code | np.where(np.signbit(x), 8, 0).astype(np.uint8)


# ---- ConvRot ---------------------------------------------------------------------------------------------------

def hadamard(g, dtype=F32):
    """(H4 ⊗ ... ⊗ H4) / sqrt(g), H4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],[-1,1,1,1]] (regular, not Sylvester)."""
    h4 = np.array([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=np.float64)
    h, n = h4, 4
    while n < g:
        h, n = np.kron(h, h4), n * 4
    assert n == g, "ConvRot groups are powers of 4"
    return (h / np.sqrt(g)).astype(dtype)


def rotate(w, g):
    """w [N, K] -> w @ H_g per group of g columns, float32."""
    n, k = w.shape
    return (w.astype(F32).reshape(n, k // g, g) @ hadamard(g)).reshape(n, k)


# ---- ComfyUI formats -------------------------------------------------------------------------------------------

def marker(fmt, convrot=False, group=256, fpmm=False):
    d = {"format": fmt}
    if convrot:
        d["convrot"] = True
        d["convrot_groupsize"] = group
    if fpmm:
        d["full_precision_matrix_mult"] = True
    return np.frombuffer(json.dumps(d).encode(), dtype=np.uint8).copy()


def int8_quantize(w, group=0, per_row=True):
    x = rotate(w, group) if group else w.astype(F32)
    amax = np.abs(x).max(axis=1, keepdims=True) if per_row else np.abs(x).max().reshape(1, 1)
    s = np.maximum(amax.astype(F32) / F32(127.0), F32(1e-30)).astype(F32)
    q = np.clip(np.rint(x / s), -128, 127).astype(np.int8)
    return q, (s if per_row else s.reshape(()))


def int8_dequantize(q, s, group=0):
    w = q.astype(F32) * np.asarray(s, dtype=F32).reshape(-1, 1)
    return rotate(w, group) if group else w


def fp8_quantize(w):
    s = F32(np.abs(w).max() / F32(448.0))
    t = np.clip(w.astype(F32) * (F32(1.0) / s), -448, 448).astype(F32)
    return e4m3_encode(t), np.array(s, dtype=F32)


def fp8_dequantize(q, s):
    return e4m3_decode(q) * F32(s)


def swizzle_index(r, c, C):
    return ((r // 128) * ((C + 3) // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def nvfp4_quantize(w):
    n, k = w.shape
    x = w.astype(F32)
    s2 = F32(np.abs(x).max() / F32(2688.0))
    blocks = x.reshape(n, k // 16, 16)
    bs = np.minimum(np.abs(blocks).max(axis=-1) / F32(6.0) / s2, F32(448.0)).astype(F32)
    bq = e4m3_encode(bs)
    total = (s2 * e4m3_decode(bq)).astype(F32)
    safe = np.where(total == 0, F32(1), total)
    data = np.where(total[..., None] == 0, F32(0), blocks / safe[..., None]).astype(F32)
    codes = e2m1_encode(np.clip(data, -6, 6)).reshape(n, k)
    packed = (codes[:, 0::2] << 4) | codes[:, 1::2]
    C = k // 16
    rows, cols = (n + 127) // 128 * 128, (C + 3) // 4 * 4
    sw = np.zeros(rows * cols, dtype=np.uint8)
    r, c = np.meshgrid(np.arange(n), np.arange(C), indexing="ij")
    sw[swizzle_index(r, c, C)] = bq
    return packed.astype(np.uint8), sw.reshape(rows, cols), np.array(s2, dtype=F32)


def nvfp4_dequantize(packed, sw, s2, n, k):
    C = k // 16
    r, c = np.meshgrid(np.arange(n), np.arange(C), indexing="ij")
    bs = e4m3_decode(sw.reshape(-1)[swizzle_index(r, c, C)])
    ts = (bs * F32(s2)).astype(F32)  # one rounding: the product of the scales
    codes = np.empty((n, k), dtype=np.uint8)
    codes[:, 0::2], codes[:, 1::2] = packed >> 4, packed & 15
    return (E2M1[codes].reshape(n, C, 16) * ts[..., None]).reshape(n, k).astype(F32)


# ---- GGUF: ggml block formats ----------------------------------------------------------------------------------

GG = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11,
      "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "BF16": 30}
BLOCK = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
         "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}


def f16(b, o):
    return F32(np.frombuffer(bytes(b[o:o + 2]), dtype=np.float16)[0])


def scale_min_k4(j, q):
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def dequant_block(t, b):
    """One block's values, float32 with ggml's operation order (products and sums rounded one at a time)."""
    b = np.frombuffer(bytes(b), dtype=np.uint8)
    y = np.zeros(BLOCK[t][0], dtype=F32)
    if t == "Q4_0":
        d, qs = f16(b, 0), b[2:18].astype(np.int32)
        y[:16], y[16:] = (qs & 15) - 8, (qs >> 4) - 8
        return (y * d).astype(F32)
    if t == "Q4_1":
        d, m, qs = f16(b, 0), f16(b, 2), b[4:20].astype(np.int32)
        y[:16], y[16:] = qs & 15, qs >> 4
        return (y * d + m).astype(F32)
    if t in ("Q5_0", "Q5_1"):
        d = f16(b, 0)
        m = f16(b, 2) if t == "Q5_1" else None
        o = 4 if t == "Q5_1" else 2
        qh = int.from_bytes(bytes(b[o:o + 4]), "little")
        qs = b[o + 4:o + 20].astype(np.int32)
        for j in range(16):
            y[j] = (qs[j] & 15) | (((qh >> j) & 1) << 4)
            y[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)
        if t == "Q5_0":
            return ((y - 16) * d).astype(F32)
        return (y * d + m).astype(F32)
    if t == "Q8_0":
        return (b[2:34].view(np.int8).astype(F32) * f16(b, 0)).astype(F32)
    if t == "Q2_K":
        sc, q, d, mn = b[0:16], b[16:80], f16(b, 80), f16(b, 82)
        out, isc = [], 0
        for n0 in (0, 32):
            for shift in (0, 2, 4, 6):
                for half in (0, 16):
                    s = int(sc[isc]); isc += 1
                    dl, ml = F32(d * F32(s & 15)), F32(mn * F32(s >> 4))
                    v = ((q[n0 + half:n0 + half + 16] >> shift) & 3).astype(F32)
                    out.append((dl * v - ml).astype(F32))
        return np.concatenate(out)
    if t == "Q3_K":
        hm, q, sc, d = b[0:32], b[32:96], b[96:108], f16(b, 108)
        scales = np.zeros(16, dtype=np.int32)
        for j in range(16):
            lo = (sc[j] & 15) if j < 8 else (sc[j - 8] >> 4)
            hi = (sc[8 + j % 4] >> (2 * (j // 4))) & 3
            scales[j] = (lo | (hi << 4)) - 32
        out, isc, m = [], 0, 1
        for n0 in (0, 32):
            for shift in (0, 2, 4, 6):
                for half in (0, 16):
                    dl = F32(d * F32(scales[isc])); isc += 1
                    qq = ((q[n0 + half:n0 + half + 16] >> shift) & 3).astype(np.int32)
                    hbit = (hm[half:half + 16] & m) != 0
                    out.append((dl * (qq - np.where(hbit, 0, 4)).astype(F32)).astype(F32))
                m <<= 1
        return np.concatenate(out)
    if t in ("Q4_K", "Q5_K"):
        d, mn, sc = f16(b, 0), f16(b, 2), b[4:16]
        qh = b[16:48] if t == "Q5_K" else None
        ql = b[48:176] if t == "Q5_K" else b[16:144]
        out, u1, u2 = [], 1, 2
        for i in range(4):
            s1, m1 = scale_min_k4(2 * i, sc)
            s2, m2 = scale_min_k4(2 * i + 1, sc)
            d1, mm1, d2, mm2 = F32(d * F32(s1)), F32(mn * F32(m1)), F32(d * F32(s2)), F32(mn * F32(m2))
            q = ql[32 * i:32 * i + 32].astype(np.int32)
            lo, hi = q & 15, q >> 4
            if qh is not None:
                lo = lo + np.where(qh & u1, 16, 0)
                hi = hi + np.where(qh & u2, 16, 0)
                u1, u2 = u1 << 2, u2 << 2
            out.append((d1 * lo.astype(F32) - mm1).astype(F32))
            out.append((d2 * hi.astype(F32) - mm2).astype(F32))
        return np.concatenate(out)
    if t == "Q6_K":
        ql, qh, sc, d = b[0:128].astype(np.int32), b[128:192].astype(np.int32), b[192:208].view(np.int8), f16(b, 208)
        for n in range(2):
            L, H, S = ql[64 * n:64 * n + 64], qh[32 * n:32 * n + 32], sc[8 * n:8 * n + 8].astype(F32)
            for l in range(32):
                is_ = l // 16
                q1 = ((L[l] & 15) | (((H[l] >> 0) & 3) << 4)) - 32
                q2 = ((L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4)) - 32
                q3 = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32
                q4 = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32
                y[128 * n + l] = F32(d * S[is_]) * F32(q1)
                y[128 * n + l + 32] = F32(d * S[is_ + 2]) * F32(q2)
                y[128 * n + l + 64] = F32(d * S[is_ + 4]) * F32(q3)
                y[128 * n + l + 96] = F32(d * S[is_ + 6]) * F32(q4)
        return y
    raise ValueError(t)


def gguf_dequant(t, raw, shape):
    if t == "F32":
        return np.frombuffer(raw, dtype=F32).reshape(shape)
    if t == "F16":
        return np.frombuffer(raw, dtype=np.float16).astype(F32).reshape(shape)
    if t == "BF16":
        return bf16_to_f32(np.frombuffer(raw, dtype=np.uint16)).reshape(shape)
    be, bb = BLOCK[t]
    n = len(raw) // bb
    return np.concatenate([dequant_block(t, raw[i * bb:(i + 1) * bb]) for i in range(n)]).reshape(shape)


def f16_bytes(v):
    return np.array([v], dtype=np.float16).tobytes()


def gguf_quantize(t, w):
    """Simple but valid encoders (not ggml's optimizing ones: the fixtures need valid blocks, the decoder defines
    the values). w [N, K] float32 -> raw bytes, rows of K // block blocks."""
    w = w.astype(F32)
    if t == "F32":
        return w.tobytes()
    if t == "F16":
        return w.astype(np.float16).tobytes()
    if t == "BF16":
        return f32_to_bf16(w).tobytes()
    be, bb = BLOCK[t]
    out = bytearray()
    for x in w.reshape(-1, be):
        if t == "Q8_0":
            d = F32(np.abs(x).max() / 127)
            q = np.rint(x / d).astype(np.int8) if d else np.zeros(32, np.int8)
            out += f16_bytes(d) + q.tobytes()
        elif t in ("Q4_0", "Q5_0"):
            nb = 8 if t == "Q4_0" else 16
            i = np.argmax(np.abs(x))
            d = F32(x[i] / -nb)
            q = np.clip(np.floor(x / d + nb + 0.5) if d else np.full(32, nb), 0, 2 * nb - 1).astype(np.int32)
            qs = (q[:16] & 15) | ((q[16:] & 15) << 4)
            blk = f16_bytes(d)
            if t == "Q5_0":
                qh = 0
                for j in range(32):
                    qh |= ((int(q[j]) >> 4) & 1) << j
                blk += struct.pack("<I", qh)
            out += blk + qs.astype(np.uint8).tobytes()
        elif t in ("Q4_1", "Q5_1"):
            top = 15 if t == "Q4_1" else 31
            mn, mx = x.min(), x.max()
            d = F32((mx - mn) / top)
            q = np.clip(np.floor((x - mn) / d + 0.5) if d else np.zeros(32), 0, top).astype(np.int32)
            qs = (q[:16] & 15) | ((q[16:] & 15) << 4)
            blk = f16_bytes(d) + f16_bytes(mn)
            if t == "Q5_1":
                qh = 0
                for j in range(32):
                    qh |= ((int(q[j]) >> 4) & 1) << j
                blk += struct.pack("<I", qh)
            out += blk + qs.astype(np.uint8).tobytes()
        elif t == "Q4_K":
            sub = x.reshape(8, 32)
            mins = np.maximum(-sub.min(axis=1), 0).astype(F32)
            scl = ((sub.max(axis=1) + mins) / 15).astype(F32)
            d, dmin = F32(scl.max() / 63), F32(mins.max() / 63)
            d, dmin = F32(np.float16(d)), F32(np.float16(dmin))
            ls = np.clip(np.rint(scl / d) if d else np.zeros(8), 0, 63).astype(np.int32)
            lm = np.clip(np.rint(mins / dmin) if dmin else np.zeros(8), 0, 63).astype(np.int32)
            sc = np.zeros(12, dtype=np.int32)
            for j in range(8):
                if j < 4:
                    sc[j], sc[j + 4] = ls[j], lm[j]
                else:
                    sc[j + 4] = (ls[j] & 15) | ((lm[j] & 15) << 4)
                    sc[j - 4] |= (ls[j] >> 4) << 6
                    sc[j] |= (lm[j] >> 4) << 6
            L = np.zeros(256, dtype=np.int32)
            for j in range(8):
                dd, mm = F32(d * ls[j]), F32(dmin * lm[j])
                if dd:
                    L[32 * j:32 * j + 32] = np.clip(np.rint((sub[j] + mm) / dd), 0, 15)
            qs = np.zeros(128, dtype=np.int32)
            for j in range(4):
                qs[32 * j:32 * j + 32] = L[64 * j:64 * j + 32] | (L[64 * j + 32:64 * j + 64] << 4)
            out += f16_bytes(d) + f16_bytes(dmin) + sc.astype(np.uint8).tobytes() + qs.astype(np.uint8).tobytes()
        elif t == "Q6_K":
            sub = x.reshape(16, 16)
            scl = (np.abs(sub).max(axis=1) / 31).astype(F32)
            d = F32(np.float16(F32(scl.max() / 127)))
            ls = np.clip(np.rint(scl / d) if d else np.zeros(16), -128, 127).astype(np.int32)
            L = np.zeros(256, dtype=np.int32)
            for j in range(16):
                dd = F32(d * ls[j])
                L[16 * j:16 * j + 16] = (np.clip(np.rint(sub[j] / dd), -32, 31) if dd else 0) + 32
            ql, qh = np.zeros(128, np.int32), np.zeros(64, np.int32)
            for n in range(2):
                for l in range(32):
                    b0 = 128 * n
                    q1, q2, q3, q4 = L[b0 + l], L[b0 + l + 32], L[b0 + l + 64], L[b0 + l + 96]
                    ql[64 * n + l] = (q1 & 15) | ((q3 & 15) << 4)
                    ql[64 * n + l + 32] = (q2 & 15) | ((q4 & 15) << 4)
                    qh[32 * n + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
            out += (ql.astype(np.uint8).tobytes() + qh.astype(np.uint8).tobytes() + ls.astype(np.int8).tobytes()
                    + f16_bytes(d))
        else:
            raise ValueError("no encoder for " + t)
    assert len(out) == w.size // be * bb
    return bytes(out)


def random_blocks(t, rows, k, rng):
    """Random block bytes whose f16 scales are finite (the decoder's input space, not a quantizer's output)."""
    be, bb = BLOCK[t]
    raw = bytearray(rng.integers(0, 256, size=rows * (k // be) * bb, dtype=np.uint8).tobytes())
    f16_at = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}[t]
    for i in range(rows * (k // be)):
        for o in f16_at:
            raw[i * bb + o:i * bb + o + 2] = f16_bytes(F32(rng.uniform(-0.05, 0.05)))
    return bytes(raw)


def write_gguf(path, tensors, kv=None, alignment=32):
    """tensors: list of (name, type name, shape outermost first, raw bytes); kv: list of (key, type, value)."""
    def s(x):
        x = x.encode()
        return struct.pack("<Q", len(x)) + x
    kv = [("general.alignment", 4, alignment)] + (kv or [])
    h = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, ty, v in kv:
        h += s(key) + struct.pack("<I", ty)
        if ty == 4:
            h += struct.pack("<I", v)
        elif ty == 8:
            h += s(v)
        elif ty == 9:  # array of INT32
            h += struct.pack("<IQ", 5, len(v)) + struct.pack("<%di" % len(v), *v)
        else:
            raise ValueError(ty)
    off, blobs = 0, []
    for name, t, shape, raw in tensors:
        ne = list(reversed(shape))
        h += s(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        h += struct.pack("<IQ", GG[t], off)
        pad = -len(raw) % alignment
        blobs.append(raw + b"\0" * pad)
        off += len(raw) + pad
    h += b"\0" * (-len(h) % alignment)
    with open(path, "wb") as f:
        f.write(h + b"".join(blobs))


# ---- fixtures --------------------------------------------------------------------------------------------------

def make_formats(out, rng):
    t = {}

    def add_orig(l, w):
        t[l + ".orig"] = ("F32", w.astype(F32))

    # int8 + ConvRot: G = 256 (the H3 DiT and text encoder), G = 64 (the full DiT's adaln), and plain int8
    for l, (n, k, g, per_row) in {"int8r256": (16, 512, 256, True), "int8r64": (12, 128, 64, True),
                                  "int8": (12, 48, 0, True), "int8s": (8, 32, 0, False)}.items():
        w = (rng.standard_normal((n, k)) * 0.05).astype(F32)
        w[3, 5] = 0.9  # an outlier, the case ConvRot exists for
        q, s = int8_quantize(w, g, per_row)
        t[l + ".weight"] = ("I8", q)
        t[l + ".weight_scale"] = ("F32", s)
        t[l + ".comfy_quant"] = ("U8", marker("int8_tensorwise", bool(g), g) if g else marker("int8_tensorwise"))
        t[l + ".expected"] = ("F32", int8_dequantize(q, s, g))
        add_orig(l, w)
    # float8_e4m3fn with one scale
    w = (rng.standard_normal((16, 64)) * 0.05).astype(F32)
    q, s = fp8_quantize(w)
    t.update({"fp8.weight": ("F8_E4M3", q), "fp8.weight_scale": ("F32", s),
              "fp8.comfy_quant": ("U8", marker("float8_e4m3fn")), "fp8.expected": ("F32", fp8_dequantize(q, s))})
    add_orig("fp8", w)
    # nvfp4: unpadded swizzle (N = 256, K/16 = 8) with AWQ, and padded (N = 200 -> 256, K/16 = 5 -> 8)
    for l, (n, k, awq) in {"nvfp4": (128, 64, True), "nvfp4p": (40, 48, False)}.items():
        w = (rng.standard_normal((n, k)) * 0.05).astype(F32)
        pqs = None
        if awq:
            pqs = f32_to_bf16(rng.uniform(0.5, 2.0, size=k).astype(F32))
            wq = (w / bf16_to_f32(pqs)).astype(F32)  # the smoothing AWQ folds into the weight
        else:
            wq = w
        packed, sw, s2 = nvfp4_quantize(wq)
        t[l + ".weight"] = ("U8", packed)
        t[l + ".weight_scale"] = ("F8_E4M3", sw)
        t[l + ".weight_scale_2"] = ("F32", s2)
        t[l + ".comfy_quant"] = ("U8", marker("nvfp4", fpmm=True))
        e = nvfp4_dequantize(packed, sw, s2, n, k)
        if awq:
            t[l + ".pre_quant_scale"] = ("BF16", pqs)
            e = (e * bf16_to_f32(pqs)).astype(F32)
        t[l + ".expected"] = ("F32", e)
        add_orig(l, w)
    # the nvfp4 text encoder's int8 embedding: per-row scales, no ConvRot, 29-byte marker
    w = (rng.standard_normal((50, 32)) * 0.05).astype(F32)
    q, s = int8_quantize(w, 0, True)
    t.update({"embed.weight": ("I8", q), "embed.weight_scale": ("F32", s),
              "embed.comfy_quant": ("U8", marker("int8_tensorwise")), "embed.expected": ("F32", int8_dequantize(q, s))})
    add_orig("embed", w)
    write_st(os.path.join(out, "formats.safetensors"), t)


def make_gguf_types(out, rng):
    tensors, exp = [], {}
    k = 512
    for ty in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]:
        raw = random_blocks(ty, 2, k, rng)
        tensors.append((ty.lower(), ty, [2, k], raw))
        exp[ty.lower()] = ("F32", gguf_dequant(ty, raw, (2, k)))
    for ty in ["F32", "F16", "BF16"]:
        w = (rng.standard_normal((5, 7)) * 0.5).astype(F32)
        raw = gguf_quantize(ty, w)
        tensors.append((ty.lower(), ty, [5, 7], raw))
        exp[ty.lower()] = ("F32", gguf_dequant(ty, raw, (5, 7)))
    # the encoders the model fixtures use, on real-looking rows: decoded values near the originals
    for ty in ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K"]:
        w = (rng.standard_normal((2, 256)) * 0.05).astype(F32)
        raw = gguf_quantize(ty, w)
        name = "enc_" + ty.lower()
        tensors.append((name, ty, [2, 256], raw))
        exp[name] = ("F32", gguf_dequant(ty, raw, (2, 256)))
        exp[name + ".orig"] = ("F32", w)
    # 3-D tensor (rows of the last dim) and a ComfyUI-GGUF flattened matrix: true shape [12, 40] stored [15, 32]
    raw = random_blocks("Q8_0", 6, 64, rng)
    tensors.append(("cube", "Q8_0", [2, 3, 64], raw))
    exp["cube"] = ("F32", gguf_dequant("Q8_0", raw, (2, 3, 64)))
    raw = random_blocks("Q8_0", 15, 32, rng)
    tensors.append(("flat", "Q8_0", [15, 32], raw))
    exp["flat"] = ("F32", gguf_dequant("Q8_0", raw, (12, 40)))
    kv = [("general.architecture", 8, "h3test"), ("comfy.gguf.orig_shape.flat", 9, [12, 40])]
    write_gguf(os.path.join(out, "gguf_types.gguf"), tensors, kv)
    write_st(os.path.join(out, "gguf_expected.safetensors"), exp)


def st_f32(dt, a):
    return to_f32(dt, a).astype(F32)


def make_dit_gguf(out):
    src = read_st(os.path.join(ROOT, "tests", "fixtures", "dit", "comfy_pruned.safetensors"))
    kinds = {"attn.qkv_proj.weight": "Q8_0", "attn.out_proj.weight": "Q4_K", "mlp.fc1.weight": "Q5_0",
             "mlp.fc2.weight": "Q4_1"}
    refiner = {"attn.qkv_proj.weight": "Q5_1", "attn.out_proj.weight": "Q6_K", "mlp.fc1.weight": "Q4_0",
               "mlp.fc2.weight": "Q8_0"}
    tensors, kv = [], [("general.architecture", 8, "minimax_h3")]
    for name in sorted(src):
        dt, a = src[name]
        ty = {"F32": "F32", "F16": "F16", "BF16": "BF16"}[dt]
        shape = list(a.shape)
        suffix = name.split(".", 2)[-1] if name.startswith("blocks.") else None
        if name.startswith("blocks.") and suffix in kinds:
            ty = kinds[suffix]
        elif name.startswith("token_refiner.blocks."):
            suf = name.split(".", 3)[-1]
            ty = refiner.get(suf, ty)
        w = st_f32(dt, a)
        if name == "video_patch_proj.weight":  # [32, 96] stored flattened as F16 [12, 256]
            raw = w.astype(np.float16).tobytes()
            tensors.append(("model.diffusion_model." + name, "F16", [w.size // 256, 256], raw))
            kv.append(("comfy.gguf.orig_shape.model.diffusion_model." + name, 9, shape))
            continue
        if name == "condition_proj.weight":  # [32, 24] stored flattened as Q8_0 [24, 32]
            raw = gguf_quantize("Q8_0", w.reshape(-1, 32))
            tensors.append(("model.diffusion_model." + name, "Q8_0", [w.size // 32, 32], raw))
            kv.append(("comfy.gguf.orig_shape.model.diffusion_model." + name, 9, shape))
            continue
        if ty in ("F32", "F16", "BF16"):
            raw = a.tobytes()
        else:
            raw = gguf_quantize(ty, w)
        tensors.append(("model.diffusion_model." + name, ty, shape, raw))
    write_gguf(os.path.join(out, "dit.gguf"), tensors, kv)


LLAMA = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def make_te_gguf(out):
    src = read_st(os.path.join(ROOT, "tests", "fixtures", "text_encoder", "comfy.safetensors"))
    kinds = {"self_attn.q_proj": "Q8_0", "self_attn.k_proj": "Q4_0", "self_attn.v_proj": "Q5_1",
             "self_attn.o_proj": "Q5_0", "mlp.gate_proj": "Q4_1", "mlp.up_proj": "Q8_0", "mlp.down_proj": "Q4_0"}
    tensors = []
    for name in sorted(src):
        dt, a = src[name]
        if name.startswith("visual."):
            continue
        w = st_f32(dt, a)
        if name == "model.embed_tokens.weight":
            tensors.append(("token_embd.weight", "Q8_0", list(a.shape), gguf_quantize("Q8_0", w)))
            continue
        _, _, layer, rest = name.split(".", 3)
        mod = rest[:-len(".weight")]
        ty = kinds.get(mod, "F32")
        raw = w.astype(F32).tobytes() if ty == "F32" else gguf_quantize(ty, w)
        tensors.append(("blk.%s.%s.weight" % (layer, LLAMA[mod]), ty, list(a.shape), raw))
    write_gguf(os.path.join(out, "te.gguf"), tensors, [("general.architecture", 8, "qwen3vl")])


def make_te_nvfp4(out, rng):
    src = read_st(os.path.join(ROOT, "tests", "fixtures", "text_encoder", "comfy.safetensors"))
    t = {}
    for name in sorted(src):
        dt, a = src[name]
        if name.startswith("visual."):
            continue
        w = st_f32(dt, a)
        base = name[:-len(".weight")]
        if name == "model.embed_tokens.weight":
            q, s = int8_quantize(w, 0, True)
            t.update({name: ("I8", q), base + ".weight_scale": ("F32", s),
                      base + ".comfy_quant": ("U8", marker("int8_tensorwise"))})
        elif name.endswith("_proj.weight"):
            awq = base.endswith("o_proj") or base.endswith("down_proj")
            if awq:
                pqs = f32_to_bf16(rng.uniform(0.5, 2.0, size=w.shape[1]).astype(F32))
                w = (w / bf16_to_f32(pqs)).astype(F32)
                t[base + ".pre_quant_scale"] = ("BF16", pqs)
            packed, sw, s2 = nvfp4_quantize(w)
            t.update({name: ("U8", packed), base + ".weight_scale": ("F8_E4M3", sw),
                      base + ".weight_scale_2": ("F32", s2),
                      base + ".comfy_quant": ("U8", marker("nvfp4", fpmm=True))})
        else:
            t[name] = (dt, a)
    write_st(os.path.join(out, "te_nvfp4_awq.safetensors"), t)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "fixtures", "quant")
    os.makedirs(out, exist_ok=True)
    make_formats(out, np.random.default_rng(20261209))
    make_gguf_types(out, np.random.default_rng(20261210))
    make_dit_gguf(out)
    make_te_gguf(out)
    make_te_nvfp4(out, np.random.default_rng(20261211))
    total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print("wrote %s (%d bytes)" % (out, total))


if __name__ == "__main__":
    main()
