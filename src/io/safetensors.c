#define _GNU_SOURCE
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/log.h"

/* ---- header parsing -------------------------------------------------------------------------------------- */

typedef struct {
    h3_st_entry *v;
    int64_t n, cap;
} entry_vec;

static h3_status vec_push(entry_vec *v, h3_st_entry *e) {
    if (v->n == v->cap) {
        int64_t nc = v->cap ? v->cap * 2 : 64;
        h3_st_entry *nv = h3_realloc(v->v, (size_t)nc * sizeof *nv, H3_MEM_IO);
        if (!nv) return H3_ERR_NOMEM;
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = *e;
    return H3_OK;
}

static void free_entries(h3_st_entry *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) h3_free(v[i].name);
    h3_free(v);
}

static int cmp_begin(const void *a, const void *b) {
    const h3_st_entry *x = *(h3_st_entry *const *)a, *y = *(h3_st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const h3_st_entry *)a)->name, ((const h3_st_entry *)b)->name);
}

/* Parses and validates one entry of the header. */
static h3_status parse_entry(const char *path, const char *name, json_t *val, uint64_t data_size, int file_idx,
                             h3_st_entry *e) {
    memset(e, 0, sizeof *e);
    if (!json_is_object(val))
        return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", path, name);
    const char *dt = h3_json_get_str(val, "dtype");
    if (!dt) return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s': missing string field 'dtype'", path, name);
    if (!h3_dtype_from_st(dt, &e->dtype))
        return H3_ERR(H3_ERR_FORMAT,
                      "%s: tensor '%s': unknown dtype '%s' (known: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 "
                      "U64 U32 U16 U8 BOOL)",
                      path, name, dt);
    json_t *shape = json_object_get(val, "shape");
    if (!json_is_array(shape)) return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s': missing array field 'shape'", path, name);
    size_t nd = json_array_size(shape);
    if (nd > H3_MAX_DIMS)
        return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s': %zu dims; h3run supports at most %d", path, name, nd,
                      H3_MAX_DIMS);
    e->ndim = (int)nd;
    uint64_t numel = 1;
    int overflow = 0;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer", path, name, i);
        uint64_t dim = (uint64_t)json_integer_value(d);
        e->shape[i] = (int64_t)dim;
        if (dim != 0 && numel > UINT64_MAX / dim) overflow = 1;
        else numel *= dim;
    }
    uint64_t es = h3_dtype_size(e->dtype), nbytes = 0;
    if (overflow || (es && numel > UINT64_MAX / es) || numel > (uint64_t)INT64_MAX)
        return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s': shape element count overflows 64 bits", path, name);
    nbytes = numel * es;
    json_t *off = json_object_get(val, "data_offsets");
    if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
        !json_is_integer(json_array_get(off, 1)))
        return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s': 'data_offsets' must be an array of two integers", path, name);
    json_int_t b = json_integer_value(json_array_get(off, 0)), en = json_integer_value(json_array_get(off, 1));
    if (b < 0 || en < b)
        return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] are negative or reversed", path, name,
                      (long long)b, (long long)en);
    e->begin = (uint64_t)b;
    e->end = (uint64_t)en;
    if (e->end > data_size)
        return H3_ERR(H3_ERR_FORMAT,
                      "%s: tensor '%s': data_offsets end %llu lies past the data area of %llu bytes (file truncated?)",
                      path, name, (unsigned long long)e->end, (unsigned long long)data_size);
    if (e->end - e->begin != nbytes)
        return H3_ERR(H3_ERR_FORMAT,
                      "%s: tensor '%s': byte span %llu does not match shape x dtype size = %llu bytes", path, name,
                      (unsigned long long)(e->end - e->begin), (unsigned long long)nbytes);
    e->file = file_idx;
    e->name = h3_strdup(name);
    if (!e->name) return H3_ERR_NOMEM;
    return H3_OK;
}

/* Opens a file, reads and validates its header, appends its entries to v. */
static h3_status open_one(const char *path, int file_idx, h3_st_file *f, entry_vec *v) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->map.fd = -1;
    h3_status st = H3_OK;
    char *hdr = NULL;
    json_t *root = NULL;
    h3_st_entry **sorted = NULL;
    int64_t first = v->n;
    f->path = h3_strdup(path);
    if (!f->path) return H3_ERR_NOMEM;
    /* a regular file: a FIFO or device is refused, not waited on */
    H3_CHECK(h3_open_input(path, &f->fd, &f->file_size));
    if (f->file_size < 8)
        H3_FAIL(H3_ERR_FORMAT, "%s: %llu bytes is too short for a safetensors file (needs an 8-byte header length)",
                path, (unsigned long long)f->file_size);
    uint8_t lenb[8];
    H3_CHECK(h3_pread_exact(f->fd, path, lenb, 8, 0));
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | lenb[i];
    if (n > f->file_size - 8)
        H3_FAIL(H3_ERR_FORMAT, "%s: header length %llu runs past the end of the %llu-byte file (truncated or not safetensors)",
                path, (unsigned long long)n, (unsigned long long)f->file_size);
    if (n > H3_ST_MAX_HEADER)
        H3_FAIL(H3_ERR_FORMAT, "%s: header length %llu exceeds the format's limit of %u bytes", path,
                (unsigned long long)n, H3_ST_MAX_HEADER);
    if (n < 2) H3_FAIL(H3_ERR_FORMAT, "%s: header of %llu bytes cannot hold a JSON object", path, (unsigned long long)n);
    f->header_len = n;
    f->data_start = 8 + n;
    hdr = h3_malloc((size_t)n, H3_MEM_IO);
    if (!hdr) H3_FAIL(H3_ERR_NOMEM, "out of memory reading the %llu-byte header of %s", (unsigned long long)n, path);
    H3_CHECK(h3_pread_exact(f->fd, path, hdr, (size_t)n, 8));
    /* Trailing spaces pad the header to 8 bytes; jansson accepts trailing whitespace. */
    {
        char what[600];
        snprintf(what, sizeof what, "the header of %s", path);
        H3_CHECK(h3_json_parse(hdr, (size_t)n, what, &root));
    }
    if (!json_is_object(root)) H3_FAIL(H3_ERR_FORMAT, "%s: header is JSON but not an object", path);
    uint64_t data_size = f->file_size - f->data_start;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) H3_FAIL(H3_ERR_FORMAT, "%s: '__metadata__' is not an object", path);
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv))
                    H3_FAIL(H3_ERR_FORMAT, "%s: '__metadata__' value of '%s' is not a string", path, mk);
            }
            f->metadata = json_incref(val);
            continue;
        }
        h3_st_entry e;
        H3_CHECK(parse_entry(path, key, val, data_size, file_idx, &e));
        st = vec_push(v, &e);
        if (st != H3_OK) {
            h3_free(e.name);
            goto done;
        }
    }
    /* Overlap check over this file's entries, by start offset. Zero-size tensors cannot overlap anything. */
    {
        int64_t cnt = v->n - first;
        if (cnt > 1) {
            sorted = h3_malloc((size_t)cnt * sizeof *sorted, H3_MEM_IO);
            if (!sorted) H3_FAIL(H3_ERR_NOMEM, "out of memory checking %s", path);
            int64_t m = 0;
            for (int64_t i = 0; i < cnt; i++)
                if (v->v[first + i].end > v->v[first + i].begin) sorted[m++] = &v->v[first + i];
            qsort(sorted, (size_t)m, sizeof *sorted, cmp_begin);
            for (int64_t i = 1; i < m; i++) {
                if (sorted[i]->begin < sorted[i - 1]->end)
                    H3_FAIL(H3_ERR_FORMAT, "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", path,
                            sorted[i - 1]->name, (unsigned long long)sorted[i - 1]->begin,
                            (unsigned long long)sorted[i - 1]->end, sorted[i]->name,
                            (unsigned long long)sorted[i]->begin, (unsigned long long)sorted[i]->end);
            }
        }
    }
done:
    h3_free(sorted);
    h3_free(hdr);
    json_decref(root);
    return st;
}

static void close_file(h3_st_file *f) {
    if (f->mapped) h3_mmap_close(&f->map);
    if (f->fd >= 0) close(f->fd);
    json_decref(f->metadata);
    h3_free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

void h3_st_close(h3_st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n_files; i++) close_file(&s->files[i]);
    h3_free(s->files);
    free_entries(s->entries, s->n_entries);
    h3_free(s->source);
    memset(s, 0, sizeof *s);
}

static h3_status finish_set(h3_st_set *s, entry_vec *v) {
    s->entries = v->v;
    s->n_entries = v->n;
    if (s->n_entries > 1) qsort(s->entries, (size_t)s->n_entries, sizeof *s->entries, cmp_name);
    for (int64_t i = 1; i < s->n_entries; i++) {
        if (strcmp(s->entries[i].name, s->entries[i - 1].name) == 0)
            return H3_ERR(H3_ERR_FORMAT, "tensor '%s' appears in both %s and %s", s->entries[i].name,
                          s->files[s->entries[i - 1].file].path, s->files[s->entries[i].file].path);
    }
    return H3_OK;
}

h3_status h3_st_open_files(const char *const *paths, int n, const char *source, h3_st_set *out) {
    memset(out, 0, sizeof *out);
    entry_vec v = {0};
    h3_status st = H3_OK;
    out->source = h3_strdup(source);
    out->files = h3_calloc((size_t)(n > 0 ? n : 1), sizeof *out->files, H3_MEM_IO);
    if (!out->source || !out->files) {
        st = H3_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < n; i++) {
        out->n_files = i + 1;
        H3_CHECK(open_one(paths[i], i, &out->files[i], &v));
    }
    st = finish_set(out, &v);
    v.v = NULL;
    v.n = 0;
done:
    if (st != H3_OK) {
        free_entries(v.v, v.n);
        h3_st_close(out);
    }
    return st;
}

/* Opens a shard index: {"weight_map": {tensor: shard file}}. Every shard listed is opened; every tensor the map
 * names must be in the shard it names. */
static h3_status open_index(const char *path, h3_st_set *out) {
    json_t *root = NULL;
    char *dir = NULL;
    char **files = NULL;
    int nf = 0;
    h3_status st = h3_json_load_file(path, 64u << 20, &root);
    if (st != H3_OK) return st;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm)) {
        json_decref(root);
        return H3_ERR(H3_ERR_FORMAT, "%s: a shard index needs a 'weight_map' object", path);
    }
    dir = h3_path_dir(path);
    if (!dir) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    {
        size_t cap = json_object_size(wm);
        files = h3_calloc(cap ? cap : 1, sizeof *files, H3_MEM_IO);
        if (!files) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        const char *k;
        json_t *val;
        json_object_foreach(wm, k, val) {
            if (!json_is_string(val)) H3_FAIL(H3_ERR_FORMAT, "%s: weight_map entry '%s' is not a file name", path, k);
            const char *fn = json_string_value(val);
            if (strchr(fn, '/') || strcmp(fn, "..") == 0)
                H3_FAIL(H3_ERR_FORMAT, "%s: shard name '%s' must be a file in the index's folder", path, fn);
            int seen = 0;
            for (int i = 0; i < nf && !seen; i++) seen = strcmp(h3_path_base(files[i]), fn) == 0;
            if (!seen) {
                files[nf] = h3_path_join(dir, fn);
                if (!files[nf]) H3_FAIL(H3_ERR_NOMEM, "out of memory");
                nf++;
            }
        }
        if (nf == 0) H3_FAIL(H3_ERR_FORMAT, "%s: weight_map is empty", path);
    }
    H3_CHECK_CTX(h3_st_open_files((const char *const *)files, nf, path, out), "opening the shards of %s", path);
    {
        const char *k;
        json_t *val;
        json_object_foreach(wm, k, val) {
            const h3_st_entry *e = h3_st_find(out, k);
            if (!e || strcmp(h3_path_base(out->files[e->file].path), json_string_value(val)) != 0) {
                st = H3_ERR(H3_ERR_FORMAT, "%s: weight_map puts '%s' in %s, but that shard does not hold it", path, k,
                            json_string_value(val));
                h3_st_close(out);
                goto done;
            }
        }
        if ((int64_t)json_object_size(wm) != out->n_entries)
            H3_WARN("%s: the shards hold %lld tensors but weight_map lists %zu", path, (long long)out->n_entries,
                    json_object_size(wm));
    }
done:
    h3_strlist_free(files, nf);
    h3_free(dir);
    json_decref(root);
    return st;
}

h3_status h3_st_open(const char *path, h3_st_set *out) {
    memset(out, 0, sizeof *out);
    if (h3_path_is_dir(path)) {
        char **names;
        int n;
        H3_TRY(h3_list_dir(path, &names, &n));
        int n_index = 0, n_st = 0, idx_at = -1;
        for (int i = 0; i < n; i++) {
            if (h3_str_ends_with(names[i], ".safetensors.index.json")) {
                n_index++;
                idx_at = i;
            } else if (h3_str_ends_with(names[i], ".safetensors")) {
                n_st++;
            }
        }
        h3_status st;
        if (n_index == 1) {
            char *p = h3_path_join(path, names[idx_at]);
            st = p ? open_index(p, out) : H3_ERR_NOMEM;
            h3_free(p);
        } else if (n_index > 1) {
            st = H3_ERR(H3_ERR_FORMAT, "%s holds %d shard indexes; name the one to use", path, n_index);
        } else if (n_st == 0) {
            st = H3_ERR(H3_ERR_NOT_FOUND, "%s holds no .safetensors files", path);
        } else {
            char **files = h3_calloc((size_t)n_st, sizeof *files, H3_MEM_IO);
            int k = 0;
            st = files ? H3_OK : H3_ERR_NOMEM;
            for (int i = 0; i < n && st == H3_OK; i++) {
                if (!h3_str_ends_with(names[i], ".safetensors")) continue;
                files[k] = h3_path_join(path, names[i]);
                if (!files[k]) st = H3_ERR_NOMEM;
                else k++;
            }
            if (st == H3_OK) st = h3_st_open_files((const char *const *)files, k, path, out);
            h3_strlist_free(files, k);
        }
        h3_strlist_free(names, n);
        return st;
    }
    if (h3_str_ends_with(path, ".json")) return open_index(path, out);
    const char *one[1] = {path};
    return h3_st_open_files(one, 1, path, out);
}

const h3_st_entry *h3_st_find(const h3_st_set *s, const char *name) {
    int64_t lo = 0, hi = s->n_entries;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(s->entries[mid].name, name);
        if (c == 0) return &s->entries[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

int64_t h3_st_lower_bound(const h3_st_set *s, const char *prefix) {
    int64_t lo = 0, hi = s->n_entries;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (strcmp(s->entries[mid].name, prefix) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

const char *h3_st_metadata(const h3_st_set *s, const char *key) {
    for (int i = 0; i < s->n_files; i++) {
        if (!s->files[i].metadata) continue;
        const char *v = h3_json_get_str(s->files[i].metadata, key);
        if (v) return v;
    }
    return NULL;
}

int64_t h3_st_entry_numel(const h3_st_entry *e) {
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
    return n;
}

h3_status h3_st_bytes(h3_st_set *s, const h3_st_entry *e, const void **data) {
    h3_st_file *f = &s->files[e->file];
    if (!f->mapped) {
        H3_TRY(h3_mmap_open(f->path, &f->map));
        f->mapped = 1;
        if (f->map.size != f->file_size)
            return H3_ERR(H3_ERR_IO, "%s changed size while open (%llu -> %zu bytes)", f->path,
                          (unsigned long long)f->file_size, f->map.size);
    }
    *data = (const uint8_t *)f->map.data + f->data_start + e->begin;
    return H3_OK;
}

h3_status h3_st_tensor(h3_st_set *s, const h3_st_entry *e, h3_tensor *out) {
    const void *p = NULL;
    memset(out, 0, sizeof *out);
    if (e->end == e->begin) {
        return h3_tensor_wrap(out, NULL, H3_PLACE_HOST, e->dtype, e->ndim, e->shape);
    }
    H3_TRY(h3_st_bytes(s, e, &p));
    size_t es = h3_dtype_size(e->dtype);
    if (((uintptr_t)p % es) == 0) return h3_tensor_wrap(out, (void *)p, H3_PLACE_HOST, e->dtype, e->ndim, e->shape);
    H3_TRY(h3_tensor_alloc(out, H3_PLACE_HOST, e->dtype, e->ndim, e->shape, H3_MEM_WEIGHTS));
    memcpy(out->data, p, (size_t)(e->end - e->begin));
    return H3_OK;
}

h3_status h3_st_get(h3_st_set *s, const char *name, h3_tensor *out) {
    const h3_st_entry *e = h3_st_find(s, name);
    if (!e) return H3_ERR(H3_ERR_NOT_FOUND, "%s has no tensor '%s'", s->source ? s->source : "weights", name);
    return h3_st_tensor(s, e, out);
}

h3_status h3_st_load(h3_st_set *s, const char *name, h3_place place, h3_dtype dtype, h3_mem_category cat,
                     h3_tensor *out) {
    h3_tensor src;
    H3_TRY(h3_st_get(s, name, &src));
    h3_status st = h3_tensor_alloc(out, place, dtype, src.ndim, src.shape, cat);
    if (st == H3_OK) {
        size_t n = (size_t)h3_tensor_numel(&src);
        /* A tensor with no elements has no data pointer (its view is NULL): copy 0 bytes from a real address.
         */
        static const uint64_t none = 0;
        const void *from = n ? src.data : (const void *)&none;
        if (src.dtype == dtype) {
            memcpy(out->data, from, n * h3_dtype_size(dtype));
        } else if (dtype == H3_F32 && h3_convert_to_f32(src.dtype, from, out->data, n)) {
        } else if (src.dtype == H3_F32 && h3_convert_from_f32(dtype, from, out->data, n)) {
        } else {
            h3_tensor_free(out);
            st = H3_ERR(H3_ERR_UNSUPPORTED, "%s: tensor '%s' is %s; cannot convert it to %s", s->source, name,
                        h3_dtype_name(src.dtype), h3_dtype_name(dtype));
        }
    }
    h3_tensor_free(&src);
    return st;
}

/* ---- writer ------------------------------------------------------------------------------------------------- */

typedef struct {
    char *name;
    h3_dtype dtype;
    int ndim;
    int64_t shape[H3_MAX_DIMS];
    const void *data;
    uint64_t nbytes;
} w_entry;

struct h3_st_writer {
    w_entry *v;
    int n, cap;
    json_t *meta;
};

h3_status h3_st_writer_new(h3_st_writer **out) {
    h3_json_init();
    *out = h3_calloc(1, sizeof **out, H3_MEM_IO);
    return *out ? H3_OK : H3_ERR_NOMEM;
}

void h3_st_writer_free(h3_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) h3_free(w->v[i].name);
    h3_free(w->v);
    json_decref(w->meta);
    h3_free(w);
}

h3_status h3_st_writer_add(h3_st_writer *w, const char *name, h3_dtype dtype, int ndim, const int64_t *shape,
                           const void *data) {
    if (ndim < 0 || ndim > H3_MAX_DIMS) return H3_ERR(H3_ERR_INVALID, "tensor '%s': rank %d unsupported", name, ndim);
    if (strcmp(name, "__metadata__") == 0) return H3_ERR(H3_ERR_INVALID, "'__metadata__' is not a tensor name");
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->v[i].name, name) == 0) return H3_ERR(H3_ERR_INVALID, "tensor '%s' added twice", name);
    if (w->n == w->cap) {
        int nc = w->cap ? w->cap * 2 : 32;
        w_entry *nv = h3_realloc(w->v, (size_t)nc * sizeof *nv, H3_MEM_IO);
        if (!nv) return H3_ERR_NOMEM;
        w->v = nv;
        w->cap = nc;
    }
    w_entry *e = &w->v[w->n];
    memset(e, 0, sizeof *e);
    e->name = h3_strdup(name);
    if (!e->name) return H3_ERR_NOMEM;
    e->dtype = dtype;
    e->ndim = ndim;
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        e->shape[i] = shape[i];
        n *= (uint64_t)shape[i];
    }
    e->nbytes = n * h3_dtype_size(dtype);
    e->data = data;
    w->n++;
    return H3_OK;
}

h3_status h3_st_writer_add_tensor(h3_st_writer *w, const char *name, const h3_tensor *t) {
    if (!h3_tensor_is_contiguous(t) || t->place == H3_PLACE_DEVICE)
        return H3_ERR(H3_ERR_INVALID, "tensor '%s': only contiguous host tensors can be written", name);
    return h3_st_writer_add(w, name, t->dtype, t->ndim, t->shape, t->data);
}

h3_status h3_st_writer_meta(h3_st_writer *w, const char *key, const char *value) {
    if (!w->meta) {
        w->meta = json_object();
        if (!w->meta) return H3_ERR_NOMEM;
    }
    json_t *s = json_string(value);
    if (!s || json_object_set_new(w->meta, key, s) != 0) return H3_ERR(H3_ERR_NOMEM, "out of memory adding metadata");
    return H3_OK;
}

h3_status h3_st_writer_write(h3_st_writer *w, const char *path, int data_hole) {
    h3_status st = H3_OK;
    json_t *root = json_object();
    char *text = NULL;
    h3_outfile of = {0};
    if (!root) return H3_ERR_NOMEM;
    if (w->meta && json_object_set(root, "__metadata__", w->meta) != 0) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        w_entry *e = &w->v[i];
        json_t *o = json_object(), *shape = json_array(), *offs = json_array();
        int bad = !o || !shape || !offs;
        for (int d = 0; d < e->ndim && !bad; d++) bad = json_array_append_new(shape, json_integer(e->shape[d])) != 0;
        if (!bad) bad = json_array_append_new(offs, json_integer((json_int_t)off)) != 0;
        if (!bad) bad = json_array_append_new(offs, json_integer((json_int_t)(off + e->nbytes))) != 0;
        if (!bad) bad = json_object_set_new(o, "dtype", json_string(h3_dtype_st_name(e->dtype))) != 0;
        if (!bad) {
            bad = json_object_set_new(o, "shape", shape) != 0;
            shape = NULL;
        }
        if (!bad) {
            bad = json_object_set_new(o, "data_offsets", offs) != 0;
            offs = NULL;
        }
        if (!bad) {
            bad = json_object_set_new(root, e->name, o) != 0;
            o = NULL;
        }
        json_decref(o);
        json_decref(shape);
        json_decref(offs);
        if (bad) H3_FAIL(H3_ERR_NOMEM, "out of memory building a safetensors header");
        off += e->nbytes;
    }
    H3_CHECK(h3_json_dumps(root, JSON_COMPACT, &text));
    size_t tl = strlen(text), padded = (tl + 7) / 8 * 8;
    H3_CHECK(h3_out_open(path, &of));
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    fwrite(lenb, 1, 8, of.f);
    fwrite(text, 1, tl, of.f);
    for (size_t i = tl; i < padded; i++) fputc(' ', of.f);
    if (data_hole) {
        fflush(of.f);
        if (ftruncate(fileno(of.f), (off_t)(8 + padded + off)) != 0)
            H3_FAIL(H3_ERR_IO, "cannot extend %s to %llu bytes: %s", of.tmp_path, (unsigned long long)(8 + padded + off),
                    strerror(errno));
    } else {
        for (int i = 0; i < w->n; i++) {
            if (w->v[i].nbytes && fwrite(w->v[i].data, 1, (size_t)w->v[i].nbytes, of.f) != w->v[i].nbytes)
                H3_FAIL(H3_ERR_IO, "writing %s failed: %s", of.tmp_path, strerror(errno));
        }
    }
    st = h3_out_commit(&of);
done:
    if (st != H3_OK && of.f) h3_out_abort(&of);
    h3_free(text);
    json_decref(root);
    return st;
}
