#!/usr/bin/env bash
# generate --checkpoint with the small model (20 steps of euler on the h3 schedule, on the CPU):
#  - a run killed with SIGKILL after its 12th model call leaves the checkpoint of its 10th (every 5) and no clip;
#    the same command again resumes from it (it says so) and its latents equal, byte for byte, those of a run that
#    was never interrupted; the checkpoint is gone once the run is done;
#  - a checkpoint of another request (another seed) is not used: the run says so and starts from the first call;
#  - a sampler that keeps state between calls (res_multistep) writes no checkpoint and says why;
#  - a folder as --checkpoint, and --checkpoint-every 0, are refused with exit 2.
# Usage: cli_checkpoint.sh PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$1
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -9 $pid 2>/dev/null; rm -rf "$tmp"' EXIT
A=(--prompt "a green circle moves right, a low tone" --steps 20 --seed 4 --device cpu --threads 2)
"$H3RUN" generate "${A[@]}" -q -o "$tmp/full.mp4" --latents "$tmp/full.st" || { fail "the plain run"; exit 1; }
# killed after the 12th call: the checkpoint of the 10th stays
"$H3RUN" generate "${A[@]}" --progress json -o "$tmp/r.mp4" --latents "$tmp/r.st" --checkpoint "$tmp/c.ckpt" \
    >"$tmp/out" 2>"$tmp/err" &
pid=$!
for _ in $(seq 600); do
    grep -q '"stage":"dit","step":1[2-9]' "$tmp/err" && break
    sleep 0.05
done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
pid=
grep -q '"stage":"dit","step":1[2-9]' "$tmp/err" || fail "the run did not reach its 12th call: $(tail -3 "$tmp/err")"
[ -f "$tmp/c.ckpt" ] || fail "no checkpoint after 12 calls: $(ls "$tmp")"
[ ! -e "$tmp/r.mp4" ] || fail "a killed run left a clip"
# the same command resumes
"$H3RUN" generate "${A[@]}" --progress none -o "$tmp/r.mp4" --latents "$tmp/r.st" --checkpoint "$tmp/c.ckpt" \
    >"$tmp/out" 2>"$tmp/err" || fail "the resumed run: $(tail -3 "$tmp/err")"
grep -q "resuming from the checkpoint $tmp/c.ckpt: 10 of 20 model calls done" "$tmp/err" ||
    fail "the run did not resume from call 10: $(cat "$tmp/err")"
grep -q "resumed from $tmp/c.ckpt: 10 of 20 model calls were done before" "$tmp/out" || fail "the summary: $(cat "$tmp/out")"
cmp -s "$tmp/full.st" "$tmp/r.st" || fail "the resumed run's latents differ from the uninterrupted run's"
[ ! -e "$tmp/c.ckpt" ] || fail "the checkpoint is left after the run finished"
# another request's checkpoint: not used
"$H3RUN" generate "${A[@]}" --steps 12 --checkpoint-every 5 --progress json -o "$tmp/s.mp4" --checkpoint "$tmp/c.ckpt" \
    >"$tmp/out" 2>"$tmp/err" &
pid=$!
for _ in $(seq 600); do
    grep -q '"stage":"dit","step":[6-9]' "$tmp/err" && break
    sleep 0.05
done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
pid=
[ -f "$tmp/c.ckpt" ] || fail "no checkpoint of the 12-step run"
"$H3RUN" generate "${A[@]}" --seed 5 --progress none -o "$tmp/t.mp4" --checkpoint "$tmp/c.ckpt" >"$tmp/out" 2>"$tmp/err" ||
    fail "a run beside another request's checkpoint: $(tail -3 "$tmp/err")"
grep -q "the checkpoint $tmp/c.ckpt is another request's: starting from the first call" "$tmp/err" ||
    fail "another request's checkpoint: $(cat "$tmp/err")"
grep -q "resumed from" "$tmp/out" && fail "resumed from another request's checkpoint"
# samplers with state: no checkpoint
rm -f "$tmp/c.ckpt"
"$H3RUN" generate "${A[@]}" --steps 6 --sampler res_multistep --scheduler simple --checkpoint-every 1 --progress none \
    -o "$tmp/u.mp4" --checkpoint "$tmp/c.ckpt" >"$tmp/out" 2>"$tmp/err" || fail "res_multistep: $(tail -3 "$tmp/err")"
grep -q "keeps state between calls that is not saved: no checkpoint" "$tmp/err" || fail "res_multistep: $(cat "$tmp/err")"
# bad values
mkdir "$tmp/dir"
"$H3RUN" generate "${A[@]}" -o "$tmp/v.mp4" --checkpoint "$tmp/dir" >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] || fail "--checkpoint on a folder: $(cat "$tmp/err")"
"$H3RUN" generate "${A[@]}" -o "$tmp/v.mp4" --checkpoint "$tmp/c.ckpt" --checkpoint-every 0 >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] || fail "--checkpoint-every 0: $(cat "$tmp/err")"
[ ! -e "$tmp/v.mp4" ] || fail "a refused run left a clip"
[ $fails -eq 0 ] && echo "cli_checkpoint: all passed"
exit $((fails > 0))
