#!/usr/bin/env python3
"""The second job of a batch on h3run serve, on the GPU machine with the release-shaped model (tests/gpu/run.sh
serve; on the CPU tests/serve_test.py reuse checks the same with the small model).

Starts `h3run serve --model MODEL --device DEVICE` on 127.0.0.1, submits four jobs (the same prompt twice with two
seeds, then another prompt, then the first job again), waits for each, and prints from their reports when the DiT's
first model call began (dit_start_s: every load before the DiT computes) and what each job reused. Exits 1 unless
the second job's DiT began at least 3x sooner than the first's and the fourth job's latents equal the first's bit
for bit (on a GPU the later jobs compute with the DiT placement the first one left: the same weights must give the
same clip). Needs only python3's standard library (no ffprobe, no network).
Usage: serve_reuse.py H3RUN MODEL [--device cuda] [--frames 22] [--size 512x288] [--steps 4] [--data DIR]
       [--vram-budget SIZE] [--out FILE.json]
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("h3run")
ap.add_argument("model")
ap.add_argument("--device", default="cuda")
ap.add_argument("--frames", type=int, default=22)
ap.add_argument("--size", default="512x288")
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--data", default=None)
ap.add_argument("--out", default=None)
ap.add_argument("--timeout", type=float, default=500)
ap.add_argument("--vram-budget", default=None)
a = ap.parse_args()
data = a.data or tempfile.mkdtemp(prefix="h3serve-")
shutil.rmtree(os.path.join(data, "jobs"), ignore_errors=True)
for f in ("jobs.db", "jobs.db-wal", "jobs.db-shm"):
    if os.path.exists(os.path.join(data, f)):
        os.unlink(os.path.join(data, f))
os.makedirs(data, exist_ok=True)
log = open(os.path.join(data, "server.log"), "wb")
srv = subprocess.Popen([a.h3run, "serve", "--model", a.model, "--device", a.device, "--data", data, "--listen",
                        "127.0.0.1:0"] + (["--vram-budget", a.vram_budget] if a.vram_budget else []),
                       stdout=subprocess.PIPE, stderr=log)
line = srv.stdout.readline().decode()
if "listening on" not in line:
    sys.exit("the server did not start: %r (see %s/server.log)" % (line, data))
port = int(line.split("127.0.0.1:")[1].split("/")[0])
t_end = time.time() + a.timeout


def call(method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request(method, path, json.dumps(body) if body is not None else None,
              {"Content-Type": "application/json"} if body is not None else {})
    r = c.getresponse()
    out = json.loads(r.read())
    c.close()
    return r.status, out


prompt = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e_prompt.txt")).read()
reqs = [dict(prompt=prompt, seed=1), dict(prompt=prompt, seed=2), dict(prompt=prompt + " Another shot.", seed=3),
        dict(prompt=prompt, seed=1)]
reports, ids = [], []
try:
    for req in reqs:
        req.update(frames=a.frames, size=a.size, steps=a.steps, latents=True)
        st, job = call("POST", "/api/jobs", req)
        if st != 201:
            sys.exit("POST /api/jobs: %d %s" % (st, job))
        while True:
            st, job = call("GET", "/api/jobs/%d" % job["id"])
            if job["state"] in ("done", "failed", "cancelled") or time.time() > t_end:
                break
            time.sleep(0.5)
        if job["state"] != "done":
            sys.exit("job %d: %s %s" % (job["id"], job["state"], job.get("message")))
        reports.append(job["report"])
        ids.append(job["id"])
        r = job["report"]
        print("job %d: DiT began at %.3f s of %.2f s; text encoder %.2f s; reused %s" %
              (job["id"], r["dit_start_s"], r["total_s"], r["stage_s"]["text_encoder"], ", ".join(r["reused"]) or
               "nothing"), flush=True)
finally:
    srv.send_signal(signal.SIGTERM)
    srv.wait(timeout=120)
ratio = reports[0]["dit_start_s"] / max(reports[1]["dit_start_s"], 1e-9)
print("the second job's DiT began %.1fx sooner than the first's (%.3f s against %.3f s); a new prompt: %.3f s" %
      (ratio, reports[1]["dit_start_s"], reports[0]["dit_start_s"], reports[2]["dit_start_s"]))
lat = [open(os.path.join(data, "jobs", "%d.safetensors" % i), "rb").read() for i in (ids[0], ids[3])]
same = lat[0] == lat[1]
print("the first job run again (job %d, reused %s): latents %s the first's (%d bytes)" %
      (ids[3], ", ".join(reports[3]["reused"]) or "nothing", "equal to" if same else "DIFFERENT from", len(lat[0])))
for i, r in enumerate(reports):
    pk = "; ".join("%s %.3f GiB measured, %.3f predicted" % (k, v["measured"] / 2**30, v["predicted"] / 2**30)
                   for k, v in r.get("stage_device_peak", {}).items())
    print("job %d: DiT stage %.3f s, %.4f s a call; device peaks: %s" %
          (ids[i], r["stage_s"]["dit"], r.get("dit_step_s", 0), pk or "none (no stage on a GPU)"))
if a.out:
    with open(a.out, "w") as f:
        json.dump({"reports": reports, "ratio": ratio, "latents_equal": same, "model": a.model, "device": a.device,
                   "vram_budget": a.vram_budget}, f, indent=1)
sys.exit(0 if ratio >= 3 and same else 1)
