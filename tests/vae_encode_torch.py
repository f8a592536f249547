"""h3run vae-encode against the project's own torch encoder (tools/train/encoders.py VideoEncoder, what trained the
small model's encoder; float64) on the shipped weights of models/h3-small: an image (through the encoder alone, as
diffusers' _encode takes one frame) and 22 frames (two 17-frame clips, 3 latent frames dropped). Exit 1 when the
largest difference exceeds 1e-5 of max(1, the largest value). Usage: vae_encode_torch.py H3RUN TMPDIR (run by
tests/cli_vae_encode.sh when /usr/bin/python3 has torch)."""
import json, os, struct, subprocess, sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
H3RUN, TMP = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tools", "train"))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import torch
from encoders import VideoEncoder
from video_vae import read_safetensors
sd = read_safetensors(os.path.join(ROOT, "models/h3-small/video_vae/source/model.safetensors"))
cfg = json.load(open(os.path.join(ROOT, "models/h3-small/video_vae/config.json")))
enc = VideoEncoder(cfg["latents_mean"], cfg["latents_std"], z=24, ch=32, ch_mult=(1, 2, 2, 4), layers=1)
own = {}
for k, v in sd.items():
    if not (k.startswith("encoder.") or k.startswith("quant_conv.")): continue
    p = k.split(".")
    if p[1] == "down":
        if p[3] == "block":
            tail = ["conv_shortcut" if x == "nin_shortcut" else x for x in p[5:]]
            k = ".".join(["encoder", "down_blocks", p[2], "resnets", p[4]] + tail)
        else:
            k = ".".join(["encoder", "down_blocks", p[2], "downsamplers", "0"] + p[4:])
    own[k] = torch.as_tensor(v) if not isinstance(v, torch.Tensor) else v
missing = enc.load_state_dict(own, strict=False)
bad = [m for m in missing.missing_keys if "latents" not in m and "pixel" not in m] + missing.unexpected_keys
if bad:
    sys.exit(f"the shipped encoder's tensors do not map onto VideoEncoder: {bad}")
worst = 0.0
enc = enc.double()
for F, H, W in ((1, 128, 96), (22, 64, 64)):
    g = torch.Generator().manual_seed(F)
    px = torch.randint(0, 256, (1, 3, F, H, W), generator=g, dtype=torch.uint8)
    data = px.numpy().tobytes()
    hdr = json.dumps({"pixels": {"dtype": "U8", "shape": list(px.shape), "data_offsets": [0, len(data)]}}).encode()
    hdr += b" " * ((8 - len(hdr) % 8) % 8)
    open(os.path.join(TMP, "p.st"), "wb").write(struct.pack("<Q", len(hdr)) + hdr + data)
    subprocess.run([H3RUN, "vae-encode", "--model", os.path.join(ROOT, "models/h3-small"), "--input",
                    os.path.join(TMP, "p.st"), "--out", os.path.join(TMP, "o.st"), "-q", "--threads", "2"], check=True)
    raw = open(os.path.join(TMP, "o.st"), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])["latents"]
    a, b = h["data_offsets"]
    got = torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]), dtype=torch.float32).reshape(h["shape"]).double()
    with torch.no_grad():
        x = px.double().div(255.0)
        if F == 1:  # VideoEncoder pads to clips; an image goes through the encoder alone in diffusers: run it directly
            xn = (x - enc.pixel_mean.double()) / enc.pixel_std.double()
            ref = enc.quant_conv(enc.encoder(xn))[:, :24]
        else:
            z = enc(x)
            ref = z * enc.latents_std.double() + enc.latents_mean.double()
    err = (got - ref).abs().max().item() / max(1.0, ref.abs().max().item())
    print(f"{F} frames of {W}x{H}: latents {tuple(got.shape)}, max |h3run - torch| / max(1, max |torch|) {err:.2e}")
    worst = max(worst, err if tuple(got.shape) == tuple(ref.shape) else 1.0)
sys.exit(0 if worst <= 1e-5 else 1)
