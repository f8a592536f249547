/* The command's plumbing that does not need a model: where generate looks for the small model when no --model
 * is given (src/cli/cli.h), in the documented order, and what it says when the model is in none of those
 * places. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "cli/cli.h"
#include "testutil.h"

static void make_dir(const char *root, const char *rel) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755);
            *s = '/';
        }
    CHECK(mkdir(p, 0755) == 0, "mkdir %s", p);
}

static void remove_tree(const char *root) {
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
}

/* The places come in the documented order: each H3RUN_MODELS folder, the checkout above the program, the
 * prefix above the program, the configured prefix, the source tree; a folder named twice is listed once. */
static void test_model_places_order(void) {
    char tmp[512], prog[600];
    t_tmp_path("places", tmp, sizeof tmp);
    make_dir(tmp, "inst/bin");
    char *real = realpath(tmp, NULL);
    CHECK(real != NULL);
    if (!real) return;
    snprintf(prog, sizeof prog, "%s/inst/bin/h3run", real);
    const h3_cli_model_where w = {"/a:/b::/a", prog, "/usr/local", "/src/h3run"};
    char *places[H3_CLI_MAX_MODEL_PLACES];
    const int n = h3_cli_model_places(&w, places, H3_CLI_MAX_MODEL_PLACES);
    char want[6][700];
    snprintf(want[0], sizeof want[0], "/a/h3-small");
    snprintf(want[1], sizeof want[1], "/b/h3-small");
    snprintf(want[2], sizeof want[2], "%s/inst/models/h3-small", real);
    snprintf(want[3], sizeof want[3], "%s/inst/share/h3run/models/h3-small", real);
    snprintf(want[4], sizeof want[4], "/usr/local/share/h3run/models/h3-small");
    snprintf(want[5], sizeof want[5], "/src/h3run/models/h3-small");
    CHECK(n == 6, "%d places, expected 6", n);
    for (int i = 0; i < 6 && i < n; i++)
        CHECK(!strcmp(places[i], want[i]), "place %d is %s, expected %s", i, places[i], want[i]);
    for (int i = 0; i < n; i++) h3_free(places[i]);
    /* nothing known: no places */
    const h3_cli_model_where none = {NULL, NULL, NULL, NULL};
    CHECK(h3_cli_model_places(&none, places, H3_CLI_MAX_MODEL_PLACES) == 0);
    free(real);
    remove_tree(tmp);
}

/* The first place that holds the model wins, whatever comes after; the answer is an absolute path and the
 * list of places is left empty. */
static void test_model_first_found(void) {
    char tmp[512], prog[600], env[1300], src[700];
    t_tmp_path("found", tmp, sizeof tmp);
    make_dir(tmp, "inst/bin");
    make_dir(tmp, "inst/share/h3run/models/h3-small");
    make_dir(tmp, "mine/h3-small");
    make_dir(tmp, "src/models/h3-small");
    char *real = realpath(tmp, NULL);
    CHECK(real != NULL);
    if (!real) return;
    snprintf(prog, sizeof prog, "%s/inst/bin/h3run", real);
    snprintf(src, sizeof src, "%s/src", real);
    char looked[2048] = "x", want[700];
    h3_cli_model_where w = {NULL, prog, "/nonexistent-prefix", src};
    char *m = h3_cli_find_model(&w, looked, sizeof looked);
    snprintf(want, sizeof want, "%s/inst/share/h3run/models/h3-small", real);
    CHECK(m && !strcmp(m, want), "found %s, expected %s", m ? m : "nothing", want);
    CHECK(looked[0] == 0, "the list is set when the model was found: %s", looked);
    h3_free(m);
    /* H3RUN_MODELS comes first; an entry without the model is passed over */
    snprintf(env, sizeof env, "%s/none:%s/mine", real, real);
    w.models_env = env;
    m = h3_cli_find_model(&w, NULL, 0);
    snprintf(want, sizeof want, "%s/mine/h3-small", real);
    CHECK(m && !strcmp(m, want), "with H3RUN_MODELS found %s, expected %s", m ? m : "nothing", want);
    h3_free(m);
    /* a program elsewhere (an out-of-tree build): the source tree */
    w.models_env = NULL;
    w.program = "/nonexistent-build/h3run";
    m = h3_cli_find_model(&w, NULL, 0);
    snprintf(want, sizeof want, "%s/src/models/h3-small", real);
    CHECK(m && !strcmp(m, want), "from an out-of-tree build found %s, expected %s", m ? m : "nothing", want);
    h3_free(m);
    free(real);
    remove_tree(tmp);
}

/* Nowhere: NULL, and the list names every place looked in, in order. */
static void test_model_not_found(void) {
    char tmp[512], prog[600];
    t_tmp_path("missing", tmp, sizeof tmp);
    make_dir(tmp, "inst/bin");
    char *real = realpath(tmp, NULL);
    CHECK(real != NULL);
    if (!real) return;
    snprintf(prog, sizeof prog, "%s/inst/bin/h3run", real);
    const h3_cli_model_where w = {"/nonexistent-models", prog, "/nonexistent-prefix", "/nonexistent-src"};
    char *places[H3_CLI_MAX_MODEL_PLACES];
    const int n = h3_cli_model_places(&w, places, H3_CLI_MAX_MODEL_PLACES);
    char looked[4096];
    char *m = h3_cli_find_model(&w, looked, sizeof looked);
    CHECK(m == NULL, "found %s", m);
    h3_free(m);
    CHECK(n == 5, "%d places, expected 5", n);
    const char *at = looked;
    for (int i = 0; i < n; i++) {
        const char *hit = strstr(at, places[i]);
        CHECK(hit != NULL, "'%s' is not listed (in order) in: %s", places[i], looked);
        if (hit) at = hit + strlen(places[i]);
        h3_free(places[i]);
    }
    free(real);
    remove_tree(tmp);
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        {"model_places_order", test_model_places_order},
        {"model_first_found", test_model_first_found},
        {"model_not_found", test_model_not_found},
        {NULL, NULL},
    };
    return t_main("test_cli", cases, argc, argv);
}
