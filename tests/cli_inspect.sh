#!/usr/bin/env bash
# h3run inspect: the figures of the header-only official DiT, speed without reading data, and one-line errors
# with a non-zero status for every malformed file. Usage: cli_inspect.sh PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$1
BUILD=${H3_BUILD_DIR:-$(dirname "$H3RUN")}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$BUILD/h3-testdata" dit-official "$tmp/dit.safetensors" || fail "h3-testdata dit-official"
t0=$(date +%s%N)
out=$("$H3RUN" inspect --summary "$tmp/dit.safetensors" 2>"$tmp/err")
rc=$?
t1=$(date +%s%N)
ms=$(( (t1 - t0) / 1000000 ))
[ $rc -eq 0 ] || fail "inspect --summary exited $rc: $(cat "$tmp/err")"
for want in "tensors: 535 " "elements: 33,122,992,912 " "data bytes: 66,280,430,144 " "official layout" \
            "50 blocks" "full AdaLN"; do
    grep -qF -- "$want" <<<"$out" || fail "summary lacks '$want'"
done
# Sanitizer builds are slower; the bound is about not reading the 66 GB data area.
[ $ms -lt 1000 ] || fail "inspect took ${ms} ms (must not read the data area)"
echo "inspect --summary of the header-only official DiT: ${ms} ms"

# The full listing names every tensor with dtype, shape and bytes.
n=$("$H3RUN" inspect "$tmp/dit.safetensors" | grep -c '^blocks\.[0-9]*\.attn\.qkv_proj\.weight *BF16 *\[21504, 5376\] *231,211,008$')
[ "$n" = 50 ] || fail "listing shows $n qkv_proj rows with dtype, shape and bytes, expected 50"

# Malformed files: exit status 1, exactly one line on stderr naming the problem, no sanitizer report.
"$BUILD/test_safetensors" --write-malformed "$tmp/bad" >/dev/null
count=0
for f in "$tmp"/bad/*.safetensors; do
    count=$((count + 1))
    "$H3RUN" inspect "$f" >/dev/null 2>"$tmp/err"
    rc=$?
    lines=$(wc -l <"$tmp/err")
    [ $rc -eq 1 ] || fail "$(basename "$f"): exit status $rc, expected 1"
    [ "$lines" -eq 1 ] || fail "$(basename "$f"): $lines lines on stderr, expected one: $(head -c 600 "$tmp/err")"
    grep -q "^h3run inspect: error: .*$(basename "$f")" "$tmp/err" || fail "$(basename "$f"): message does not name the file: $(cat "$tmp/err")"
    if grep -qE "AddressSanitizer|runtime error|LeakSanitizer" "$tmp/err"; then fail "$(basename "$f"): sanitizer report"; fi
done
[ $count -ge 15 ] || fail "only $count malformed files were checked"
echo "malformed files rejected cleanly: $count"

# Usage errors exit 2; a missing path exits 1 and names it.
"$H3RUN" inspect --nope x >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown option must exit 2"
"$H3RUN" inspect >/dev/null 2>&1; [ $? -eq 2 ] || fail "missing argument must exit 2"
"$H3RUN" inspect "" 2>"$tmp/err" >/dev/null; rc=$?
[ $rc -eq 2 ] && grep -q "an empty argument" "$tmp/err" || fail "an empty path must exit 2 (rc $rc): $(cat "$tmp/err")"
"$H3RUN" frobnicate >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown command must exit 2"
"$H3RUN" inspect "$tmp/absent.safetensors" 2>"$tmp/err" >/dev/null; rc=$?
[ $rc -eq 1 ] && grep -q "absent.safetensors" "$tmp/err" || fail "a missing file must exit 1 and be named (rc $rc)"
"$H3RUN" inspect --help | grep -q "usage: h3run inspect" || fail "--help"

[ $fails -eq 0 ] && echo "cli_inspect: all checks passed" || echo "cli_inspect: $fails failures"
exit $(( fails > 0 ))
