#include "io/detect.h"

#include <stdio.h>
#include <string.h>

#include "io/gguf.h"

const char *h3_component_name(h3_component c) {
    switch (c) {
        case H3_COMP_DIT: return "MiniMax-H3 DiT (omni transformer)";
        case H3_COMP_TEXT_ENCODER: return "Qwen3-VL text encoder";
        case H3_COMP_VIDEO_VAE: return "video VAE (f16t4d24)";
        case H3_COMP_AUDIO_VAE: return "audio VAE (DAC encoder + BigVGAN decoder)";
        default: return "unknown";
    }
}

const char *h3_layout_name(h3_layout l) {
    switch (l) {
        case H3_LAYOUT_OFFICIAL: return "official";
        case H3_LAYOUT_DIFFUSERS: return "diffusers";
        case H3_LAYOUT_COMFY: return "ComfyUI";
        default: return "unknown";
    }
}

static int has(const h3_st_set *s, const char *prefix, const char *name) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s%s", prefix, name);
    return h3_st_find(s, buf) != NULL;
}

int h3_count_layers(const h3_st_set *s, const char *prefix) {
    int n = 0;
    char buf[512];
    for (;;) {
        snprintf(buf, sizeof buf, "%s%d.", prefix, n);
        int64_t i = h3_st_lower_bound(s, buf);
        if (i >= s->n_entries || strncmp(s->entries[i].name, buf, strlen(buf)) != 0) break;
        n++;
    }
    return n;
}

static void add_format(h3_detect_info *d, const char *fmt) {
    if (strstr(d->formats, fmt)) return;
    size_t n = strlen(d->formats);
    snprintf(d->formats + n, sizeof d->formats - n, "%s%s", n ? ", " : "", fmt);
}

static void scan_quant(h3_st_set *s, h3_detect_info *d) {
    for (int64_t i = 0; i < s->n_entries; i++) {
        const h3_st_entry *e = &s->entries[i];
        size_t len = strlen(e->name);
        if (len < 12 || strcmp(e->name + len - 12, ".comfy_quant") != 0) continue;
        d->n_quantized++;
        const void *p;
        json_t *j = NULL;
        if (e->dtype != H3_U8 || e->end - e->begin > 4096 || h3_st_bytes(s, e, &p) != H3_OK ||
            h3_json_parse(p, (size_t)(e->end - e->begin), e->name, &j) != H3_OK) {
            h3_clear_error();
            add_format(d, "unreadable marker");
            continue;
        }
        const char *f = h3_json_get_str(j, "format");
        add_format(d, f ? f : "marker without format");
        json_t *cr = json_object_get(j, "convrot");
        if (json_is_true(cr)) add_format(d, "convrot");
        json_decref(j);
    }
}

static const char *const g_prefixes[] = {"", "model.diffusion_model.", "diffusion_model.", "model.", NULL};

/* A set opened from a GGUF file (src/io/gguf.h): one file whose name ends in ".gguf". */
static int set_is_gguf(const h3_st_set *s) {
    return s->n_files == 1 && s->files[0].path && h3_path_is_gguf(s->files[0].path);
}

h3_status h3_detect(h3_st_set *s, h3_detect_info *d) {
    memset(d, 0, sizeof *d);
    d->prefix = "";
    scan_quant(s, d);
    for (int i = 0; g_prefixes[i]; i++) {
        const char *p = g_prefixes[i];
        if (has(s, p, "blocks.0.attn.qkv_proj.weight") || has(s, p, "adaln_t_table")) {
            d->comp = H3_COMP_DIT;
            d->prefix = p;
            d->adaln_pruned = has(s, p, "adaln_t_table");
            char lp[256];
            snprintf(lp, sizeof lp, "%sblocks.", p);
            d->n_layers = h3_count_layers(s, lp);
            /* GGUF DiTs are converted from ComfyUI's files (sd.cpp, ComfyUI-GGUF): contiguous [Q; K; V]. */
            d->layout = (d->adaln_pruned || d->n_quantized || set_is_gguf(s)) ? H3_LAYOUT_COMFY : H3_LAYOUT_OFFICIAL;
            break;
        }
        if (has(s, p, "transformer_blocks.0.attn.to_q.weight") && has(s, p, "context_embedder.weight")) {
            d->comp = H3_COMP_DIT;
            d->layout = H3_LAYOUT_DIFFUSERS;
            d->prefix = p;
            char lp[256];
            snprintf(lp, sizeof lp, "%stransformer_blocks.", p);
            d->n_layers = h3_count_layers(s, lp);
            break;
        }
    }
    if (d->comp == H3_COMP_UNKNOWN) {
        if (has(s, "", "model.language_model.layers.0.self_attn.q_proj.weight")) {
            d->comp = H3_COMP_TEXT_ENCODER;
            d->layout = H3_LAYOUT_OFFICIAL; /* transformers' Qwen3VLForConditionalGeneration names */
            d->prefix = "model.language_model.";
            d->n_layers = h3_count_layers(s, "model.language_model.layers.");
        } else if (has(s, "", "model.layers.0.self_attn.q_proj.weight")) {
            d->comp = H3_COMP_TEXT_ENCODER;
            d->layout = H3_LAYOUT_COMFY;
            d->prefix = "model.";
            d->n_layers = h3_count_layers(s, "model.layers.");
        } else if (has(s, "", "post_quant_conv.weight") &&
                   (has(s, "", "decoder.x_embedder.weight") || has(s, "", "decoder.proj_in.weight"))) {
            d->comp = H3_COMP_VIDEO_VAE;
            d->layout = has(s, "", "decoder.x_embedder.weight") ? H3_LAYOUT_OFFICIAL : H3_LAYOUT_DIFFUSERS;
            d->n_layers = h3_count_layers(s, "decoder.transformer_blocks.");
        } else if (has(s, "", "dec_in_proj.weight")) {
            d->comp = H3_COMP_AUDIO_VAE;
            d->layout = H3_LAYOUT_OFFICIAL;
        }
    }
    if (set_is_gguf(s)) add_format(d, "GGUF");
    switch (d->comp) {
        case H3_COMP_DIT:
            snprintf(d->summary, sizeof d->summary, "%s, %s layout, %d blocks, %s AdaLN%s%s%s", h3_component_name(d->comp),
                     h3_layout_name(d->layout), d->n_layers,
                     d->adaln_pruned ? "pruned (curve table, rank 8)" : "full",
                     d->formats[0] ? ", quantized: " : "", d->formats, d->prefix[0] ? " (prefixed names)" : "");
            break;
        case H3_COMP_TEXT_ENCODER:
            snprintf(d->summary, sizeof d->summary, "%s, %s names, %d decoder layers%s%s", h3_component_name(d->comp),
                     d->layout == H3_LAYOUT_OFFICIAL ? "transformers" : "ComfyUI", d->n_layers,
                     d->formats[0] ? ", quantized: " : "", d->formats);
            break;
        case H3_COMP_VIDEO_VAE:
            snprintf(d->summary, sizeof d->summary, "%s, %s layout, %d ViT decoder blocks", h3_component_name(d->comp),
                     h3_layout_name(d->layout), d->n_layers);
            break;
        case H3_COMP_AUDIO_VAE:
            snprintf(d->summary, sizeof d->summary, "%s", h3_component_name(d->comp));
            break;
        default: snprintf(d->summary, sizeof d->summary, "not an H3 component h3run recognizes"); break;
    }
    return H3_OK;
}
