"""h3run vae-encode (the audio VAE's encoder) against the project's float64 reference (tools/reference/audio_vae.py
encode, written from H3-FACTS §4) on the small model's audio VAE: a stereo waveform whose length is not a multiple
of the hop. Exit 1 when the relative L2 error exceeds 1e-5. Usage: audio_encode_ref.py H3RUN TMPDIR (run by
tests/cli_vae_encode.sh when /usr/bin/python3 has torch)."""
import math
import os
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
H3RUN, TMP = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import torch  # noqa: E402
import audio_vae  # noqa: E402
from video_vae import read_safetensors, write_safetensors  # noqa: E402

model = os.path.join(ROOT, "models", "h3-small", "audio_vae")
n = 32000 + 517
t = torch.arange(n, dtype=torch.float64) / 32000
g = torch.Generator().manual_seed(5)
wave = torch.stack([0.5 * torch.sin(2 * math.pi * 440 * t) + 0.05 * torch.randn(n, generator=g, dtype=torch.float64),
                    0.3 * torch.sin(2 * math.pi * 262 * t + 0.5)]).float()
inp, out = os.path.join(TMP, "wave.safetensors"), os.path.join(TMP, "alat.safetensors")
write_safetensors(inp, {"waveform": wave[:, None].contiguous()})
r = subprocess.run([H3RUN, "vae-encode", "--model", model, "--input", inp, "--out", out, "--threads", "2", "-q"],
                   capture_output=True, text=True)
if r.returncode != 0:
    sys.exit("h3run vae-encode exited %d: %s" % (r.returncode, r.stderr))
got = read_safetensors(out)["latents"].double()
w, _ = audio_vae.load_audio_vae(model)
ref = audio_vae.encode(w, wave.double())
err = float((got - ref).norm() / ref.norm())
print("audio encode, the small model, waveform [2, 1, %d] -> latents %s: relative L2 %.2e against the reference"
      % (n, list(got.shape), err))
sys.exit(0 if got.shape == ref.shape and err <= 1e-5 else 1)
