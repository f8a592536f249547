#!/usr/bin/env python3
"""h3run serve on 127.0.0.1 with the small model (tests/cli_serve.sh runs it; docs/SERVE.md).

Cases (all by default, or those named on the command line):
  submit      a job followed through its events (SSE) to done; its MP4 downloaded whole and by range requests
              (206 with the right bytes, 416 beyond the end) and accepted by ffprobe with the requested frames
  cancel      a running job cancelled: it stops, ends 'cancelled' and leaves no file; a queued job deleted
  concurrent  20 jobs from 4 clients at once: every accepted job done, none lost, run in the order accepted
  crash       kill -9 during a running job (after its 7th DiT call), then a restart: that job runs again from the
              checkpoint saved after its 5th call (its report says so) and completes, the queued jobs complete, no
              unfinished (*.partial) or truncated result and no checkpoint is left
  bad         at least 200 bad requests (malformed JSON, wrong types, unknown options, invalid frames and canvases,
              huge bodies, path-like ids, wrong methods, a missing or wrong token) each get a 4xx with a message;
              the server still answers afterwards and exits cleanly (under ASan: no leak, no error)
  plan        POST /api/plan resolves and plans without queuing; a request beyond the server's budget is refused
              with 422 and the planner's message, at /api/plan and at /api/jobs, and nothing is queued; refine,
              output_size and shift are taken with generate's checks (a job at output_size 96x80 writes a 96x80 MP4);
              'cache' (true or a threshold) runs a job with step caching, its figures in the report; bad values 400;
              'attention' takes auto, bf16, fp8 or int8, anything else 400
  token       a bind beyond loopback without a token refuses to start; with --token every request needs it
  reuse       the reused jobs of a batch start their DiT at least 3x sooner than the first (the better of two; what they reused is in
              its report)
  keyframes   on h3-tinymodel's model (a vision tower and a video VAE encoder): a job with a first frame and a
              keyframe at frame 10 sent as base64 (a data: URL and plain) runs to done with 2 keyframes in its
              report, its images stored under DATA/uploads/ and removed with the job; bad images (not base64,
              empty, a name instead of an image, a negative frame) get 400 and leave no upload; on a model
              without a vision tower (h3-tinymodel --no-keyframes) a keyframe job is refused with 422 naming it;
              the small model (the default, which has one) runs a job with a first frame to done
  loras       with --lora-dir: GET /api/info lists the folder's LoRA files (nothing else of it); a job naming one
              runs to done with latents other than the same job's without it, and the job after it without the
              LoRA gives the first job's latents bit for bit (the server's kept DiT never carries a job's LoRA);
              bad LoRA options (no folder, path-like or hidden names, another extension, a missing file, a wrong
              strength, extra keys, too many) get 400
  audio       a job with a soundtrack sent as a WAV in a data: URL runs to done, its MP4 carries sound, the upload
              goes with the job; bad soundtracks (not a string, a name, not base64, empty, an image) get 400 and
              leave no upload
Usage: serve_test.py PATH/TO/h3run [case ...]. Needs ffprobe.
"""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

H3RUN = sys.argv[1]
ONLY = sys.argv[2:]
TMP = tempfile.mkdtemp(prefix="h3serve-")
FAILS = []
TINY = {"frames": 5, "size": "64x64", "steps": 2, "x264_preset": "ultrafast"}  # a job of a fraction of a second
TOKEN = "t0ken-for-the-test-0123456789"


def fail(msg):
    FAILS.append(msg)
    print("FAIL:", msg, flush=True)


def check(cond, msg):
    if not cond:
        fail(msg)
    return cond


class Server:
    """h3run serve on 127.0.0.1 with a free port, its output in DATA/server.log."""

    def __init__(self, data, *extra):
        self.data = data
        os.makedirs(data, exist_ok=True)
        self.log = open(os.path.join(data, "server.log"), "ab")
        self.proc = subprocess.Popen([H3RUN, "serve", "--listen", "127.0.0.1:0", "--data", data, *extra],
                                     stdout=subprocess.PIPE, stderr=self.log)
        line = self.proc.stdout.readline().decode()
        if "listening on http://127.0.0.1:" not in line:
            raise RuntimeError("the server did not start: %r; log: %s" % (line, self.log_text()))
        self.port = int(line.split("127.0.0.1:")[1].split("/")[0])
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        with open(os.path.join(self.data, "server.log"), "rb") as f:
            return f.read().decode(errors="replace")[-3000:]

    def request(self, method, path, body=None, headers=None, raw=False, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode("utf-8", errors="surrogatepass")
        c.putrequest(method, path, skip_accept_encoding=True)
        for k, v in (headers or {}).items():
            c.putheader(k, v)
        if body is not None:
            c.putheader("Content-Length", str(len(body)))
        c.endheaders()
        if body is not None:
            c.send(body)
        r = c.getresponse()
        data = r.read()
        c.close()
        if raw:
            return r.status, data, r
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, {"_raw": data[:200]}

    def submit(self, req, **kw):
        st, job = self.request("POST", "/api/jobs", req, **kw)
        check(st == 201, "POST /api/jobs %s: %s %s" % (req, st, job))
        return job.get("id")

    def wait(self, job_id, states=("done", "failed", "cancelled"), timeout=300):
        end = time.time() + timeout
        while time.time() < end:
            st, job = self.request("GET", "/api/jobs/%d" % job_id)
            if st == 200 and job["state"] in states:
                return job
            time.sleep(0.1)
        fail("job %s did not reach %s in %d s: %s" % (job_id, states, timeout, job))
        return job

    def events(self, job_id, until=None, timeout=300):
        """The job's SSE stream: (event, data) pairs until it ends (or until(event, data) is true)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.request("GET", "/api/jobs/%d/events" % job_id)
        r = c.getresponse()
        check(r.status == 200 and r.getheader("Content-Type") == "text/event-stream",
              "events: %s %s" % (r.status, r.getheader("Content-Type")))
        out, ev = [], None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.decode().rstrip("\n")
            if line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                out.append((ev, data))
                if until and until(ev, data):
                    break
                if ev == "status" and data.get("state") in ("done", "failed", "cancelled", "gone"):
                    break  # the stream's last event (the connection may stay open for the next request)
        c.close()
        return out

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=120)
        self.log.close()
        return rc


def ffprobe_frames(path):
    r = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-count_frames", "-show_entries",
                        "stream=codec_name,nb_read_frames", "-of", "csv=p=0", path], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    parts = r.stdout.strip().split(",")
    return int(parts[1]) if len(parts) == 2 and parts[0] == "h264" else None


def sanitizer_clean(srv, what):
    text = srv.log_text()
    for word in ("AddressSanitizer", "LeakSanitizer", "runtime error"):
        check(word not in text, "%s: sanitizer report in the server's log: %s" % (what, text[-1500:]))


# ---- cases ---------------------------------------------------------------------------------------------------


def case_submit():
    srv = Server(os.path.join(TMP, "submit"))
    job_id = srv.submit(dict(TINY, prompt="a red circle moves right", frames=22, seed=7))
    evs = srv.events(job_id)
    kinds = [e for e, _ in evs]
    steps = [d for e, d in evs if e == "progress" and d.get("stage") == "dit" and d["event"] == "step"]
    check(kinds[0] == "status" and kinds[-1] == "status", "the stream begins and ends with the status: %s" % kinds)
    check(evs[-1][1]["state"] == "done", "the last status is done: %s" % evs[-1][1])
    check(len(steps) == 2 and steps[-1]["step"] == 2, "the DiT's 2 steps as progress events: %s" % steps)
    check(any(d.get("event") == "done" for e, d in evs if e == "progress"), "the run's done event")
    st, body, r = srv.request("GET", "/api/jobs/%d/video" % job_id, raw=True)
    path = os.path.join(TMP, "submit.mp4")
    with open(path, "wb") as f:
        f.write(body)
    check(st == 200 and r.getheader("Accept-Ranges") == "bytes", "video: %s %s" % (st, r.getheaders()))
    check(ffprobe_frames(path) == 22, "ffprobe reads 22 H.264 frames from the downloaded MP4")
    n = len(body)
    for rng, want in (("bytes=0-99", body[:100]), ("bytes=100-", body[100:]), ("bytes=-50", body[-50:]),
                      ("bytes=%d-%d" % (n - 10, n + 1000), body[n - 10:])):
        st, part, r = srv.request("GET", "/api/jobs/%d/video" % job_id, headers={"Range": rng}, raw=True)
        check(st == 206 and part == want, "Range %s: %s, %d bytes" % (rng, st, len(part)))
        check(r.getheader("Content-Range", "").endswith("/%d" % n), "Content-Range of %s: %s" %
              (rng, r.getheader("Content-Range")))
    st, part, r = srv.request("GET", "/api/jobs/%d/video" % job_id, headers={"Range": "bytes=%d-" % n}, raw=True)
    check(st == 416 and r.getheader("Content-Range") == "bytes */%d" % n, "a range past the end: %s" % st)
    job = srv.wait(job_id)
    check(job["report"]["frames"] == 22 and job["report"]["seed"] == 7, "the report: %s" % job["report"])
    check(srv.stop() == 0, "the server exits 0 on SIGTERM")
    sanitizer_clean(srv, "submit")


def case_cancel():
    srv = Server(os.path.join(TMP, "cancel"))
    long_job = srv.submit({"prompt": "a slow one", "steps": 400, "frames": 56, "size": "128x128"})
    queued = srv.submit(dict(TINY, prompt="never runs"))
    # running: its first DiT step is reported
    srv.events(long_job, until=lambda e, d: e == "progress" and d.get("stage") == "dit" and d.get("step", 0) >= 1)
    t0 = time.time()
    st, job = srv.request("POST", "/api/jobs/%d/cancel" % long_job)
    check(st == 200 and job.get("state") == "cancelled", "cancel of the running job: %s %s" % (st, job))
    check(time.time() - t0 < 30, "the running job stopped in %.1f s" % (time.time() - t0))
    check(not any(f.startswith("%d." % long_job) for f in os.listdir(os.path.join(srv.data, "jobs"))),
          "a cancelled job leaves no file: %s" % os.listdir(os.path.join(srv.data, "jobs")))
    st, job = srv.request("POST", "/api/jobs/%d/cancel" % long_job)
    check(st == 200 and job.get("state") == "cancelled", "a second cancel: %s %s" % (st, job))
    st, body = srv.request("DELETE", "/api/jobs/%d" % queued)
    check(st == 200 and body.get("deleted") == queued, "DELETE of a queued job: %s %s" % (st, body))
    st, body = srv.request("GET", "/api/jobs/%d" % queued)
    check(st == 404 and "no job" in body.get("error", ""), "a deleted job is gone: %s %s" % (st, body))
    after = srv.submit(dict(TINY, prompt="after the cancel"))
    check(srv.wait(after)["state"] == "done", "the queue goes on after a cancel")
    st, body = srv.request("POST", "/api/jobs/%d/cancel" % after)
    check(st == 409, "cancelling a done job is a conflict: %s %s" % (st, body))
    check(srv.stop() == 0, "the server exits 0")
    sanitizer_clean(srv, "cancel")


def case_concurrent():
    srv = Server(os.path.join(TMP, "concurrent"))
    ids, lock = [], threading.Lock()

    def client(k):
        for i in range(5):
            st, job = srv.request("POST", "/api/jobs", dict(TINY, prompt="client %d job %d" % (k, i), seed=k * 10 + i))
            with lock:
                ids.append(job.get("id") if st == 201 else None)
            srv.request("GET", "/api/jobs")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(len(ids) == 20 and None not in ids and len(set(ids)) == 20, "20 jobs accepted with distinct ids: %s" % ids)
    for i in ids:
        if i:
            srv.wait(i, timeout=600)
    st, body = srv.request("GET", "/api/jobs")
    jobs = body["jobs"]
    check(sorted(j["id"] for j in jobs) == sorted(i for i in ids if i), "none lost: every accepted job is listed")
    check(all(j["state"] == "done" for j in jobs), "all done: %s" % [(j["id"], j["state"]) for j in jobs])
    by_id = sorted(jobs, key=lambda j: j["id"])
    starts = [j["started"] for j in by_id]
    ends = [j["finished"] for j in by_id]
    check(starts == sorted(starts) and ends == sorted(ends), "run in the order accepted (start and end times)")
    check(all(j["started"] >= p["finished"] for p, j in zip(by_id, by_id[1:])), "one job at a time")
    check(srv.stop() == 0, "the server exits 0")
    sanitizer_clean(srv, "concurrent")


def case_crash():
    data = os.path.join(TMP, "crash")
    srv = Server(data)
    first = srv.submit({"prompt": "killed mid-run", "steps": 20, "frames": 56, "size": "128x128", "seed": 3})
    rest = [srv.submit(dict(TINY, prompt="queued %d" % i)) for i in range(3)]
    # past the checkpoint after 5 model calls (DATA/jobs/<id>.ckpt): the job resumes from it
    srv.events(first, until=lambda e, d: e == "progress" and d.get("stage") == "dit" and d.get("step", 0) >= 7)
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait()
    srv.log.close()
    jobs_dir = os.path.join(data, "jobs")
    check(not os.path.exists(os.path.join(jobs_dir, "%d.mp4" % first)), "no result of the killed job")
    with open(os.path.join(jobs_dir, "%d.mp4.partial" % first), "wb") as f:  # as a death while writing leaves
        f.write(b"\0" * 1000)
    srv = Server(data)
    for i in [first] + rest:
        job = srv.wait(i, timeout=600)
        check(job["state"] == "done", "job %d after the restart: %s %s" % (i, job["state"], job.get("message")))
    st, job = srv.request("GET", "/api/jobs/%d" % first)
    check(job["attempts"] == 2, "the killed job ran again: %d attempts" % job["attempts"])
    resumed = job.get("report", {}).get("resumed_step", 0)
    check(resumed >= 5, "the killed job resumed from its checkpoint: after %s of 20 model calls" % resumed)
    check(not os.path.exists(os.path.join(jobs_dir, "%d.ckpt" % first)), "the checkpoint is removed when done")
    names = os.listdir(jobs_dir)
    check(not any(n.endswith(".partial") for n in names), "no unfinished file left: %s" % names)
    check(ffprobe_frames(os.path.join(jobs_dir, "%d.mp4" % first)) == 56, "the killed job's clip is whole (56 frames)")
    for i in rest:
        check(ffprobe_frames(os.path.join(jobs_dir, "%d.mp4" % i)) == 5, "queued job %d's clip is whole" % i)
    check(srv.stop() == 0, "the server exits 0")
    sanitizer_clean(srv, "crash")


def bad_requests():
    """(method, path, body, headers, what): every one must get a 4xx with a message."""
    B = []
    post = lambda body, what: B.append(("POST", "/api/jobs", body, None, what))
    plan = lambda body, what: B.append(("POST", "/api/plan", body, None, what))
    for text in ["", "{", "}", "[", "]", "{\"prompt\":}", "null", "\"a prompt\"", "123", "[1, 2]", "true",
                 "{\"prompt\": \"a\",}", "{\"prompt\" \"a\"}", "{\"prompt\": \"a\"}{\"x\": 1}", "{'prompt': 'a'}",
                 "{\"prompt\": \"a\" /* c */}", "{\"prompt\": \"\\ud800\"}", "{\"prompt\": \"a\\u0000b\"}",
                 "[" * 5000 + "]" * 5000, "{\"a\":" * 3000 + "1" + "}" * 3000, "\xff\xfe{}",
                 "{\"prompt\": \"a\", \"prompt\": \"b\"}", "{\"prompt\": NaN}", "{\"frames\": Infinity}",
                 "{\"prompt\": \"unterminated}", " ", "\n\n", "{\"prompt\": 'single'}", "{prompt: \"a\"}"]:
        post(text, "malformed JSON %r" % text[:30])
        plan(text, "malformed JSON to the plan %r" % text[:30])
    wrong = {
        "prompt": [1, True, None, [], {}, 2.5],
        "frames": ["56", 56.5, True, None, [], {}, -1, 0, 10**9, 14401],
        "seconds": ["2", True, None, -1, 0, 0.1, 10**9, []],
        "size": [128, "128", "128x", "x128", "0x0", "33x32", "128x1024", "-128x128", "1e3x1e3", "", "128x128x3",
                 None, "64 x 64", "9999999999x64", "32x200"],
        "steps": [0, -5, 1001, "4", 4.5, None, True],
        "sampler": ["", "foo", 1, None, ["euler"]],
        "scheduler": ["bar", None, 3, ""],
        "seed": [-1, "5", 1.5, 2**60, None, True],
        "x264_preset": ["warp", 3, "", None],
        "wav": ["yes", 1, None],
        "latents": [0, "true"],
    }
    for key, values in wrong.items():
        for v in values:
            post(dict(TINY, **{"prompt": "x", key: v}), "%s = %r" % (key, v))
    for key in ["output", "model", "png_dir", "device", "Prompt", "prompt ", "../x", "__proto__", "frames2",
                "vram_budget", "path", "data", "", "latents_path", "token"]:
        post(dict(TINY, **{"prompt": "x", key: "/etc/passwd"}), "unknown option %r" % key)
    for frames in [2, 6, 7, 10, 21, 23, 55, 57, 100, 123, 125, 1000]:
        post(dict(TINY, prompt="x", frames=frames), "frames %d (not 17n+5)" % frames)
        plan(dict(TINY, prompt="x", frames=frames), "frames %d (not 17n+5) to the plan" % frames)
    post({"prompt": "x", "frames": 22, "seconds": 1}, "frames and seconds")
    post({"frames": 22}, "no prompt")
    post({}, "no options")
    post({"prompt": "x" * (1024 * 1024 + 1)}, "a prompt over 1 MiB")
    post("{\"prompt\": \"" + "y" * (4 * 1024 * 1024) + "\"}", "a 4 MiB body")
    post("z" * (64 * 1024 * 1024 + 1), "a body one byte over the limit (64 MiB)")
    plan("[" * (3 * 1024 * 1024 + 10), "a huge body to the plan")
    for path in ["/api/jobs/../../etc/passwd", "/api/jobs/..%2F..%2Fetc%2Fpasswd", "/api/jobs/-1", "/api/jobs/0",
                 "/api/jobs/abc", "/api/jobs/1.0", "/api/jobs/%00", "/api/jobs/999999", "/api/jobs/1234567890123456789",
                 "/api/jobs/1/../../jobs.db", "/api/jobs/1/video/../../jobs.db", "/api/jobs/1/nope", "/etc/passwd",
                 "/api/../jobs.db", "/api/jobs.db", "/api/jobs/1%2F..%2F..%2Fjobs.db", "/api/jobs/0x10",
                 "/api/jobs/1e3", "/api/jobs/+1", "/api/jobs/%2e%2e", "/api/jobs/999999/video",
                 "/api/jobs/999999/events", "/jobs/1.mp4", "/jobs.db", "/api/", "/api/jobs/1/video/x",
                 "/api/jobs/%C3%A9%FF", "/api/jobs/1%00", "/api/jobs%00", "/api/jobs/999999/wav", "/api/jobs/999999/latents"]:
        B.append(("GET", path, None, None, "path %r" % path))
    B.append(("DELETE", "/api/jobs/999999", None, None, "DELETE of no job"))
    B.append(("DELETE", "/api/jobs/../x", None, None, "DELETE of a path"))
    B.append(("POST", "/api/jobs/999999/cancel", None, None, "cancel of no job"))
    for method, path in [("PUT", "/api/jobs"), ("DELETE", "/api/jobs"), ("PATCH", "/api/jobs/1"),
                         ("DELETE", "/api/plan"), ("GET", "/api/plan"), ("POST", "/api/info"),
                         ("POST", "/"), ("PUT", "/api/jobs/1/video"), ("GET", "/api/jobs/1/cancel"),
                         ("POST", "/api/jobs/1/events")]:
        B.append((method, path, None, None, "%s %s" % (method, path)))
    return B


def case_bad():
    srv = Server(os.path.join(TMP, "bad"))
    done_id = srv.submit(dict(TINY, prompt="one good job"))
    srv.wait(done_id)
    cases = bad_requests()
    n4 = 0
    for method, path, body, headers, what in cases:
        try:
            st, resp = srv.request(method, path, body, headers)
        except Exception as e:  # noqa: BLE001 - a dropped connection is a failure like any other
            fail("%s: no answer (%s)" % (what, e))
            continue
        if check(400 <= st < 500, "%s: status %d %s" % (what, st, resp)):
            n4 += 1
        check(isinstance(resp.get("error"), str) and len(resp["error"]) > 10, "%s: a message: %s" % (what, resp))
    st, _ = srv.request("GET", "/api/info")
    check(st == 200, "the server still answers after %d bad requests" % len(cases))
    st, body = srv.request("GET", "/api/jobs")
    check(st == 200 and [j["id"] for j in body["jobs"]] == [done_id], "no bad request made a job: %s" % body)
    check(n4 >= 200, "at least 200 bad requests answered 4xx: %d of %d" % (n4, len(cases)))
    print("  %d bad requests: %d answered 4xx with a message" % (len(cases), n4))
    check(srv.stop() == 0, "the server exits 0 after the bad requests")
    sanitizer_clean(srv, "bad")
    # the token: missing, wrong or malformed are 401
    srv = Server(os.path.join(TMP, "bad-token"), "--token", TOKEN)
    n401 = 0
    for headers in [None, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                    {"Authorization": "Bearer " + TOKEN[:-1]}, {"Authorization": "Basic " + TOKEN},
                    {"Authorization": "Bearer " + TOKEN + "x"}, {"Authorization": ""}]:
        for method, path, body in [("GET", "/api/jobs", None), ("POST", "/api/jobs", dict(TINY, prompt="x")),
                                   ("GET", "/", None), ("GET", "/api/jobs/1/video", None)]:
            st, resp = srv.request(method, path, body, headers)
            if check(st == 401 and "token" in resp.get("error", ""), "%s %s with %s: %s" % (method, path, headers, st)):
                n401 += 1
    st, resp = srv.request("GET", "/api/jobs?token=nope")
    check(st == 401, "a wrong ?token=: %s" % st)
    print("  %d requests without the right token: 401" % n401)
    check(srv.stop() == 0, "the token server exits 0")
    sanitizer_clean(srv, "bad-token")


def case_token():
    for listen in ["0.0.0.0:0", "[::]:0", "192.0.2.1:0"]:
        r = subprocess.run([H3RUN, "serve", "--listen", listen, "--data", os.path.join(TMP, "tok")],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 2 and "--token" in r.stderr, "--listen %s without a token: %d %s" %
              (listen, r.returncode, r.stderr))
    for args in [["--token", "short"], ["--listen", "nohost"], ["--listen", "127.0.0.1:99999"],
                 ["--token", TOKEN, "--token-file", "/nonexistent"], ["--device", "tpu"],
                 ["--device", "cpu", "--gpus", "2"]]:
        r = subprocess.run([H3RUN, "serve", "--data", os.path.join(TMP, "tok"), *args], capture_output=True, text=True,
                           timeout=60)
        check(r.returncode == 2 and "error" in r.stderr, "serve %s: %d %s" % (args, r.returncode, r.stderr))
    tok = os.path.join(TMP, "token.txt")
    with open(tok, "w") as f:
        f.write(TOKEN + "\n")
    srv = Server(os.path.join(TMP, "token"), "--token-file", tok)
    auth = {"Authorization": "Bearer " + TOKEN}
    st, _ = srv.request("GET", "/api/jobs", headers=auth)
    check(st == 200, "with the token: %d" % st)
    st, _ = srv.request("GET", "/api/jobs?token=" + TOKEN)
    check(st == 200, "with ?token=: %d" % st)
    st, _ = srv.request("GET", "/api/jobs")
    check(st == 401, "without it on loopback too, once given: %d" % st)
    check(srv.stop() == 0, "the server exits 0")


def case_plan():
    srv = Server(os.path.join(TMP, "plan"))
    st, body = srv.request("POST", "/api/plan", {"prompt": "x", "seconds": 1})
    check(st == 200 and body["request"]["frames"] == 39 and body["request"]["size"] == "128x128" and
          "host memory" in body["plan"], "the plan of a good request: %s %s" % (st, body))
    st, body = srv.request("GET", "/api/jobs")
    check(st == 200 and body["jobs"] == [], "a plan queues nothing: %s" % body)
    # generate's refine, delivery size and shifts as job options, with its messages
    st, body = srv.request("POST", "/api/plan", dict(TINY, prompt="x", refine="128x128"))
    check(st == 200 and body["request"].get("refine") == "128x128:0.5" and body["request"].get("shift") == "12:3",
          "a refine plan: %s %s" % (st, body))
    for extra, want in (({"output_size": "1919x1080"}, "1918x1080"), ({"shift": "x"}, "--shift takes V or V:A"),
                        ({"refine": "32x32"}, "refine"), ({"refine": 5}, "a non-empty string")):
        st, body = srv.request("POST", "/api/plan", dict(TINY, prompt="x", **extra))
        check(st == 400 and want in body.get("error", ""), "plan %s: %s %s" % (extra, st, body))
    job = srv.wait(srv.submit(dict(TINY, prompt="a delivery size", output_size="96x80", shift="6:3")))
    r = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "stream=width,height",
                        "-of", "csv=p=0", os.path.join(TMP, "plan", "jobs", "%d.mp4" % job["id"])],
                       capture_output=True, text=True)
    check(job["state"] == "done" and r.stdout.strip() == "96,80", "output_size 96x80: %s %s" % (job["state"], r.stdout))
    # step caching as a job option: true (the default threshold) or a threshold; its figures in the report
    job = srv.wait(srv.submit(dict(TINY, prompt="a cached one", steps=30, cache=True)))
    rep = job.get("report", {}).get("cache", {})
    check(job["state"] == "done" and rep.get("calls") == 30 and 0 < rep.get("skipped", 0) < 30,
          "cache true: %s %s" % (job["state"], rep))
    for val, ok in ((0.05, True), (False, True), (0, False), (-1, False), (11, False), ("0.2", False), ([], False)):
        st, body = srv.request("POST", "/api/plan", dict(TINY, prompt="x", cache=val))
        check((st == 200) == ok and (ok or "option 'cache' takes" in body.get("error", "")),
              "cache %r: %s %s" % (val, st, body))
    # the DiT's attention as a job option (generate's --attention): a mode, named in the plan; anything else 400
    for val, ok in (("fp8", True), ("int8", True), ("bf16", True), ("auto", True), ("fp9", False), (8, False)):
        st, body = srv.request("POST", "/api/plan", dict(TINY, prompt="x", attention=val))
        check((st == 200) == ok and (ok or "attention" in body.get("error", "")), "attention %r: %s %s" % (val, st, body))
    # sparse attention's rule (generate's --sparse, implying it); a bad rule or another mode beside it: 400
    for extra, ok, msg in (({"sparse": "0.5,0,1"}, True, ""), ({"sparse": "1.3,0.9,0.2"}, False, "TAU,START,END"),
                           ({"sparse": 1.3}, False, "sparse"),
                           ({"sparse": "1.3", "attention": "fp8"}, False, "give --attention sparse")):
        st, body = srv.request("POST", "/api/plan", dict(TINY, prompt="x", **extra))
        check((st == 200) == ok and msg in body.get("error", ""), "%r: %s %s" % (extra, st, body))
    check(srv.stop() == 0, "the server exits 0")
    # a host budget too small for the DiT stage: the planner's refusal, before the job is accepted
    srv = Server(os.path.join(TMP, "plan-small"), "--ram-budget", "1MiB")
    for path in ("/api/plan", "/api/jobs"):
        st, body = srv.request("POST", path, {"prompt": "x"})
        check(st == 422 and "fewer frames or a smaller canvas" in body.get("error", ""),
              "%s beyond the budget: %s %s" % (path, st, body))
    st, body = srv.request("GET", "/api/jobs")
    check(st == 200 and body["jobs"] == [], "a refused job is not queued: %s" % body)
    check(srv.stop() == 0, "the server exits 0")
    sanitizer_clean(srv, "plan")


def case_reuse():
    srv = Server(os.path.join(TMP, "reuse"))
    req = {"prompt": "a green square slides down, a low tone", "steps": 4}
    a = srv.wait(srv.submit(dict(req, seed=1)))
    b = srv.wait(srv.submit(dict(req, seed=2)))
    b2 = srv.wait(srv.submit(dict(req, seed=4)))
    c = srv.wait(srv.submit(dict(req, prompt="another prompt: the text encoder runs", seed=3)))
    ra, rb, rc = a["report"], b["report"], c["report"]
    # the reused start is a few milliseconds; the better of two such jobs, so one scheduler stall under a loaded
    # machine (CI ran tests beside it: 0.095 s once, against 0.004-0.013 s) does not decide the ratio
    ratio = ra["dit_start_s"] / max(min(rb["dit_start_s"], b2["report"]["dit_start_s"]), 1e-9)
    print("  the DiT began at %.4f s (first job), %.4f and %.4f s (second and third: %.1fx sooner; reused %s), %.4f s "
          "(a new prompt; reused %s)" % (ra["dit_start_s"], rb["dit_start_s"], b2["report"]["dit_start_s"], ratio,
                                         ", ".join(rb["reused"]), rc["dit_start_s"], ", ".join(rc["reused"])))
    check(ra["reused"] == [], "the first job loads everything: reused %s" % ra["reused"])
    check(set(rb["reused"]) >= {"files", "tokenizer", "prompt", "dit", "audio_vae", "video_vae"},
          "the second job reused %s" % rb["reused"])
    check("text_encoder" in rc["reused"] and "prompt" not in rc["reused"], "a new prompt: reused %s" % rc["reused"])
    check(ratio >= 3, "the reused jobs' DiT began %.1fx sooner than the first's (>= 3)" % ratio)
    check(srv.stop() == 0, "the server exits 0")
    sanitizer_clean(srv, "reuse")


def ppm_b64(w, h, seed):
    """A binary PPM (libav reads it) as base64: a colour field, different per seed."""
    import base64
    px = bytes(((x * 7 + seed * 40) % 256, (y * 9 + seed * 90) % 256, (x + y + seed * 17) % 256)[c]
               for y in range(h) for x in range(w) for c in range(3))
    return base64.b64encode(b"P6 %d %d 255\n" % (w, h) + px).decode()


def case_keyframes():
    tiny = os.path.join(TMP, "tiny-model")
    subprocess.run([os.path.join(os.path.dirname(os.path.abspath(H3RUN)), "h3-tinymodel"), tiny],
                   check=True, stdout=subprocess.DEVNULL)
    data = os.path.join(TMP, "keyframes")
    srv = Server(data, "--model", tiny)
    uploads = os.path.join(data, "uploads")
    req = dict(TINY, prompt="a red ball", frames=22, first_frame="data:image/x-portable-pixmap;base64," +
               ppm_b64(40, 24, 1), keyframes=[{"image": ppm_b64(30, 30, 2), "frame": 10}])
    job = srv.wait(srv.submit(req))
    check("text_encoder" not in job.get("report", {}).get("reused", []),
          "the first job opened the text encoder, it did not reuse it: %s" % job.get("report", {}).get("reused"))
    check(job.get("state") == "done" and job.get("report", {}).get("keyframes") == 2,
          "a job with keyframes: %s" % {k: job.get(k) for k in ("state", "message", "report")})
    stored = job.get("request", {})
    check(str(stored.get("first_frame", "")).startswith("upload:") and
          str(stored.get("keyframes", [{}])[0].get("image", "")).startswith("upload:"),
          "the stored request names its uploads: %s" % stored)
    check(len(os.listdir(uploads)) == 2, "two uploads stored: %s" % os.listdir(uploads))
    st, _ = srv.request("DELETE", "/api/jobs/%d" % job["id"])
    check(st == 200 and os.listdir(uploads) == [], "the uploads go with the job: %s %s" % (st, os.listdir(uploads)))
    bad = [({"first_frame": "not base64 !!"}, "base64"), ({"first_frame": ""}, "first_frame"),
           ({"last_frame": "upload:" + "0" * 32 + ".png"}, "not a name"),
           ({"keyframes": [{"image": ppm_b64(8, 8, 3), "frame": -1}]}, "frame from 0"),
           ({"keyframes": [{"image": ppm_b64(8, 8, 3)}]}, "frame from 0"),
           ({"first_frame": ppm_b64(8, 8, 1), "keyframes": "x"}, "keyframes")]
    for extra, want in bad:
        st, body = srv.request("POST", "/api/jobs", dict(TINY, prompt="x", **extra))
        check(st == 400 and want in body.get("error", ""), "bad keyframes %s: %s %s" % (list(extra), st, body))
    check(os.listdir(uploads) == [], "refused requests leave no upload: %s" % os.listdir(uploads))
    st, body = srv.request("POST", "/api/plan", dict(TINY, prompt="x", first_frame=ppm_b64(40, 24, 1)))
    check(st == 200 and os.listdir(uploads) == [], "a plan with a keyframe keeps no upload: %s %s" % (st, body))
    check(srv.stop() == 0, "the server exits 0")
    sanitizer_clean(srv, "keyframes")
    # a model whose text encoder has no vision tower (h3-tinymodel --no-keyframes): refused, its upload removed
    notower = os.path.join(TMP, "tiny-notower")
    subprocess.run([os.path.join(os.path.dirname(os.path.abspath(H3RUN)), "h3-tinymodel"), "--no-keyframes", notower],
                   check=True, stdout=subprocess.DEVNULL)
    srv = Server(os.path.join(TMP, "keyframes-notower"), "--model", notower)
    st, body = srv.request("POST", "/api/jobs", dict(TINY, prompt="x", first_frame=ppm_b64(40, 24, 1)))
    check(st == 422 and "vision tower" in body.get("error", ""), "keyframes without a vision tower: %s %s" % (st, body))
    check(os.listdir(os.path.join(TMP, "keyframes-notower", "uploads")) == [], "the refused job's upload is removed")
    check(srv.stop() == 0, "the server exits 0")
    # the small model (the default) has one: a first frame is taken
    srv = Server(os.path.join(TMP, "keyframes-small"))
    job = srv.wait(srv.submit(dict(TINY, prompt="x", first_frame=ppm_b64(40, 24, 1))))
    check(job.get("state") == "done" and job.get("report", {}).get("keyframes") == 1,
          "a first frame on the small model: %s" % {k: job.get(k) for k in ("state", "message", "report")})
    check(srv.stop() == 0, "the server exits 0")


def case_loras():
    ld = os.path.join(TMP, "lora-dir")
    os.makedirs(os.path.join(ld, "sub"), exist_ok=True)
    with open(os.path.join(ld, "notes.txt"), "w") as f:
        f.write("not a LoRA")
    srv = Server(os.path.join(TMP, "loras-none"))
    st, info = srv.request("GET", "/api/info")
    st2, body = srv.request("POST", "/api/jobs", dict(TINY, prompt="x", loras=[{"name": "a.safetensors"}]))
    check(st == 200 and info.get("loras") == [] and st2 == 400 and "--lora-dir" in body.get("error", ""),
          "no LoRA folder: info %s, a job with a LoRA: %s %s" % (info.get("loras"), st2, body))
    check(srv.stop() == 0, "the server exits 0")
    lora = os.path.join(ld, "shape.safetensors")
    r = subprocess.run([os.path.join(os.path.dirname(os.path.abspath(H3RUN)), "h3-testdata"), "lora", lora, "--dit",
                        os.path.join(info["model"], "transformer"), "--rank", "4", "--seed", "3"],
                       capture_output=True, text=True)
    check(r.returncode == 0 and os.path.exists(lora), "h3-testdata lora: %s %s" % (r.returncode, r.stderr[-500:]))
    srv = Server(os.path.join(TMP, "loras"), "--lora-dir", ld)
    st, info = srv.request("GET", "/api/info")
    check(st == 200 and info.get("loras") == [{"name": "shape.safetensors", "bytes": os.path.getsize(lora)}],
          "GET /api/info lists the LoRA folder's .safetensors files only: %s" % info.get("loras"))
    base = dict(TINY, prompt="a blue triangle spins, a high tone", seed=11, latents=True)
    ids = [srv.submit(base), srv.submit(dict(base, loras=[{"name": "shape.safetensors", "strength": 1.0}])),
           srv.submit(base)]
    jobs = [srv.wait(i) for i in ids]
    check(all(j["state"] == "done" for j in jobs), "the three jobs: %s" % [(j["state"], j.get("message")) for j in jobs])
    lat = []
    for i in ids:
        st, raw, _ = srv.request("GET", "/api/jobs/%d/latents" % i, raw=True)
        lat.append(raw if st == 200 else b"")
    check(lat[0] and lat[1] and lat[0] != lat[1], "the LoRA changes the latents")
    check(lat[0] == lat[2], "the job after the LoRA's gives the first job's latents bit for bit")
    check("dit" not in jobs[1]["report"]["reused"], "the LoRA's job opened its own DiT: reused %s" %
          jobs[1]["report"]["reused"])
    bad = [([{"name": "../shape.safetensors"}], "not a LoRA's name"), ([{"name": "sub/x.safetensors"}], "not a LoRA"),
           ([{"name": ".shape.safetensors"}], "not a LoRA"), ([{"name": "notes.txt"}], "not a LoRA"),
           ([{"name": "missing.safetensors"}], "no LoRA 'missing"), ([{"name": "sub.safetensors"}], "no LoRA"),
           ([{"name": "shape.safetensors", "strength": "1"}], "must be"),
           ([{"name": "shape.safetensors", "strength": 1000}], "from -100 to 100"),
           ([{"name": "shape.safetensors", "path": "/etc/passwd"}], "must be"), (["shape.safetensors"], "must be"),
           ({"name": "shape.safetensors"}, "an array"), ([{"name": "shape.safetensors"}] * 17, "at most 16"),
           ([{"name": "shape.safetensors\u0000.txt"}], "")]
    os.makedirs(os.path.join(ld, "sub.safetensors"), exist_ok=True)
    for loras, want in bad:
        st, body = srv.request("POST", "/api/jobs", dict(TINY, prompt="x", loras=loras))
        check(st == 400 and want in body.get("error", ""), "loras %s: %s %s" % (str(loras)[:80], st, body))
    st, body = srv.request("GET", "/api/jobs")
    check(len(body["jobs"]) == 3, "no refused job is queued: %d jobs" % len(body["jobs"]))
    check(srv.stop() == 0, "the server exits 0")
    sanitizer_clean(srv, "loras")


def wav_b64(seconds, hz=523, rate=32000):
    """A mono 16-bit WAV of a tone, as base64."""
    import base64, io, math, struct, wave
    buf = io.BytesIO()
    w = wave.open(buf, "wb")
    w.setnchannels(1)
    w.setsampwidth(2)
    w.setframerate(rate)
    w.writeframes(b"".join(struct.pack("<h", int(12000 * math.sin(2 * math.pi * hz * i / rate)))
                           for i in range(int(seconds * rate))))
    w.close()
    return base64.b64encode(buf.getvalue()).decode()


def case_audio():
    data = os.path.join(TMP, "audio")
    srv = Server(data)
    uploads = os.path.join(data, "uploads")
    job = srv.wait(srv.submit(dict(TINY, prompt="a tone and a square", steps=4, frames=22,
                                   audio="data:audio/wav;base64," + wav_b64(1.2))))
    check(job["state"] == "done" and abs(job["report"].get("soundtrack_s", 0) - 1.2) < 0.01,
          "a job with a soundtrack: %s %s" % (job["state"], job.get("report", {}).get("soundtrack_s")))
    stored = job["request"].get("audio", "")
    check(stored.startswith("upload:") and stored.endswith(".wav") and len(os.listdir(uploads)) == 1,
          "the soundtrack is stored as an upload: %s %s" % (stored, os.listdir(uploads)))
    r = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "a:0", "-show_entries", "stream=codec_name",
                        "-of", "csv=p=0", os.path.join(data, "jobs", "%d.mp4" % job["id"])], capture_output=True,
                       text=True)
    check(r.stdout.strip() == "aac", "the clip carries its sound: %r" % r.stdout)
    st, _ = srv.request("DELETE", "/api/jobs/%d" % job["id"])
    check(st == 200 and os.listdir(uploads) == [], "the soundtrack goes with the job: %s" % os.listdir(uploads))
    import base64
    for val, want in ((5, "must be a sound file"), ("upload:" + "0" * 32 + ".wav", "not a name"),
                      ("!!!", "not base64"), ("", "is empty"), (base64.b64encode(b"P6\n1 1\n255\nabc").decode(),
                                                                 "no audio stream")):
        st, body = srv.request("POST", "/api/jobs", dict(TINY, prompt="x", audio=val))
        check(st == 400 and want in body.get("error", ""), "audio %r: %s %s" % (str(val)[:30], st, body))
    check(os.listdir(uploads) == [], "refused soundtracks leave no upload: %s" % os.listdir(uploads))
    check(srv.stop() == 0, "the server exits 0")
    sanitizer_clean(srv, "audio")


CASES = [("token", case_token), ("plan", case_plan), ("submit", case_submit), ("reuse", case_reuse), ("bad", case_bad),
         ("cancel", case_cancel), ("crash", case_crash), ("concurrent", case_concurrent), ("keyframes", case_keyframes),
         ("loras", case_loras), ("audio", case_audio)]

if __name__ == "__main__":
    try:
        for name, fn in CASES:
            if ONLY and name not in ONLY:
                continue
            t0 = time.time()
            before = len(FAILS)
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - reported as the case's failure
                fail("%s: %s: %s" % (name, type(e).__name__, e))
            print("%s %-12s (%.1f s)" % ("ok  " if len(FAILS) == before else "FAIL", name, time.time() - t0),
                  flush=True)
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    print("%d failures" % len(FAILS))
    sys.exit(1 if FAILS else 0)
