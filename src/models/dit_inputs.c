/* DiT inputs from a safetensors file of named tensors (what `h3run dit --inputs` reads). */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "io/safetensors.h"
#include "models/dit.h"

static const char *shp(const h3_st_entry *e, char *buf, size_t n) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < e->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)e->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

/* The entry `name` with ndim dims; want0/want1 >= 0 pin a dim. `need` describes it for the message. */
static h3_status entry(h3_st_set *s, const char *name, int ndim, int64_t want0, int64_t want1,
                       const char *need, const h3_st_entry **out) {
    char b[96];
    const h3_st_entry *e = h3_st_find(s, name);
    if (!e)
        return H3_ERR(H3_ERR_FORMAT, "%s: input tensor '%s' is missing (it must be %s)", s->source, name,
                      need);
    if (e->ndim != ndim || (want0 >= 0 && e->shape[0] != want0) ||
        (ndim > 1 && want1 >= 0 && e->shape[1] != want1))
        return H3_ERR(H3_ERR_FORMAT, "%s: input tensor '%s' has shape %s; it must be %s", s->source, name,
                      shp(e, b, sizeof b), need);
    *out = e;
    return H3_OK;
}

static h3_status rows_f32(h3_st_set *s, const char *name, int64_t cols, const char *need, h3_tensor *t,
                          int64_t *n) {
    const h3_st_entry *e;
    H3_TRY(entry(s, name, 2, -1, cols, need, &e));
    if (!h3_dtype_is_float(e->dtype) || e->dtype == H3_F8_E4M3 || e->dtype == H3_F8_E5M2)
        return H3_ERR(H3_ERR_FORMAT, "%s: input tensor '%s' is %s; it must be a float tensor (%s)", s->source,
                      name, h3_dtype_name(e->dtype), need);
    *n = e->shape[0];
    if (*n == 0) {
        int64_t sh[2] = {1, cols};
        H3_TRY(h3_tensor_alloc(t, H3_PLACE_HOST, H3_F32, 2, sh, H3_MEM_ACTIVATIONS));
        t->shape[0] = 0;
        return H3_OK;
    }
    return h3_st_load(s, name, H3_PLACE_HOST, H3_F32, H3_MEM_ACTIVATIONS, t);
}

/* Integer tensor (I64 or I32) of n values into int32. */
static h3_status ints(h3_st_set *s, const char *name, int64_t n, const char *need, int32_t **out) {
    const h3_st_entry *e;
    const void *p = NULL;
    H3_TRY(entry(s, name, 1, n, -1, need, &e));
    if (e->dtype != H3_I64 && e->dtype != H3_I32)
        return H3_ERR(H3_ERR_FORMAT, "%s: input tensor '%s' is %s; it must be I64 or I32 (%s)", s->source,
                      name, h3_dtype_name(e->dtype), need);
    int32_t *v = h3_malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t), H3_MEM_IO);
    if (!v) return H3_ERR_NOMEM;
    if (n) {
        h3_status st = h3_st_bytes(s, e, &p);
        if (st != H3_OK) {
            h3_free(v);
            return st;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t x;
        if (e->dtype == H3_I64)
            memcpy(&x, (const uint8_t *)p + 8 * i, 8);
        else {
            int32_t y;
            memcpy(&y, (const uint8_t *)p + 4 * i, 4);
            x = y;
        }
        if (x < INT32_MIN || x > INT32_MAX) {
            h3_free(v);
            return H3_ERR(H3_ERR_FORMAT,
                          "%s: input tensor '%s' holds %lld at %lld, beyond 32-bit row numbers", s->source,
                          name, (long long)x, (long long)i);
        }
        v[i] = (int32_t)x;
    }
    *out = v;
    return H3_OK;
}

static h3_status floats(h3_st_set *s, const char *name, const h3_st_entry *e, void *dst, int as_double) {
    const void *p = NULL;
    int64_t n = h3_st_entry_numel(e);
    if (!h3_dtype_is_float(e->dtype) || e->dtype == H3_F8_E4M3 || e->dtype == H3_F8_E5M2)
        return H3_ERR(H3_ERR_FORMAT, "%s: input tensor '%s' is %s; it must be a float tensor", s->source,
                      name, h3_dtype_name(e->dtype));
    if (n) H3_TRY(h3_st_bytes(s, e, &p));
    for (int64_t i = 0; i < n; i++) {
        double v;
        if (e->dtype == H3_F64) {
            memcpy(&v, (const uint8_t *)p + 8 * i, 8);
        } else {
            float f;
            h3_convert_to_f32(e->dtype, (const uint8_t *)p + h3_dtype_size(e->dtype) * (size_t)i, &f, 1);
            v = f;
        }
        if (as_double)
            ((double *)dst)[i] = v;
        else
            ((float *)dst)[i] = (float)v;
    }
    return H3_OK;
}

void h3_dit_inputs_file_free(h3_dit_inputs_file *f) {
    h3_tensor_free(&f->video);
    h3_tensor_free(&f->audio);
    h3_tensor_free(&f->text);
    h3_free(f->timesteps);
    h3_free(f->position_ids);
    h3_free(f->timestep_indices);
    h3_free(f->token_tags);
    h3_free(f->video_indices);
    h3_free(f->audio_indices);
    h3_free(f->text_indices);
    memset(f, 0, sizeof *f);
}

h3_status h3_dit_inputs_read(const char *path, const h3_dit_config *c, h3_dit_inputs_file *f) {
    memset(f, 0, sizeof *f);
    h3_st_set s;
    H3_TRY_CTX(h3_st_open(path, &s), "reading the DiT inputs");
    h3_status st = H3_OK;
    char need[128];
    int64_t Nv, Na, L, S, T;
    const h3_st_entry *e;
    snprintf(need, sizeof need, "f32 [Nv, %lld]: patchified video rows", (long long)h3_dit_video_dim(c));
    H3_CHECK(rows_f32(&s, "video", h3_dit_video_dim(c), need, &f->video, &Nv));
    snprintf(need, sizeof need, "f32 [Na, %lld]: audio rows", (long long)c->audio_dim);
    H3_CHECK(rows_f32(&s, "audio", c->audio_dim, need, &f->audio, &Na));
    snprintf(need, sizeof need, "f32 [L, %lld]: text-encoder states", (long long)c->text_dim);
    H3_CHECK(rows_f32(&s, "text", c->text_dim, need, &f->text, &L));
    H3_CHECK(entry(&s, "token_tags", 1, -1, -1, "I64 [S]: 0 video, 1 text, 2 audio per row", &e));
    S = e->shape[0];
    if (S != Nv + Na + L)
        H3_FAIL(H3_ERR_FORMAT, "%s: token_tags has %lld rows but video %lld + audio %lld + text %lld = %lld",
                path, (long long)S, (long long)Nv, (long long)Na, (long long)L, (long long)(Nv + Na + L));
    if (S < 1) H3_FAIL(H3_ERR_FORMAT, "%s: the sequence is empty", path);
    H3_CHECK(ints(&s, "token_tags", S, "I64 [S]: 0 video, 1 text, 2 audio per row", &f->token_tags));
    snprintf(need, sizeof need, "I64 [S = %lld]: index into timesteps per row", (long long)S);
    H3_CHECK(ints(&s, "timestep_indices", S, need, &f->timestep_indices));
    snprintf(need, sizeof need, "I64 [Nv = %lld]: packed row of each video row", (long long)Nv);
    H3_CHECK(ints(&s, "video_indices", Nv, need, &f->video_indices));
    snprintf(need, sizeof need, "I64 [Na = %lld]: packed row of each audio row", (long long)Na);
    H3_CHECK(ints(&s, "audio_indices", Na, need, &f->audio_indices));
    snprintf(need, sizeof need, "I64 [L = %lld]: packed row of each text row", (long long)L);
    H3_CHECK(ints(&s, "text_indices", L, need, &f->text_indices));
    H3_CHECK(entry(&s, "timesteps", 1, -1, -1, "f32 [T]: the distinct t = 1 - sigma", &e));
    T = e->shape[0];
    if (T < 1 || T > (1 << 20))
        H3_FAIL(H3_ERR_FORMAT, "%s: timesteps has %lld values; 1 to 2^20 are accepted", path, (long long)T);
    f->timesteps = h3_malloc((size_t)T * sizeof(float), H3_MEM_IO);
    if (!f->timesteps) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    H3_CHECK(floats(&s, "timesteps", e, f->timesteps, 0));
    snprintf(need, sizeof need, "F64 [S = %lld, 3]: (t, h, w) RoPE coordinates", (long long)S);
    H3_CHECK(entry(&s, "position_ids", 2, S, 3, need, &e));
    f->position_ids = h3_malloc((size_t)(S * 3) * sizeof(double), H3_MEM_IO);
    if (!f->position_ids) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    H3_CHECK(floats(&s, "position_ids", e, f->position_ids, 1));

    h3_dit_inputs *in = &f->in;
    in->video = Nv ? &f->video : NULL;
    in->audio = Na ? &f->audio : NULL;
    in->text = L ? &f->text : NULL;
    in->timesteps = f->timesteps;
    in->n_timesteps = (int)T;
    in->seq_len = S;
    in->timestep_indices = f->timestep_indices;
    in->token_tags = f->token_tags;
    in->position_ids = f->position_ids;
    in->video_indices = f->video_indices;
    in->audio_indices = f->audio_indices;
    in->text_indices = f->text_indices;
done:
    h3_st_close(&s);
    if (st != H3_OK) h3_dit_inputs_file_free(f);
    return st;
}
