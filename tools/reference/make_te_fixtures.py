"""Writes tests/fixtures/text_encoder/: a tiny Qwen3-VL text encoder with random bf16 weights in both namings h3run
reads, and the hidden states tools/reference/qwen3.py computes for two prompts in float64.

    /usr/bin/python3 tools/reference/make_te_fixtures.py [OUT_DIR]

The tiny model keeps the real structure: grouped-query attention (4 query heads, 2 key/value heads), head_dim 32
with inner width 128 != hidden 64 (as 8192 != 5120 in the real model), per-head QK-RMSNorm, rope_theta 5e6,
RMSNorm eps 1e-6, SwiGLU MLP, no biases.

official/ holds what MiniMaxAI ships in text_encoder/ (transformers' Qwen3VLForConditionalGeneration names, a
config.json, two shards and an index) with 5 decoder layers, of which the last one, the final norm, lm_head and the
vision tensors are NaN: computing hidden_states[0..4] must never read them (hidden_states[5] is all NaN, which shows
the poison works). comfy.safetensors is the ComfyUI / Wan2GP repack of the same weights truncated to 4 layers
(model.layers.*, visual.* without the "model." prefix, no norm, no lm_head, no config). expected.safetensors holds
the prompts' ids and hidden_states[0..4] for both (same weights, same values).

Deterministic: the same bytes every time.
"""

import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3  # noqa: E402

CFG = dict(hidden=64, layers=5, heads=4, kv_heads=2, head_dim=32, intermediate=96, vocab=256, rms_eps=1e-6,
           rope_theta=5e6, mrope_section=[6, 5, 5])
USED = 4  # layers whose outputs the fixtures hold; layer 4 is poisoned
SEED = 20261204

g = torch.Generator().manual_seed(SEED)


def randn(*shape, std=1.0):
    return torch.randn(*shape, generator=g, dtype=torch.float64) * std


def bf16(t):
    return t.to(torch.bfloat16)


def nan_like(*shape):
    return torch.full(shape, float("nan"), dtype=torch.bfloat16)


def text_weights():
    """Canonical names, bf16."""
    c = CFG
    C, D, F = c["hidden"], c["head_dim"], c["intermediate"]
    w = {"embed_tokens.weight": bf16(randn(c["vocab"], C))}
    for i in range(c["layers"]):
        p = "layers.%d." % i
        lin = {"self_attn.q_proj.weight": (c["heads"] * D, C), "self_attn.k_proj.weight": (c["kv_heads"] * D, C),
               "self_attn.v_proj.weight": (c["kv_heads"] * D, C), "self_attn.o_proj.weight": (C, c["heads"] * D),
               "mlp.gate_proj.weight": (F, C), "mlp.up_proj.weight": (F, C), "mlp.down_proj.weight": (C, F)}
        for name, (n_out, n_in) in lin.items():
            w[p + name] = bf16(randn(n_out, n_in, std=1.0 / math.sqrt(n_in)))
        w[p + "input_layernorm.weight"] = bf16(1 + randn(C, std=0.2))
        w[p + "post_attention_layernorm.weight"] = bf16(1 + randn(C, std=0.2))
        w[p + "self_attn.q_norm.weight"] = bf16(1 + randn(D, std=0.2))
        w[p + "self_attn.k_norm.weight"] = bf16(1 + randn(D, std=0.2))
        if i >= USED:
            for k in list(w):
                if k.startswith(p):
                    w[k] = nan_like(*w[k].shape)
    return w


VISION = {  # a few tensors of the vision tower, by their names under the tower's prefix (shapes reduced)
    "patch_embed.proj.weight": (8, 3, 2, 4, 4),
    "patch_embed.proj.bias": (8,),
    "pos_embed.weight": (16, 8),
    "blocks.0.norm1.weight": (8,),
    "blocks.0.attn.qkv.weight": (24, 8),
    "merger.linear_fc2.weight": (64, 32),
    "deepstack_merger_list.0.norm.weight": (32,),
}


def config_json():
    c = CFG
    text = {"model_type": "qwen3_vl_text", "hidden_size": c["hidden"], "num_hidden_layers": c["layers"],
            "num_attention_heads": c["heads"], "num_key_value_heads": c["kv_heads"], "head_dim": c["head_dim"],
            "intermediate_size": c["intermediate"], "vocab_size": c["vocab"], "rms_norm_eps": c["rms_eps"],
            "hidden_act": "silu", "attention_bias": False, "max_position_embeddings": 4096, "tie_word_embeddings": False,
            "rope_theta": c["rope_theta"],
            "rope_scaling": {"rope_type": "default", "mrope_section": c["mrope_section"], "mrope_interleaved": True}}
    vision = {"model_type": "qwen3_vl", "depth": 1, "hidden_size": 8, "intermediate_size": 16, "num_heads": 2,
              "in_channels": 3, "patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2,
              "out_hidden_size": c["hidden"], "num_position_embeddings": 16, "deepstack_visual_indexes": [0]}
    return {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "text_config": text,
            "vision_config": vision, "image_token_id": 151655, "video_token_id": 151656,
            "vision_start_token_id": 151652, "vision_end_token_id": 151653, "tie_word_embeddings": False}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                               "tests", "fixtures", "text_encoder")
    out = os.path.normpath(out)
    qwen3.check_text_only_mrope(CFG)
    w = text_weights()

    # official/: transformers names, two shards and an index, config.json
    d = os.path.join(out, "official")
    os.makedirs(d, exist_ok=True)
    off = {"model.language_model." + k: v for k, v in w.items()}
    off["model.language_model.norm.weight"] = nan_like(CFG["hidden"])
    off["lm_head.weight"] = nan_like(CFG["vocab"], CFG["hidden"])
    for k, shape in VISION.items():
        off["model.visual." + k] = nan_like(*shape)
    shard_of = lambda k: 0 if (k.startswith("model.language_model.embed") or  # noqa: E731
                               any(k.startswith("model.language_model.layers.%d." % i) for i in (0, 1))) else 1
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map = {}
    for s in (0, 1):
        part = {k: v for k, v in off.items() if shard_of(k) == s}
        qwen3.save_safetensors(os.path.join(d, names[s]), part, {"format": "pt"})
        weight_map.update({k: names[s] for k in part})
    total = sum(v.numel() * v.element_size() for v in off.values())
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        f.write("\n")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config_json(), f, indent=2)
        f.write("\n")

    # comfy.safetensors: truncated repack, ComfyUI names, no config
    comfy = {"model." + k: v for k, v in w.items()
             if not any(k.startswith("layers.%d." % i) for i in range(USED, CFG["layers"]))}
    for k, shape in VISION.items():
        comfy["visual." + k] = nan_like(*shape)
    qwen3.save_safetensors(os.path.join(out, "comfy.safetensors"), comfy)

    # expected outputs: two prompts (37 tokens, and a single token)
    gi = torch.Generator().manual_seed(SEED + 1)
    prompts = {"a": torch.randint(0, CFG["vocab"], (37,), generator=gi), "b": torch.tensor([CFG["vocab"] - 1])}
    exp = {}
    for name, ids in prompts.items():
        hs = qwen3.hidden_states(w, CFG, ids, USED)
        exp["ids." + name] = ids.to(torch.int32)
        for i, h in enumerate(hs):
            assert torch.isfinite(h).all()
            exp["hidden.%s.%d" % (name, i)] = h.to(torch.float32)
        # the poisoned layer really is poison: the state after it is not finite
        assert not torch.isfinite(qwen3.hidden_states(w, CFG, ids, USED + 1)[-1]).any()
    qwen3.save_safetensors(os.path.join(out, "expected.safetensors"), exp,
                           {"layers": str(USED), "reference": "tools/reference/qwen3.py, float64"})
    print("wrote %s" % out)


if __name__ == "__main__":
    main()
