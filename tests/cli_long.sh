#!/usr/bin/env bash
# Long clips (pipeline/window.h) with the small model on the CPU:
#  - a 30 s clip (719 frames) in windows of 56 frames overlapping by 17: 21 windows, every frame written, and no
#    seam (h3-synth seams): the largest frame-to-frame difference inside the overlaps no larger than inside single
#    windows, the sound's largest sample step in the overlaps no larger than elsewhere; the prompt followed at its
#    start and end (colour and pitch);
#  - two prompts (--prompt twice; then --prompts FILE with start times): each part's colour and pitch are its
#    prompt's;
#  - a windowed run killed after its 5th step resumes from its checkpoint to the uninterrupted latents; step caching
#    skips whole steps (every window's call);
#  - --refine refines a long clip in the same windows, keeping the first pass's audio; a soundtrack (--audio) is
#    held across the windows; keyframes too: each window presents and holds those inside it
#    (window 0's first call checked against a one-window clip's);
#  - bad input exits 2 naming the problem and writes nothing: a window or an overlap of the wrong form, several
#    prompts in a clip of one window, a --prompts line without a time or
#    whose first prompt does not start at 0.
# Usage: cli_long.sh PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$1
BUILD=$(cd "${H3_BUILD_DIR:-$(dirname "$H3RUN")}" && pwd)
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
SYNTH="$BUILD/h3-synth"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -9 $pid 2>/dev/null; rm -rf "$tmp"' EXIT
P4=$("$SYNTH" prompt 4) # a red square, a deep low tone
P0=$("$SYNTH" prompt 0) # a purple circle, a very high tone
A=(--steps 10 --seed 3 --device cpu --threads 2 --progress none --window 56 --overlap 17)
# colour and pitch of held-out prompt K over frames [F0, F1)
part() { # CLIP K F0 F1 WHAT
    local r
    r=$("$SYNTH" check "$1" --heldout "$2" --from "$3" --to "$4")
    echo "$5: $r"
    grep -q "colour [a-z]* (right)" <<<"$r" || fail "$5: the colour is not the prompt's: $r"
    grep -q "pitch [a-z]* (right)" <<<"$r" || fail "$5: the pitch is not the prompt's: $r"
}

# 30 s, one prompt
"$H3RUN" generate --prompt "$P4" --frames 719 "${A[@]}" -o "$tmp/one.mp4" >"$tmp/out" 2>"$tmp/err" ||
    { fail "the 30 s clip: $(tail -3 "$tmp/err")"; exit 1; }
grep -q "^windows: 21 overlapping windows of 56 frames" "$tmp/out" || fail "the summary: $(cat "$tmp/out")"
grep -q "wrote .*: 719 frames" "$tmp/out" || fail "not 719 frames: $(cat "$tmp/out")"
s=$("$SYNTH" seams "$tmp/one.mp4" --window 56 --overlap 17 --json)
echo "30 s clip: $s"
read -r fin fov ain aov <<<"$(sed 's/.*"frame_diff_inside_max": \([0-9.]*\).*"frame_diff_overlap_max": \([0-9.]*\).*"audio_step_inside_max": \([0-9.]*\).*"audio_step_overlap_max": \([0-9.]*\).*/\1 \2 \3 \4/' <<<"$s")"
# no frame step in the overlaps beyond 1.25x the largest inside one window: the two maxima trade places with the DiT
# (0.0186 / 0.0196 before its keyframe training, 0.0182 / 0.0169 after; mean inside 0.006), while a join of two
# windows sampled apart is 0.056 (two 56-frame clips of this prompt at seeds 3 and 4, end to start)
awk -v a="$fov" -v b="$fin" 'BEGIN{exit !(a <= 1.25 * b)}' || fail "a seam: frame difference $fov in the overlaps, $fin inside one window"
awk -v a="$aov" -v b="$ain" 'BEGIN{exit !(a <= b)}' || fail "a seam in the sound: step $aov in the overlaps, $ain elsewhere"
part "$tmp/one.mp4" 4 0 120 "30 s clip, first 5 s"
part "$tmp/one.mp4" 4 599 719 "30 s clip, last 5 s"

# two prompts: the first half red and low, the second purple and very high (15 s, 10 windows)
"$H3RUN" generate --prompt "$P4" --prompt "$P0" --frames 362 "${A[@]}" -o "$tmp/two.mp4" -v >"$tmp/out" 2>"$tmp/err" ||
    fail "two prompts: $(tail -3 "$tmp/err")"
grep -q "window 1 (from 0.00 s): prompt 1" "$tmp/err" && grep -q "): prompt 2" "$tmp/err" ||
    fail "two prompts: the windows' prompts are not logged: $(grep -i prompt "$tmp/err")"
part "$tmp/two.mp4" 4 0 140 "two prompts, first part"
part "$tmp/two.mp4" 0 222 362 "two prompts, second part"
# the same from a file of start times (a short clip, two steps: it runs and takes the file's prompts)
printf '# start time, prompt\n0 %s\n\n2.5 %s\n' "$P4" "$P0" >"$tmp/prompts.txt"
"$H3RUN" generate --prompts "$tmp/prompts.txt" --frames 124 --steps 2 --seed 1 --device cpu --progress none \
    --window 56 --overlap 17 -o "$tmp/file.mp4" -v >"$tmp/out" 2>"$tmp/err" || fail "--prompts: $(tail -3 "$tmp/err")"
grep -q "): prompt 2" "$tmp/err" || fail "--prompts: no window took the second prompt: $(grep -i prompt "$tmp/err")"

# a long clip resumes from its checkpoint (the whole clip's rows) to the uninterrupted run's latents, bit for bit;
# step caching skips whole steps of it (every window's call)
B=(--prompt "$P4" --prompt "$P0" --frames 124 --steps 8 --seed 5 --device cpu --threads 2 --window 56 --overlap 17)
"$H3RUN" generate "${B[@]}" --progress none -o "$tmp/u.mp4" --latents "$tmp/u.st" >/dev/null 2>&1 ||
    fail "the uninterrupted windowed run"
"$H3RUN" generate "${B[@]}" --checkpoint "$tmp/c.ckpt" --checkpoint-every 2 --progress json -o "$tmp/k.mp4" \
    --latents "$tmp/k.st" >/dev/null 2>"$tmp/err" &
pid=$!
for _ in $(seq 1200); do
    grep -q '"stage":"dit","step":[5-8]' "$tmp/err" && break
    sleep 0.05
done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
pid=
[ -f "$tmp/c.ckpt" ] || fail "a windowed run left no checkpoint: $(tail -2 "$tmp/err")"
"$H3RUN" generate "${B[@]}" --checkpoint "$tmp/c.ckpt" --checkpoint-every 2 --progress none -o "$tmp/k.mp4" \
    --latents "$tmp/k.st" >"$tmp/out" 2>"$tmp/err" || fail "the resumed windowed run: $(tail -3 "$tmp/err")"
grep -q "resuming from the checkpoint" "$tmp/err" || fail "the windowed run did not resume: $(cat "$tmp/err")"
cmp -s "$tmp/u.st" "$tmp/k.st" || fail "the resumed windowed run's latents differ from the uninterrupted run's"
"$H3RUN" generate "${B[@]}" --steps 20 --cache --progress none -o "$tmp/c.mp4" >"$tmp/out" 2>"$tmp/err" ||
    fail "a cached windowed run: $(tail -3 "$tmp/err")"
n=$(sed -n 's/^step cache.*answered from the cache, \([0-9]*\) DiT calls.*/\1/p' "$tmp/out")
[ -n "$n" ] && [ "$n" -lt 60 ] && [ $((n % 3)) = 0 ] || fail "the cache skipped no step of a windowed run: $(cat "$tmp/out")"
grep -q "^windows: 3 overlapping windows of 56 frames .*; $n DiT calls" "$tmp/out" ||
    fail "the windows' DiT calls with the cache: $(cat "$tmp/out")"

# --refine over a long clip: the second pass in the same windows at the refine canvas, the first pass's audio kept
"$H3RUN" generate --prompt "$P4" --frames 124 --window 56 --overlap 17 --size 64x64 --refine 128x128 --steps 4 \
    --seed 2 --device cpu --progress none -o "$tmp/rf.mp4" --latents "$tmp/rf.st" >"$tmp/out" 2>"$tmp/err" ||
    fail "--refine with windows: $(tail -3 "$tmp/err")"
grep -q "wrote .*: 124 frames at 128x128" "$tmp/out" && grep -q "^windows: 3 overlapping.*; 18 DiT calls" "$tmp/out" ||
    fail "--refine with windows: the summary: $(cat "$tmp/out")"
grep -q "video_latents \[1, 24, 37, 8, 8\]" "$tmp/out" || fail "--refine with windows: the latents: $(cat "$tmp/out")"
"$H3RUN" generate --prompt "$P4" --frames 124 --window 56 --overlap 17 --size 64x64 --steps 4 --seed 2 --device cpu \
    --progress none -o "$tmp/rf1.mp4" --latents "$tmp/rf1.st" >/dev/null 2>&1 || fail "the first pass alone"
python3 "$SRC/tests/latents_tool.py" same-audio "$tmp/rf.st" "$tmp/rf1.st" ||
    fail "--refine with windows: the audio is not the first pass's"

# a soundtrack in a clip of several windows: held in every window, the MP4 carries it
ffmpeg -v error -y -f lavfi -i "sine=frequency=300:duration=6" -ac 2 "$tmp/tone.wav" || fail "ffmpeg tone"
"$H3RUN" generate --prompt "$P4" --audio "$tmp/tone.wav" --frames 141 --steps 2 --seed 1 --device cpu --progress none \
    --window 56 --overlap 17 -o "$tmp/snd.mp4" --latents "$tmp/snd.st" >"$tmp/out" 2>"$tmp/err" ||
    fail "a soundtrack with windows: $(tail -3 "$tmp/err")"
grep -q "^windows: 4 overlapping" "$tmp/out" && grep -q "^soundtrack: " "$tmp/out" ||
    fail "a soundtrack with windows: the summary: $(cat "$tmp/out")"

ffmpeg -v error -y -f lavfi -i "testsrc2=size=128x128:rate=1" -frames:v 1 "$tmp/k.png" || fail "ffmpeg"
# keyframes in a long clip (the reduced random model, which has a vision tower): each window presents and holds the
# keyframes inside it; window 0's first DiT call sees exactly what a one-window clip of its frames with its
# keyframe sees (every table, the text states, the keyframe's rows; only the target's noise differs)
"$BUILD/h3-tinymodel" "$tmp/tiny" >/dev/null 2>&1 || fail "h3-tinymodel"
ffmpeg -v error -y -f lavfi -i "color=c=red:size=128x128" -frames:v 1 "$tmp/red.png" || fail "ffmpeg red"
K=(--model "$tmp/tiny" --size 128x128 --steps 2 --seed 3 --device cpu --progress none)
"$H3RUN" generate "${K[@]}" --prompt "a red ball rolls" --prompt "a blue sky" --frames 124 --window 56 --overlap 17 \
    --first-frame "$tmp/k.png" --last-frame "$tmp/red.png" --keyframe "$tmp/red.png@60" -o "$tmp/kl.mp4" \
    --dump-dit-inputs "$tmp/kl.st" >"$tmp/out" 2>"$tmp/err" || fail "keyframes in a long clip: $(tail -3 "$tmp/err")"
grep -q "^windows: 3 overlapping" "$tmp/out" && grep -q "^keyframes: 3 (16 rows held" "$tmp/out" ||
    fail "keyframes in a long clip: the summary: $(cat "$tmp/out")"
"$H3RUN" generate "${K[@]}" --prompt "a red ball rolls" --frames 56 --first-frame "$tmp/k.png" -o "$tmp/k1.mp4" \
    --dump-dit-inputs "$tmp/k1.st" >/dev/null 2>"$tmp/err" || fail "the one-window clip: $(tail -3 "$tmp/err")"
r=$(python3 "$SRC/tests/latents_tool.py" same-inputs "$tmp/kl.st" "$tmp/k1.st" 16) ||
    fail "window 0's first call differs from the one-window clip's: $r"

# bad input
expect() { # WHAT GREP ARGS...
    local what=$1 pat=$2
    shift 2
    rm -f "$tmp/bad.mp4"
    "$H3RUN" generate --frames 124 --steps 1 --device cpu --progress none -o "$tmp/bad.mp4" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    [ $rc -eq 2 ] || fail "$what: exit $rc, want 2: $(cat "$tmp/err")"
    grep -q -- "$pat" "$tmp/err" || fail "$what: the message lacks '$pat': $(cat "$tmp/err")"
    [ ! -e "$tmp/bad.mp4" ] && [ ! -e "$tmp/bad.mp4.partial" ] || fail "$what: an output was left"
}
expect "a window not 17n+5" "use 39 or 56" --prompt x --window 50
expect "an overlap not whole chunks" "whole 17-frame chunks" --prompt x --window 56 --overlap 10
expect "an overlap too long" "the window less 22" --prompt x --window 56 --overlap 51
expect "two prompts in one window" "several prompts need a clip of several windows" --prompt x --prompt y
printf '0 a\nlater b\n' >"$tmp/p1.txt"
expect "a --prompts line without a time" "a line is SECONDS PROMPT" --prompts "$tmp/p1.txt" --window 56
printf '1 a\n2 b\n' >"$tmp/p2.txt"
expect "a --prompts file not starting at 0" "the first prompt must start at 0" --prompts "$tmp/p2.txt" --window 56
printf '0 a\n9 b\n' >"$tmp/p3.txt"
expect "a prompt after the clip's end" "within the clip" --prompts "$tmp/p3.txt" --window 56

[ $fails -eq 0 ] && echo "cli_long: ok"
exit $((fails > 0))
