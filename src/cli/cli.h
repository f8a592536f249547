/* Command-line plumbing shared by the subcommands: one table of options per command, with help text. */
#ifndef H3_CLI_CLI_H
#define H3_CLI_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "pipeline/plan.h"

/* Exit statuses: 0 success; 1 the work failed (bad file, out of memory, device error); 2 the request was bad
 * (unknown option, invalid value, impossible frame count...). */
enum { H3_EXIT_OK = 0, H3_EXIT_FAIL = 1, H3_EXIT_USAGE = 2 };

/* STR is a non-empty string (a path, a name); TEXT any string, the empty one included (a prompt). */
typedef enum h3_opt_type {
    H3_OPT_FLAG,
    H3_OPT_STR,
    H3_OPT_TEXT,
    H3_OPT_INT,
    H3_OPT_FLOAT,
    H3_OPT_SIZE,
    H3_OPT_LIST, /* a STR that may be repeated: target is an h3_cli_list, max the most occurrences */
    H3_OPT_TEXTS /* a TEXT that may be repeated (empty allowed), as H3_OPT_LIST */
} h3_opt_type;

#define H3_CLI_LIST_MAX 16
typedef struct h3_cli_list {
    const char *v[H3_CLI_LIST_MAX];
    int n;
} h3_cli_list;

typedef struct h3_cli_opt {
    const char *name; /* long name without dashes */
    char short_name;  /* or 0 */
    h3_opt_type type;
    void *target; /* int* (FLAG), const char** (STR, TEXT), int64_t* (INT, SIZE), double* (FLOAT) */
    const char *metavar;
    const char *help;
    /* INT and FLOAT: the values a user may give, inclusive; the parser refuses others with a message naming
     * the range. An option whose default is a "not given" value (0 frames: the default length) takes a range
     * without that value, so that giving it is an error rather than the default. Both 0: the type's whole
     * range. */
    double min, max;
} h3_cli_opt;

typedef struct h3_cli_cmd {
    const char *name;
    const char *usage;   /* "inspect PATH [--summary]" */
    const char *summary; /* one line */
    const char *details; /* paragraphs and examples printed by --help */
    const h3_cli_opt *opts;
    int min_pos, max_pos; /* positional arguments */
} h3_cli_cmd;

/* Parses argv (after the subcommand name). Prints problems to stderr and returns H3_EXIT_USAGE; returns -1
 * after printing --help; 0 on success. */
int h3_cli_parse(const h3_cli_cmd *cmd, int argc, char **argv, const char **pos, int *npos);
void h3_cli_print_help(const h3_cli_cmd *cmd, FILE *out);

/* Parses "8GiB", "512M", "1.5G", "123456" into bytes. Returns 0 on success. */
int h3_parse_size(const char *s, int64_t *out);
/* Human-readable bytes ("61.73 GiB"). */
const char *h3_fmt_bytes(double bytes, char *buf, size_t n);
/* 33122992912 -> "33,122,992,912". */
const char *h3_fmt_int(int64_t v, char *buf, size_t n);

/* Reads a prompt from a file (--prompt-file): all of it, as is. Refused as a bad request (H3_ERR_INVALID): a
 * file that is not a regular file, one longer than a prompt may be (h3_request_check_prompt_bytes), one
 * holding a NUL byte. *text is NUL-terminated, from h3_malloc. */
h3_status h3_cli_read_prompt(const char *path, char **text, size_t *len);

/* --lora FILE[:STRENGTH], repeatable, with --lora-mode: the LoRAs a DiT command applies. A strength is the
 * text after the last ':' when it reads as a number (default 1.0), so paths holding ':' still work. Returns
 * H3_EXIT_USAGE after printing the problem (a strength out of [-100, 100], a bad mode), 0 otherwise. */
typedef struct h3_cli_loras {
    char *path[H3_CLI_LIST_MAX]; /* h3_malloc'd */
    float strength[H3_CLI_LIST_MAX];
    int n;
    int mode; /* h3_lora_mode */
} h3_cli_loras;
int h3_cli_loras_parse(const char *cmd, const h3_cli_list *given, const char *mode, h3_cli_loras *out);
void h3_cli_loras_free(h3_cli_loras *l);
/* A seed nobody chose (generate without --seed, a job without "seed"): from the kernel's random source, else
 * the clock; 53 bits, exact in JSON and in every language's doubles. */
uint64_t h3_cli_random_seed(void);

/* Installs the stderr log callback. verbosity: -1 quiet (errors only), 0 normal, 1 verbose. */
void h3_cli_setup_logging(int verbosity);
/* Prints "h3run CMD: error: <last error>" to stderr and returns the exit status for the code. */
int h3_cli_fail(const char *cmd, h3_status st);

/* ---- paths, interrupts and outputs: one mechanism for every command ---------------------------------- */

typedef enum h3_cli_path_role {
    H3_CLI_IN = 0,   /* read: a file or a folder */
    H3_CLI_IN_FILE,  /* read: a file only */
    H3_CLI_OUT_FILE, /* written: a file */
    H3_CLI_OUT_DIR,  /* written: a folder of frames */
    H3_CLI_OUT_ANY,  /* written: a file or a folder, decided later (decode --out) */
} h3_cli_path_role;

typedef struct h3_cli_path {
    const char *opt;  /* "--wav" */
    const char *path; /* NULL: not given (skipped) */
    h3_cli_path_role role;
} h3_cli_path;

/* A command's paths, checked against each other before any work (base/fs.h, h3_pathset): inputs that are
 * FIFOs, devices or sockets (or folders where a file is wanted), outputs that name a device, a FIFO, a
 * non-empty folder of frames or a missing folder, two outputs on one path, and an output on an input (the
 * same file, or a file inside an input folder). Prints the problem and returns H3_EXIT_USAGE (H3_EXIT_FAIL
 * when out of memory); 0 when all is well. */
int h3_cli_check_paths(const char *cmd, const h3_cli_path *paths, int n);
/* h3_cli_check_paths over the command's paths and the LoRA files (each a file to read). */
int h3_cli_check_paths_loras(const char *cmd, const h3_cli_path *paths, int n, const h3_cli_loras *l);

/* Interrupts and outputs. h3_cli_run_begin installs SIGINT and SIGTERM handlers that ask the library to stop
 * (h3_cancel_request: the next op, or the running kernel between its pieces, returns H3_ERR_INTERRUPTED, so
 * any stage ends within about a second) and opens an output group (base/fs.h): every file the command writes
 * waits under its temporary name. h3_cli_run_end(st) commits them all when st is H3_OK and no stop came, else
 * removes them, restores the default signal actions and returns the status to report (a stop as
 * H3_ERR_INTERRUPTED, "interrupted by SIGTERM: ..."). A second signal ends the process at once; what it
 * leaves is named *.partial. Exactly one end per begin, on every path. */
void h3_cli_run_begin(void);
h3_status h3_cli_run_end(h3_status st);

/* ---- where a command's stages run: --device and --vram-budget ------------------------------------------ */

typedef struct h3_cli_device {
    int cuda;     /* the stages are planned for the GPU (and run there where their plan puts them) */
    int required; /* --device cuda: a stage the budget cannot hold on the GPU is an error, not the host */
    int64_t vram; /* the device budget (cuda): every byte the command takes on the GPU */
    int have_fig; /* figures of this GPU for time predictions */
    h3_device_figures fig;
} h3_cli_device;

/* Resolves --device NAME (cpu, cuda, or auto: cuda when a GPU is present) and --vram-budget SIZE (NULL: the
 * free memory less 512 MiB) for a command that runs stages (pipeline/stages.h). plan_only: the command only
 * prints its plan, so --device cuda needs no GPU when a budget is given (arithmetic only). Prints the problem
 * and returns H3_EXIT_USAGE (a bad name or size, --device cuda without a GPU); 0 otherwise. */
int h3_cli_device_resolve(const char *cmd, const char *device, const char *vram_s, int plan_only,
                          h3_cli_device *out);
/* The message when --device cuda was asked for and the plan puts the stage on the host: H3_ERR_BUDGET with
 * the plan's reason and the fixes. */
h3_status h3_cli_device_refused(const char *stage, const char *reason);

/* The small trained model h3run uses when no --model is given (models/h3-small: docs/SYNTH.md), looked for in
 * this order (docs/PIPELINE.md):
 *   1. DIR/h3-small for each DIR of the H3RUN_MODELS variable (folders of models, separated by ':'),
 *   2. beside the program: PROGRAM_DIR/../models/h3-small (the program in a checkout's build folder),
 *   3. the install prefix's share folder: PROGRAM_DIR/../share/h3run/models/h3-small (where `cmake --install`
 *      puts it beside PREFIX/bin/h3run), then the configured prefix's (H3_INSTALL_PREFIX, a compile
 * definition),
 *   4. the source tree the build was configured from: H3_SOURCE_TREE/models/h3-small (a compile definition),
 * so an out-of-tree build (cmake -S . -B /elsewhere) finds it. Each input may be NULL (not set / not known).
 */
#define H3_SMALL_MODEL "h3-small"
typedef struct h3_cli_model_where {
    const char *models_env;     /* H3RUN_MODELS */
    const char *program;        /* the program's path */
    const char *install_prefix; /* the configured install prefix */
    const char *source_tree;    /* the source tree the build was configured from */
} h3_cli_model_where;
enum { H3_CLI_MAX_MODEL_PLACES = 16 };
/* The places, in order, from h3_malloc (caller frees each); returns how many (at most max). */
int h3_cli_model_places(const h3_cli_model_where *w, char **places, int max);
/* The first of those places that is a folder, as an absolute path (caller frees with h3_free), or NULL; then
 * `looked` (when given) receives the places, comma-separated, for the message. */
char *h3_cli_find_model(const h3_cli_model_where *w, char *looked, size_t looked_size);
/* The same for this process: H3RUN_MODELS from the environment, the program from /proc/self/exe, the prefix
 * and source tree compiled in. */
char *h3_cli_default_model(char *looked, size_t looked_size);
/* Its canvas and length when the request names none: 56 frames (2.33 s) at 128x128, what it was trained on.
 */
enum { H3_SMALL_MODEL_FRAMES = 56 };

int h3_cmd_inspect(int argc, char **argv);
int h3_cmd_dit(int argc, char **argv);
int h3_cmd_encode(int argc, char **argv);
int h3_cmd_decode(int argc, char **argv);
int h3_cmd_vae_encode(int argc, char **argv);
int h3_cmd_quantize(int argc, char **argv);
int h3_cmd_plan(int argc, char **argv);
int h3_cmd_generate(int argc, char **argv);
int h3_cmd_serve(int argc, char **argv);

#endif
