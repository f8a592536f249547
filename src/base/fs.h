/* File helpers: whole-file reads, read-only mappings, paths, and writes that appear only when complete. */
#ifndef H3_BASE_FS_H
#define H3_BASE_FS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

typedef struct h3_mmap {
    void *data; /* NULL for an empty file */
    size_t size;
    int fd;
} h3_mmap;

/* Maps the whole file read-only. A zero-length file maps to data == NULL, size == 0. */
h3_status h3_mmap_open(const char *path, h3_mmap *out);
void h3_mmap_close(h3_mmap *m);

/* Reads a whole file into a NUL-terminated buffer from h3_malloc (category IO). max_size guards against
 * reading something absurd (a JSON config that is 4 GB is an error, not a config). */
h3_status h3_read_file(const char *path, size_t max_size, char **out, size_t *out_len);

/* Reads exactly n bytes at offset; a short read is an error naming the file. */
h3_status h3_pread_exact(int fd, const char *path, void *buf, size_t n, uint64_t offset);

int h3_path_is_dir(const char *path);
int h3_path_is_file(const char *path);
int h3_path_exists(const char *path);
/* dir + "/" + name into a new buffer from h3_malloc. */
char *h3_path_join(const char *dir, const char *name);
/* Final component of a path (no allocation). */
const char *h3_path_base(const char *path);
/* The folder a path is in, in a new buffer from h3_malloc: "a/b.json" -> "a", "b.json" -> ".", "/b.json" -> "/".
 * NULL when out of memory. */
char *h3_path_dir(const char *path);
/* 1 when s ends with / starts with the given text. */
int h3_str_ends_with(const char *s, const char *suffix);
int h3_str_starts_with(const char *s, const char *prefix);

/* A file written under "<path>.partial" and renamed to <path> by h3_out_commit, so an interrupted run never
 * leaves a file that looks complete. h3_out_abort removes the partial file. */
typedef struct h3_outfile {
    FILE *f;
    char *path, *tmp_path;
} h3_outfile;
h3_status h3_out_open(const char *path, h3_outfile *out);
h3_status h3_out_commit(h3_outfile *o);
void h3_out_abort(h3_outfile *o);

/* Sorted list of entry names in a directory (excluding . and ..). Free with h3_strlist_free. */
h3_status h3_list_dir(const char *dir, char ***names, int *count);
void h3_strlist_free(char **names, int count);

#endif
