#!/usr/bin/env bash
# Larger seeds for the fuzz targets, made here instead of kept in the repository: the reduced model's files
# (written by h3-tinymodel) and the test fixtures that fit a fuzz input (at most 256 KiB), one folder per target.
# With --sweep, also DIR/sweep-all: every tensor of the reduced model with every change of fuzz/targets/sweep.c
# (empty, drop, six reshapes, a retype), about 16,000 inputs: the full one-tensor-at-a-time sweep.
#
#   fuzz/seeds.sh [--sweep] H3_TINYMODEL DIR
#
# H3_TINYMODEL: the h3-tinymodel program of a build. The committed seeds (fuzz/corpus) come from
# fuzz/make_corpus.py instead.
set -euo pipefail
sweep=0
if [ "${1:-}" = "--sweep" ]; then
    sweep=1
    shift
fi
[ $# -eq 2 ] || { echo "usage: $0 [--sweep] H3_TINYMODEL DIR" >&2; exit 2; }
tiny=$1
out=$2
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
model="$out/tinymodel"
[ -f "$model/transformer/config.json" ] || "$tiny" --force "$model" >/dev/null

# fixtures and model files of at most 256 KiB, by what they are
small() { find "$@" -type f -size -257k 2>/dev/null | sort; }
copy() { # TARGET FILES...
    local t=$1
    shift
    mkdir -p "$out/$t"
    for f in "$@"; do cp "$f" "$out/$t/$(echo "${f#"$src"/}" | tr '/' '_')"; done
}
mapfile -t st < <(small "$src/tests/fixtures" "$model" -name '*.safetensors')
copy safetensors "${st[@]}"
mapfile -t gg < <(small "$src/tests/fixtures" -name '*.gguf')
copy gguf "${gg[@]}"
mapfile -t ix < <(small "$src/tests/fixtures" "$model" -name '*.index.json')
copy shard_index "${ix[@]}"
copy tokenizer "$model/tokenizer/tokenizer.json"
mapfile -t lat < <(small "$src/tests/fixtures/video_vae" "$src/tests/fixtures/audio_vae" -name 'case_*.safetensors')
copy latents "${lat[@]}" "$src/tests/fixtures/dit/inputs.safetensors"
# configs: the first byte names the file (fuzz/targets/config.c)
FUZZ_MODEL=$model python3 "$src/fuzz/make_corpus.py" "$out/generated" >/dev/null
mkdir -p "$out/config"
cp "$out"/generated/config/* "$out/config/"
rm -rf "$out/generated"

if [ $sweep = 1 ]; then
    python3 - "$model" "$out/sweep-all" <<'EOF'
import json, os, struct, sys
model, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
dirs = ["transformer", "text_encoder", "video_vae/source", "audio_vae"]
for c, d in enumerate(dirs):
    names = []
    for f in sorted(os.listdir(os.path.join(model, d))):
        if not f.endswith(".safetensors"):
            continue
        with open(os.path.join(model, d, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            names += [k for k in json.loads(fh.read(n)) if k != "__metadata__"]
    names.sort(key=lambda s: s.encode())
    for i, name in enumerate(names):
        # empty (first dim), drop, the six reshapes of the first dim, a retype
        for op, param in [(0, 0), (1, 0)] + [(2, p) for p in range(6)] + [(3, 0)]:
            with open(os.path.join(out, f"c{c}_{i:04d}_{op}_{param}"), "wb") as fh:
                fh.write(bytes([c]) + struct.pack("<H", i) + bytes([op, param]))
EOF
fi
for t in "$out"/*/; do
    t=$(basename "$t")
    [ "$t" = tinymodel ] || echo "$t: $(find "$out/$t" -type f | wc -l) seeds"
done
