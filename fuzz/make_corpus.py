#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets that is kept in the repository (fuzz/corpus/NAME/): small files, one
per case, each a valid or nearly valid input that reaches a different part of its reader. Deterministic: running it
again gives the same bytes. Larger seeds (the reduced model's files, the test fixtures) come from fuzz/seeds.sh.

Usage: fuzz/make_corpus.py [OUT_DIR]   (default: fuzz/corpus beside this script). Python 3 standard library only.
The configs and the tokenizer seeds are those h3-tinymodel writes (tools/h3-tinymodel.c); they are copied from
FUZZ_MODEL (a folder it wrote) when that variable is set, else kept as they are in OUT_DIR."""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "corpus")

DT = {"F64": ("d", 8), "F32": ("f", 4), "F16": ("e", 2), "BF16": (None, 2), "I64": ("q", 8), "I32": ("i", 4),
      "I16": ("h", 2), "I8": ("b", 1), "U64": ("Q", 8), "U32": ("I", 4), "U16": ("H", 2), "U8": ("B", 1),
      "BOOL": ("?", 1), "F8_E4M3": (None, 1), "F8_E5M2": (None, 1)}


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def values(dtype, n, seed=1):
    """n little-endian values of dtype, small and varied."""
    fmt, size = DT[dtype]
    out = bytearray()
    for i in range(n):
        v = ((i * 7 + seed * 3) % 11) - 5
        if dtype == "BF16":
            out += struct.pack("<f", v * 0.25)[2:]
        elif dtype.startswith("F8"):
            out.append((i * 29 + seed) % 251)
        elif dtype == "BOOL":
            out.append(i % 2)
        elif dtype.startswith("U"):
            out += struct.pack("<" + fmt, abs(v))
        elif fmt in "def":
            out += struct.pack("<" + fmt, v * 0.25)
        else:
            out += struct.pack("<" + fmt, v)
    return bytes(out)


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes or None for generated values)."""
    header, data = {}, bytearray()
    for name, dtype, shape, raw in tensors:
        n = 1
        for s in shape:
            n *= s
        raw = values(dtype, n) if raw is None else raw
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + bytes(data)


def gguf(kvs, tensors, version=3, align=32):
    """kvs: list of (key, type id, value bytes); tensors: list of (name, dims fastest first, ggml type, bytes)."""
    def s(x):
        return struct.pack("<Q", len(x)) + x.encode()
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, t, v in kvs:
        out += s(key) + struct.pack("<I", t) + v
    offset, blobs = 0, b""
    for name, dims, t, raw in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", t, offset)
        pad = -len(raw) % align
        blobs += raw + b"\0" * pad
        offset += len(raw) + pad
    out += b"\0" * (-len(out) % align)
    return out + blobs


def q8_0(n):
    """n/32 blocks: f16 scale + 32 int8."""
    return b"".join(struct.pack("<e", 0.05) + bytes((j * 5 + b) % 256 for j in range(32)) for b in range(n // 32))


def q4_0(n):
    return b"".join(struct.pack("<e", 0.1) + bytes((j * 3 + b) % 256 for j in range(16)) for b in range(n // 32))


def main():
    # ---- safetensors: every dtype, scalars, metadata, ComfyUI markers, an empty set, a misaligned tensor
    put("safetensors", "empty", safetensors([]))
    put("safetensors", "dtypes", safetensors([(f"t.{d.lower()}", d, [2, 3], None) for d in DT]))
    put("safetensors", "scalar_and_meta", safetensors(
        [("s", "F32", [], None), ("v", "F16", [5], None), ("m", "BF16", [1, 2, 2, 1], None)],
        {"format": "pt", "config": "{\"hidden_size\": 64}"}))
    put("safetensors", "int8_marker", safetensors([
        ("x.weight", "I8", [4, 16], None), ("x.weight_scale", "F32", [], None),
        ("x.comfy_quant", "U8", [len(b'{"format": "int8_tensorwise"}')], b'{"format": "int8_tensorwise"}')]))
    marker = b'{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 16}'
    put("safetensors", "int8_convrot_rows", safetensors([
        ("y.weight", "I8", [4, 32], None), ("y.weight_scale", "F32", [4, 1], None),
        ("y.comfy_quant", "U8", [len(marker)], marker)]))
    fp8 = b'{"format": "float8_e4m3fn"}'
    put("safetensors", "fp8_marker", safetensors([
        ("z.weight", "F8_E4M3", [4, 16], None), ("z.weight_scale", "F32", [], None),
        ("z.comfy_quant", "U8", [len(fp8)], fp8)]))
    put("safetensors", "fp8_legacy", safetensors([("w.weight", "F8_E4M3", [2, 8], None),
                                                  ("w.scale_weight", "F32", [], None)]))
    put("safetensors", "dit_names", safetensors([
        ("blocks.0.attn.qkv_proj.weight", "BF16", [12, 4], None), ("blocks.0.mlp.fc1.weight", "BF16", [8, 4], None),
        ("video_patch_proj.weight", "F32", [4, 96], None), ("audio_patch_proj.weight", "F32", [4, 32], None)]))
    h = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    put("safetensors", "unpadded_header", struct.pack("<Q", len(h)) + h + values("F32", 2))

    # ---- shard indexes (beside fixed/shard-1 and shard-2.safetensors: a.weight a.bias b.weight, c.weight d.weight d.bias)
    wm = {"a.weight": "shard-1.safetensors", "a.bias": "shard-1.safetensors", "b.weight": "shard-1.safetensors",
          "c.weight": "shard-2.safetensors", "d.weight": "shard-2.safetensors", "d.bias": "shard-2.safetensors"}
    put("shard_index", "both", json.dumps({"metadata": {"total_size": 152}, "weight_map": wm}, indent=1))
    put("shard_index", "one_shard", json.dumps({"weight_map": {k: v for k, v in wm.items() if "1" in v}}))
    put("shard_index", "missing_name", json.dumps({"weight_map": {"a.weight": "shard-1.safetensors",
                                                                 "zz": "shard-2.safetensors"}}))
    put("shard_index", "no_file", json.dumps({"weight_map": {"a.weight": "shard-9.safetensors"}}))

    # ---- GGUF: float and block types, llama names, ComfyUI's flattened shapes, alignment
    f32 = struct.pack("<I", 6)
    u32 = struct.pack("<I", 4)
    put("gguf", "floats_and_blocks", gguf(
        [("general.architecture", 8, struct.pack("<Q", 5) + b"llama"), ("general.alignment", 4, struct.pack("<I", 32))],
        [("blk.0.attn_q.weight", [32, 2], 8, q8_0(64)), ("blk.0.ffn_gate.weight", [32, 2], 2, q4_0(64)),
         ("token_embd.weight", [4, 3], 0, values("F32", 12)), ("output_norm.weight", [4], 1, values("F16", 4))]))
    shape = struct.pack("<IQ", 5, 2) + struct.pack("<ii", 2, 32)  # INT32 array [2, 32]
    put("gguf", "orig_shape", gguf(
        [("comfy.gguf.orig_shape.blocks.0.mlp.fc1.weight", 9, shape)],
        [("blocks.0.mlp.fc1.weight", [64], 8, q8_0(64)), ("x.bias", [2], 28, values("F64", 2))]))
    put("gguf", "v2_kv_types", gguf(
        [("u8", 0, b"\x07"), ("i16", 3, struct.pack("<h", -3)), ("f", 6, struct.pack("<f", 1.5)),
         ("b", 7, b"\x01"), ("arr", 9, struct.pack("<IQ", 8, 2) + struct.pack("<Q", 1) + b"a" +
                                    struct.pack("<Q", 2) + b"bc"), ("u64", 10, struct.pack("<Q", 9)),
         ("d", 12, struct.pack("<d", 2.5)), ("align", 4, u32)],
        [("t", [8], 30, values("BF16", 8))], version=2))
    del f32

    # ---- config.json files: the first byte picks the file (fuzz/targets/config.c), the rest is the reduced
    # model's own file (copied from FUZZ_MODEL when given)
    model = os.environ.get("FUZZ_MODEL")
    files = ["transformer/config.json", "text_encoder/config.json", "video_vae/config.json",
             "video_vae/source/config.json", "audio_vae/config.json", "audio_vae/metadata.json"]
    if model:
        for i, rel in enumerate(files):
            with open(os.path.join(model, rel), "rb") as f:
                put("config", f"{i}_" + rel.replace("/", "_"), bytes([i]) + f.read())
        with open(os.path.join(model, "tokenizer", "tokenizer.json"), "rb") as f:
            put("tokenizer", "tiny_bpe.json", f.read())
    put("config", "0_diffusers_keys", b"\x00" + json.dumps({
        "_class_name": "MiniMaxH3Transformer3DModel", "num_layers": 4, "num_attention_heads": 2,
        "attention_head_dim": 128, "in_channels": 24, "text_dim": 64}).encode())
    put("config", "1_qwen3_text", b"\x01" + json.dumps({
        "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128, "vocab_size": 576,
        "rope_theta": 5000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu"}).encode())
    put("config", "5_null_stats", b"\x05" + json.dumps({"latents_mean": None, "latents_std": None}).encode())

    # ---- tokenizer.json: a hand-made byte-level BPE with an added token and NFC
    alphabet = {}
    n = 0
    for b in list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256)):
        alphabet[b] = chr(b)
    for b in range(256):
        if b not in alphabet:
            alphabet[b] = chr(256 + n)
            n += 1
    vocab = {alphabet[b]: b for b in range(256)}
    merges = [f"{alphabet[ord('a')]} {alphabet[ord('b')]}", f"{alphabet[ord(' ')]} {alphabet[ord('a')]}"]
    vocab["ab"] = 256
    vocab[alphabet[ord(' ')] + "a"] = 257
    tok = {"version": "1.0", "added_tokens": [
        {"id": 258, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                                   "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges}}
    put("tokenizer", "handmade_bpe.json", json.dumps(tok, ensure_ascii=False))

    # ---- prompts
    put("prompt", "synth", "integrated_multimodal_description: [Shot 1] A purple circle moves from the right side "
                           "to the left side on a plain black background. overall_soundscape: A very high tone.")
    put("prompt", "unicode", "caf\u00e9 cafe\u0301 \u56fe\u7247 \U0001f3b5 \u0661\u0662 it's we'll I'M")
    put("prompt", "added_tokens", "<|endoftext|>a<|im_start|>b<|im_end|> <|vision_start|>")
    put("prompt", "white_space", "  \n\n\t x  \r\n  y   ")
    put("prompt", "not_utf8", b"ok \xff\xfe \xc3")
    put("prompt", "nul_inside", b"before\x00after")
    put("prompt", "empty", b"")

    # ---- request lines: the first names the command (fuzz/targets/request.c)
    lines = {
        "generate": ["generate", "--prompt", "a red square", "--frames", "22", "--size", "64x64", "--steps", "4",
                     "--sampler", "res_multistep", "--scheduler", "simple", "--seed", "7", "-o", "x.mp4",
                     "--wav", "x.wav", "--png-dir", "frames", "--latents", "l.safetensors"],
        "generate_bad": ["generate", "--prompt", "x", "--size", "0x0", "--seconds", "-1", "--vram-budget", "lots"],
        "generate_budgets": ["generate", "--prompt", "x", "--seconds", "2.5", "--ram-budget", "unlimited",
                             "--vram-budget", "8GiB", "--device", "cpu", "--progress", "json", "--threads", "2"],
        "plan": ["plan", "m", "--frames", "124", "--size", "960x544", "--vram-budget", "8GiB", "--ram-budget", "16G"],
        "plan_workload": ["plan", "m", "--workload", "W73", "--device", "h200", "--text-tokens", "300"],
        "inspect": ["inspect", "m", "--summary"],
        "encode": ["encode", "--model", "m", "--prompt", "x", "--layer", "50", "--out", "o.safetensors"],
        "decode": ["decode", "--model", "m", "--latents", "l.safetensors", "--plan", "--tile-size", "128"],
        "dit": ["dit", "--model", "m", "--inputs", "i.safetensors", "-o", "o.safetensors", "--chunk-rows", "64"],
        "quantize": ["quantize", "m", "q.safetensors", "--format", "int8_convrot", "--rows", "8", "--threads", "1"],
        "help": ["generate", "--help"],
    }
    for name, argv in lines.items():
        put("request", name, "\n".join(argv))

    # ---- h3run serve's job bodies (fuzz/targets/serve_request.c)
    bodies = {
        "good": '{"prompt":"a red ball","steps":4}',
        "all_options": '{"prompt":"x","frames":22,"size":"64x64","steps":2,"sampler":"dpmpp_2m","scheduler":"beta",'
                       '"seed":7,"x264_preset":"ultrafast","wav":true,"latents":false}',
        "seconds": '{"prompt":"x","seconds":2.5}',
        "bad_rules": '{"prompt":"x","frames":50,"size":"33x32"}',
        "unknown": '{"prompt":"x","output":"/etc/passwd"}',
        "wrong_types": '{"prompt":1,"frames":"5"}',
        "not_object": '[1,2,{"prompt":"x"}]',
        "nul": '{"prompt":"a\\u0000b"}',
    }
    for name, body in bodies.items():
        put("serve_request", name, body)

    # ---- latents files: decode's (video, audio) and dit's inputs, for the reduced model
    put("latents", "video", safetensors([("latents", "F32", [1, 24, 1, 2, 2], None)]))
    put("latents", "video_4d_bf16", safetensors([("latents", "BF16", [24, 2, 2, 2], None)]))
    put("latents", "audio_stereo", safetensors([("latents", "F32", [2, 32, 2], None)]))
    put("latents", "audio_mono_f16", safetensors([("latents", "F16", [32, 3], None)]))
    put("latents", "wrong_rank", safetensors([("latents", "F32", [2, 2, 2, 2, 2, 2], None)]))
    S, NV, NA, NL = 8, 4, 2, 2
    pos = b"".join(struct.pack("<d", float((i * k) % 3)) for i in range(S) for k in range(3))
    tags = [0] * NV + [2] * NA + [1] * NL
    put("latents", "dit_inputs", safetensors([
        ("video", "F32", [NV, 96], None), ("audio", "F32", [NA, 32], None), ("text", "F32", [NL, 64], None),
        ("timesteps", "F32", [1], struct.pack("<f", 0.5)), ("position_ids", "F64", [S, 3], pos),
        ("timestep_indices", "I32", [S], b"\0" * 4 * S),
        ("token_tags", "I32", [S], b"".join(struct.pack("<i", t) for t in tags)),
        ("video_indices", "I64", [NV], b"".join(struct.pack("<q", i) for i in range(NV))),
        ("audio_indices", "I64", [NA], b"".join(struct.pack("<q", NV + i) for i in range(NA))),
        ("text_indices", "I64", [NL], b"".join(struct.pack("<q", NV + NA + i) for i in range(NL)))]))

    # ---- LoRA files for the reduced DiT (hidden 64, 2 heads x 128, FFN 128, 4 + 2 blocks, text 64, AdaLN 32)
    put("lora", "ai_toolkit_qkv", safetensors([
        ("diffusion_model.blocks.0.attn.qkv_proj.lora_A.weight", "BF16", [2, 64], None),
        ("diffusion_model.blocks.0.attn.qkv_proj.lora_B.weight", "BF16", [768, 2], None)]))
    put("lora", "musubi_fc1_alpha", safetensors([
        ("lora_unet_blocks_1_mlp_fc1.lora_down.weight", "F32", [4, 64], None),
        ("lora_unet_blocks_1_mlp_fc1.lora_up.weight", "F32", [256, 4], None),
        ("lora_unet_blocks_1_mlp_fc1.alpha", "F32", [], None)]))
    put("lora", "diffsynth_qkv", safetensors([
        ("token_refiner.blocks.1.attn.qkv_proj.lora_A.default.weight", "F32", [2, 64], None),
        ("token_refiner.blocks.1.attn.qkv_proj.lora_B.default.weight", "F32", [768, 2], None)]))
    put("lora", "diffusers_split", safetensors([
        ("transformer.transformer_blocks.2.attn.to_k.lora_A.weight", "F16", [3, 64], None),
        ("transformer.transformer_blocks.2.attn.to_k.lora_B.weight", "F16", [256, 3], None),
        ("transformer.transformer_blocks.2.ff.net.0.proj.lora_A.weight", "F16", [3, 64], None),
        ("transformer.transformer_blocks.2.ff.net.0.proj.lora_B.weight", "F16", [256, 3], None)]))
    put("lora", "globals_meta_alpha", safetensors([
        ("final_layer.adaln_proj.linear.lora_A.weight", "F32", [2, 32], None),
        ("final_layer.adaln_proj.linear.lora_B.weight", "F32", [128, 2], None),
        ("blocks.3.adaln_proj.linear.lora_A.weight", "F32", [2, 32], None),
        ("blocks.3.adaln_proj.linear.lora_B.weight", "F32", [1152, 2], None),
        ("video_patch_proj.lora.down.weight", "F32", [1, 96], None),
        ("video_patch_proj.lora.up.weight", "F32", [64, 1], None)], {"alpha": "4"}))
    put("lora", "incomplete", safetensors([("blocks.0.mlp.fc2.lora_A.weight", "F32", [2, 128], None)]))

    # ---- the sweep: [component] [tensor u16] [change] [parameter] (fuzz/targets/sweep.c)
    for comp in range(4):
        for op in range(4):
            put("sweep", f"c{comp}_change{op}", bytes([comp]) + struct.pack("<H", 3 + 11 * op) + bytes([op, 9 * op + 2]))


if __name__ == "__main__":
    main()
