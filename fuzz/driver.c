/* A plain main for the fuzz targets: replays files (and the files of folders, recursively) through
 * LLVMFuzzerTestOneInput, so every target also runs with gcc and without libFuzzer (CTest replays
 * fuzz/corpus).
 *
 *   fuzz_NAME_replay [--timeout S] PATH...
 *
 * A crash or sanitizer report ends the process as it would end libFuzzer, after naming the input; an input
 * that runs longer than S seconds (default 60) is a hang: the input is named and the process aborts. Exit
 * status 0: every input ran; 2: bad usage or an unreadable path. */
#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fuzz.h"

void __sanitizer_set_death_callback(void (*cb)(void)) __attribute__((weak));

static char g_current[PATH_MAX];
static int g_timeout = 60;

static void say_input(void) {
    if (g_current[0]) dprintf(2, "==FUZZ== the input was %s\n", g_current);
}

static void on_alarm(int sig) {
    (void)sig;
    dprintf(2, "==FUZZ== hang: %s ran for more than %d s\n", g_current, g_timeout);
    abort();
}

static void on_fatal(int sig) {
    say_input();
    signal(sig, SIG_DFL);
    raise(sig);
}

static int run_file(const char *path, long *count) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz replay: cannot read %s\n", path);
        return 2;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "fuzz replay: out of memory reading %s\n", path);
        return 2;
    }
    snprintf(g_current, sizeof g_current, "%s", path);
    /* an exact copy, so a read past the input's end is a report, as under libFuzzer */
    uint8_t *exact = malloc(n ? n : 1);
    memcpy(exact, buf, n);
    free(buf);
    alarm((unsigned)g_timeout);
    LLVMFuzzerTestOneInput(exact, n);
    alarm(0);
    free(exact);
    g_current[0] = 0;
    (*count)++;
    return 0;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_path(const char *path, long *count) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "fuzz replay: no such file or folder: %s\n", path);
        return 2;
    }
    if (!S_ISDIR(st.st_mode)) return run_file(path, count);
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "fuzz replay: cannot read the folder %s\n", path);
        return 2;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue; /* ., .., and hidden files such as .gitkeep */
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            names = realloc(names, cap * sizeof *names);
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_names);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char sub[PATH_MAX];
        snprintf(sub, sizeof sub, "%s/%s", path, names[i]);
        const size_t len = strlen(names[i]);
        const int readme = len > 3 && !strcmp(names[i] + len - 3, ".md"); /* notes beside the inputs */
        if (!rc && !readme) rc = run_path(sub, count);
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    int first = 1;
    if (argc > 2 && !strcmp(argv[1], "--timeout")) {
        g_timeout = atoi(argv[2]);
        first = 3;
    }
    if (first >= argc || g_timeout <= 0) {
        fprintf(stderr, "usage: %s [--timeout SECONDS] FILE_OR_FOLDER...\n", argv[0]);
        return 2;
    }
    signal(SIGALRM, on_alarm);
    if (__sanitizer_set_death_callback) {
        __sanitizer_set_death_callback(say_input);
    } else { /* no sanitizer runtime: name the input on the signals it would have reported */
        signal(SIGSEGV, on_fatal);
        signal(SIGBUS, on_fatal);
        signal(SIGFPE, on_fatal);
        signal(SIGILL, on_fatal);
    }
    signal(SIGABRT, on_fatal);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long count = 0;
    for (int i = first; i < argc; i++) {
        int rc = run_path(argv[i], &count);
        if (rc) return rc;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("replayed %ld inputs in %.2f s\n", count,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));
    return 0;
}
