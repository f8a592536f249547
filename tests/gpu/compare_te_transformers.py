#!/usr/bin/env python3
"""The text encoder against transformers' Qwen3VLForConditionalGeneration, on the GPU machine.

    python3 tests/gpu/compare_te_transformers.py            # OUT=/dir to keep details (compare_te_transformers.json)

What it compares, all in float32 on the device (TF32 off) against the project's float64 reference
(tools/reference/qwen3.py) and the committed fixtures (tests/fixtures/text_encoder/):
  1. fixture: transformers loads tests/fixtures/text_encoder/official with from_pretrained, exactly as it loads
     MiniMaxAI's text_encoder/ folder (config.json, two shards; layer 4, the final norm, lm_head and the vision
     tensors are NaN), and runs model.model(input_ids, attention_mask, use_cache=False, output_hidden_states=True)
     the way diffusers' MiniMax-H3 encoder step does; hidden_states[0..4] of both fixture prompts are compared with
     the fixture and with the reference.
  2. real-rope: a random model with the real rotary layout (head_dim 128, mrope_section [24, 20, 20], theta 5e6),
     8/2 heads and a 300-token prompt (positions up to 299), written in the official layout to a temporary folder.
  3. diffusers: when DIFFUSERS_SRC names a diffusers source folder (holding src/diffusers), diffusers'
     get_qwen3vl_prompt_embeds (the MiniMax-H3 encoder step) on the fixture model.
  4. h3run: when the h3run binary is found (env H3RUN, else .devbundle/bin/h3run, else build/h3run),
     `h3run encode --token-ids ... --layer N -o` on both models, compared with transformers and the reference.
Without transformers (or without a GPU: it then runs on the CPU) the parts that need it are skipped with a message
and the rest still runs, so the script can be checked anywhere with /usr/bin/python3.

Tolerance: relative L2 error <= 1e-4 per hidden state (the same bound the C tests use: f32 computation against the
float64 reference differs by ~1e-7 here, while a wrong rotary pairing or head mapping is off by 1e-2 or more).
Exit status 1 when any comparison exceeds it. Needs no network.
"""

import inspect
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import qwen3  # noqa: E402

TOL = 1e-4
FIX = os.path.join(ROOT, "tests", "fixtures", "text_encoder")
rows = []  # (case, what, prompt, layer, rel_err)
notes = []


def rel(a, b):
    a = a.double().flatten().cpu()
    b = b.double().flatten().cpu()
    if not torch.isfinite(a).all():
        return math.inf
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def record(case, what, prompt, layer, err):
    rows.append(dict(case=case, what=what, prompt=prompt, layer=layer, rel_err=err, ok=bool(err <= TOL)))


def load_folder(d):
    sd = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            sd.update(qwen3.load_safetensors(os.path.join(d, f)))
    return sd


def find_h3run():
    for p in (os.environ.get("H3RUN"), os.path.join(ROOT, ".devbundle", "bin", "h3run"),
              os.path.join(ROOT, "build", "h3run")):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def h3run_hidden(h3run, model_dir, ids, layer, tmp):
    out = os.path.join(tmp, "h3run_hidden.safetensors")
    cmd = [h3run, "encode", "-q", "--text-encoder", model_dir, "--token-ids", ",".join(str(int(i)) for i in ids),
           "--layer", str(layer), "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s failed: %s" % (" ".join(cmd[:4]), r.stderr.strip()))
    return qwen3.load_safetensors(out)["hidden"]


def transformers_model(model_dir, device):
    """from_pretrained of an official-layout folder, float32, eager attention; None when transformers is missing."""
    try:
        import transformers
        from transformers import Qwen3VLForConditionalGeneration
    except Exception as e:  # noqa: BLE001 - any import problem means: not available here
        notes.append("transformers is not available here (%s): the comparisons with transformers were skipped" %
                     e.__class__.__name__)
        return None
    try:  # transformers 5 calls it dtype, 4.x torch_dtype
        model = Qwen3VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32,
                                                                attn_implementation="eager")
    except TypeError:
        model = Qwen3VLForConditionalGeneration.from_pretrained(model_dir, torch_dtype=torch.float32,
                                                                attn_implementation="eager")
    if model.dtype != torch.float32:
        model = model.float()
    notes.append("transformers %s, torch %s, device %s" % (transformers.__version__, torch.__version__, device))
    return model.eval().to(device)


def transformers_hidden(model, ids, device):
    x = torch.tensor([list(map(int, ids))], dtype=torch.long, device=device)
    kw = dict(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False, output_hidden_states=True)
    if "mm_token_type_ids" in inspect.signature(model.model.forward).parameters:
        kw["mm_token_type_ids"] = torch.zeros_like(x)  # all text, as diffusers' encoder step passes it
    with torch.no_grad():
        out = model.model(**kw)
    return [h[0].double().cpu() for h in out.hidden_states]


def check_rope(model, cfg, case):
    """The rotary module transformers built from the config uses our theta, head_dim and mRoPE sections."""
    rot = model.model.language_model.rotary_emb
    err = rel(rot.inv_freq.double(), qwen3.inv_freq(cfg))
    record(case, "transformers inv_freq vs theta^(-2j/D)", "-", -1, err)
    sec = list(getattr(rot, "mrope_section", cfg["mrope_section"]))
    if sec != list(cfg["mrope_section"]):
        record(case, "mrope_section %s vs %s" % (sec, cfg["mrope_section"]), "-", -1, math.inf)


def case_fixture(device, h3run, tmp):
    case = "fixture"
    cfg = qwen3.config_from_json(json.load(open(os.path.join(FIX, "official", "config.json"))))
    qwen3.check_text_only_mrope(cfg)
    w_off = qwen3.canonical(load_folder(os.path.join(FIX, "official")))
    w_cmf = qwen3.canonical(qwen3.load_safetensors(os.path.join(FIX, "comfy.safetensors")))
    exp = qwen3.load_safetensors(os.path.join(FIX, "expected.safetensors"))
    layers = int(max(int(k.split(".")[2]) for k in exp if k.startswith("hidden.")))
    same = all(torch.equal(w_cmf[k].view(torch.int16), w_off[k].view(torch.int16)) for k in w_cmf)
    record(case, "comfy.safetensors weights == official/ (layers 0..%d)" % (layers - 1), "-", -1, 0.0 if same else math.inf)
    model = transformers_model(os.path.join(FIX, "official"), device)
    if model is not None:
        check_rope(model, cfg, case)
    for p in sorted({k.split(".")[1] for k in exp if k.startswith("ids.")}):
        ids = exp["ids." + p].long()
        ref = qwen3.hidden_states(w_off, cfg, ids, layers)
        hf = transformers_hidden(model, ids, device) if model is not None else None
        c = None
        for k in range(layers + 1):
            fx = exp["hidden.%s.%d" % (p, k)]
            record(case, "fixture vs reference", p, k, rel(fx, ref[k]))
            if hf is not None:
                record(case, "transformers vs reference", p, k, rel(hf[k], ref[k]))
                record(case, "transformers vs fixture", p, k, rel(hf[k], fx))
            if h3run:
                c = h3run_hidden(h3run, os.path.join(FIX, "official"), ids.tolist(), k, tmp)
                record(case, "h3run vs reference", p, k, rel(c, ref[k]))
                if hf is not None:
                    record(case, "h3run vs transformers", p, k, rel(c, hf[k]))
    return model, cfg, exp


def case_diffusers(model, exp, device):
    src = os.environ.get("DIFFUSERS_SRC")
    if not src or not os.path.isdir(os.path.join(src, "src", "diffusers")):
        notes.append("DIFFUSERS_SRC is not set to a diffusers source folder: skipped diffusers' encoder step")
        return
    if model is None:
        return
    sys.path.insert(0, os.path.join(src, "src"))
    try:
        from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds
    except Exception as e:  # noqa: BLE001
        notes.append("diffusers' MiniMax-H3 encoder step did not import (%s): skipped" % e)
        return

    class TextOnlyProcessor:  # what Qwen3VLProcessor answers for a prompt without vision pads
        def create_mm_token_type_ids(self, batch):
            return [[0] * len(ids) for ids in batch]

    layers = int(max(int(k.split(".")[2]) for k in exp if k.startswith("hidden.")))
    for p in sorted({k.split(".")[1] for k in exp if k.startswith("ids.")}):
        ids = exp["ids." + p].long().tolist()
        with torch.no_grad():
            e = get_qwen3vl_prompt_embeds(model, TextOnlyProcessor(), ids, {}, text_encoder_layer=layers,
                                          device=torch.device(device), dtype=torch.float32)
        record("diffusers", "get_qwen3vl_prompt_embeds vs fixture", p, layers, rel(e[0], exp["hidden.%s.%d" % (p, layers)]))


def case_real_rope(device, h3run, tmp):
    """A random model with the real rotary layout and a long prompt, in the official layout."""
    case = "real-rope"
    cfg = dict(hidden=96, layers=3, heads=8, kv_heads=2, head_dim=128, intermediate=160, vocab=1000, rms_eps=1e-6,
               rope_theta=5e6, mrope_section=[24, 20, 20])
    qwen3.check_text_only_mrope(cfg)
    g = torch.Generator().manual_seed(7)
    C, D, F = cfg["hidden"], cfg["head_dim"], cfg["intermediate"]
    w = {"embed_tokens.weight": torch.randn(cfg["vocab"], C, generator=g, dtype=torch.float64)}
    for i in range(cfg["layers"]):
        p = "layers.%d." % i
        for name, (o, n) in {"self_attn.q_proj.weight": (cfg["heads"] * D, C), "self_attn.k_proj.weight": (cfg["kv_heads"] * D, C),
                             "self_attn.v_proj.weight": (cfg["kv_heads"] * D, C), "self_attn.o_proj.weight": (C, cfg["heads"] * D),
                             "mlp.gate_proj.weight": (F, C), "mlp.up_proj.weight": (F, C), "mlp.down_proj.weight": (C, F)}.items():
            w[p + name] = torch.randn(o, n, generator=g, dtype=torch.float64) / math.sqrt(n)
        for name, n in (("input_layernorm.weight", C), ("post_attention_layernorm.weight", C),
                        ("self_attn.q_norm.weight", D), ("self_attn.k_norm.weight", D)):
            w[p + name] = 1 + 0.2 * torch.randn(n, generator=g, dtype=torch.float64)
    w = {k: v.to(torch.bfloat16) for k, v in w.items()}
    d = os.path.join(tmp, "real_rope")
    os.makedirs(d, exist_ok=True)
    sd = {"model.language_model." + k: v for k, v in w.items()}
    sd["model.language_model.norm.weight"] = torch.ones(C, dtype=torch.bfloat16)
    sd["lm_head.weight"] = torch.zeros(cfg["vocab"], C, dtype=torch.bfloat16)
    qwen3.save_safetensors(os.path.join(d, "model.safetensors"), sd, {"format": "pt"})
    fixture_cfg = json.load(open(os.path.join(FIX, "official", "config.json")))
    t = fixture_cfg["text_config"]
    t.update(hidden_size=C, num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
             num_key_value_heads=cfg["kv_heads"], head_dim=D, intermediate_size=F, vocab_size=cfg["vocab"])
    t["rope_scaling"]["mrope_section"] = cfg["mrope_section"]
    fixture_cfg["vision_config"]["out_hidden_size"] = C
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(fixture_cfg, f)
    ids = torch.randint(0, cfg["vocab"], (300,), generator=g)
    ref = qwen3.hidden_states(w, cfg, ids, cfg["layers"])
    model = transformers_model(d, device)
    hf = None
    if model is not None:
        check_rope(model, cfg, case)
        hf = transformers_hidden(model, ids, device)
        del model
    for k in range(cfg["layers"]):  # hidden_states[layers] of transformers is the normed output
        if hf is not None:
            record(case, "transformers vs reference", "300 tokens", k, rel(hf[k], ref[k]))
        if h3run:
            c = h3run_hidden(h3run, d, ids.tolist(), k, tmp)
            record(case, "h3run vs reference", "300 tokens", k, rel(c, ref[k]))
            if hf is not None:
                record(case, "h3run vs transformers", "300 tokens", k, rel(c, hf[k]))


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    h3run = find_h3run()
    if not h3run:
        notes.append("no h3run binary (set H3RUN): skipped the h3run comparisons")
    tmp = tempfile.mkdtemp(prefix="h3_te_cmp_")
    try:
        model, _, exp = case_fixture(device, h3run, tmp)
        case_diffusers(model, exp, device)
        del model
        case_real_rope(device, h3run, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "compare_te_transformers.json"), "w") as f:
            json.dump(dict(tolerance=TOL, notes=notes, rows=rows, h3run=h3run), f, indent=1)
    for n in dict.fromkeys(notes):
        print("note:", n)
    # The table: worst error per (case, comparison).
    worst = {}
    for r in rows:
        key = (r["case"], r["what"])
        if key not in worst or not (r["rel_err"] <= worst[key]["rel_err"]):
            worst[key] = r
    print("\n%-10s %-52s %9s %12s  %s" % ("case", "comparison", "states", "worst rel L2", "result"))
    for (case, what), r in worst.items():
        n = sum(1 for x in rows if x["case"] == case and x["what"] == what)
        print("%-10s %-52s %9d %12.3e  %s" % (case, what, n, r["rel_err"], "ok" if r["ok"] else "FAIL (tol %.0e)" % TOL))
    bad = [r for r in rows if not r["ok"]]
    print("\n%d comparisons, %d above the tolerance %.0e" % (len(rows), len(bad), TOL))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
