/* h3run inspect PATH: what a weight file, shard index or model folder holds, without reading its data. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "cli/cli.h"
#include "io/detect.h"
#include "io/discover.h"
#include "quant/qload.h"

typedef struct {
    char key[96];
    int64_t count, elems, bytes;
} group_row;

typedef struct {
    group_row *v;
    int n, cap;
} group_tab;

static h3_status group_add(group_tab *t, const char *key, int64_t elems, int64_t bytes) {
    for (int i = 0; i < t->n; i++) {
        if (strcmp(t->v[i].key, key) == 0) {
            t->v[i].count++;
            t->v[i].elems += elems;
            t->v[i].bytes += bytes;
            return H3_OK;
        }
    }
    if (t->n == t->cap) {
        int nc = t->cap ? 2 * t->cap : 16;
        group_row *nv = h3_realloc(t->v, (size_t)nc * sizeof *nv, H3_MEM_OTHER);
        if (!nv) return H3_ERR_NOMEM;
        t->v = nv;
        t->cap = nc;
    }
    group_row *r = &t->v[t->n++];
    snprintf(r->key, sizeof r->key, "%s", key);
    r->count = 1;
    r->elems = elems;
    r->bytes = bytes;
    return H3_OK;
}

static void print_groups(const char *title, group_tab *t) {
    char a[32], b[32], c[32];
    printf("  %s:\n", title);
    for (int i = 0; i < t->n; i++)
        printf("    %-32s %6lld tensors  %20s elements  %20s bytes (%s)\n", t->v[i].key, (long long)t->v[i].count,
               h3_fmt_int(t->v[i].elems, a, sizeof a), h3_fmt_int(t->v[i].bytes, b, sizeof b),
               h3_fmt_bytes((double)t->v[i].bytes, c, sizeof c));
}

/* The module a tensor belongs to, for the summary: its first name component ("blocks", "final_layer"), or the
 * first two for names under "model." ("model.language_model", "model.visual"). */
static void module_key(const char *name, char *out, size_t n) {
    const char *dot = strchr(name, '.');
    size_t len = dot ? (size_t)(dot - name) : strlen(name);
    if (dot && len == 5 && strncmp(name, "model", 5) == 0) {
        const char *dot2 = strchr(dot + 1, '.');
        len = dot2 ? (size_t)(dot2 - name) : strlen(name);
    }
    if (len >= n) len = n - 1;
    memcpy(out, name, len);
    out[len] = 0;
}

/* The layer number in "...layers.N." / "blocks.N.", or -1. */
static int layer_of(const char *name, const char *marker) {
    const char *p = strstr(name, marker);
    if (!p) return -1;
    p += strlen(marker);
    char *end;
    long v = strtol(p, &end, 10);
    return (end != p && *end == '.') ? (int)v : -1;
}

typedef struct {
    int summary;
    int64_t total_tensors, total_elems, total_bytes;
    int n_sets;
    h3_status st;
} inspect_ctx;

static int inspect_set(const char *path, void *user) {
    inspect_ctx *c = user;
    h3_st_set s;
    h3_gguf *g = NULL;
    h3_status st = h3_weights_open(path, &s, &g);
    if (st != H3_OK) {
        c->st = st;
        return 1;
    }
    h3_detect_info d;
    h3_detect(&s, &d);
    char a[32], b[32], e[32];
    int64_t elems = 0, bytes = 0, te_used_elems = 0, te_used_bytes = 0;
    group_tab by_dtype = {0}, by_module = {0}, by_role = {0}, by_format = {0};
    for (int64_t i = 0; i < s.n_entries && st == H3_OK; i++) {
        const h3_st_entry *en = &s.entries[i];
        int64_t ne = h3_st_entry_numel(en), nb = (int64_t)(en->end - en->begin);
        /* The stored format of a weight (ComfyUI's markers, GGUF types): its logical shape and its label. */
        h3_qweight_info qi;
        int quant = 0, is_comp = !g && h3_qweight_is_companion(en->name);
        char label[96] = "";
        if (!is_comp) {
            if (h3_qweight_info_of(&s, g, en, &qi) == H3_OK) {
                quant = qi.fmt != H3_QF_NONE;
                if (quant || g) {
                    ne = 1;
                    for (int k = 0; k < qi.ndim; k++) ne *= qi.shape[k];
                }
                snprintf(label, sizeof label, "%s", qi.label);
            } else {
                snprintf(label, sizeof label, "unreadable: %.80s", h3_last_error_message());
                quant = 1;
                h3_clear_error();
            }
        }
        elems += ne;
        bytes += nb;
        const char *dname = h3_dtype_st_name(en->dtype);
        if (g) {
            const h3_gguf_tensor *gt = h3_gguf_find(g, en->name);
            if (gt && h3_ggml_type_name(gt->type)) dname = h3_ggml_type_name(gt->type);
        }
        if (!c->summary) {
            char shape[128];
            size_t o = 0;
            int nd = (g && !is_comp && label[0] && strncmp(label, "unreadable", 10)) ? qi.ndim : en->ndim;
            const int64_t *sh = nd == qi.ndim && g ? qi.shape : en->shape;
            o += (size_t)snprintf(shape + o, sizeof shape - o, "[");
            for (int k = 0; k < nd && o < sizeof shape; k++)
                o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%lld", k ? ", " : "", (long long)sh[k]);
            if (o < sizeof shape) snprintf(shape + o, sizeof shape - o, "]");
            const h3_gguf_tensor *gt = g ? h3_gguf_find(g, en->name) : NULL;
            if (quant && !g)
                printf("%-64s %-8s %-22s %s  %s\n", en->name, dname, shape, h3_fmt_int(nb, a, sizeof a), label);
            else if (gt && strcmp(gt->name, en->name))
                printf("%-64s %-8s %-22s %s  (stored as %s)\n", en->name, dname, shape, h3_fmt_int(nb, a, sizeof a),
                       gt->name);
            else
                printf("%-64s %-8s %-22s %s\n", en->name, dname, shape, h3_fmt_int(nb, a, sizeof a));
            continue;
        }
        char key[96];
        if (quant && !g) st = group_add(&by_format, label, ne, qi.bytes); /* GGUF: the dtype table has the types */
        if (st == H3_OK) st = group_add(&by_dtype, dname, ne, nb);
        if (st == H3_OK) {
            module_key(en->name, key, sizeof key);
            st = group_add(&by_module, key, ne, nb);
        }
        if (st != H3_OK) break;
        const char *role = NULL;
        if (d.comp == H3_COMP_DIT) {
            role = (strstr(en->name, "adaln") || strstr(en->name, "time_embedder")) ? "AdaLN and time embedding"
                                                                                    : "core (everything else)";
        } else if (d.comp == H3_COMP_TEXT_ENCODER) {
            /* H3 reads hidden_states[50] of a text-only prompt: the embedding rows and decoder layers 0-49. */
            int layer = layer_of(en->name, "layers.");
            if (strstr(en->name, "visual.")) role = "vision tower (images/videos)";
            else if (strstr(en->name, "embed_tokens")) role = "H3 uses: embeddings";
            else if (layer >= 0 && layer < 50) role = "H3 uses: decoder layers 0-49";
            else role = "unused: layers 50+, norm, head";
            if (strncmp(role, "H3 uses", 7) == 0) te_used_elems += ne, te_used_bytes += nb;
        }
        if (role) st = group_add(&by_role, role, ne, nb);
    }
    if (st == H3_OK) {
        printf("%s%s\n  component: %s\n", c->summary ? "" : "\n", path, d.summary);
        printf("  tensors: %lld   elements: %s   data bytes: %s (%s)   files: %d\n", (long long)s.n_entries,
               h3_fmt_int(elems, a, sizeof a), h3_fmt_int(bytes, b, sizeof b), h3_fmt_bytes((double)bytes, e, sizeof e),
               s.n_files);
        if (c->summary) {
            print_groups("by dtype", &by_dtype);
            if (by_format.n) print_groups("by format (quantized weights with their scales)", &by_format);
            print_groups("by module", &by_module);
            if (by_role.n) print_groups("by role", &by_role);
            if (d.comp == H3_COMP_TEXT_ENCODER) {
                char f[32], g2[32], h[32];
                printf("  H3 uses (embeddings + decoder layers 0-49): %s elements, %s bytes (%s); the rest is unused "
                       "by text prompts: %s bytes\n",
                       h3_fmt_int(te_used_elems, f, sizeof f), h3_fmt_int(te_used_bytes, g2, sizeof g2),
                       h3_fmt_bytes((double)te_used_bytes, h, sizeof h), h3_fmt_int(bytes - te_used_bytes, a, sizeof a));
            }
        }
        c->total_tensors += s.n_entries;
        c->total_elems += elems;
        c->total_bytes += bytes;
        c->n_sets++;
    }
    h3_free(by_dtype.v);
    h3_free(by_module.v);
    h3_free(by_role.v);
    h3_free(by_format.v);
    h3_st_close(&s);
    h3_gguf_free(g);
    c->st = st;
    return st != H3_OK;
}

int h3_cmd_inspect(int argc, char **argv) {
    int summary = 0, quiet = 0;
    const h3_cli_opt opts[] = {
        {"summary", 's', H3_OPT_FLAG, &summary, NULL,
         "counts and bytes per dtype, per module and per role, not every tensor", 0, 0},
        {"quiet", 'q', H3_OPT_FLAG, &quiet, NULL, "print only errors on stderr", 0, 0},
        {0},
    };
    const h3_cli_cmd cmd = {
        "inspect", "inspect PATH [--summary]",
        "List the tensors of a .safetensors file, a shard index (*.safetensors.index.json), a .gguf file or a model\n"
        "folder; name the H3 component and layout each weight set holds and the stored format of every quantized\n"
        "weight (ComfyUI's int8_tensorwise / convrot, float8_e4m3fn, nvfp4 markers; GGUF types). Reads headers and\n"
        "markers only, never the weight data.",
        "examples:\n  h3run inspect FL2VA/transformer --summary\n  h3run inspect ComfyUI/models/diffusion_models/"
        "minimax_h3_fl2va_pruned_int8_convrot.safetensors",
        opts, 1, 1};
    const char *pos[1];
    int npos;
    int r = h3_cli_parse(&cmd, argc, argv, pos, &npos);
    if (r) return r < 0 ? H3_EXIT_OK : r;
    h3_cli_setup_logging(quiet ? -1 : 0);
    const h3_cli_path in = {"PATH", pos[0], H3_CLI_IN}; /* a FIFO or device is refused, not waited on */
    r = h3_cli_check_paths("inspect", &in, 1);
    if (r) return r;
    inspect_ctx c = {summary, 0, 0, 0, 0, H3_OK};
    h3_status st = h3_discover_sets(pos[0], inspect_set, &c);
    if (st == H3_OK) st = c.st;
    if (st != H3_OK) return h3_cli_fail("inspect", st);
    if (c.n_sets > 1) {
        char a[32], b[32], e[32];
        printf("\ntotal over %d weight sets: %lld tensors, %s elements, %s data bytes (%s)\n", c.n_sets,
               (long long)c.total_tensors, h3_fmt_int(c.total_elems, a, sizeof a), h3_fmt_int(c.total_bytes, b, sizeof b),
               h3_fmt_bytes((double)c.total_bytes, e, sizeof e));
    }
    return H3_EXIT_OK;
}
