#include "cli/cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/log.h"
#include "cuda/cuda.h"
#include "mem/budget.h"
#include "pipeline/generate.h"
#include "pipeline/request.h"

static const h3_cli_opt *find_long(const h3_cli_opt *o, const char *name, size_t len) {
    for (; o && o->name; o++)
        if (strlen(o->name) == len && strncmp(o->name, name, len) == 0) return o;
    return NULL;
}

static const h3_cli_opt *find_short(const h3_cli_opt *o, char c) {
    for (; o && o->name; o++)
        if (o->short_name == c) return o;
    return NULL;
}

int h3_parse_size(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0) || !isfinite(v)) return 1;
    while (*end == ' ') end++;
    double mul = 1;
    char u = (char)toupper((unsigned char)*end);
    if (u) {
        switch (u) {
            case 'K':
                mul = 1024.0;
                break;
            case 'M':
                mul = 1024.0 * 1024;
                break;
            case 'G':
                mul = 1024.0 * 1024 * 1024;
                break;
            case 'T':
                mul = 1024.0 * 1024 * 1024 * 1024;
                break;
            case 'B':
                mul = 1;
                break;
            default:
                return 1;
        }
        end++;
        if (u != 'B') {
            if (*end == 'i' || *end == 'I') end++;
            if (*end == 'B' || *end == 'b') end++;
        }
    }
    if (*end) return 1;
    double b = v * mul;
    if (b > 9.0e18) return 1;
    *out = (int64_t)b;
    return 0;
}

const char *h3_fmt_bytes(double b, char *buf, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
    return buf;
}

const char *h3_fmt_int(int64_t v, char *buf, size_t n) {
    char tmp[32];
    int neg = v < 0;
    uint64_t u = neg ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v;
    int len = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)u);
    size_t o = 0;
    if (neg && o + 1 < n) buf[o++] = '-';
    for (int i = 0; i < len && o + 1 < n; i++) {
        if (i && (len - i) % 3 == 0 && o + 1 < n) buf[o++] = ',';
        buf[o++] = tmp[i];
    }
    buf[o] = 0;
    return buf;
}

void h3_cli_print_help(const h3_cli_cmd *cmd, FILE *out) {
    fprintf(out, "usage: h3run %s\n\n%s\n", cmd->usage, cmd->summary);
    if (cmd->opts && cmd->opts->name) {
        fprintf(out, "\noptions:\n");
        for (const h3_cli_opt *o = cmd->opts; o->name; o++) {
            char left[64];
            if (o->short_name)
                snprintf(left, sizeof left, "-%c, --%s%s%s", o->short_name, o->name, o->metavar ? " " : "",
                         o->metavar ? o->metavar : "");
            else
                snprintf(left, sizeof left, "    --%s%s%s", o->name, o->metavar ? " " : "",
                         o->metavar ? o->metavar : "");
            fprintf(out, "  %-28s %s\n", left, o->help);
        }
        fprintf(out, "  %-28s %s\n", "-h, --help", "show this help");
    }
    if (cmd->details) fprintf(out, "\n%s\n", cmd->details);
}

/* "a whole number from 1 to 14400" */
static void range_text(const h3_cli_opt *o, char *buf, size_t n) {
    const char *what = o->type == H3_OPT_INT ? "a whole number" : "a number";
    if (o->min < o->max)
        snprintf(buf, n, o->type == H3_OPT_INT ? "%s from %.0f to %.0f" : "%s from %g to %g", what, o->min,
                 o->max);
    else
        snprintf(buf, n, "%s", what);
}

static int set_value(const h3_cli_cmd *cmd, const h3_cli_opt *o, const char *v) {
    char *end;
    switch (o->type) {
        case H3_OPT_STR:
            if (!*v) {
                fprintf(stderr, "h3run %s: --%s needs a value (%s); got an empty string\n", cmd->name,
                        o->name, o->metavar ? o->metavar : "");
                return H3_EXIT_USAGE;
            }
            *(const char **)o->target = v;
            return 0;
        case H3_OPT_TEXT:
            *(const char **)o->target = v;
            return 0;
        case H3_OPT_INT: {
            errno = 0;
            long long x = strtoll(v, &end, 10);
            if (end == v || *end || errno) break;
            if (o->min < o->max && ((double)x < o->min || (double)x > o->max)) break;
            *(int64_t *)o->target = x;
            return 0;
        }
        case H3_OPT_FLOAT: {
            errno = 0;
            double x = strtod(v, &end);
            if (end == v || *end || errno || !isfinite(x)) break;
            if (o->min < o->max && (x < o->min || x > o->max)) break;
            *(double *)o->target = x;
            return 0;
        }
        case H3_OPT_SIZE:
            if (h3_parse_size(v, (int64_t *)o->target) == 0) return 0;
            fprintf(stderr, "h3run %s: --%s takes a size like 8GiB, 512M or 123456; got '%s'\n", cmd->name,
                    o->name, v);
            return H3_EXIT_USAGE;
        default:
            break;
    }
    char range[96];
    range_text(o, range, sizeof range);
    fprintf(stderr, "h3run %s: --%s takes %s; got '%s'\n", cmd->name, o->name, range, v);
    return H3_EXIT_USAGE;
}

int h3_cli_parse(const h3_cli_cmd *cmd, int argc, char **argv, const char **pos, int *npos) {
    *npos = 0;
    int only_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!only_pos && (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)) {
            h3_cli_print_help(cmd, stdout);
            return -1;
        }
        if (!only_pos && strcmp(a, "--") == 0) {
            only_pos = 1;
            continue;
        }
        const h3_cli_opt *o = NULL;
        const char *val = NULL;
        if (!only_pos && a[0] == '-' && a[1] == '-') {
            const char *eq = strchr(a + 2, '=');
            size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            o = find_long(cmd->opts, a + 2, len);
            if (!o) {
                fprintf(stderr, "h3run %s: unknown option '%.*s' (see 'h3run %s --help')\n", cmd->name,
                        (int)(len + 2), a, cmd->name);
                return H3_EXIT_USAGE;
            }
            if (eq) val = eq + 1;
        } else if (!only_pos && a[0] == '-' && a[1] && !isdigit((unsigned char)a[1])) {
            o = find_short(cmd->opts, a[1]);
            if (!o || a[2]) {
                fprintf(stderr, "h3run %s: unknown option '%s' (see 'h3run %s --help')\n", cmd->name, a,
                        cmd->name);
                return H3_EXIT_USAGE;
            }
        } else {
            if (!*a) {
                fprintf(stderr, "h3run %s: an empty argument (usage: h3run %s)\n", cmd->name, cmd->usage);
                return H3_EXIT_USAGE;
            }
            if (*npos >= cmd->max_pos) {
                fprintf(stderr, "h3run %s: unexpected argument '%s' (usage: h3run %s)\n", cmd->name, a,
                        cmd->usage);
                return H3_EXIT_USAGE;
            }
            pos[(*npos)++] = a;
            continue;
        }
        if (o->type == H3_OPT_FLAG) {
            if (val) {
                fprintf(stderr, "h3run %s: --%s takes no value\n", cmd->name, o->name);
                return H3_EXIT_USAGE;
            }
            *(int *)o->target = 1;
            continue;
        }
        if (!val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "h3run %s: --%s needs a value (%s)\n", cmd->name, o->name,
                        o->metavar ? o->metavar : "");
                return H3_EXIT_USAGE;
            }
            val = argv[++i];
        }
        int r = set_value(cmd, o, val);
        if (r) return r;
    }
    if (*npos < cmd->min_pos) {
        fprintf(stderr, "h3run %s: missing argument (usage: h3run %s)\n", cmd->name, cmd->usage);
        return H3_EXIT_USAGE;
    }
    return 0;
}

h3_status h3_cli_read_prompt(const char *path, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    struct stat sb;
    if (stat(path, &sb) != 0) return H3_ERR(H3_ERR_INVALID, "--prompt-file %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return H3_ERR(H3_ERR_INVALID, "--prompt-file %s is not a regular file; give a text file", path);
    H3_TRY_CTX(h3_request_check_prompt_bytes((size_t)sb.st_size), "--prompt-file %s", path);
    H3_TRY(h3_read_file(path, H3_MAX_PROMPT_BYTES, text, len));
    if (memchr(*text, 0, *len)) {
        h3_free(*text);
        *text = NULL;
        return H3_ERR(H3_ERR_INVALID, "--prompt-file %s contains a NUL byte; a prompt is UTF-8 text", path);
    }
    return H3_OK;
}

static void log_stderr(h3_log_level level, const char *msg, void *user) {
    (void)user;
    static const char *const tags[] = {"debug: ", "", "warning: ", "error: "};
    fprintf(stderr, "%s%s\n", tags[level], msg);
}

void h3_cli_setup_logging(int verbosity) {
    h3_log_level min = verbosity < 0 ? H3_LOG_ERROR : verbosity > 0 ? H3_LOG_DEBUG : H3_LOG_INFO;
    h3_log_set_callback(log_stderr, NULL, min);
}

int h3_cli_fail(const char *cmd, h3_status st) {
    const char *msg = h3_last_error();
    if (!msg[0]) msg = h3_code_name(st);
    fprintf(stderr, "h3run %s: error: %s\n", cmd, msg);
    return st == H3_ERR_INVALID ? H3_EXIT_USAGE : H3_EXIT_FAIL;
}

int h3_cli_device_resolve(const char *cmd, const char *device, const char *vram_s, int plan_only,
                          h3_cli_device *out) {
    memset(out, 0, sizeof *out);
    h3_device d;
    h3_status st = h3_device_parse(device ? device : "cpu", &d);
    if (st == H3_OK && vram_s) st = h3_budget_parse(vram_s, "--vram-budget", &out->vram);
    if (st != H3_OK) return h3_cli_fail(cmd, st);
    const int gpus = h3_cuda_device_count();
    if (d == H3_DEVICE_AUTO) d = gpus > 0 ? H3_DEVICE_CUDA : H3_DEVICE_CPU;
    if (d == H3_DEVICE_CPU) return 0;
    if (gpus == 0 && !(plan_only && out->vram)) {
        fprintf(stderr, "h3run %s: error: --device cuda: %s; use --device cpu\n", cmd,
                h3_cuda_compiled() ? "no CUDA GPU is visible on this machine"
                                   : "this h3run was built without CUDA");
        return H3_EXIT_USAGE;
    }
    out->cuda = 1;
    out->required = device && !strcmp(device, "cuda");
    char name[128] = "";
    int64_t free_b = 0;
    if (gpus > 0 && h3_cuda_device_info(0, name, sizeof name, NULL, &free_b) == H3_OK)
        out->have_fig = h3_device_figures_for(name, &out->fig);
    h3_clear_error();
    if (!out->vram) {
        st = h3_budget_default_vram(0, &out->vram);
        if (st != H3_OK) return h3_cli_fail(cmd, st);
    }
    return 0;
}

h3_status h3_cli_device_refused(const char *stage, const char *reason) {
    return H3_ERR(H3_ERR_BUDGET,
                  "the %s cannot run on the GPU within the device budget: %s; raise --vram-budget, "
                  "or use --device auto (the host when the GPU cannot hold it) or --device cpu",
                  stage, reason);
}

int h3_cli_check_paths(const char *cmd, const h3_cli_path *paths, int n) {
    h3_pathset ps;
    h3_pathset_init(&ps);
    h3_status st = H3_OK;
    for (int i = 0; i < n && st == H3_OK; i++) {
        const h3_cli_path *p = &paths[i];
        if (!p->path) continue;
        switch (p->role) {
            case H3_CLI_IN:
                st = h3_pathset_input(&ps, p->opt, p->path, 0);
                break;
            case H3_CLI_IN_FILE:
                st = h3_pathset_input(&ps, p->opt, p->path, 1);
                break;
            case H3_CLI_OUT_FILE:
                st = h3_pathset_output(&ps, p->opt, p->path, H3_OUT_FILE);
                break;
            case H3_CLI_OUT_DIR:
                st = h3_pathset_output(&ps, p->opt, p->path, H3_OUT_DIR);
                break;
            case H3_CLI_OUT_ANY:
                st = h3_pathset_output(&ps, p->opt, p->path, H3_OUT_FILE_OR_DIR);
                break;
        }
    }
    h3_pathset_free(&ps);
    return st == H3_OK ? 0 : h3_cli_fail(cmd, st);
}

static volatile sig_atomic_t g_signal;
static h3_outgroup g_run_outs;
static int g_run_open;

static void on_stop_signal(int sig) {
    g_signal = sig;
    h3_cancel_request(); /* async-signal-safe: one lock-free atomic store */
}

void h3_cli_run_begin(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND; /* a second signal takes the default action: the process ends at once */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    h3_outgroup_begin(&g_run_outs);
    g_run_open = 1;
}

h3_status h3_cli_run_end(h3_status st) {
    const int sig = g_signal;
    if (sig || h3_cancel_requested()) {
        /* generate says which stage it stopped in; other commands' stops are told here */
        if (st != H3_ERR_INTERRUPTED || !strstr(h3_last_error_message(), "removed what it had written"))
            st = H3_ERR(H3_ERR_INTERRUPTED,
                        "interrupted by %s: the command stopped and removed what it had written",
                        sig == SIGINT    ? "SIGINT (Ctrl-C)"
                        : sig == SIGTERM ? "SIGTERM"
                                         : "a stop request");
    }
    if (g_run_open) {
        g_run_open = 0;
        if (st == H3_OK)
            st = h3_outgroup_commit(&g_run_outs);
        else
            h3_outgroup_abort(&g_run_outs);
    }
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    return st;
}

char *h3_cli_default_model(void) {
    static const char *const rel[] = {"../models/h3-small", "../share/h3run/models/h3-small"};
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            char *p = h3_path_join(exe, rel[i]), *real = p && h3_path_is_dir(p) ? realpath(p, NULL) : NULL;
            h3_free(p);
            if (real) { /* the folder without "build/.." in it */
                char *out = h3_strdup(real);
                free(real);
                return out;
            }
        }
    }
    return h3_path_is_dir("models/h3-small") ? h3_strdup("models/h3-small") : NULL;
}
