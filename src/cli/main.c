/* h3run: the command. Each subcommand lives in its own file and owns its option table. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cuda/cuda.h"
#include "h3run.h"
#include "pipeline/dit_group.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} subcommand;

static const subcommand g_cmds[] = {
    {"inspect", h3_cmd_inspect, "list the tensors of weight files and name the H3 components they hold"},
    {"dit", h3_cmd_dit, "run the DiT once on a packed sequence given as named tensors"},
    {"encode", h3_cmd_encode,
     "tokenize a prompt and run the text encoder to H3's conditioning (hidden_states[50])"},
    {"decode", h3_cmd_decode, "decode latents with the video or audio VAE to PNG frames or a WAV file"},
    {"vae-encode", h3_cmd_vae_encode,
     "encode pixels with the video VAE's encoder to latents (for comparisons)"},
    {"plan", h3_cmd_plan,
     "plan a request's memory: where each weight block lives, peaks and time, before loading"},
    {"generate", h3_cmd_generate, "a prompt to an MP4 with stereo sound: text encoder, DiT steps, VAEs, mux"},
    {"serve", h3_cmd_serve, "an HTTP API and web page over a queue of generate jobs that survives a crash"},
    {"quantize", h3_cmd_quantize,
     "write int8 / fp8 / nvfp4 weights in ComfyUI's format; the error of each format"},
    {NULL, NULL, NULL},
};

static void usage(FILE *out) {
    fprintf(out,
            "h3run %s: MiniMax-H3 (prompt to video with sound) on GPUs smaller than the model\n\n"
            "usage: h3run COMMAND [options]\n\ncommands:\n",
            H3RUN_VERSION);
    for (const subcommand *c = g_cmds; c->name; c++) fprintf(out, "  %-10s %s\n", c->name, c->summary);
    fprintf(out, "\n'h3run COMMAND --help' describes a command and its options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return H3_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "-h") || !strcmp(name, "--help") || !strcmp(name, "help")) {
        usage(stdout);
        return H3_EXIT_OK;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "version")) {
        printf("h3run %s\n", H3RUN_VERSION);
        /* what --device cuda would find; tests read this line to decide whether a GPU run is expected */
        if (!h3_cuda_compiled()) {
            printf("cuda: not in this build\n");
        } else {
            const int n = h3_cuda_device_count();
            printf("cuda: %d device%s", n, n == 1 ? "" : "s");
            for (int i = 0; i < n; i++) {
                char dn[128] = "?";
                int64_t total = 0;
                if (h3_cuda_device_info(i, dn, sizeof dn, &total, NULL) == H3_OK)
                    printf("%s %d: %s (%.1f GiB)", i ? "," : ";", i, dn, (double)total / 1073741824.0);
            }
            printf("\n");
        }
        return H3_EXIT_OK;
    }
    /* not a user's command: a DiT worker of `generate --gpus N`, started by h3run with its setup on stdin */
    if (!strcmp(name, "__dit-rank")) return h3_dit_rank_main(h3_cli_setup_logging);
    for (const subcommand *c = g_cmds; c->name; c++)
        if (!strcmp(c->name, name)) return c->fn(argc - 2, argv + 2);
    fprintf(stderr, "h3run: unknown command '%s'\n\n", name);
    usage(stderr);
    return H3_EXIT_USAGE;
}
