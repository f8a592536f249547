/* The harness's own checks can fail: a file left behind after a failed command, and a kept file changed even
 * after one that succeeded, end the process (abort); new outputs of a command that succeeded are removed,
 * whatever their names (spaces, new lines, backslashes). Each case runs in a child process. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fuzz.h"

static void touch(const char *rel, const char *text) {
    FILE *f = fopen(fz_path(rel), "w");
    if (!f) _exit(3);
    fputs(text, f);
    fclose(f);
}

static void stray_after_failure(void) {
    touch("stray file", "x");
    fz_end("selftest", 0);
}

static void kept_file_changed(void) {
    touch("kept", "changed, and longer");
    fz_end("selftest", 1);
}

static void outputs_after_success(void) {
    touch("out put\nwith\\odd name", "x");
    mkdir(fz_path("out dir"), 0755);
    touch("out dir/frame 1", "x");
    fz_write("input", "y", 1);
    fz_end("selftest", 1);
    struct stat st;
    if (stat(fz_path("out put\nwith\\odd name"), &st) == 0 || stat(fz_path("out dir"), &st) == 0 ||
        stat(fz_path("input"), &st) == 0)
        exit(4);           /* not removed */
    fz_end("selftest", 0); /* and the folder is as kept again */
}

/* Runs fn in a child; whether it aborted. */
static int aborts(void (*fn)(void)) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) { /* _exit: the folder is the parent's, removed when it exits */
        touch("kept", "x");
        fz_keep();
        fn();
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        printf("the case exited %d\n", WEXITSTATUS(status));
        return -1;
    }
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

int main(void) {
    int fails = 0;
    fz_dir(); /* one folder for every case */
    if (aborts(stray_after_failure) != 1)
        fails++, printf("FAIL: a file left after a failure was not reported\n");
    if (aborts(kept_file_changed) != 1) fails++, printf("FAIL: a changed kept file was not reported\n");
    if (aborts(outputs_after_success) != 0)
        fails++, printf("FAIL: outputs of a success were reported or kept\n");
    printf("fuzz harness self-test: %s\n", fails ? "FAILED" : "passed");
    return fails != 0;
}
