"""What the training scripts share: their common options, h3run's programs, and the verdict of the check that
h3run computes what the reference computed with the exported weights."""

import argparse
import contextlib
import glob
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, "..", "..", "build")
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402


def parser(doc, steps, batch, lr, template=True):
    """The options every script takes: --data, --template (unless template is False), --out, --steps, --minutes,
    --batch, --lr, --seed, --threads, --device."""
    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    ap.add_argument("--data", required=True, nargs="+", help="h3-synth datasets (shards + captions.jsonl)")
    if template:
        ap.add_argument("--template", required=True, help="an official-layout model folder (h3-tinymodel's)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, help=f"training steps (default {steps}; no limit when --minutes is given; 0 "
                    "with --init: export and check again)")
    ap.set_defaults(default_steps=steps)
    ap.add_argument("--minutes", type=float, default=0, help="stop training after this long (0: no limit)")
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (needs PyTorch 2)")
    ap.add_argument("--init", help="start from an earlier run's --out folder instead of the template's random weights "
                    "(with --steps 0: export and check it again)")
    return ap


def setup(a):
    """Seed, threads, device (new tensors are made there: the reference code creates its constants without
    naming a device), and the output folder (absolute)."""
    if a.steps is None and not a.minutes:
        a.steps = a.default_steps
    torch.manual_seed(a.seed)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.device != "cpu":
        if not hasattr(torch, "set_default_device"):
            raise SystemExit(f"--device {a.device} needs PyTorch 2 (this is {torch.__version__})")
        torch.set_default_device(a.device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    return out


@contextlib.contextmanager
def full_float32():
    """Full float32 inside (a structural check compared at float32 rounding), TF32 as it was after."""
    was = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    exact()
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = was


def exact():
    """Full float32 from here on (the checks against h3run: TF32 training is not what h3run computes)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


try:  # the batch dimension of the training steps: the reference forwards run per example under vmap
    from torch.func import vmap  # noqa: F401  (PyTorch 2)
except ImportError:
    from functorch import vmap  # noqa: F401  (PyTorch 1.13)


class Clock:
    """Training steps until --steps or --minutes runs out; step() says whether to go on."""

    def __init__(self, a):
        self.steps, self.limit, self.t0, self.n = a.steps, a.minutes * 60, time.time(), 0

    def step(self):
        if (self.steps is not None and self.n >= self.steps) or (self.limit and time.time() - self.t0 > self.limit):
            return False
        self.n += 1
        return True

    def elapsed(self):
        return time.time() - self.t0


class Ema:
    """An exponential moving average of a dict of tensors (what is exported: steadier than the last step)."""

    def __init__(self, w, decay):
        self.decay, self.w = decay, {k: v.detach().clone() for k, v in w.items()}

    @torch.no_grad()
    def update(self, w, step):
        d = min(self.decay, (1 + step) / (10 + step))
        for k, v in w.items():
            self.w[k].mul_(d).add_(v.detach(), alpha=1 - d)


def cpu(t):
    """A tensor ready for write_safetensors: on the host, contiguous."""
    return t.detach().cpu().contiguous()


def shards(folders):
    """The shard files of h3-synth datasets, folder by folder."""
    out = []
    for folder in folders:
        found = sorted(glob.glob(os.path.join(folder, "shard-*.safetensors")))
        if not found:
            raise SystemExit(f"no shard-*.safetensors in {folder} (make them with h3-synth dataset)")
        out += found
    return out


def program(name):
    """build/<name>, or the path in $H3RUN / $H3SYNTH."""
    env = {"h3run": "H3RUN", "h3-synth": "H3SYNTH"}.get(name)
    return os.environ.get(env, os.path.join(BUILD, name)) if env else os.path.join(BUILD, name)


def run(cmd):
    """Runs one of h3run's programs; exits naming it when it fails."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{os.path.basename(cmd[0])} {cmd[1]} failed: {r.stderr.strip()[-400:]}")
    return r.stdout


def h3run_decode(vae_dir, latents, stem):
    """h3run decode of latents with the exported VAE in vae_dir (`--tensors-out`): its tensors, read back. The
    latents and the result are kept as STEM-latents.safetensors and STEM-decoded.safetensors."""
    lat, dec = stem + "-latents.safetensors", stem + "-decoded.safetensors"
    write_safetensors(lat, {"latents": cpu(latents)})
    run([program("h3run"), "decode", "--model", vae_dir, "--latents", lat, "--tensors-out", dec, "-q"])
    return read_safetensors(dec)


def finish(out, name, res, what):
    """Writes OUT/NAME_train.json and returns the verdict on the held-out rows' h3run-vs-reference differences."""
    with open(os.path.join(out, f"{name}_train.json"), "w") as f:
        json.dump(res, f, indent=1)
    return verdict(what, max(h["h3run_vs_reference_max_abs"] for h in res["held_out"]), 1e-5)


def verdict(what, worst, tol):
    """Prints whether h3run agrees with the reference within tol (max |diff| worst); the script's exit status."""
    ok = worst <= tol
    print(f"{'ok  ' if ok else 'FAIL'} {what}: h3run agrees with the reference, max |diff| {worst:.1e} "
          f"(at most {tol:.0e})", flush=True)
    return 0 if ok else 1
