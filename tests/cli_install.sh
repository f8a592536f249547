#!/usr/bin/env bash
# The install and the default model's lookup (src/cli/cli.h, docs/PIPELINE.md). Builds nothing: installs the
# build this test belongs to into a temporary prefix (cmake --install BUILD --prefix TMP), then, from another
# working folder: the installed h3run and h3-synth run, generate finds the installed small model without --model
# (at 56 frames and 128x128) and writes a clip, also after the prefix is moved as a whole; H3RUN_MODELS comes
# before every other place; a copy of the program alone finds the model of the source tree it was configured from
# (as an out-of-tree build does). The message when the model is in none of the places is checked by test_cli.
# Usage: cli_install.sh PATH/TO/h3run (CTest passes it; H3_CMAKE names cmake).
set -u
H3RUN=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
BUILD=$(cd "${H3_BUILD_DIR:-$(dirname "$H3RUN")}" && pwd)
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd -P)
CMAKE=${H3_CMAKE:-cmake}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
tmp=$(cd "$tmp" && pwd -P)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/work"
cd "$tmp/work" || exit 1

"$CMAKE" --install "$BUILD" --prefix "$tmp/inst" >"$tmp/install.log" 2>&1 || fail "cmake --install: $(tail -3 "$tmp/install.log")"
for f in bin/h3run bin/h3-synth bin/h3-tinymodel share/h3run/models/h3-small/transformer/config.json \
         share/h3run/models/h3-small/tokenizer/tokenizer.json share/doc/h3run/README.md; do
    [ -e "$tmp/inst/$f" ] || fail "the install lacks $f"
done
[ ! -e "$tmp/inst/bin/h3-testdata" ] || fail "the install holds h3-testdata (a test tool)"
# every file of the small model, byte for byte
diff -r "$SRC/models/h3-small" "$tmp/inst/share/h3run/models/h3-small" >/dev/null || fail "the installed model differs"

# generate without --model from this folder; the prefix moved as a whole must work the same
gen() { # PREFIX EXPECTED_MODEL LOG [extra args]
    local prefix=$1 want=$2 log=$3
    shift 3
    "$prefix/bin/h3run" generate --prompt "$("$prefix/bin/h3-synth" prompt 3)" --seed 1 --steps 3 --device cpu \
        --progress none -o "$tmp/work/out.mp4" "$@" >"$log" 2>&1 || { fail "generate ($prefix): $(tail -2 "$log")"; return; }
    grep -qF "model: $want " "$log" || fail "generate ($prefix) did not take $want: $(head -2 "$log")"
    [ -s "$tmp/work/out.mp4" ] || fail "generate ($prefix) wrote no clip"
    rm -f "$tmp/work/out.mp4"
}
gen "$tmp/inst" "$tmp/inst/share/h3run/models/h3-small" "$tmp/gen1.log"
grep -q "56 frames at 128x128" "$tmp/gen1.log" || fail "the installed copy did not run at 56 frames and 128x128"
mv "$tmp/inst" "$tmp/moved"
gen "$tmp/moved" "$tmp/moved/share/h3run/models/h3-small" "$tmp/gen2.log" --frames 5 --size 32x32

# H3RUN_MODELS first: a reduced model there is taken over the installed one
"$tmp/moved/bin/h3-tinymodel" "$tmp/models/h3-small" >/dev/null || fail "h3-tinymodel"
H3RUN_MODELS="$tmp/none:$tmp/models" gen "$tmp/moved" "$tmp/models/h3-small" "$tmp/gen3.log" --frames 5 --size 32x32

# the program alone (no model beside it, no prefix around it): the configured places, the source tree last
mkdir -p "$tmp/alone/bin" && cp "$H3RUN" "$tmp/alone/bin/h3run"
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$BUILD/CMakeCache.txt")
want=$SRC/models/h3-small
[ -d "$prefix/share/h3run/models/h3-small" ] && want=$(cd "$prefix/share/h3run/models/h3-small" && pwd -P)
"$tmp/alone/bin/h3run" generate --prompt "$("$tmp/moved/bin/h3-synth" prompt 3)" --seed 1 --steps 1 --frames 5 \
    --size 32x32 --device cpu --progress none -o "$tmp/work/out.mp4" >"$tmp/gen4.log" 2>&1 ||
    fail "generate from a copy of the program: $(tail -2 "$tmp/gen4.log")"
grep -qF "model: $want " "$tmp/gen4.log" || fail "a copy of the program did not take $want: $(head -2 "$tmp/gen4.log")"
# nothing was written into the working folder but the clips asked for
[ -z "$(ls -A "$tmp/work" | grep -v '^out.mp4$')" ] || fail "left in the working folder: $(ls -A "$tmp/work")"

[ $fails -eq 0 ] && echo "cli_install: all passed" || { echo "cli_install: $fails failures"; exit 1; }
