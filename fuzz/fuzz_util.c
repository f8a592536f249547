/* The fuzz harness's helpers (fuzz/fuzz.h). Failures of the harness itself (a full disk, a missing tool)
 * abort with a message that starts "fuzz harness:", so they are never taken for findings of the code under
 * test. */
#define _XOPEN_SOURCE 700 /* nftw */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "io/detect.h"
#include "quant/qload.h"

extern char **environ;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static const int g_stderr = 2;

/* The harness compares its own text with loops of its own, and this file is built without coverage: libFuzzer
 * learns from the comparisons of the code under test, not from these. */
static int same(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

static void die(const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dprintf(g_stderr, "fuzz harness: %s\n", msg);
    abort();
}

/* ---- the private folder ------------------------------------------------------------------------- */

static char g_dir[PATH_MAX];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

static void rm_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (!S_ISDIR(st.st_mode)) {
        remove(path);
        return;
    }
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void remove_dir_at_exit(void) {
    if (g_dir[0]) rm_tree(g_dir);
}

const char *fz_dir(void) {
    if (g_dir[0]) return g_dir;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/h3fuzz.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir))
        die("cannot make a folder under %s: %s", tmp && *tmp ? tmp : "/tmp", strerror(errno));
    char *real = realpath(g_dir, NULL);
    if (real) {
        snprintf(g_dir, sizeof g_dir, "%s", real);
        free(real);
    }
    atexit(remove_dir_at_exit);
    return g_dir;
}

const char *fz_path(const char *rel) {
    static char bufs[8][PATH_MAX];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, PATH_MAX, "%s/%s", fz_dir(), rel);
    return b;
}

/* What this input made, removed by fz_end (deepest last made first). */
static char *g_made[256];
static int g_n_made;

static void remember(const char *rel) {
    for (int i = 0; i < g_n_made; i++)
        if (same(g_made[i], rel)) return;
    if (g_n_made == (int)(sizeof g_made / sizeof g_made[0])) die("more than 256 files for one input");
    g_made[g_n_made++] = strdup(rel);
}

static void make_parents(const char *rel) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", rel);
    for (char *s = p; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(fz_path(p), 0755) == 0) remember(p);
            *s = '/';
        }
}

const char *fz_write(const char *rel, const void *data, size_t n) {
    make_parents(rel);
    const char *path = fz_path(rel);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die("cannot write %s: %s", path, strerror(errno));
    remember(rel);
    const uint8_t *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) die("cannot write %s: %s", path, strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    close(fd);
    return path;
}

const char *fz_link(const char *rel, const char *target) {
    make_parents(rel);
    const char *path = fz_path(rel);
    if (symlink(target, path) != 0) die("cannot link %s: %s", path, strerror(errno));
    remember(rel);
    return path;
}

const char *fz_mkdir(const char *rel) {
    make_parents(rel);
    const char *path = fz_path(rel);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) die("cannot make %s: %s", path, strerror(errno));
    remember(rel);
    return path;
}

/* ---- the folder's state ------------------------------------------------------------------------- */

/* One line per entry under fz_dir (links not followed): "path type size mtime", the path escaped (a space is
 * \s, a backslash \\, a control character \xHH) so that any name is one word. Folders have size and mtime 0.
 */
typedef struct {
    char *text;
    size_t len, cap;
} strbuf;
static strbuf g_walk;

static void escape(const char *in, char *out, size_t n) {
    size_t k = 0;
    for (; *in && k + 5 < n; in++) {
        const unsigned char c = (unsigned char)*in;
        if (c == ' ')
            k += (size_t)snprintf(out + k, n - k, "\\s");
        else if (c == '\\')
            k += (size_t)snprintf(out + k, n - k, "\\\\");
        else if (c < 32 || c == 127)
            k += (size_t)snprintf(out + k, n - k, "\\x%02x", c);
        else
            out[k++] = (char)c;
    }
    out[k] = 0;
}

static int walk_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)flag;
    if (ftw->level == 0) return 0;
    char name[4 * PATH_MAX], line[4 * PATH_MAX + 96];
    escape(path + strlen(g_dir) + 1, name, sizeof name);
    const int dir = S_ISDIR(st->st_mode);
    int n = snprintf(line, sizeof line, "%s %o %lld %lld.%09ld\n", name, (unsigned)(st->st_mode & S_IFMT),
                     dir ? 0LL : (long long)st->st_size, dir ? 0LL : (long long)st->st_mtim.tv_sec,
                     dir ? 0L : st->st_mtim.tv_nsec);
    if (n < 0) return 0;
    if (g_walk.len + (size_t)n + 1 > g_walk.cap) {
        g_walk.cap = (g_walk.len + (size_t)n + 1) * 2;
        g_walk.text = realloc(g_walk.text, g_walk.cap);
        if (!g_walk.text) die("out of memory");
    }
    memcpy(g_walk.text + g_walk.len, line, (size_t)n + 1);
    g_walk.len += (size_t)n;
    return 0;
}

static int cmp_lines(const void *a, const void *b) {
    const unsigned char *x = *(const unsigned char *const *)a, *y = *(const unsigned char *const *)b;
    while (*x && *x == *y) x++, y++;
    return (int)*x - (int)*y;
}

/* The state as sorted lines, joined (caller frees). */
static char *state(void) {
    g_walk.len = 0;
    if (g_walk.text) g_walk.text[0] = 0;
    nftw(fz_dir(), walk_entry, 16, FTW_PHYS);
    if (!g_walk.text) return strdup("");
    size_t n = 0;
    for (size_t i = 0; i < g_walk.len; i++) n += g_walk.text[i] == '\n';
    char **lines = malloc((n + 1) * sizeof *lines);
    char *copy = strdup(g_walk.text), *s = copy;
    if (!lines || !copy) die("out of memory");
    size_t k = 0;
    for (char *nl; (nl = strchr(s, '\n')); s = nl + 1) {
        *nl = 0;
        lines[k++] = s;
    }
    qsort(lines, k, sizeof *lines, cmp_lines);
    char *out = malloc(g_walk.len + 1);
    if (!out) die("out of memory");
    size_t at = 0;
    for (size_t i = 0; i < k; i++) at += (size_t)sprintf(out + at, "%s\n", lines[i]);
    out[at] = 0;
    free(lines);
    free(copy);
    return out;
}

static char *g_kept;

void fz_keep(void) {
    for (int i = 0; i < g_n_made; i++) free(g_made[i]); /* made so far: part of the state now */
    g_n_made = 0;
    free(g_kept);
    g_kept = state();
}

/* Whether the state has a line that starts with `word` followed by `end` (' ' for a path, '\n' for a line).
 */
static int has_word(const char *st, const char *word, size_t n, char end) {
    for (const char *s = st; *s;) {
        size_t i = 0;
        while (i < n && s[i] == word[i]) i++;
        if (i == n && s[n] == end) return 1;
        while (*s && *s != '\n') s++;
        if (*s) s++;
    }
    return 0;
}

/* The first line of a that b lacks, into out. */
static int first_missing(const char *a, const char *b, char *out, size_t n) {
    for (const char *s = a; *s;) {
        size_t len = 0;
        while (s[len] && s[len] != '\n') len++;
        if (!has_word(b, s, len, '\n')) {
            snprintf(out, n, "%.*s", (int)len, s);
            return 1;
        }
        s += len + (s[len] == '\n');
    }
    return 0;
}

/* Removes the entries the kept state does not name (children before their folders). */
static int remove_new(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    if (ftw->level == 0) return 0;
    char name[4 * PATH_MAX];
    escape(path + strlen(g_dir) + 1, name, sizeof name);
    if (!has_word(g_kept, name, strlen(name), ' ')) remove(path);
    return 0;
}

void fz_end(const char *what, int outputs_ok) {
    for (int i = g_n_made - 1; i >= 0; i--) {
        rm_tree(fz_path(g_made[i]));
        free(g_made[i]);
    }
    g_n_made = 0;
    if (!g_kept) fz_keep();
    char *now = state();
    if (!same(now, g_kept)) {
        char extra[4 * PATH_MAX + 96] = "", gone[4 * PATH_MAX + 96] = "";
        const int has_extra = first_missing(now, g_kept, extra, sizeof extra);
        const int has_gone = first_missing(g_kept, now, gone, sizeof gone);
        if (outputs_ok && !has_gone) { /* new files only: the outputs of a command that succeeded */
            nftw(fz_dir(), remove_new, 16, FTW_DEPTH | FTW_PHYS);
            free(now);
            return;
        }
        dprintf(g_stderr, "==FUZZ== %s: the run %s%s%s%s (path, type, size, mtime; in %s)\n", what,
                has_extra ? "left or changed: " : "", extra, has_gone ? "; removed or changed: " : "", gone,
                fz_dir());
        abort();
    }
    free(now);
}

/* ---- output ------------------------------------------------------------------------------------- */

/* The stdio streams are swapped, not the file descriptors: what the code under test prints through stdout and
 * stderr (all of h3run's output) goes nowhere, while sanitizer and libFuzzer reports, written to descriptor
 * 2, still show. */
static int g_quiet_depth;
static FILE *g_null, *g_out, *g_err;

void fz_quiet(int on) {
    static int verbose = -1;
    if (verbose < 0) {
        const char *v = getenv("H3_FUZZ_VERBOSE");
        verbose = v && *v && !same(v, "0");
        if (!verbose) h3_log_set_callback(NULL, NULL, H3_LOG_ERROR);
    }
    if (verbose) return;
    if (on) {
        if (g_quiet_depth++) return;
        if (!g_null && !(g_null = fopen("/dev/null", "w"))) die("cannot open /dev/null: %s", strerror(errno));
        fflush(stdout);
        fflush(stderr);
        g_out = stdout;
        g_err = stderr;
        stdout = g_null;
        stderr = g_null;
    } else {
        if (!g_quiet_depth || --g_quiet_depth) return;
        fflush(g_null);
        stdout = g_out;
        stderr = g_err;
    }
}

int fz_note(const char *what, int st) {
    static int verbose = -1;
    if (verbose < 0) {
        const char *v = getenv("H3_FUZZ_VERBOSE");
        verbose = v && *v && !same(v, "0");
    }
    if (verbose) dprintf(g_stderr, "fuzz: %s: %s\n", what, st ? h3_last_error() : "ok");
    return st;
}

/* ---- the reduced model -------------------------------------------------------------------------- */

const char *fz_tiny_model(void) {
    static char path[PATH_MAX];
    if (path[0]) return path;
    const char *env = getenv("H3_FUZZ_MODEL");
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
        return path;
    }
#ifndef H3_FUZZ_TINYMODEL
#error "H3_FUZZ_TINYMODEL (the path of the h3-tinymodel program) must be defined"
#endif
    snprintf(path, sizeof path, "%s", fz_path("tiny"));
    char *argv[] = {(char *)H3_FUZZ_TINYMODEL, path, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ), status = 0;
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) die("cannot run %s: %s", argv[0], strerror(rc));
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("%s %s failed (status %d)", argv[0], path, status);
    return path;
}

const char *fz_model_with(const char *rel, const char *replace) {
    char src[PATH_MAX], dst[PATH_MAX], rest[PATH_MAX];
    snprintf(src, sizeof src, "%s", fz_tiny_model());
    snprintf(dst, sizeof dst, "%s", rel);
    snprintf(rest, sizeof rest, "%s", replace);
    fz_mkdir(dst);
    for (char *part = rest;;) {
        char *slash = strchr(part, '/');
        if (slash) *slash = 0;
        DIR *d = opendir(src);
        if (!d) die("cannot read %s", src);
        for (struct dirent *e; (e = readdir(d));) {
            if (same(e->d_name, ".") || same(e->d_name, "..") || same(e->d_name, part)) continue;
            char from[PATH_MAX + 256], to[PATH_MAX + 256];
            snprintf(from, sizeof from, "%s/%s", src, e->d_name);
            snprintf(to, sizeof to, "%s/%s", dst, e->d_name);
            fz_link(to, from);
        }
        closedir(d);
        size_t ls = strlen(src), ld = strlen(dst);
        snprintf(src + ls, sizeof src - ls, "/%s", part);
        snprintf(dst + ld, sizeof dst - ld, "/%s", part);
        if (!slash) {
            static char out[PATH_MAX];
            snprintf(out, sizeof out, "%s", dst);
            return out;
        }
        fz_mkdir(dst);
        part = slash + 1;
    }
}

/* ---- known findings ----------------------------------------------------------------------------- */

int fz_open_finding(const char *id) {
    static char ids[4096];
    static int loaded;
    if (!loaded) {
        loaded = 1;
        const char *all = getenv("H3_FUZZ_ALL");
        if (all && *all && !same(all, "0")) return 0;
#ifndef H3_FUZZ_DIR
#error "H3_FUZZ_DIR (the fuzz/ folder of the source tree) must be defined"
#endif
        FILE *f = fopen(H3_FUZZ_DIR "/known/open.txt", "r");
        char line[512];
        size_t at = 0;
        while (f && fgets(line, sizeof line, f)) {
            char tok[32];
            if (line[0] == '#' || sscanf(line, "%31s", tok) != 1) continue;
            at += (size_t)snprintf(ids + at, sizeof ids - at, " %s ", tok);
            if (at >= sizeof ids) break;
        }
        if (f) fclose(f);
    }
    char key[40];
    snprintf(key, sizeof key, " %s ", id);
    const size_t n = strlen(key);
    for (const char *s = ids; *s; s++) {
        size_t i = 0;
        while (i < n && s[i] == key[i]) i++;
        if (i == n) return 1;
    }
    return 0;
}

/* ---- weight sets -------------------------------------------------------------------------------- */

int fz_walk_weights(const char *path) {
    h3_st_set s;
    h3_gguf *g = NULL;
    if (h3_weights_open(path, &s, &g) != H3_OK) return 0;
    h3_detect_info info;
    h3_detect(&s, &info);
    for (int64_t i = 0; i < s.n_entries; i++) {
        const h3_st_entry *e = &s.entries[i];
        const int64_t n = h3_st_entry_numel(e);
        h3_tensor t;
        if (h3_st_tensor(&s, e, &t) == H3_OK) h3_tensor_free(&t);
        if (n == 0 && fz_open_finding("F1")) continue; /* h3_st_load: memcpy(dst, NULL, 0) */
        if (n <= (1 << 16) && h3_st_load(&s, e->name, H3_PLACE_HOST, H3_F32, H3_MEM_IO, &t) == H3_OK)
            h3_tensor_free(&t);
        if (h3_qweight_is_companion(e->name)) continue;
        h3_qweight_info qi;
        h3_qweight_info_of(&s, g, e, &qi);
        if (h3_qweight_get(&s, g, e, &t) != H3_OK) continue;
        const int64_t rows = h3_tensor_rows(&t), cols = h3_tensor_cols(&t);
        if (rows > 0 && cols > 0 && rows <= (1 << 16) / cols) {
            float *f = h3_malloc((size_t)(rows * cols) * sizeof *f, H3_MEM_IO);
            if (f) h3_tensor_rows_to_f32(&t, 0, rows, f);
            h3_free(f);
        }
        h3_tensor_free(&t);
    }
    h3_st_metadata(&s, "format");
    h3_st_close(&s);
    h3_gguf_free(g);
    return 1;
}

/* ---- input readers ------------------------------------------------------------------------------ */

int fz_contains(const uint8_t *data, size_t n, const char *text) {
    const size_t k = strlen(text);
    for (size_t i = 0; k && i + k <= n; i++)
        if (data[i] == (uint8_t)text[0]) {
            size_t j = 1;
            while (j < k && data[i + j] == (uint8_t)text[j]) j++;
            if (j == k) return 1;
        }
    return 0;
}

uint32_t fz_u8(fz_bytes *b) {
    if (!b->n) return 0;
    b->n--;
    return *b->p++;
}

uint32_t fz_u16(fz_bytes *b) {
    uint32_t lo = fz_u8(b);
    return lo | fz_u8(b) << 8;
}
