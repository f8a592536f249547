/* Command-line plumbing shared by the subcommands: one table of options per command, with help text. */
#ifndef H3_CLI_CLI_H
#define H3_CLI_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

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
    H3_OPT_SIZE
} h3_opt_type;

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

/* Reads a prompt from a file (--prompt-file): all of it, as is. Refused as a bad request (H3_ERR_INVALID): a
 * file that is not a regular file, one longer than a prompt may be (h3_request_check_prompt_bytes), one
 * holding a NUL byte. *text is NUL-terminated, from h3_malloc. */
h3_status h3_cli_read_prompt(const char *path, char **text, size_t *len);

/* Installs the stderr log callback. verbosity: -1 quiet (errors only), 0 normal, 1 verbose. */
void h3_cli_setup_logging(int verbosity);
/* Prints "h3run CMD: error: <last error>" to stderr and returns the exit status for the code. */
int h3_cli_fail(const char *cmd, h3_status st);

/* The small trained model h3run uses when no --model is given (models/h3-small: docs/SYNTH.md): looked for
 * beside the program (PROGRAM_DIR/../models/h3-small in a checkout or build tree,
 * PROGRAM_DIR/../share/h3run/models/h3-small installed), then in the working folder (models/h3-small).
 * Returns the folder (caller frees) or NULL. */
char *h3_cli_default_model(void);
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
