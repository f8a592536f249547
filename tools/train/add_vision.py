"""Gives a small model's text encoder a vision tower (fl2va keyframes): the `model.visual.*` tensors and the
`vision_config` / vision token ids of a template's text encoder (h3-tinymodel without --no-keyframes: Qwen3-VL's
structure at depth 1, hidden 16, one DeepStack merger), added beside the model's own weights as a second shard.

    /usr/bin/python3 tools/train/add_vision.py TEMPLATE/text_encoder MODEL/text_encoder

The model's language weights are not rewritten: model.safetensors becomes model-00001-of-00002.safetensors (the same
bytes), the tower goes to model-00002-of-00002.safetensors, and model.safetensors.index.json maps both. The tower is
the template's random one and stays frozen: the DiT learns the keyframes from their latent rows (train_dit.py
--keyframes), and the tower's features are fixed random projections of the image that it learns to read too.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

VISION_KEYS = ("vision_config", "vision_start_token_id", "image_token_id", "video_token_id")


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    tpl, dst = sys.argv[1], sys.argv[2]
    src = os.path.join(dst, "model.safetensors")
    if not os.path.exists(src):
        raise SystemExit(f"{src}: not found (a text encoder in one file, without a tower yet)")
    tower = {k: v for k, v in read_safetensors(os.path.join(tpl, "model.safetensors")).items()
             if k.startswith("model.visual.")}
    if not tower:
        raise SystemExit(f"{tpl}: no model.visual.* tensors (write the template without --no-keyframes)")
    own = read_safetensors(src)
    if any(k.startswith("model.visual.") for k in own):
        raise SystemExit(f"{src}: already has a vision tower")
    with open(os.path.join(tpl, "config.json")) as f:
        tcfg = json.load(f)
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    if tcfg["text_config"]["hidden_size"] != cfg["text_config"]["hidden_size"]:
        raise SystemExit("the template's text width differs from the model's: the tower's merger would not fit")
    for k in VISION_KEYS:
        cfg[k] = tcfg[k]
    a, b = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    write_safetensors(os.path.join(dst, b), tower)
    os.replace(src, os.path.join(dst, a))
    index = {"metadata": {}, "weight_map": {**{k: a for k in sorted(own)}, **{k: b for k in sorted(tower)}}}
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")
    print(f"{dst}: a vision tower of {sum(v.numel() for v in tower.values()):,} parameters ({len(tower)} tensors) "
          f"in {b}")


if __name__ == "__main__":
    main()
