/* The base layer: errors, logging, counted allocation with failure injection, the thread pool, dtype
 * conversions (against the compiler's own conversions and exhaustive enumeration), and tensor views. */
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/cancel.h"
#include "base/fs.h"
#include "base/log.h"
#include "base/threads.h"
#include "tensor/dtype.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "testutil.h"

static h3_status inner_fail(void) {
    return H3_ERR(H3_ERR_FORMAT, "tensor '%s' is broken", "x");
}

static h3_status outer_fail(void) {
    H3_TRY_CTX(inner_fail(), "loading %s", "model.safetensors");
    return H3_OK;
}

static void test_status(void) {
    h3_clear_error();
    CHECK(h3_last_error()[0] == 0);
    h3_status st = outer_fail();
    CHECK(st == H3_ERR_FORMAT);
    CHECK(h3_last_error_code() == H3_ERR_FORMAT);
    CHECK(strcmp(h3_last_error_message(), "loading model.safetensors: tensor 'x' is broken") == 0, "%s",
          h3_last_error_message());
    CHECK(strstr(h3_last_error(), "test_base.c:") != NULL, "origin missing: %s", h3_last_error());
    CHECK(strcmp(h3_code_name(H3_ERR_NOMEM), "out of memory") == 0);
    CHECK(strcmp(h3_code_name(999), "unknown error") == 0);
    /* cleanup between a failure and its report keeps the failure's message (h3_error_save/restore) */
    h3_error_state kept;
    h3_error_save(&kept);
    (void)H3_ERR(H3_ERR_DEVICE, "a sync in cleanup failed");
    h3_clear_error();
    h3_error_restore(&kept);
    CHECK(h3_last_error_code() == H3_ERR_FORMAT &&
              strcmp(h3_last_error_message(), "loading model.safetensors: tensor 'x' is broken") == 0,
          "after restore: %s", h3_last_error());
    h3_clear_error();
}

static int g_logged;
static char g_last_log[256];
static void log_cb(h3_log_level lvl, const char *msg, void *user) {
    (void)lvl;
    (void)user;
    g_logged++;
    snprintf(g_last_log, sizeof g_last_log, "%s", msg);
}

static void test_logging(void) {
    h3_log_set_callback(log_cb, NULL, H3_LOG_WARN);
    h3_log(H3_LOG_INFO, "dropped %d", 1);
    CHECK(g_logged == 0);
    h3_log(H3_LOG_WARN, "kept %d", 2);
    CHECK(g_logged == 1 && strcmp(g_last_log, "kept 2") == 0);
    h3_log_set_callback(NULL, NULL, H3_LOG_DEBUG);
    h3_log(H3_LOG_ERROR, "nowhere");
    CHECK(g_logged == 1);
}

static void test_alloc(void) {
    h3_mem_stats a, b;
    h3_mem_get_stats(&a);
    void *p = h3_malloc(1000, H3_MEM_WEIGHTS), *q = h3_calloc(10, 30, H3_MEM_IO);
    CHECK(p && q && ((uintptr_t)p % H3_ALIGN) == 0);
    CHECK(((unsigned char *)q)[299] == 0);
    h3_mem_get_stats(&b);
    CHECK(b.current[H3_MEM_WEIGHTS] - a.current[H3_MEM_WEIGHTS] == 1000);
    CHECK(b.current[H3_MEM_IO] - a.current[H3_MEM_IO] == 300);
    CHECK(b.peak[H3_MEM_WEIGHTS] >= b.current[H3_MEM_WEIGHTS]);
    p = h3_realloc(p, 5000, H3_MEM_WEIGHTS);
    CHECK(h3_alloc_size(p) == 5000);
    h3_free(p);
    h3_free(q);
    h3_mem_get_stats(&b);
    CHECK(b.total_current == a.total_current, "leak of %lld", (long long)(b.total_current - a.total_current));
    /* Injection: the 3rd allocation fails, then (not sticky) the 4th succeeds. */
    h3_mem_fail_at(3, 0);
    void *x1 = h3_malloc(8, H3_MEM_OTHER), *x2 = h3_malloc(8, H3_MEM_OTHER);
    h3_clear_error();
    void *x3 = h3_malloc(8, H3_MEM_OTHER);
    CHECK(x1 && x2 && !x3);
    CHECK(h3_last_error_code() == H3_ERR_NOMEM && strstr(h3_last_error(), "8 bytes"));
    void *x4 = h3_malloc(8, H3_MEM_OTHER);
    CHECK(x4 != NULL);
    /* Sticky: every allocation after the trip fails. */
    h3_mem_fail_at(1, 1);
    void *y1 = h3_malloc(8, H3_MEM_OTHER), *y2 = h3_malloc(8, H3_MEM_OTHER);
    CHECK(!y1 && !y2);
    int64_t ticks = h3_mem_fail_at(0, 0);
    CHECK(ticks == 2, "counted %lld allocations", (long long)ticks);
    h3_free(x1);
    h3_free(x2);
    h3_free(x4);
    /* Overflow checks */
    size_t out;
    CHECK(!h3_mul_size(SIZE_MAX / 2, 3, &out));
    CHECK(h3_mul_size(1000, 1000, &out) && out == 1000000);
    CHECK(h3_calloc(SIZE_MAX / 4, 8, H3_MEM_OTHER) == NULL);
}

static _Atomic int g_hits[10000];

static void count_range(void *ctx, int64_t b, int64_t e, int tid) {
    int nt = *(int *)ctx;
    if (tid < 0 || tid >= nt) atomic_fetch_add(&g_hits[0], 1000000);
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&g_hits[i], 1);
}

static void test_threads(void) {
    for (int nt = 1; nt <= 5; nt++) {
        h3_pool *p;
        CHECK_OK(h3_pool_create(nt, &p));
        for (int rep = 0; rep < 50; rep++) {
            int64_t n = (int64_t)(t_rand_u64() % 10000);
            memset(g_hits, 0, sizeof g_hits);
            h3_parallel_for(p, n, (int64_t)(t_rand_u64() % 50), count_range, &nt);
            int bad = 0;
            for (int64_t i = 0; i < n; i++) bad += atomic_load(&g_hits[i]) != 1;
            CHECK(bad == 0, "threads %d, n %lld: %d indices not visited exactly once", nt, (long long)n, bad);
        }
        h3_pool_free(p);
    }
    /* pool creation fails cleanly */
    for (int n = 1; n < 8; n++) {
        h3_mem_stats a, b;
        h3_mem_get_stats(&a);
        h3_mem_fail_at(n, 0);
        h3_pool *p = NULL;
        h3_status st = h3_pool_create(4, &p);
        h3_mem_fail_at(0, 0);
        if (st == H3_OK) {
            h3_pool_free(p);
            break;
        }
        h3_mem_get_stats(&b);
        CHECK(b.total_current == a.total_current, "pool creation failing at %d leaked", n);
    }
    /* Thread counts beyond H3_MAX_THREADS are refused before anything is allocated or started (a pool of
     * 2^31 - 1 threads once asked for a 16 GiB table); the default is one per CPU, within the limit. */
    const int too_many[] = {H3_MAX_THREADS + 1, 1 << 20, 2147483647};
    for (size_t i = 0; i < sizeof too_many / sizeof too_many[0]; i++) {
        h3_mem_stats a, b;
        h3_mem_get_stats(&a);
        h3_pool *p = (h3_pool *)&a;
        CHECK_ERR(h3_pool_create(too_many[i], &p), H3_ERR_INVALID, "threads must be 1 to 1024");
        CHECK(p == NULL, "a refused pool is NULL");
        h3_exec ex;
        CHECK_ERR(h3_exec_init(&ex, too_many[i]), H3_ERR_INVALID, "(0: one per CPU");
        h3_mem_get_stats(&b);
        CHECK(b.total_peak == a.total_peak && b.total_current == a.total_current,
              "refusing %d threads allocated %lld bytes", too_many[i],
              (long long)(b.total_peak - a.total_current));
    }
    int n = 0;
    CHECK_OK(h3_threads_resolve(0, &n));
    CHECK(n >= 1 && n <= H3_MAX_THREADS && (n == h3_cpu_count() || n == H3_MAX_THREADS), "default %d threads",
          n);
    CHECK_OK(h3_threads_resolve(H3_MAX_THREADS, &n));
    CHECK(n == H3_MAX_THREADS);
}

/* ---- dtypes -------------------------------------------------------------------------------------------- */

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_f16(void) {
    /* Every half value decodes to the value the compiler's _Float16 has and re-encodes to itself. */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = h3_f16_to_f32((uint16_t)h);
#ifdef __FLT16_MAX__
        _Float16 c;
        uint16_t hh = (uint16_t)h;
        memcpy(&c, &hh, 2);
        if (!(isnan(f) && isnan((float)c)) && f != (float)c) bad++;
#endif
        if (isnan(f)) {
            if (!isnan(h3_f16_to_f32(h3_f32_to_f16(f)))) bad++;
        } else if (h3_f32_to_f16(f) != h) {
            bad++;
        }
    }
    CHECK(bad == 0, "%d half values mis-decoded or not round-tripped", bad);
#ifdef __FLT16_MAX__
    /* Rounding of arbitrary floats matches the compiler's round-to-nearest-even. */
    bad = 0;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)t_rand_u64();
        float f = bits_f(u);
        if (isnan(f)) continue;
        _Float16 c = (_Float16)f;
        uint16_t ref;
        memcpy(&ref, &c, 2);
        if (h3_f32_to_f16(f) != ref) bad++;
    }
    for (int i = 0; i < 200000; i++) { /* dense around the half range, incl. subnormals */
        float f = (float)t_uniform(-70000, 70000) * (i % 3 == 0 ? 1e-6f : 1.0f);
        _Float16 c = (_Float16)f;
        uint16_t ref;
        memcpy(&ref, &c, 2);
        if (h3_f32_to_f16(f) != ref) bad++;
    }
    CHECK(bad == 0, "%d floats rounded to half differently from the compiler", bad);
#endif
    float src[37], dst[37];
    uint16_t hs[37];
    for (int i = 0; i < 37; i++) src[i] = (float)t_randn();
    h3_convert_f32_to_f16(src, hs, 37);
    h3_convert_f16_to_f32(hs, dst, 37);
    for (int i = 0; i < 37; i++) CHECK(dst[i] == h3_f16_to_f32(h3_f32_to_f16(src[i])));
}

static void test_bf16(void) {
    int bad = 0;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)t_rand_u64();
        float f = bits_f(u);
        uint16_t b = h3_f32_to_bf16(f);
        if (isnan(f)) {
            bad += !isnan(h3_bf16_to_f32(b));
            continue;
        }
        /* Reference: nearest of the two bf16 neighbours in double, ties to an even mantissa. */
        uint32_t lo = u & 0xffff0000u;
        double dlo = bits_f(lo), dhi = bits_f(lo + 0x10000u), df = f;
        if (isinf(dhi))
            dhi = copysign(ldexp(1.0, 128), df); /* the step past the largest finite value: IEEE overflow */
        uint16_t ref;
        if ((lo & 0x7f800000u) == 0x7f800000u)
            ref = (uint16_t)(lo >> 16); /* inf stays inf */
        else if (fabs(df - dlo) < fabs(dhi - df))
            ref = (uint16_t)(lo >> 16);
        else if (fabs(df - dlo) > fabs(dhi - df))
            ref = (uint16_t)((lo + 0x10000u) >> 16);
        else
            ref = ((lo >> 16) & 1) ? (uint16_t)((lo + 0x10000u) >> 16) : (uint16_t)(lo >> 16);
        if (b != ref && bad < 5) t_note("bf16 of %a (0x%08x): got 0x%04x, expected 0x%04x", f, u, b, ref);
        bad += b != ref;
    }
    CHECK(bad == 0, "%d floats rounded to bf16 wrongly", bad);
}

static void test_fp8(void) {
    /* Decoding: all 256 codes against the e4m3fn definition. */
    for (int v = 0; v < 256; v++) {
        int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
        double ref = e == 0 ? m / 8.0 * pow(2, -6) : (1 + m / 8.0) * pow(2, e - 7);
        if (s) ref = -ref;
        float f = h3_fp8e4m3_to_f32((uint8_t)v);
        if (e == 15 && m == 7)
            CHECK(isnan(f), "code %d should be NaN", v);
        else
            CHECK(f == (float)ref, "code %d decodes to %g, expected %g", v, f, ref);
    }
    CHECK(h3_fp8e4m3_to_f32(0x7e) == 448.0f);
    /* Encoding: nearest finite code by brute force, ties to the even code, saturating at ±448. */
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        float f = (float)(t_randn() * pow(2, t_uniform(-12, 10)));
        uint8_t got = h3_f32_to_fp8e4m3(f);
        double best = INFINITY;
        int bc = -1;
        for (int c = 0; c < 256; c++) {
            float d = h3_fp8e4m3_to_f32((uint8_t)c);
            if (isnan(d)) continue;
            if ((c & 0x80) != (signbit(f) ? 0x80 : 0)) continue;
            double err = fabs((double)d - f);
            if (err < best || (err == best && (c & 1) == 0)) {
                best = err;
                bc = c;
            }
        }
        if (fabsf(f) >= 448.0f) bc = signbit(f) ? 0xfe : 0x7e;
        if (got != bc) bad++;
    }
    CHECK(bad == 0, "%d floats encoded to the wrong fp8 code", bad);
    CHECK(h3_f32_to_fp8e4m3(1e9f) == 0x7e && h3_f32_to_fp8e4m3(-1e9f) == 0xfe);
    CHECK(isnan(h3_fp8e4m3_to_f32(h3_f32_to_fp8e4m3(NAN))));
    h3_dtype t;
    CHECK(h3_dtype_from_st("F8_E4M3", &t) && t == H3_F8_E4M3 && h3_dtype_size(t) == 1);
    CHECK(!h3_dtype_from_st("F4", &t));
}

static void test_paths(void) {
    static const char *const cases[][2] = {
        {"a/b.json", "a"}, {"b.json", "."}, {"/b.json", "/"}, {"/x/y/z", "/x/y"}, {"a/", "a"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *d = h3_path_dir(cases[i][0]);
        CHECK(d && !strcmp(d, cases[i][1]), "h3_path_dir(%s) = %s, expected %s", cases[i][0], d ? d : "NULL",
              cases[i][1]);
        h3_free(d);
    }
    CHECK(h3_str_ends_with("m.safetensors", ".safetensors") && !h3_str_ends_with("m.gguf", ".safetensors") &&
              !h3_str_ends_with("x", "longer") && h3_str_ends_with("", ""),
          "h3_str_ends_with");
    CHECK(h3_str_starts_with("model.diffusion", "model.") && !h3_str_starts_with("mod", "model."),
          "h3_str_starts_with");
}

/* ---- files: inputs that are not regular files, outputs, output groups, a command's paths --------------- */

static char g_dir[1024];

static const char *at(const char *name, char *buf) { /* g_dir/name in buf[1024] */
    snprintf(buf, 1024, "%s/%s", g_dir, name);
    return buf;
}

static void put(const char *name, const char *text) {
    char p[1024];
    FILE *f = fopen(at(name, p), "w");
    CHECK(f != NULL, "cannot create %s", p);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* The content of a file ("" when absent, "?" when it is not a regular file). */
static const char *text_of(const char *name) {
    static char buf[256];
    char p[1024];
    struct stat st;
    if (stat(at(name, p), &st) != 0) return "";
    if (!S_ISREG(st.st_mode)) return "?";
    FILE *f = fopen(p, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    return buf;
}

static int is_fifo(const char *name) {
    char p[1024];
    struct stat st;
    return lstat(at(name, p), &st) == 0 && S_ISFIFO(st.st_mode);
}

static void fs_setup(void) {
    char cmd[1200];
    t_tmp_path("fs", g_dir, sizeof g_dir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s/dir' '%s/empty'", g_dir, g_dir, g_dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    char p[1024];
    CHECK(mkfifo(at("fifo", p), 0600) == 0, "mkfifo %s", p);
    put("file", "input");
    put("dir/x", "in a folder");
}

static void fs_teardown(void) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    CHECK(system(cmd) == 0);
}

/* Inputs: a FIFO (whose open() would wait for a writer forever), a folder, a device: refused at once with a
 * message that says what the path is; a regular file opens. */
static void test_inputs(void) {
    fs_setup();
    char p[1024];
    static const struct {
        const char *path; /* under g_dir, or absolute */
        const char *needle;
    } cases[] = {
        {"fifo", "is a FIFO (named pipe), not a regular file"},
        {"dir", "is a folder; a file is expected here"},
        {"/dev/null", "is a character device, not a regular file"},
        {"missing", "No such file"},
        {"file", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *path = cases[i].path[0] == '/' ? cases[i].path : at(cases[i].path, p);
        int fd = -1;
        uint64_t size = 0;
        h3_clear_error();
        h3_status st = h3_open_input(path, &fd, &size);
        if (!cases[i].needle) {
            CHECK(st == H3_OK && fd >= 0 && size == 5, "%s: %s", path, h3_last_error());
        } else {
            CHECK(st == H3_ERR_IO && fd < 0 && strstr(h3_last_error(), cases[i].needle), "%s: %d %s", path,
                  st, h3_last_error());
        }
        if (fd >= 0) close(fd);
        /* the whole-file readers refuse the same way */
        char *buf = NULL;
        st = h3_read_file(path, 1 << 20, &buf, NULL);
        CHECK((st == H3_OK) == !cases[i].needle, "h3_read_file(%s): %s", path, h3_last_error());
        h3_free(buf);
        h3_mmap m;
        st = h3_mmap_open(path, &m);
        CHECK((st == H3_OK) == !cases[i].needle, "h3_mmap_open(%s): %s", path, h3_last_error());
        if (st == H3_OK) h3_mmap_close(&m);
    }
    CHECK(is_fifo("fifo"), "the FIFO is still there");
    fs_teardown();
}

/* Outputs: what h3_check_output refuses up front, and what the writer (h3_out_open) refuses itself: nothing
 * but a regular file is ever replaced, nothing but a stale regular "<path>.partial" is removed. */
static void test_outputs(void) {
    fs_setup();
    char p[1024], q[1024];
    CHECK(mkfifo(at("busy.partial", p), 0600) == 0);
    put("victim", "keep");
    CHECK(symlink("victim", at("lnk.partial", q)) == 0);
    mkdir(at("full", p), 0777);
    put("full/frame_00000.png", "old frame");
    static const struct {
        const char *path;
        h3_out_kind kind;
        const char *needle; /* NULL: accepted */
    } cases[] = {
        {"fifo", H3_OUT_FILE, "is a FIFO (named pipe): h3run writes its outputs only to regular files"},
        {"/dev/null", H3_OUT_FILE, "is a character device: h3run writes its outputs only to regular files"},
        {"dir", H3_OUT_FILE, "is a folder; give a file name"},
        {"file", H3_OUT_DIR, "is a file; give a folder"},
        {"full", H3_OUT_DIR, "is a folder that is not empty"},
        {"full", H3_OUT_FILE_OR_DIR, "is a folder that is not empty"},
        {"nodir/x.wav", H3_OUT_FILE, "does not exist (create it first)"},
        {"busy", H3_OUT_FILE, "busy.partial exists and is a FIFO"},
        {"lnk", H3_OUT_FILE, "lnk.partial exists and is a symbolic link"},
        {"file", H3_OUT_FILE, NULL},
        {"new.wav", H3_OUT_FILE, NULL},
        {"empty", H3_OUT_DIR, NULL},
        {"empty/", H3_OUT_FILE_OR_DIR, NULL},
        {"frames", H3_OUT_DIR, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *path = cases[i].path[0] == '/' ? cases[i].path : at(cases[i].path, p);
        h3_clear_error();
        h3_status st = h3_check_output(path, "--out", cases[i].kind);
        if (!cases[i].needle)
            CHECK(st == H3_OK, "%s: %s", path, h3_last_error());
        else
            CHECK(st == H3_ERR_INVALID && strstr(h3_last_error(), cases[i].needle) &&
                      strstr(h3_last_error(), "--out"),
                  "%s: %d %s", path, st, h3_last_error());
    }
    /* The writer itself: a FIFO or device target, a FIFO or symlink where the temporary file goes. */
    const char *refused[] = {"fifo", "/dev/null", "busy", "lnk"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        const char *path = refused[i][0] == '/' ? refused[i] : at(refused[i], p);
        h3_outfile o;
        h3_clear_error();
        CHECK(h3_out_open(path, &o) == H3_ERR_IO && o.f == NULL, "h3_out_open(%s): %s", path,
              h3_last_error());
    }
    CHECK(is_fifo("fifo") && is_fifo("busy.partial") && !strcmp(text_of("victim"), "keep"),
          "a refused output changed what was there");
    struct stat st;
    CHECK(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode), "/dev/null is still a device");
    /* A stale regular .partial (a killed run's) is replaced; the result appears at the path. */
    put("out.wav.partial", "stale");
    h3_outfile o;
    CHECK_OK(h3_out_open(at("out.wav", p), &o));
    if (o.f) {
        fputs("new", o.f);
        CHECK_OK(h3_out_commit(&o));
    }
    CHECK(!strcmp(text_of("out.wav"), "new") && !strcmp(text_of("out.wav.partial"), ""), "out.wav: '%s'",
          text_of("out.wav"));
    fs_teardown();
}

static h3_status write_text(const char *name, const char *text) {
    char p[1024];
    h3_outfile o;
    H3_TRY(h3_out_open(at(name, p), &o));
    fputs(text, o.f);
    return h3_out_commit(&o);
}

/* Output groups: finished files wait under their temporary names and appear together at the commit; an abort
 * (a failure, an interrupt) removes them and leaves what was at their paths as it was; inner groups hand
 * their files to the outer one; a commit that cannot place one output places none. */
static void test_outgroup(void) {
    fs_setup();
    char p[1024];
    put("a", "old a");
    h3_outgroup g;
    h3_outgroup_begin(&g);
    CHECK_OK(write_text("a", "new a"));
    CHECK_OK(write_text("b", "new b"));
    CHECK(!strcmp(text_of("a"), "old a") && !strcmp(text_of("b"), "") &&
              !strcmp(text_of("a.partial"), "new a"),
          "inside a group, outputs wait under their temporary names");
    h3_outgroup_abort(&g);
    CHECK(!strcmp(text_of("a"), "old a") && !strcmp(text_of("b"), "") && !strcmp(text_of("a.partial"), "") &&
              !strcmp(text_of("b.partial"), ""),
          "an aborted group leaves the old a, no b, no temporaries");
    /* nested, committed: the inner group's files wait for the outer commit */
    h3_outgroup outer, inner;
    h3_outgroup_begin(&outer);
    h3_outgroup_begin(&inner);
    CHECK_OK(write_text("a", "new a"));
    CHECK_OK(h3_outgroup_commit(&inner));
    CHECK(!strcmp(text_of("a"), "old a"), "an inner commit does not place the file");
    CHECK_OK(write_text("b", "new b"));
    CHECK_OK(h3_outgroup_commit(&outer));
    CHECK(!strcmp(text_of("a"), "new a") && !strcmp(text_of("b"), "new b") &&
              !strcmp(text_of("a.partial"), ""),
          "the outer commit places both");
    /* a commit that fails on its second output: neither appears */
    put("a", "old a");
    h3_outgroup_begin(&g);
    CHECK_OK(write_text("c", "new c"));
    CHECK_OK(write_text("d", "new d"));
    CHECK(mkfifo(at("d", p), 0600) == 0); /* d became a FIFO meanwhile */
    CHECK_ERR(h3_outgroup_commit(&g), H3_ERR_IO, "FIFO");
    CHECK(!strcmp(text_of("c"), "") && !strcmp(text_of("c.partial"), "") &&
              !strcmp(text_of("d.partial"), "") && is_fifo("d"),
          "a failed commit places none and removes the temporaries");
    /* without a group, a commit places the file at once */
    CHECK_OK(write_text("e", "e"));
    CHECK(!strcmp(text_of("e"), "e"));
    /* every allocation of two writes and a commit failing in turn: H3_ERR_NOMEM, no file, no leak */
    h3_mem_stats m0, m1;
    h3_mem_get_stats(&m0);
    int n;
    for (n = 1; n < 100; n++) {
        h3_mem_fail_at(n, 0);
        h3_outgroup_begin(&g);
        h3_status st = write_text("f", "f");
        if (st == H3_OK) st = write_text("h", "h");
        if (st == H3_OK)
            st = h3_outgroup_commit(&g);
        else
            h3_outgroup_abort(&g);
        h3_mem_fail_at(0, 0);
        h3_mem_get_stats(&m1);
        CHECK(m1.total_current == m0.total_current, "allocation %d failing leaked %lld bytes", n,
              (long long)(m1.total_current - m0.total_current));
        if (st == H3_OK) break;
        CHECK(st == H3_ERR_NOMEM, "allocation %d: %d %s", n, st, h3_last_error());
        CHECK(!*text_of("f") && !*text_of("h") && !*text_of("f.partial") && !*text_of("h.partial"),
              "allocation %d failing left a file", n);
    }
    CHECK(n > 4 && n < 100, "the loop ended at %d", n);
    CHECK(!strcmp(text_of("f"), "f") && !strcmp(text_of("h"), "h"), "the run without failures wrote both");
    fs_teardown();
}

/* A command's paths: every pair that would overwrite an input or another output is refused, naming both. */
static void test_pathset(void) {
    fs_setup();
    char p[1024], q[1024];
    CHECK(link(at("file", p), at("hard", q)) == 0);
    CHECK(symlink("file", at("soft", q)) == 0);
    CHECK(link(at("dir/x", p), at("hard_x", q)) == 0);
    static const struct {
        const char *in, *out1, *out2; /* under g_dir; NULL: none */
        h3_out_kind kind2;
        const char *needle; /* NULL: accepted */
    } cases[] = {
        {"file", "file", NULL, H3_OUT_FILE, "is the input --in"},
        {"file", "hard", NULL, H3_OUT_FILE, "is the input --in"},
        {"file", "soft", NULL, H3_OUT_FILE, "is the input --in"},
        {"soft", "file", NULL, H3_OUT_FILE, "is the input --in"},
        {"dir", "dir/x", NULL, H3_OUT_FILE, "is a file of the input --in"},
        {"dir", "hard_x", NULL, H3_OUT_FILE, "is a file of the input --in"},
        {"file", "file.partial", NULL, H3_OUT_FILE, NULL}, /* absent: a new name */
        {"dir/x", "dir/x.partial", "dir/x.partial", H3_OUT_FILE, "name the same file"},
        {NULL, "a.wav", "./empty/../a.wav", H3_OUT_FILE, "name the same file"},
        {NULL, "a.mp4", "a.mp4.partial", H3_OUT_FILE, "is the temporary file of --o1"},
        {NULL, "empty/a.mp4", "empty", H3_OUT_DIR, "lies inside the folder of --o2"},
        {NULL, "frames", "frames/", H3_OUT_DIR, "name the same file"},
        {"file", "a.mp4", "frames", H3_OUT_DIR, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        h3_pathset ps;
        h3_pathset_init(&ps);
        h3_clear_error();
        h3_status st = H3_OK;
        /* outputs first, then the input: the order must not matter */
        if (st == H3_OK && cases[i].out1)
            st = h3_pathset_output(&ps, "--o1", at(cases[i].out1, p), H3_OUT_FILE);
        if (st == H3_OK && cases[i].out2)
            st = h3_pathset_output(&ps, "--o2", at(cases[i].out2, p), cases[i].kind2);
        if (st == H3_OK && cases[i].in) st = h3_pathset_input(&ps, "--in", at(cases[i].in, p), 0);
        h3_pathset_free(&ps);
        const char *needle = cases[i].needle;
        if (!needle)
            CHECK(st == H3_OK, "case %zu: %s", i, h3_last_error());
        else
            CHECK(st == H3_ERR_INVALID && strstr(h3_last_error(), needle), "case %zu: %d %s", i, st,
                  h3_last_error());
        /* and with the input first */
        h3_pathset_init(&ps);
        h3_clear_error();
        st = cases[i].in ? h3_pathset_input(&ps, "--in", at(cases[i].in, p), 0) : H3_OK;
        if (st == H3_OK && cases[i].out1)
            st = h3_pathset_output(&ps, "--o1", at(cases[i].out1, p), H3_OUT_FILE);
        if (st == H3_OK && cases[i].out2)
            st = h3_pathset_output(&ps, "--o2", at(cases[i].out2, p), cases[i].kind2);
        h3_pathset_free(&ps);
        CHECK((st == H3_OK) == !needle, "case %zu, input first: %s", i, h3_last_error());
    }
    /* Inputs: a FIFO, or a folder where a file is wanted, is refused (H3_ERR_INVALID); a missing one is left
     * to its reader. */
    h3_pathset ps;
    h3_pathset_init(&ps);
    CHECK_ERR(h3_pathset_input(&ps, "--tokenizer", at("fifo", p), 0), H3_ERR_INVALID,
              "is a FIFO (named pipe)");
    CHECK_ERR(h3_pathset_input(&ps, "--config", at("dir", p), 1), H3_ERR_INVALID, "is a folder; give a file");
    CHECK_OK(h3_pathset_input(&ps, "--config", at("missing", p), 1));
    h3_pathset_free(&ps);
    fs_teardown();
}

static volatile sig_atomic_t g_handled;
static void on_sigusr1(int sig) {
    (void)sig;
    h3_cancel_request(); /* what the command's SIGINT/SIGTERM handler does */
    g_handled = 1;
}

/* The stop flag: off, then set from a signal handler, seen by h3_cancel_check as H3_ERR_INTERRUPTED, reset.
 */
/* h3_fd_cached_bytes: a file just read is in the page cache whole (0 <= cached <= size always; equal once
 * read, which holds on every file system: a read brings the pages in, tmpfs holds them anyway); an empty file
 * has 0; a directory, a FIFO and a closed descriptor cannot be told (-1). */
static void test_cached_bytes(void) {
    fs_setup();
    char p[1024];
    const size_t n = (3u << 20) + 123; /* not a whole number of pages */
    char *buf = malloc(n);
    CHECK(buf != NULL);
    if (!buf) return;
    memset(buf, 7, n);
    FILE *f = fopen(at("big", p), "wb");
    CHECK(f && fwrite(buf, 1, n, f) == n && fclose(f) == 0, "writing %s", p);
    int fd = open(p, O_RDONLY);
    CHECK(fd >= 0 && read(fd, buf, n) == (ssize_t)n, "reading %s", p);
    const int64_t c = h3_fd_cached_bytes(fd);
    CHECK(c == (int64_t)n, "%lld of %zu bytes cached after reading the file", (long long)c, n);
    close(fd);
    free(buf);
    put("empty_file", "");
    fd = open(at("empty_file", p), O_RDONLY);
    CHECK(fd >= 0 && h3_fd_cached_bytes(fd) == 0);
    close(fd);
    fd = open(at("dir", p), O_RDONLY);
    CHECK(fd >= 0 && h3_fd_cached_bytes(fd) == -1, "a directory");
    close(fd);
    fd = open(at("fifo", p), O_RDONLY | O_NONBLOCK);
    CHECK(fd >= 0 && h3_fd_cached_bytes(fd) == -1, "a FIFO");
    close(fd);
    CHECK(h3_fd_cached_bytes(-1) == -1 && h3_fd_cached_bytes(fd) == -1, "no descriptor");
    fs_teardown();
}

static void test_cancel(void) {
    h3_cancel_reset();
    CHECK(!h3_cancel_requested() && h3_cancel_check() == H3_OK, "the flag starts clear");
    signal(SIGUSR1, on_sigusr1);
    raise(SIGUSR1);
    signal(SIGUSR1, SIG_DFL);
    CHECK(g_handled && h3_cancel_requested(), "set from a signal handler");
    CHECK_ERR(h3_cancel_check(), H3_ERR_INTERRUPTED, "stopped on request");
    h3_cancel_reset();
    CHECK(h3_cancel_check() == H3_OK, "reset");
}

static void test_tensor_views(void) {
    h3_tensor t, v, r;
    int64_t s[3] = {4, 5, 6};
    CHECK_OK(h3_tensor_alloc(&t, H3_PLACE_HOST, H3_F32, 3, s, H3_MEM_ACTIVATIONS));
    for (int i = 0; i < 120; i++) ((float *)t.data)[i] = (float)i;
    CHECK(h3_tensor_is_contiguous(&t) && h3_tensor_rows(&t) == 20 && h3_tensor_cols(&t) == 6);
    CHECK_OK(h3_tensor_narrow(&t, 0, 1, 2, &v));
    CHECK(((float *)v.data)[0] == 30.0f && v.owner == NULL && h3_tensor_is_contiguous(&v));
    CHECK_OK(h3_tensor_narrow(&t, 2, 2, 3, &v));
    int64_t ld;
    CHECK(!h3_tensor_is_contiguous(&v) && h3_tensor_is_rowwise(&v, &ld) && ld == 6,
          "a column slice is row-wise");
    CHECK_OK(h3_tensor_narrow(&t, 1, 1, 3, &v));
    CHECK(!h3_tensor_is_rowwise(&v, &ld), "a slice of a middle dim leaves gaps between rows");
    h3_tensor m;
    int64_t s2[2] = {20, 6};
    CHECK_OK(h3_tensor_reshape(&t, 2, s2, &m));
    CHECK_OK(h3_tensor_narrow(&m, 1, 2, 3, &v));
    CHECK(h3_tensor_is_rowwise(&v, &ld) && ld == 6 && ((float *)v.data)[0] == 2.0f);
    int64_t bad[2] = {7, -1};
    CHECK_ERR(h3_tensor_reshape(&t, 2, bad, &r), H3_ERR_INVALID, "infer");
    CHECK_ERR(h3_tensor_narrow(&t, 0, 3, 2, &v), H3_ERR_INVALID, "outside");
    /* dequantizing rows of an int8 tensor with per-block scales */
    h3_tensor q;
    int64_t sq[2] = {2, 8};
    CHECK_OK(h3_tensor_alloc(&q, H3_PLACE_HOST, H3_I8, 2, sq, H3_MEM_WEIGHTS));
    float scales[4] = {0.5f, 2.0f, 1.0f, -1.0f};
    for (int i = 0; i < 16; i++) ((int8_t *)q.data)[i] = (int8_t)(i - 8);
    q.q.mode = H3_SCALE_BLOCK;
    q.q.block = 4;
    q.q.scales = scales;
    float out[8];
    h3_tensor row1;
    CHECK_OK(h3_tensor_narrow(&q, 0, 1, 1, &row1));
    CHECK_OK(h3_tensor_rows_to_f32(&row1, 0, 1, out));
    for (int i = 0; i < 8; i++) CHECK(out[i] == (float)(i) * (i < 4 ? 1.0f : -1.0f), "col %d: %g", i, out[i]);
    h3_tensor_free(&q);
    h3_tensor_free(&t);
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        {"status", test_status},
        {"logging", test_logging},
        {"alloc", test_alloc},
        {"threads", test_threads},
        {"f16", test_f16},
        {"bf16", test_bf16},
        {"fp8", test_fp8},
        {"paths", test_paths},
        {"tensor_views", test_tensor_views},
        {"inputs", test_inputs},
        {"outputs", test_outputs},
        {"outgroup", test_outgroup},
        {"pathset", test_pathset},
        {"cancel", test_cancel},
        {"cached_bytes", test_cached_bytes},
        {NULL, NULL},
    };
    return t_main("test_base", cases, argc, argv);
}
