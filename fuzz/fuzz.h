/* The fuzz targets' shared harness (fuzz/README.md).
 *
 * A target is one file in fuzz/targets/ defining LLVMFuzzerTestOneInput. It is linked twice: with libFuzzer
 * (clang, -DH3_FUZZ=ON) to search for inputs, and with fuzz/driver.c (any compiler) to replay files. Either
 * way a finding is a crash, a sanitizer report, an abort from the harness (a file left behind, a file changed
 * that the input was not meant to change) or a hang.
 *
 * Files: each process works in a private folder (fz_dir, under TMPDIR, removed at exit). What a target puts
 * there before fz_keep() (a reduced model, fixed shards) is the folder's state; each input's own files are
 * written with fz_write / fz_link and removed by fz_end, which then aborts when anything else differs from
 * that state. */
#ifndef H3_FUZZ_FUZZ_H
#define H3_FUZZ_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The private folder (absolute path), made on first use. */
const char *fz_dir(void);
/* fz_dir()/rel in a static buffer of one of 8 slots (so a few may be held at once). */
const char *fz_path(const char *rel);
/* Writes data to fz_dir()/rel (its folders made), remembered for fz_end. Aborts when the harness cannot. */
const char *fz_write(const char *rel, const void *data, size_t n);
/* fz_dir()/rel as a symbolic link to target, or a folder; both remembered for fz_end. */
const char *fz_link(const char *rel, const char *target);
const char *fz_mkdir(const char *rel);
/* Records the folder's state: every later fz_end compares with it. */
void fz_keep(void);
/* Removes what this input wrote (fz_write, fz_link, fz_mkdir); with outputs_ok, also anything else that is
 * new (outputs of a command that succeeded). Then aborts, naming `what`, if the folder differs from its kept
 * state: a file left behind by a failed command, or a kept file changed. */
void fz_end(const char *what, int outputs_ok);

/* Sends what the code under test prints (through stdout and stderr) to /dev/null until fz_quiet(0); sanitizer
 * and libFuzzer reports still reach descriptor 2. H3_FUZZ_VERBOSE=1 keeps everything. Also drops the
 * library's log. */
void fz_quiet(int on);

/* With H3_FUZZ_VERBOSE=1: prints what ran and its status (with the library's message when it failed), to see
 * how far an input gets. Returns st. */
int fz_note(const char *what, int st);

/* The reduced model of tools/h3-tinymodel.c: $H3_FUZZ_MODEL, else written once into fz_dir()/tiny by the
 * h3-tinymodel next to this build. Call before fz_keep(). */
const char *fz_tiny_model(void);

/* Makes fz_dir()/rel a copy of the reduced model made of links, except along the path `replace` (relative to
 * the model, e.g. "video_vae/source/config.json"): its folders are real folders of links to the rest, and the
 * file itself is absent. Returns where that file goes, relative to fz_dir() (write it there, or leave it out
 * to drop it). */
const char *fz_model_with(const char *rel, const char *replace);

/* 1 while finding `id` (F1, F2, ...) is listed as open in fuzz/known/open.txt: the targets then step around
 * the inputs that reach it, so that a bounded run finds new things instead of the same one. H3_FUZZ_ALL=1
 * turns every guard off (to reproduce, or to check a fix). */
int fz_open_finding(const char *id);

/* Opens path as a weight set (h3_weights_open: safetensors file, index, folder or GGUF), runs the component
 * detection, and reaches every tensor: as a view, then as a weight (quantization markers and scales, GGUF
 * blocks) decoded to f32 rows when it has at most 2^16 elements. Returns whether the set opened. */
int fz_walk_weights(const char *path);

/* Whether the bytes hold text (a plain search: no NUL needed). */
int fz_contains(const uint8_t *data, size_t n, const char *text);

/* Small readers of the input bytes. */
typedef struct fz_bytes {
    const uint8_t *p;
    size_t n;
} fz_bytes;
uint32_t fz_u8(fz_bytes *b);
uint32_t fz_u16(fz_bytes *b);

#endif
