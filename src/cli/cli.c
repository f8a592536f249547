#include "cli/cli.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/log.h"
#include "cuda/cuda.h"
#include "mem/budget.h"
#include "models/lora.h"
#include "pipeline/generate.h"
#include "pipeline/request.h"

/* Where the build was configured (CMakeLists.txt passes both): the default model's last two places. */
#ifndef H3_INSTALL_PREFIX
#define H3_INSTALL_PREFIX NULL
#endif
#ifndef H3_SOURCE_TREE
#define H3_SOURCE_TREE NULL
#endif

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
        case H3_OPT_LIST:
        case H3_OPT_TEXTS: {
            h3_cli_list *l = o->target;
            int most = o->max >= 1 && o->max < H3_CLI_LIST_MAX ? (int)o->max : H3_CLI_LIST_MAX;
            if (!*v && o->type == H3_OPT_LIST) {
                fprintf(stderr, "h3run %s: --%s needs a value (%s); got an empty string\n", cmd->name,
                        o->name, o->metavar ? o->metavar : "");
                return H3_EXIT_USAGE;
            }
            if (l->n >= most) {
                fprintf(stderr, "h3run %s: --%s may be given at most %d times\n", cmd->name, o->name, most);
                return H3_EXIT_USAGE;
            }
            l->v[l->n++] = v;
            return 0;
        }
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

int h3_cli_loras_parse(const char *cmd, const h3_cli_list *given, const char *mode, h3_cli_loras *out) {
    memset(out, 0, sizeof *out);
    h3_lora_mode m;
    if (h3_lora_mode_parse(mode, &m) != H3_OK) {
        fprintf(stderr, "h3run %s: %s\n", cmd, h3_last_error());
        h3_clear_error();
        return H3_EXIT_USAGE;
    }
    out->mode = (int)m;
    for (int i = 0; i < given->n; i++) {
        const char *s = given->v[i], *colon = strrchr(s, ':');
        size_t plen = strlen(s);
        double x = 1.0;
        if (colon) {
            char *end;
            errno = 0;
            double v = strtod(colon + 1, &end);
            if (end != colon + 1 && !*end && !errno) {
                if (!isfinite(v) || v < -100 || v > 100) {
                    fprintf(stderr, "h3run %s: --lora %s: the strength takes a number from -100 to 100\n",
                            cmd, s);
                    h3_cli_loras_free(out);
                    return H3_EXIT_USAGE;
                }
                x = v;
                plen = (size_t)(colon - s);
            }
        }
        if (plen == 0) {
            fprintf(stderr, "h3run %s: --lora %s names no file (FILE[:STRENGTH])\n", cmd, s);
            h3_cli_loras_free(out);
            return H3_EXIT_USAGE;
        }
        out->path[i] = h3_malloc(plen + 1, H3_MEM_OTHER);
        if (!out->path[i]) {
            fprintf(stderr, "h3run %s: out of memory\n", cmd);
            h3_cli_loras_free(out);
            return H3_EXIT_FAIL;
        }
        memcpy(out->path[i], s, plen);
        out->path[i][plen] = 0;
        out->strength[i] = (float)x;
        out->n = i + 1;
    }
    return 0;
}

int h3_cli_check_paths_loras(const char *cmd, const h3_cli_path *paths, int n, const h3_cli_loras *l) {
    h3_cli_path all[64];
    int k = 0;
    for (int i = 0; i < n && k < 64; i++) all[k++] = paths[i];
    for (int i = 0; i < l->n && k < 64; i++) all[k++] = (h3_cli_path){"--lora", l->path[i], H3_CLI_IN_FILE};
    return h3_cli_check_paths(cmd, all, k);
}

void h3_cli_loras_free(h3_cli_loras *l) {
    for (int i = 0; i < l->n; i++) h3_free(l->path[i]);
    memset(l, 0, sizeof *l);
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

/* Appends dir/rel to the places unless it is there already (an install prefix that is also the checkout). */
static int add_place(char **places, int n, int max, const char *dir, const char *rel) {
    if (n >= max || !dir || !*dir) return n;
    char *p = h3_path_join(dir, rel);
    if (!p) return n;
    for (int i = 0; i < n; i++)
        if (!strcmp(places[i], p)) {
            h3_free(p);
            return n;
        }
    places[n] = p;
    return n + 1;
}

int h3_cli_model_places(const h3_cli_model_where *w, char **places, int max) {
    int n = 0;
    /* 1. H3RUN_MODELS: folders of models, separated by ':' as in PATH */
    if (w->models_env) {
        const char *s = w->models_env;
        while (*s) {
            size_t len = strcspn(s, ":");
            if (len) {
                char *dir = h3_malloc(len + 1, H3_MEM_OTHER);
                if (dir) {
                    memcpy(dir, s, len);
                    dir[len] = 0;
                    n = add_place(places, n, max, dir, H3_SMALL_MODEL);
                    h3_free(dir);
                }
            }
            s += len;
            if (*s == ':') s++;
        }
    }
    /* 2. beside the program (a checkout's build folder), 3. the prefix the program was installed under: both
     * relative to the folder above the program's (PREFIX for PREFIX/bin/h3run) */
    char *pdir = w->program ? h3_path_dir(w->program) : NULL, *real = pdir ? realpath(pdir, NULL) : NULL;
    char *up = real ? h3_path_dir(real) : NULL;
    n = add_place(places, n, max, up, "models/" H3_SMALL_MODEL);
    n = add_place(places, n, max, up, "share/h3run/models/" H3_SMALL_MODEL);
    h3_free(up);
    free(real);
    h3_free(pdir);
    n = add_place(places, n, max, w->install_prefix, "share/h3run/models/" H3_SMALL_MODEL);
    /* 4. the source tree the build was configured from (an out-of-tree build: cmake -S . -B /elsewhere) */
    n = add_place(places, n, max, w->source_tree, "models/" H3_SMALL_MODEL);
    return n;
}

char *h3_cli_find_model(const h3_cli_model_where *w, char *looked, size_t looked_size) {
    char *places[H3_CLI_MAX_MODEL_PLACES];
    const int n = h3_cli_model_places(w, places, H3_CLI_MAX_MODEL_PLACES);
    char *found = NULL;
    size_t used = 0;
    if (looked && looked_size) looked[0] = 0;
    for (int i = 0; i < n; i++) {
        char *real = !found && h3_path_is_dir(places[i]) ? realpath(places[i], NULL) : NULL;
        if (real) { /* links resolved, as the path printed and used */
            found = h3_strdup(real);
            free(real);
        }
        if (looked && used < looked_size) {
            int k = snprintf(looked + used, looked_size - used, "%s%s", i ? ", " : "", places[i]);
            if (k > 0) used += (size_t)k;
        }
        h3_free(places[i]);
    }
    if (found && looked && looked_size) looked[0] = 0;
    return found;
}

char *h3_cli_default_model(char *looked, size_t looked_size) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) exe[n] = 0;
    const h3_cli_model_where w = {getenv("H3RUN_MODELS"), n > 0 ? exe : NULL, H3_INSTALL_PREFIX,
                                  H3_SOURCE_TREE};
    return h3_cli_find_model(&w, looked, looked_size);
}

/* A seed nobody chose: from the kernel's random source, else the clock. Printed so the run can be repeated.
 */
uint64_t h3_cli_random_seed(void) {
    uint64_t s = 0;
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd >= 0) {
        if (read(fd, &s, sizeof s) != (ssize_t)sizeof s) s = 0;
        close(fd);
    }
    if (!s) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
    }
    return s >> 11; /* 53 bits: exact in JSON and in every language's doubles */
}
