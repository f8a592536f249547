"""Writing trained weights in the release's official FL2VA/ layout, so h3run (and the release's own loaders) read them.

Each exporter is the inverse of the project's reference loader for the official layout (tools/reference): it takes the
canonical weight dict the reference's forward uses (float64 or float32 tensors under canonical names) and writes the
files of one component the way the release stores them, copying everything that is not a weight (configs, metadata,
the shard index) from a template folder of the same architecture: an official folder written by h3-tinymodel (or the
release itself), whose stored dtype per tensor is kept.

    export_dit(weights, "template/transformer", "out/transformer")         # per-head interleaved fused QKV rows
    export_video_vae(weights, cfg, "template/video_vae", "out/video_vae")  # decoder only, interleaved to_qkv
    export_audio_vae(weights, "template/audio_vae", "out/audio_vae")       # weight norm: g = |w| per row, v = w
    export_text_encoder(weights, "template/text_encoder", "out/text_encoder")

tools/train/test_export.py checks every exporter round-trips an h3-tinymodel folder: the same bytes for every tensor
(the audio VAE's weight-norm pairs to within float32 rounding of the folded weight).
"""

import json
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from dit import interleave_qkv, read_safetensors, write_safetensors  # noqa: E402

_DT = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def _shards(folder):
    """{shard file: [tensor names]} of a component folder (an index, or the .safetensors files in it)."""
    idx = [f for f in os.listdir(folder) if f.endswith(".safetensors.index.json")]
    if idx:
        with open(os.path.join(folder, idx[0])) as f:
            wm = json.load(f)["weight_map"]
        out = {}
        for name, shard in wm.items():
            out.setdefault(shard, []).append(name)
        return out
    return {f: list(read_safetensors(os.path.join(folder, f))) for f in sorted(os.listdir(folder))
            if f.endswith(".safetensors")}


def _copy_tree_without_weights(src, dst):
    for root, _, files in os.walk(src):
        rel = os.path.relpath(root, src)
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for f in files:
            if not f.endswith(".safetensors"):
                shutil.copy2(os.path.join(root, f), os.path.join(dst, rel, f))


def _write_like(template_dir, out_dir, stored, extra=None):
    """Writes {name: tensor} into out_dir with the template's shard files and each tensor's stored dtype; extra
    {name: tensor} (tensors the template lacks, float32) go into its only file."""
    _copy_tree_without_weights(template_dir, out_dir)
    shards = _shards(template_dir)
    if extra and len(shards) != 1:
        raise ValueError(f"{template_dir}: extra tensors need a component stored in one file")
    for shard, names in shards.items():
        tmpl = read_safetensors(os.path.join(template_dir, shard))
        missing = [n for n in names if n not in stored]
        if missing:
            raise KeyError(f"{shard}: no weights for {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        tensors = {}
        for n in names:
            t = stored[n].detach().cpu()
            if tuple(t.shape) != tuple(tmpl[n].shape):
                raise ValueError(f"{n}: shape {tuple(t.shape)}, the template has {tuple(tmpl[n].shape)}")
            tensors[n] = t.to(tmpl[n].dtype).contiguous()
        for n, t in (extra or {}).items():
            if n in tensors:
                raise ValueError(f"{n}: already in the template")
            tensors[n] = t.detach().cpu().float().contiguous()
        write_safetensors(os.path.join(out_dir, shard), tensors)


def export_dit(weights, template_dir, out_dir):
    hd = weights["blocks.0.attn.q_norm.weight"].shape[0]
    stored = {}
    for k, v in weights.items():
        stored[k] = interleave_qkv(v, hd) if k.endswith(".attn.qkv_proj.weight") else v
    _write_like(template_dir, out_dir, stored)


def video_encoder_names(state_dict):
    """A release-structure video encoder's tensors (tools/train/encoders.py, diffusers' names) under the release's
    source names: encoder.down.I.block.J (nin_shortcut), encoder.down.I.downsample.conv; conv_in, norm_out, conv_out
    and quant_conv as they are. Buffers (statistics) are left out."""
    out = {}
    for k, v in state_dict.items():
        if not (k.startswith("encoder.") or k.startswith("quant_conv.")):
            continue
        p = k.split(".")
        if p[1] == "down_blocks":
            rest = p[3:]
            if rest[0] == "resnets":
                tail = ["nin_shortcut" if x == "conv_shortcut" else x for x in rest[2:]]
                k = ".".join(["encoder", "down", p[2], "block", rest[1]] + tail)
            else:  # downsamplers.0.conv.*
                k = ".".join(["encoder", "down", p[2], "downsample"] + rest[2:])
        out[k] = v
    return out


def export_video_vae(weights, cfg, template_dir, out_dir, encoder=None):
    """encoder: a release-structure encoder's state dict (encoders.VideoEncoder), written beside the decoder under the
    release's names; None: the decoder only."""
    with open(os.path.join(template_dir, "config.json")) as f:
        wrap = json.load(f)
    src_dir = os.path.join(template_dir, wrap["source_path"])
    tmpl = read_safetensors(os.path.join(src_dir, wrap["source_safetensors_path"]))
    D = cfg["head_dim"]
    s = {}
    s["post_quant_conv.weight"] = weights["post_quant_conv.weight"].reshape(tmpl["post_quant_conv.weight"].shape)
    s["post_quant_conv.bias"] = weights["post_quant_conv.bias"]
    s["decoder.x_embedder.weight"] = weights["x_embedder.weight"]
    s["decoder.x_embedder.bias"] = weights["x_embedder.bias"]
    s["decoder.register_tokens"] = weights["register_tokens"].reshape(tmpl["decoder.register_tokens"].shape)
    for k in ("norm_out.weight", "norm_out.bias", "proj_out.weight", "proj_out.bias"):
        s["decoder." + k] = weights[k]
    for i in range(cfg["num_layers"]):
        b, p = f"blocks.{i}.", f"decoder.transformer_blocks.{i}."
        for k in ("norm1.weight", "norm2.weight", "scale1", "scale2"):
            s[p + k] = weights[b + k]
        for x in ("weight", "bias"):
            s[p + "attn.to_qkv." + x] = interleave_qkv(weights[b + "qkv." + x], D)
            s[p + "attn.to_out." + x] = weights[b + "out." + x]
            s[p + "ff.w1." + x] = weights[b + "w1." + x]
            s[p + "ff.w2." + x] = weights[b + "w2." + x]
    _copy_tree_without_weights(template_dir, out_dir)
    _write_like(src_dir, os.path.join(out_dir, wrap["source_path"]), s,
                video_encoder_names(encoder) if encoder is not None else None)


def export_audio_vae(weights, template_dir, out_dir, encoder=None):
    """Weight-normalized convolutions are stored as weight_g = |w| over all dims but the first, weight_v = w: the
    loader's fold v·(g/|v|) gives w back (to float32 rounding). encoder: a release-structure encoder's state dict
    (encoders.AudioEncoder: the release's names already, weight_g/weight_v included), written beside the decoder."""
    tmpl = {}
    for shard in _shards(template_dir):
        tmpl.update(read_safetensors(os.path.join(template_dir, shard)))
    s = {}
    for name in tmpl:
        if name.endswith(".weight_v"):
            w = weights[name[: -len("_v")]].double()
            s[name] = w
            s[name[: -len("_v")] + "_g"] = w.reshape(w.shape[0], -1).norm(dim=1).reshape(-1, *([1] * (w.ndim - 1)))
        elif not name.endswith(".weight_g"):
            s[name] = weights[name]
    extra = {k: v for k, v in encoder.items() if not k.startswith("latents_")} if encoder is not None else None
    _write_like(template_dir, out_dir, s, extra)


def export_text_encoder(weights, template_dir, out_dir, prefix="model.language_model."):
    """Canonical names (embed_tokens.weight, layers.N.*) under the official prefix; the template's other tensors
    (the final norm, lm_head, the vision tower) are kept as they are."""
    tmpl = {}
    for shard in _shards(template_dir):
        tmpl.update(read_safetensors(os.path.join(template_dir, shard)))
    s = dict(tmpl)
    for k, v in weights.items():
        s[prefix + k] = v
    _write_like(template_dir, out_dir, s)
