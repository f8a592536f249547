/* LoRA files (models/lora.h): what `--lora` reads. The input is a whole .safetensors file, read for the
 * reduced model's DiT (official layout, per-head fused QKV); what it accepts is applied (merged into owned
 * copies, then, on a fresh DiT, on the side path) and the DiT runs once on a small packed sequence. */
#include <string.h>

#include "fuzz.h"
#include "models/dit.h"
#include "models/lora.h"

static h3_exec g_ex;
static char g_model[4096];

static void setup(void) {
    if (g_model[0]) return;
    snprintf(g_model, sizeof g_model, "%s/transformer", fz_tiny_model());
    if (h3_exec_init(&g_ex, 1) != H3_OK) abort();
    fz_keep();
}

/* One forward of 4 video, 2 audio and 2 text rows at one timestep. */
static void forward(h3_dit *d) {
    enum { NV = 4, NA = 2, NL = 2, S = NV + NA + NL };
    const h3_dit_config *c = h3_dit_get_config(d);
    static float vid[NV * 96], aud[NA * 32], txt[NL * 64], vo[NV * 96], ao[NA * 32];
    int32_t ti[S] = {0}, tags[S], vi[NV], ai[NA], li[NL];
    double pos[S * 3];
    for (int i = 0; i < S; i++) {
        tags[i] = i < NV ? 0 : i < NV + NA ? 2 : 1;
        for (int k = 0; k < 3; k++) pos[i * 3 + k] = (double)((i * k) % 3);
    }
    for (int i = 0; i < NV; i++) vi[i] = i;
    for (int i = 0; i < NA; i++) ai[i] = NV + i;
    for (int i = 0; i < NL; i++) li[i] = NV + NA + i;
    for (int i = 0; i < NV * 96; i++) vid[i] = (float)((i % 7) - 3) * 0.1f;
    for (int i = 0; i < NA * 32; i++) aud[i] = (float)((i % 5) - 2) * 0.1f;
    for (int i = 0; i < NL * 64; i++) txt[i] = (float)((i % 3) - 1) * 0.1f;
    if (c->text_dim != 64) return;
    h3_tensor v, a, t, vout, aout;
    int64_t sv[2] = {NV, 96}, sa[2] = {NA, 32}, st[2] = {NL, 64};
    h3_tensor_wrap(&v, vid, H3_PLACE_HOST, H3_F32, 2, sv);
    h3_tensor_wrap(&a, aud, H3_PLACE_HOST, H3_F32, 2, sa);
    h3_tensor_wrap(&t, txt, H3_PLACE_HOST, H3_F32, 2, st);
    h3_tensor_wrap(&vout, vo, H3_PLACE_HOST, H3_F32, 2, sv);
    h3_tensor_wrap(&aout, ao, H3_PLACE_HOST, H3_F32, 2, sa);
    float ts[1] = {0.5f};
    h3_dit_inputs in = {&v, &a, &t, ts, 1, S, ti, tags, pos, vi, ai, li};
    h3_dit_forward(d, &g_ex, &in, &vout, &aout);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    const char *path = fz_write("lora.safetensors", data, size);
    fz_quiet(1);
    int ok = 0;
    for (int mode = H3_LORA_MERGE; mode <= H3_LORA_SIDE; mode++) {
        h3_dit *d = NULL;
        h3_lora l;
        memset(&l, 0, sizeof l);
        if (h3_dit_open(g_model, NULL, &d) != H3_OK) abort(); /* the reduced model itself must open */
        if (h3_lora_add_file(&l, d, path, 0.75f) == H3_OK &&
            h3_lora_apply(d, &g_ex, &l, (h3_lora_mode)mode) == H3_OK) {
            forward(d);
            ok = 1;
        }
        h3_dit_close(d);
        h3_lora_free(&l);
    }
    h3_clear_error();
    fz_quiet(0);
    fz_end("lora", ok);
    return 0;
}
