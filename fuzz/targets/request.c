/* The request options: command lines of every subcommand. The input is the command line, one argument per
 * line (NUL also ends an argument): the first names the command (generate, plan, encode, decode, dit,
 * quantize, inspect; else its first byte picks one), the rest are its arguments, parsed and checked as h3run
 * does.
 *
 * Every path stays inside the harness's folders (an argument holding '/' or equal to ".." is not run), so no
 * input reaches the machine's files. The commands run beside the reduced model, linked as "m", and small
 * input files for it: i.safetensors (DiT inputs), v.safetensors and a.safetensors (video and audio latents);
 * a valid request does its whole (small) work there. generate runs in an empty folder with "--model no-model"
 * first (a folder that does not exist), or it would find the small model of the source tree and run for
 * seconds: it parses, checks and stops before loading. A command that fails must leave no file behind; one
 * that succeeds may write its outputs. quantize --random-dit is left out: it makes a release-size block to
 * benchmark, work rather than a request. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "fuzz.h"
#include "io/safetensors.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    int beside_model;
} command;

static const command g_cmds[] = {
    {"generate", h3_cmd_generate, 0}, {"plan", h3_cmd_plan, 1}, {"encode", h3_cmd_encode, 1},
    {"decode", h3_cmd_decode, 1},     {"dit", h3_cmd_dit, 1},   {"quantize", h3_cmd_quantize, 1},
    {"inspect", h3_cmd_inspect, 1},
};
enum { N_CMDS = sizeof g_cmds / sizeof g_cmds[0], MAX_ARGS = 64, MAX_ARG = 512 };

/* A safetensors file of n tensors; data NULL: small varied floats. */
typedef struct {
    const char *name;
    h3_dtype dt;
    int nd;
    int64_t shape[5];
    const void *data;
} tdesc;

static void write_tensors(const char *rel, const tdesc *t, int n) {
    static float vals[4096];
    for (int i = 0; i < 4096; i++) vals[i] = (float)((i * 7) % 11 - 5) * 0.1f;
    h3_st_writer *w = NULL;
    h3_status st = h3_st_writer_new(&w);
    for (int i = 0; i < n && st == H3_OK; i++)
        st = h3_st_writer_add(w, t[i].name, t[i].dt, t[i].nd, t[i].shape, t[i].data ? t[i].data : vals);
    if (st == H3_OK) st = h3_st_writer_write(w, fz_path(rel), 0);
    h3_st_writer_free(w);
    if (st != H3_OK) abort();
}

/* The reduced model's inputs: a packed sequence of 4 video, 2 audio and 2 text rows, and latents. */
static void write_inputs(void) {
    enum { NV = 4, NA = 2, NL = 2, S = NV + NA + NL };
    static const float ts[1] = {0.5f};
    static const int32_t zeros[S] = {0}, tags[S] = {0, 0, 0, 0, 2, 2, 1, 1};
    static const int32_t vi[NV] = {0, 1, 2, 3}, ai[NA] = {4, 5}, li[NL] = {6, 7};
    static double pos[S * 3];
    for (int i = 0; i < S * 3; i++) pos[i] = (double)(i % 3);
    const tdesc dit[] = {
        {"video", H3_F32, 2, {NV, 96}, NULL},     {"audio", H3_F32, 2, {NA, 32}, NULL},
        {"text", H3_F32, 2, {NL, 64}, NULL},      {"timesteps", H3_F32, 1, {1}, ts},
        {"position_ids", H3_F64, 2, {S, 3}, pos}, {"timestep_indices", H3_I32, 1, {S}, zeros},
        {"token_tags", H3_I32, 1, {S}, tags},     {"video_indices", H3_I32, 1, {NV}, vi},
        {"audio_indices", H3_I32, 1, {NA}, ai},   {"text_indices", H3_I32, 1, {NL}, li},
    };
    write_tensors("withmodel/i.safetensors", dit, 10);
    const tdesc video = {"latents", H3_F32, 5, {1, 24, 1, 2, 2}, NULL},
                audio = {"latents", H3_F32, 3, {2, 32, 2}, NULL};
    write_tensors("withmodel/v.safetensors", &video, 1);
    write_tensors("withmodel/a.safetensors", &audio, 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char home[4096];
    if (!home[0]) {
        if (!getcwd(home, sizeof home)) return 0;
        fz_link("withmodel/m", fz_tiny_model());
        write_inputs();
        fz_mkdir("empty");
        fz_keep();
    }
    /* split into arguments */
    static char buf[MAX_ARGS][MAX_ARG];
    char *argv[MAX_ARGS + 3];
    int argc = 0;
    for (size_t i = 0; i < size && argc < MAX_ARGS;) {
        size_t j = i;
        while (j < size && data[j] != '\n' && data[j] != 0) j++;
        if (j - i >= MAX_ARG) return 0;
        memcpy(buf[argc], data + i, j - i);
        buf[argc][j - i] = 0;
        if (strchr(buf[argc], '/') || !strcmp(buf[argc], "..") || !strcmp(buf[argc], "--random-dit"))
            return 0;
        argv[argc] = buf[argc];
        argc++;
        i = j + 1;
    }
    if (argc == 0) return 0;
    const command *cmd = &g_cmds[(unsigned char)argv[0][0] % N_CMDS];
    for (int i = 0; i < N_CMDS; i++)
        if (!strcmp(argv[0], g_cmds[i].name)) cmd = &g_cmds[i];
    /* thread counts are taken up to 2^31-1 by dit and quantize (F6: a calloc of 16 GiB) */
    for (int i = 1; i + 1 < argc && fz_open_finding("F6"); i++)
        if ((!strcmp(argv[i], "--threads") || !strcmp(argv[i], "-t")) && strlen(argv[i + 1]) > 4) return 0;
    if (cmd->fn == h3_cmd_generate) {
        memmove(argv + 3, argv + 1, (size_t)(argc - 1) * sizeof *argv);
        argv[1] = "--model";
        argv[2] = "no-model";
        argc += 2;
    }
    argv[argc] = NULL;
    fz_quiet(1);
    if (chdir(fz_path(cmd->beside_model ? "withmodel" : "empty")) != 0) return 0;
    const int rc = cmd->fn(argc - 1, argv + 1);
    if (chdir(home) != 0) return 0;
    fz_quiet(0);
    fz_end(cmd->name, rc == 0);
    return 0;
}
