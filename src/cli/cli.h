/* Command-line plumbing shared by the subcommands: one table of options per command, with help text. */
#ifndef H3_CLI_CLI_H
#define H3_CLI_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

/* Exit statuses: 0 success; 1 the work failed (bad file, out of memory, device error); 2 the request was bad
 * (unknown option, invalid value, impossible frame count...). */
enum { H3_EXIT_OK = 0, H3_EXIT_FAIL = 1, H3_EXIT_USAGE = 2 };

typedef enum h3_opt_type { H3_OPT_FLAG, H3_OPT_STR, H3_OPT_INT, H3_OPT_FLOAT, H3_OPT_SIZE } h3_opt_type;

typedef struct h3_cli_opt {
    const char *name; /* long name without dashes */
    char short_name;  /* or 0 */
    h3_opt_type type;
    void *target; /* int* (FLAG), const char** (STR), int64_t* (INT, SIZE), double* (FLOAT) */
    const char *metavar;
    const char *help;
} h3_cli_opt;

typedef struct h3_cli_cmd {
    const char *name;
    const char *usage;   /* "inspect PATH [--summary]" */
    const char *summary; /* one line */
    const char *details; /* paragraphs and examples printed by --help */
    const h3_cli_opt *opts;
    int min_pos, max_pos; /* positional arguments */
} h3_cli_cmd;

/* Parses argv (after the subcommand name). Prints problems to stderr and returns H3_EXIT_USAGE; returns -1 after
 * printing --help; 0 on success. */
int h3_cli_parse(const h3_cli_cmd *cmd, int argc, char **argv, const char **pos, int *npos);
void h3_cli_print_help(const h3_cli_cmd *cmd, FILE *out);

/* Parses "8GiB", "512M", "1.5G", "123456" into bytes. Returns 0 on success. */
int h3_parse_size(const char *s, int64_t *out);
/* Human-readable bytes ("61.73 GiB"). */
const char *h3_fmt_bytes(double bytes, char *buf, size_t n);
/* 33122992912 -> "33,122,992,912". */
const char *h3_fmt_int(int64_t v, char *buf, size_t n);

/* Installs the stderr log callback. verbosity: -1 quiet (errors only), 0 normal, 1 verbose. */
void h3_cli_setup_logging(int verbosity);
/* Prints "h3run CMD: error: <last error>" to stderr and returns the exit status for the code. */
int h3_cli_fail(const char *cmd, h3_status st);

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
int h3_cmd_quantize(int argc, char **argv);
int h3_cmd_plan(int argc, char **argv);
int h3_cmd_generate(int argc, char **argv);

#endif
