"""What the training scripts share: their common options, h3run's programs, and the verdict of the check that
h3run computes what the reference computed with the exported weights."""

import argparse
import os
import subprocess

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, "..", "..", "build")


def parser(doc, steps, batch, lr):
    """The options every script takes: --data, --template, --out, --steps, --batch, --lr, --seed, --threads."""
    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    ap.add_argument("--data", required=True, help="an h3-synth dataset (shards + captions.jsonl)")
    ap.add_argument("--template", required=True, help="an official-layout model folder (h3-tinymodel's)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    return ap


def setup(a):
    """Seed, threads, and the output folder (absolute)."""
    torch.manual_seed(a.seed)
    if a.threads:
        torch.set_num_threads(a.threads)
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
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


def verdict(what, worst, tol):
    """Prints whether h3run agrees with the reference within tol (max |diff| worst); the script's exit status."""
    ok = worst <= tol
    print(f"{'ok  ' if ok else 'FAIL'} {what}: h3run agrees with the reference, max |diff| {worst:.1e} "
          f"(at most {tol:.0e})", flush=True)
    return 0 if ok else 1
