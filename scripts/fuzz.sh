#!/usr/bin/env bash
# The fuzz targets (fuzz/README.md) under ASan + UBSan with libFuzzer: builds them with clang into build-fuzz/,
# replays the seeds (fuzz/corpus, the seeds fuzz/seeds.sh makes, and fuzz/known's inputs of fixed findings), then
# fuzzes each target for a bounded time. Any finding fails: a crash, a sanitizer report, a leak, an input that runs
# longer than H3_FUZZ_TIMEOUT, more than 2 GiB of memory, or a file left behind. scripts/test.sh runs it (CI).
#
#   scripts/fuzz.sh                         every target, H3_FUZZ_SECONDS each (default 15; the sweep gets 3x)
#   scripts/fuzz.sh sweep request           only these targets
#   H3_FUZZ_SECONDS=600 scripts/fuzz.sh     a longer campaign
#   H3_FUZZ_SWEEP=1 scripts/fuzz.sh sweep   also the full one-tensor-at-a-time sweep (~16,000 inputs, hours)
#
# Environment: H3_FUZZ_BUILD (build folder, default build-fuzz), H3_FUZZ_SECONDS, H3_FUZZ_TIMEOUT (seconds per
# input, default 60), H3_FUZZ_ALL=1 (the guards of known findings off: fuzz/known/open.txt). New inputs that add
# coverage go to BUILD/fuzz-out/NAME/corpus, findings to BUILD/fuzz-out/NAME/ (crash-*, leak-*, timeout-*, oom-*),
# the logs to BUILD/fuzz-out/NAME.log. The total of inputs run is printed last.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
h3_install_deps "${H3_TEST_DEB_PACKAGES[@]}"
BUILD=${H3_FUZZ_BUILD:-build-fuzz}
SECONDS_EACH=${H3_FUZZ_SECONDS:-15}
TIMEOUT=${H3_FUZZ_TIMEOUT:-60}

echo "== fuzz targets: clang, libFuzzer, ASan + UBSan ($BUILD)"
CC=clang cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DH3_WERROR=ON -DH3_SANITIZE=ON -DH3_FUZZ=ON \
    -DH3_CUDA=OFF >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target h3_fuzz_targets >/dev/null

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for f in fuzz/targets/*.c; do targets+=("$(basename "$f" .c)"); done
fi
out="$BUILD/fuzz-out"
mkdir -p "$out"
seeds="$out/seeds"
sweep_arg=()
[ "${H3_FUZZ_SWEEP:-0}" = 1 ] && sweep_arg=(--sweep)
bash fuzz/seeds.sh "${sweep_arg[@]}" "$BUILD/h3-tinymodel" "$seeds" >/dev/null

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# fixed findings: their inputs replay as seeds (still open ones are stepped around: fuzz/known/open.txt)
open_ids=$(sed -n 's/^\([A-Z][0-9]*\) .*/\1/p' fuzz/known/open.txt | tr '\n' ' ')

total=0
failed=()
for t in "${targets[@]}"; do
    bin="$BUILD/fuzz/fuzz_$t"
    [ -x "$bin" ] || { echo "no fuzz target '$t' (fuzz/targets/*.c)" >&2; exit 2; }
    dirs=("fuzz/corpus/$t")
    [ -d "$seeds/$t" ] && dirs+=("$seeds/$t")
    if [ -d "fuzz/known/$t" ]; then
        mkdir -p "$out/$t/known"
        rm -f "$out/$t/known"/*
        for f in fuzz/known/"$t"/*; do
            id=$(basename "$f" | sed 's/-.*//')
            [[ " $open_ids " == *" $id "* ]] || cp "$f" "$out/$t/known/"
        done
        dirs+=("$out/$t/known")
    fi
    secs=$SECONDS_EACH
    [ "$t" = sweep ] && secs=$((SECONDS_EACH * 3))
    if [ "$t" = sweep ] && [ "${H3_FUZZ_SWEEP:-0}" = 1 ]; then
        echo "fuzz sweep: the full sweep ($(find "$seeds/sweep-all" -type f | wc -l) inputs)"
        "$BUILD/fuzz/fuzz_sweep_replay" --timeout "$TIMEOUT" "$seeds/sweep-all" >"$out/sweep-all.log" 2>&1 ||
            { echo "FINDING in the full sweep: $out/sweep-all.log"; tail -30 "$out/sweep-all.log"; failed+=(sweep-all); }
        n=$(sed -n 's/^replayed \([0-9]*\) inputs.*/\1/p' "$out/sweep-all.log")
        total=$((total + ${n:-0}))
    fi
    mkdir -p "$out/$t/corpus"
    # libFuzzer runs every seed first, then mutates for the rest of $secs seconds; non-zero exit on a finding
    log="$out/$t.log"
    if "$bin" -max_total_time="$secs" -timeout="$TIMEOUT" -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$out/$t/" "$out/$t/corpus" "${dirs[@]}" >"$log" 2>&1; then
        n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | awk '{s += $1} END {print s + 0}')
        total=$((total + n))
        echo "fuzz $t: $n inputs, no finding"
    else
        echo "FINDING in fuzz $t (log $log; the input is under $out/$t/):"
        grep -E -A25 '^==[0-9]+==ERROR|runtime error|==FUZZ==|deadly signal|fuzz harness:' "$log" | head -60 || tail -40 "$log"
        failed+=("$t")
    fi
done
echo "fuzz: $total inputs ran across ${#targets[@]} targets"
if [ ${#failed[@]} -ne 0 ]; then
    echo "fuzz: findings in ${failed[*]}: reproduce with $BUILD/fuzz/fuzz_NAME FILE, or the replay program of any build"
    exit 1
fi
echo "fuzz: no finding"
