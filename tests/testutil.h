/* A small test harness: named cases, CHECK macros that report file:line and keep going, fresh random inputs
 * every run (seed printed; set H3_TEST_SEED to replay), and float64 error helpers. */
#ifndef H3_TESTUTIL_H
#define H3_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

typedef struct {
    const char *name;
    void (*fn)(void);
} t_case;

extern int t_failures;
extern uint64_t t_seed;

void t_fail_at(const char *file, int line, const char *fmt, ...) H3_PRINTF(3, 4);
void t_fail_cond(const char *file, int line, const char *cond);
void t_note(const char *fmt, ...) H3_PRINTF(1, 2);
/* CHECK(cond) or CHECK(cond, "format", args...): reports the condition and the optional explanation. */
#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            t_fail_cond(__FILE__, __LINE__, #cond);                                                          \
            t_note(" " __VA_ARGS__);                                                                         \
        }                                                                                                    \
    } while (0)
/* A call that must succeed; prints the library's error otherwise. */
#define CHECK_OK(expr)                                                                                       \
    do {                                                                                                     \
        h3_status t__s = (expr);                                                                             \
        if (t__s != H3_OK) t_fail_at(__FILE__, __LINE__, "%s failed: %s", #expr, h3_last_error());           \
    } while (0)
/* A call that must fail with the given code and a message containing `needle` (may be NULL). */
#define CHECK_ERR(expr, code, needle)                                                                        \
    do {                                                                                                     \
        h3_clear_error();                                                                                    \
        h3_status t__s = (expr);                                                                             \
        t_check_err(__FILE__, __LINE__, #expr, t__s, (code), (needle));                                      \
    } while (0)
void t_check_err(const char *file, int line, const char *expr, h3_status got, int code, const char *needle);

/* Runs the cases (all, or those whose name contains argv[1]); returns the process exit status. */
int t_main(const char *suite, const t_case *cases, int argc, char **argv);

uint64_t t_rand_u64(void);
double t_uniform(double lo, double hi);
double t_randn(void);
void t_fill_uniform(float *x, size_t n, double lo, double hi);
void t_fill_randn(float *x, size_t n, double scale);

/* ||a − ref|| / ||ref|| (L2), and the largest |a − ref|. */
double t_rel_err(const float *a, const double *ref, size_t n);
double t_max_abs_err(const float *a, const double *ref, size_t n);
/* Reports and checks rel_err <= tol; returns the error. */
double t_expect_close(const char *file, int line, const char *what, const float *a, const double *ref,
                      size_t n, double tol);
#define EXPECT_CLOSE(what, a, ref, n, tol) t_expect_close(__FILE__, __LINE__, what, a, ref, n, tol)

/* ---- a stand-in device -----------------------------------------------------------------------------------
 * Host memory behind the DEVICE place (each allocation counted in the arena's granules, as the arena counts
 * them) and the CPU kernels behind the device backend, with ex->cuda marked: device code that needs no CUDA
 * queues (resident weights, conversions, copies, the ops) runs on any machine and its device bytes are
 * measured. t_standin_begin returns 0 and changes nothing when a real device backend is active. */
struct h3_exec;
extern int64_t t_sd_used, t_sd_peak; /* device bytes held now, and the most since the last reset */
int t_standin_begin(struct h3_exec *ex);
void t_standin_end(struct h3_exec *ex);

/* ---- one tensor at a time: the loaders' shape contract ---------------------------------------------------
 * A mutation of one tensor of a safetensors file: emptied (first dim 0), truncated (first dim - 1), reshaped
 * (same elements, another shape: dims reversed, or [n] -> [1, n]) or retyped (an integer dtype no weight role
 * takes, of the same element size where there is one). Data is kept byte for byte where the size allows, else
 * zeros. */
typedef enum { T_MUT_EMPTY, T_MUT_TRUNCATE, T_MUT_RESHAPE, T_MUT_RETYPE, T_MUT_COUNT } t_mutation;
const char *t_mutation_name(t_mutation m);
/* Writes dst: src (one .safetensors file) with tensor `name` mutated. Returns 0 when the mutation does not
 * apply (truncating or emptying a tensor whose first dim is already 0, reshaping a scalar). */
int t_st_mutate(const char *src, const char *dst, const char *name, t_mutation m);

/* Opens what `path` names with the loader under test and closes it again. */
typedef h3_status (*t_load_fn)(const char *path, void *user);
/* 1 when the loader must accept tensor `name` mutated by m (a tensor it does not read, or a size it takes
 * from that tensor itself), 0 when it must refuse in the binder's form, -1 to leave the case out (large
 * models sweep a selection), 2 when only a crash is wrong (the companions of quantized weights: markers and
 * scales have checks of their own). NULL: every mutation must be refused. */
typedef int (*t_accept_fn)(const char *name, t_mutation m, void *user);
/* For every tensor of every .safetensors file under root (a file, or a folder tree with its configs), and
 * each mutation (all four; with one_each, one per tensor in turn, for large files): mutates a copy of root
 * and loads it. A refusal must be the binder's one message form (io/wbind.h: "tensor '...' is missing; / has
 * shape [...]; / has dtype ...") and no load may crash (the ASan build runs this too). Returns the number of
 * loads. */
int t_sweep(const char *what, const char *root, t_load_fn load, t_accept_fn accept, void *user, int one_each);
/* Whether msg is the binder's message form. */
int t_wbind_form(const char *msg);

/* Path under the source tree / build tree (from the H3_SOURCE_DIR / H3_BUILD_DIR environment set by CTest).
 */
const char *t_src_path(const char *rel, char *buf, size_t n);
const char *t_tmp_path(const char *name, char *buf, size_t n);

#endif
