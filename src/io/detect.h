/* Which H3 component a set of tensors holds, in which layout, judged from tensor names and shapes alone. */
#ifndef H3_IO_DETECT_H
#define H3_IO_DETECT_H

#include "io/safetensors.h"

typedef enum h3_component {
    H3_COMP_UNKNOWN = 0,
    H3_COMP_DIT,
    H3_COMP_TEXT_ENCODER,
    H3_COMP_VIDEO_VAE,
    H3_COMP_AUDIO_VAE,
} h3_component;

typedef enum h3_layout {
    H3_LAYOUT_UNKNOWN = 0,
    H3_LAYOUT_OFFICIAL,  /* MiniMaxAI/MiniMax-H3 FL2VA/ or Ref2VA/ component folders */
    H3_LAYOUT_DIFFUSERS, /* the diffusers folders of the same repository */
    H3_LAYOUT_COMFY,     /* Comfy-Org repackaged single files */
} h3_layout;

typedef struct h3_detect_info {
    h3_component comp;
    h3_layout layout;
    const char *prefix; /* prefix stripped from every name ("" when none), e.g. "model.diffusion_model." */
    int adaln_pruned;   /* DiT: curve-form AdaLN (adaln_t_table) instead of the time embedder + full matrices */
    int n_layers;       /* DiT blocks, text-encoder decoder layers, ViT decoder blocks */
    int n_quantized;    /* tensors with a comfy_quant marker */
    char formats[160];  /* distinct comfy_quant formats, comma-separated */
    char summary[256];  /* one line for people */
} h3_detect_info;

const char *h3_component_name(h3_component c);
const char *h3_layout_name(h3_layout l);

/* Never fails on unknown content: comp is H3_COMP_UNKNOWN then. Reads comfy_quant markers (a few bytes each). */
h3_status h3_detect(h3_st_set *s, h3_detect_info *out);

/* Counts the blocks "<prefix><N>." present, N from 0 upward without gaps. */
int h3_count_layers(const h3_st_set *s, const char *prefix);

#endif
