"""What train_small_loras.sh and the keyframe training (tests/gpu/run.sh keyframes) need of the small model, small
enough to travel with a working tree (the model folder is 86 MB): its transformer/ as it is, and its video_vae/ and
audio_vae/ with the encoders' tensors only (the decoders are most of their bytes), in the official layout that
encoders.load_model_encoders reads.

    /usr/bin/python3 tools/train/pack_small.py models/h3-small OUT
"""

import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: pack_small.py MODEL OUT")
    model, out = sys.argv[1:]
    os.makedirs(out, exist_ok=True)
    shutil.copytree(os.path.join(model, "transformer"), os.path.join(out, "transformer"), dirs_exist_ok=True)
    with open(os.path.join(model, "video_vae", "config.json")) as f:
        vcfg = json.load(f)
    src = os.path.join(model, "video_vae", vcfg["source_path"])
    dst = os.path.join(out, "video_vae", vcfg["source_path"])
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(model, "video_vae", "config.json"), os.path.join(out, "video_vae"))
    for name in os.listdir(src):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(src, name), dst)
    sd = read_safetensors(os.path.join(src, vcfg["source_safetensors_path"]))
    write_safetensors(os.path.join(dst, vcfg["source_safetensors_path"]),
                      {k: v for k, v in sd.items() if k.startswith(("encoder.", "quant_conv."))})
    with open(os.path.join(model, "audio_vae", "config.json")) as f:
        acfg = json.load(f)
    os.makedirs(os.path.join(out, "audio_vae"), exist_ok=True)
    for name in os.listdir(os.path.join(model, "audio_vae")):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(model, "audio_vae", name), os.path.join(out, "audio_vae"))
    sd = read_safetensors(os.path.join(model, "audio_vae", acfg["source_safetensors_path"]))
    write_safetensors(os.path.join(out, "audio_vae", acfg["source_safetensors_path"]),
                      {k: v for k, v in sd.items() if k.startswith(("encoder.", "pre_block.", "mean_proj.",
                                                                      "logs_proj."))})
    print(f"wrote {out}: transformer/, and the VAEs' encoders")


if __name__ == "__main__":
    main()
