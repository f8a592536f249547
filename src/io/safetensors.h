/* safetensors: strict reader (single files, shard indexes, folders) and writer.
 *
 * Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [b, e]},
 * "__metadata__": {str: str}}, then the data area; offsets are relative to its start.
 *
 * Nothing is trusted before it is checked: the header must lie inside the file and be at most 100 MB of
 * well-formed JSON without duplicate keys; every dtype must be known; every shape non-negative with at most
 * H3_MAX_DIMS dims; the byte span must equal numel × element size (computed without overflow); offsets must lie
 * inside the data area; no two tensors may overlap. A failure names the file, the tensor and the rule.
 *
 * Opening reads only the header (pread). Tensor data is reached through a read-only mapping made on first use,
 * so inspecting a 66 GB checkpoint reads a few hundred KB.
 */
#ifndef H3_IO_SAFETENSORS_H
#define H3_IO_SAFETENSORS_H

#include <stdint.h>

#include "base/fs.h"
#include "base/json.h"
#include "tensor/tensor.h"

#define H3_ST_MAX_HEADER (100u << 20)

typedef struct h3_st_entry {
    char *name;
    h3_dtype dtype;
    int ndim;
    int64_t shape[H3_MAX_DIMS];
    uint64_t begin, end; /* byte offsets in the data area */
    int file;            /* index into the set's files */
} h3_st_entry;

typedef struct h3_st_file {
    char *path;
    int fd;
    uint64_t file_size, header_len, data_start;
    json_t *metadata; /* "__metadata__" object or NULL */
    h3_mmap map;      /* mapped on first data access */
    int mapped;
} h3_st_file;

/* A set of tensors from one file, one shard index, or the safetensors files of a folder. */
typedef struct h3_st_set {
    h3_st_file *files;
    int n_files;
    h3_st_entry *entries; /* sorted by name */
    int64_t n_entries;
    char *source; /* what was opened (for messages) */
} h3_st_set;

/* Opens one .safetensors file, a *.safetensors.index.json shard index, or a folder (its index if it has exactly
 * one, else all its *.safetensors files as one set). Duplicate tensor names across files are an error. */
h3_status h3_st_open(const char *path, h3_st_set *out);
/* Opens an explicit list of files as one set. */
h3_status h3_st_open_files(const char *const *paths, int n, const char *source, h3_st_set *out);
void h3_st_close(h3_st_set *s);

/* Binary search by name; NULL when absent. */
const h3_st_entry *h3_st_find(const h3_st_set *s, const char *name);
/* First entry whose name starts with prefix (sorted order), or NULL. */
int64_t h3_st_lower_bound(const h3_st_set *s, const char *prefix);
/* Metadata string of the first file that has it. */
const char *h3_st_metadata(const h3_st_set *s, const char *key);

int64_t h3_st_entry_numel(const h3_st_entry *e);

/* A tensor over the mapped bytes (zero copy, not owned) when the data is suitably aligned; an owned aligned copy
 * otherwise. Either way release with h3_tensor_free. */
h3_status h3_st_tensor(h3_st_set *s, const h3_st_entry *e, h3_tensor *out);
/* Same by name; H3_ERR_NOT_FOUND with a message naming the set when absent. */
h3_status h3_st_get(h3_st_set *s, const char *name, h3_tensor *out);
/* Copies and converts a tensor into a new owned tensor of dtype at place (HOST or PINNED). A tensor with no
 * elements gives one of the same shape (nothing is read). */
h3_status h3_st_load(h3_st_set *s, const char *name, h3_place place, h3_dtype dtype, h3_mem_category cat,
                     h3_tensor *out);
/* Raw bytes of an entry (maps the file if needed). */
h3_status h3_st_bytes(h3_st_set *s, const h3_st_entry *e, const void **data);

/* ---- writer ------------------------------------------------------------------------------------------------- */

typedef struct h3_st_writer h3_st_writer;

h3_status h3_st_writer_new(h3_st_writer **out);
/* Adds a tensor; data is copied at write time (must stay valid until h3_st_writer_write). Names must be unique. */
h3_status h3_st_writer_add(h3_st_writer *w, const char *name, h3_dtype dtype, int ndim, const int64_t *shape,
                           const void *data);
h3_status h3_st_writer_add_tensor(h3_st_writer *w, const char *name, const h3_tensor *t);
h3_status h3_st_writer_meta(h3_st_writer *w, const char *key, const char *value);
/* Writes path (via path.partial, renamed when complete). With data_hole set, the data area is left as a hole
 * (a sparse file of the right size): used to make header-only copies of real checkpoints for tests. */
h3_status h3_st_writer_write(h3_st_writer *w, const char *path, int data_hole);
void h3_st_writer_free(h3_st_writer *w);

#endif
