#include "testutil.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "h3run.h"
#include "base/alloc.h"
#include "base/fs.h"
#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "tensor/ops.h"

int t_failures;
uint64_t t_seed;
static uint64_t g_state;
static const char *g_case;

void t_fail_at(const char *file, int line, const char *fmt, ...) {
    const char *f = strrchr(file, '/');
    fprintf(stderr, "FAIL [%s] %s:%d: ", g_case ? g_case : "?", f ? f + 1 : file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    t_failures++;
}

void t_fail_cond(const char *file, int line, const char *cond) {
    const char *f = strrchr(file, '/');
    fprintf(stderr, "FAIL [%s] %s:%d: CHECK(%s) ", g_case ? g_case : "?", f ? f + 1 : file, line, cond);
    t_failures++;
}

void t_note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
}

void t_check_err(const char *file, int line, const char *expr, h3_status got, int code, const char *needle) {
    if (got != code) {
        t_fail_at(file, line, "%s returned %d (%s), expected %d (%s); message: %s", expr, got,
                  h3_code_name(got), code, h3_code_name(code), h3_last_error());
        return;
    }
    if (needle && !strstr(h3_last_error(), needle))
        t_fail_at(file, line, "%s: message '%s' does not mention '%s'", expr, h3_last_error(), needle);
}

uint64_t t_rand_u64(void) {
    /* splitmix64 */
    uint64_t z = (g_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double t_uniform(double lo, double hi) {
    return lo + (hi - lo) * ((double)(t_rand_u64() >> 11) / 9007199254740992.0);
}

double t_randn(void) {
    double u1 = t_uniform(1e-300, 1.0), u2 = t_uniform(0.0, 1.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void t_fill_uniform(float *x, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) x[i] = (float)t_uniform(lo, hi);
}

void t_fill_randn(float *x, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(t_randn() * scale);
}

double t_rel_err(const float *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        if (isnan(a[i])) return INFINITY;
        num += d * d;
        den += ref[i] * ref[i];
    }
    if (den == 0) return sqrt(num);
    return sqrt(num / den);
}

double t_max_abs_err(const float *a, const double *ref, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (isnan(a[i])) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

double t_expect_close(const char *file, int line, const char *what, const float *a, const double *ref,
                      size_t n, double tol) {
    double e = t_rel_err(a, ref, n);
    if (!(e <= tol))
        t_fail_at(file, line, "%s: relative error %.3e > tolerance %.1e (max abs %.3e over %zu values)", what,
                  e, tol, t_max_abs_err(a, ref, n), n);
    else if (getenv("H3_TEST_VERBOSE"))
        fprintf(stderr, "  ok %-48s rel err %.3e (tol %.0e)\n", what, e, tol);
    return e;
}

const char *t_src_path(const char *rel, char *buf, size_t n) {
    const char *root = getenv("H3_SOURCE_DIR");
    snprintf(buf, n, "%s/%s", root ? root : "..", rel);
    return buf;
}

const char *t_tmp_path(const char *name, char *buf, size_t n) {
    const char *root = getenv("H3_BUILD_DIR");
    snprintf(buf, n, "%s/test-tmp-%d-%s", root ? root : ".", (int)getpid(), name);
    return buf;
}

int t_main(const char *suite, const t_case *cases, int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *env = getenv("H3_TEST_SEED");
    t_seed = env ? strtoull(env, NULL, 0) : ((uint64_t)time(NULL) * 1000003u) ^ (uint64_t)getpid();
    g_state = t_seed;
    printf("%s: seed %llu (replay with H3_TEST_SEED=%llu)\n", suite, (unsigned long long)t_seed,
           (unsigned long long)t_seed);
    const char *filter = argc > 1 ? argv[1] : NULL;
    int ran = 0;
    for (const t_case *c = cases; c->name; c++) {
        if (filter && !strstr(c->name, filter)) continue;
        g_case = c->name;
        int before = t_failures;
        h3_clear_error();
        clock_t t0 = clock();
        c->fn();
        double dt = (double)(clock() - t0) / CLOCKS_PER_SEC;
        printf("%s %-40s (%.2fs cpu)\n", t_failures == before ? "ok  " : "FAIL", c->name, dt);
        ran++;
    }
    g_case = NULL;
    if (ran == 0) {
        fprintf(stderr, "%s: no test matches '%s'\n", suite, filter ? filter : "");
        return 1;
    }
    printf("%s: %d cases, %d failures\n", suite, ran, t_failures);
    return t_failures ? 1 : 0;
}

/* ---- one tensor at a time
 * ------------------------------------------------------------------------------------ */

const char *t_mutation_name(t_mutation m) {
    static const char *const n[T_MUT_COUNT] = {"emptied", "truncated", "reshaped", "retyped"};
    return (unsigned)m < T_MUT_COUNT ? n[m] : "?";
}

static h3_dtype retype_of(h3_dtype t) {
    switch (h3_dtype_size(t)) {
        case 8:
            return H3_I64;
        case 4:
            return H3_I32;
        default:
            return H3_I16;
    }
}

int t_st_mutate(const char *src, const char *dst, const char *name, t_mutation m) {
    h3_st_set s;
    h3_st_writer *w = NULL;
    void *zeros = NULL;
    int applied = 0;
    if (h3_st_open(src, &s) != H3_OK) {
        t_fail_at(__FILE__, __LINE__, "cannot open %s: %s", src, h3_last_error());
        return 0;
    }
    if (h3_st_writer_new(&w) != H3_OK) goto out;
    for (int64_t i = 0; i < s.n_entries; i++) {
        const h3_st_entry *e = &s.entries[i];
        const void *data = NULL;
        if (e->end > e->begin && h3_st_bytes(&s, e, &data) != H3_OK) goto out;
        h3_dtype dt = e->dtype;
        int nd = e->ndim;
        int64_t sh[H3_MAX_DIMS];
        memcpy(sh, e->shape, sizeof sh);
        if (!strcmp(e->name, name)) {
            if (m == T_MUT_EMPTY || m == T_MUT_TRUNCATE) {
                if (nd == 0 || sh[0] == 0) goto out;
                sh[0] = m == T_MUT_EMPTY ? 0 : sh[0] - 1;
            } else if (m == T_MUT_RESHAPE) {
                if (nd == 0) goto out;
                int64_t r[H3_MAX_DIMS];
                int same = 1;
                for (int k = 0; k < nd; k++) same &= (r[k] = sh[nd - 1 - k]) == sh[k];
                if (nd == 1 || same) { /* [n] -> [1, n]; [a, a] -> [a·a] */
                    int64_t n = 1;
                    for (int k = 0; k < nd; k++) n *= sh[k];
                    if (nd == 1) {
                        nd = 2;
                        sh[0] = 1;
                        sh[1] = n;
                    } else {
                        nd = 1;
                        sh[0] = n;
                    }
                } else {
                    memcpy(sh, r, sizeof r);
                }
            } else {
                dt = retype_of(e->dtype);
            }
            int64_t n = 1;
            for (int k = 0; k < nd; k++) n *= sh[k];
            size_t bytes = (size_t)n * h3_dtype_size(dt);
            if (bytes > (size_t)(e->end - e->begin)) { /* a larger element: zeros */
                free(zeros);
                zeros = calloc(1, bytes ? bytes : 1);
                data = zeros;
            }
            applied = 1;
        }
        if (h3_st_writer_add(w, e->name, dt, nd, sh, data) != H3_OK) goto out;
    }
    for (int i = 0; i < s.n_files; i++) { /* keep the metadata (configs, markers of repacks) */
        const char *k;
        json_t *v;
        if (!s.files[i].metadata) continue;
        json_object_foreach(s.files[i].metadata, k, v) {
            if (h3_st_writer_meta(w, k, json_string_value(v)) != H3_OK) goto out;
        }
    }
    if (applied && h3_st_writer_write(w, dst, 0) != H3_OK) {
        t_fail_at(__FILE__, __LINE__, "cannot write %s: %s", dst, h3_last_error());
        applied = 0;
    }
out:
    h3_st_writer_free(w);
    free(zeros);
    h3_st_close(&s);
    return applied;
}

int t_wbind_form(const char *msg) {
    return strstr(msg, "tensor '") &&
           (strstr(msg, "' is missing; ") || strstr(msg, "' has shape [") || strstr(msg, "' has dtype "));
}

static int copy_file_to(const char *a, const char *b) {
    char *buf;
    size_t n;
    if (h3_read_file(a, (size_t)1 << 30, &buf, &n) != H3_OK) return 0;
    FILE *f = fopen(b, "wb");
    int ok = f && fwrite(buf, 1, n, f) == n;
    if (f) ok &= fclose(f) == 0;
    h3_free(buf);
    return ok;
}

/* Copies the tree at a into b (a folder is copied file by file); appends every .safetensors path under b to
 * files[*n]. */
static int copy_tree(const char *a, const char *b, char files[][1024], int *n, int cap) {
    if (!h3_path_is_dir(a)) {
        if (!copy_file_to(a, b)) return 0;
        if (h3_str_ends_with(b, ".safetensors") && *n < cap) snprintf(files[(*n)++], 1024, "%s", b);
        return 1;
    }
    char **names;
    int count;
    if (mkdir(b, 0755) != 0 || h3_list_dir(a, &names, &count) != H3_OK) return 0;
    int ok = 1;
    for (int i = 0; i < count && ok; i++) {
        char pa[1024], pb[1024];
        snprintf(pa, sizeof pa, "%s/%s", a, names[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, names[i]);
        ok = copy_tree(pa, pb, files, n, cap);
    }
    h3_strlist_free(names, count);
    return ok;
}

static void remove_tree(const char *p) {
    if (h3_path_is_dir(p)) {
        char **names;
        int count;
        if (h3_list_dir(p, &names, &count) == H3_OK) {
            for (int i = 0; i < count; i++) {
                char q[1024];
                snprintf(q, sizeof q, "%s/%s", p, names[i]);
                remove_tree(q);
            }
            h3_strlist_free(names, count);
        }
        rmdir(p);
    } else {
        unlink(p);
    }
}

int t_sweep(const char *what, const char *root, t_load_fn load, t_accept_fn accept, void *user,
            int one_each) {
    enum { MAX_FILES = 16 };
    static char files[MAX_FILES][1024];
    char dir[1024], copy[1024], orig[1024];
    int n_files = 0, loads = 0, refused = 0, accepted = 0;
    t_tmp_path("sweep", dir, sizeof dir);
    remove_tree(dir);
    /* the copy keeps root's own name (loaders look at file names and neighbouring configs) */
    const char *base = strrchr(root, '/') ? strrchr(root, '/') + 1 : root;
    snprintf(copy, sizeof copy, "%s/%s", dir, base);
    if (mkdir(dir, 0755) != 0 || !copy_tree(root, copy, files, &n_files, MAX_FILES) || n_files == 0) {
        t_fail_at(__FILE__, __LINE__, "%s: cannot copy %s to %s", what, root, copy);
        remove_tree(dir);
        return 0;
    }
    /* the loader accepts the unmutated copy */
    h3_clear_error();
    h3_status st0 = load(copy, user);
    if (st0 != H3_OK)
        t_fail_at(__FILE__, __LINE__, "%s: the unmutated copy is refused: %s", what, h3_last_error());
    int64_t turn = (int64_t)(t_seed % T_MUT_COUNT);
    for (int f = 0; f < n_files; f++) {
        snprintf(orig, sizeof orig, "%s.orig", files[f]);
        if (rename(files[f], orig) != 0) {
            t_fail_at(__FILE__, __LINE__, "%s: cannot move %s aside", what, files[f]);
            continue;
        }
        h3_st_set s;
        if (h3_st_open(orig, &s) != H3_OK) {
            t_fail_at(__FILE__, __LINE__, "%s: %s", what, h3_last_error());
            rename(orig, files[f]);
            continue;
        }
        for (int64_t i = 0; i < s.n_entries; i++) {
            const char *name = s.entries[i].name;
            for (int m = 0; m < T_MUT_COUNT; m++) {
                if (one_each && m != (int)(turn % T_MUT_COUNT)) continue;
                int must_accept = accept ? accept(name, (t_mutation)m, user) : 0;
                if (must_accept < 0 || !t_st_mutate(orig, files[f], name, (t_mutation)m)) continue;
                h3_clear_error();
                h3_status st = load(copy, user);
                loads++;
                if (must_accept == 2) {
                    st == H3_OK ? accepted++ : refused++;
                } else if (st == H3_OK) {
                    accepted++;
                    if (!must_accept)
                        t_fail_at(__FILE__, __LINE__, "%s: '%s' %s was accepted", what, name,
                                  t_mutation_name((t_mutation)m));
                } else {
                    refused++;
                    if (must_accept)
                        t_fail_at(__FILE__, __LINE__, "%s: '%s' %s was refused: %s", what, name,
                                  t_mutation_name((t_mutation)m), h3_last_error());
                    else if (!t_wbind_form(h3_last_error()))
                        t_fail_at(__FILE__, __LINE__, "%s: '%s' %s: the message is not the binder's form: %s",
                                  what, name, t_mutation_name((t_mutation)m), h3_last_error());
                }
            }
            turn++;
        }
        h3_st_close(&s);
        unlink(files[f]);
        if (rename(orig, files[f]) != 0)
            t_fail_at(__FILE__, __LINE__, "%s: cannot restore %s", what, files[f]);
    }
    remove_tree(dir);
    printf("  %s: %d loads of one-tensor mutations (%d refused, %d accepted as expected)\n", what, loads,
           refused, accepted);
    CHECK(loads > 0, "%s: nothing was mutated", what);
    return loads;
}

/* ---- a stand-in device --------------------------------------------------------------------------------- */

int64_t t_sd_used, t_sd_peak;

static void *sd_alloc(size_t bytes, void *user) {
    (void)user;
    size_t need = (size_t)h3_cuda_granule((int64_t)(bytes ? bytes : 1));
    int64_t *p = malloc(need + 16);
    if (!p) return NULL;
    p[0] = (int64_t)need;
    t_sd_used += (int64_t)need;
    t_sd_peak = t_sd_used > t_sd_peak ? t_sd_used : t_sd_peak;
    return (char *)p + 16;
}

static void sd_free(void *ptr, void *user) {
    (void)user;
    int64_t *p = (int64_t *)((char *)ptr - 16);
    t_sd_used -= p[0];
    free(p);
}

extern const h3_backend h3_cpu_backend;

static h3_status sd_copy(h3_exec *ex, h3_tensor *dst, const h3_tensor *src) {
    return h3_cpu_backend.convert(ex, dst, src);
}
static h3_status sd_sync(h3_exec *ex) {
    (void)ex;
    return H3_OK;
}

static h3_backend g_sd_backend;
static int g_sd_token;

int t_standin_begin(h3_exec *ex) {
    if (h3_backend_for_place(H3_PLACE_DEVICE)) return 0;
    g_sd_backend = h3_cpu_backend;
    g_sd_backend.name = "stand-in device";
    g_sd_backend.copy = sd_copy;
    g_sd_backend.sync = sd_sync;
    static const h3_place_allocator da = {sd_alloc, sd_free, NULL};
    h3_place_set_allocator(H3_PLACE_DEVICE, &da);
    h3_backend_set_device(&g_sd_backend);
    ex->cuda = &g_sd_token; /* "a device is up" */
    t_sd_used = t_sd_peak = 0;
    return 1;
}

void t_standin_end(h3_exec *ex) {
    ex->cuda = NULL;
    h3_backend_set_device(NULL);
    h3_place_set_allocator(H3_PLACE_DEVICE, NULL);
}
