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

/* ---- inputs --------------------------------------------------------------------------------------------
 *
 * Inputs are read only from regular files. A path is stat()ed first: a FIFO (whose open() would wait for a
 * writer forever), a device, a socket or a folder is refused with a message that says what it is; then the
 * file is opened with O_NONBLOCK and checked to be the same regular file (it cannot be swapped for a FIFO in
 * between). */

/* Opens path for reading as above; *fd and *size (may be NULL) on success. H3_ERR_IO otherwise. */
h3_status h3_open_input(const char *path, int *fd, uint64_t *size);
/* What a path is, for messages: "a regular file", "a folder", "a FIFO (named pipe)", "a character device", "a
 * block device", "a socket", "something other than a file" (stat follows links); NULL when it does not exist.
 */
const char *h3_path_kind(const char *path);

/* ---- outputs -------------------------------------------------------------------------------------------
 *
 * Every output is written under a temporary name, "<path>.partial" (a folder of PNG frames:
 * "<dir>.partial/"), and renamed to <path> only when complete, so an interrupted run never leaves a file that
 * looks finished. Outputs go only to regular files: a path that names a FIFO, a device or a socket is refused
 * (the rename into place would replace the node, e.g. /dev/null, with a file; writing into a FIFO would wait
 * for a reader). A stale "<path>.partial" file left by a killed run is replaced; anything else of that name
 * is refused. */

typedef enum h3_out_kind {
    H3_OUT_FILE = 0,    /* a file */
    H3_OUT_DIR,         /* a folder that is created (or, empty, replaced) whole: PNG frames */
    H3_OUT_FILE_OR_DIR, /* either, decided later (decode --out: frames or a WAV) */
} h3_out_kind;

/* What an output path needs before any work: when it exists, a regular file (H3_OUT_FILE) or an empty folder
 * (H3_OUT_DIR; a folder that holds anything is refused: frames never mix with files already there, and
 * nothing there is deleted); its folder exists and is writable; "<path>.partial" is absent or a stale
 * temporary of the same kind. `what` names the option in messages ("--wav"; NULL: none). H3_ERR_INVALID. */
h3_status h3_check_output(const char *path, const char *what, h3_out_kind kind);

/* A file written under "<path>.partial" and put in place by h3_out_commit; h3_out_abort removes the partial
 * file. */
typedef struct h3_outfile {
    FILE *f;
    char *path, *tmp_path;
} h3_outfile;
h3_status h3_out_open(const char *path, h3_outfile *out);
/* Closes the file and renames it to its path, or, while an output group is open, hands it to the group. */
h3_status h3_out_commit(h3_outfile *o);
/* Closes the file and renames it now, whatever group is open: for files inside a temporary folder. */
h3_status h3_out_commit_now(h3_outfile *o);
void h3_out_abort(h3_outfile *o);

/* For writers that open the file themselves (libavformat): checks path as h3_out_open does and creates an
 * empty "<path>.partial" (*tmp_path from h3_malloc). The writer then puts it in place with h3_out_place, or
 * removes it. */
h3_status h3_out_reserve(const char *path, char **tmp_path);
/* A finished temporary file or folder (is_dir) to its path: renamed now, or, while an output group is open,
 * handed to the group. On failure tmp is removed. */
h3_status h3_out_place(const char *tmp, const char *path, int is_dir);
/* Removes a temporary folder: the files in it, then the folder (what is left in it stays, with the folder).
 */
void h3_out_remove_dir(const char *dir);

/* A group of outputs that appear together. While a group is open on this thread, every finished output
 * (h3_out_commit, h3_out_place, and the writers built on them: WAV, PNG, PNG folders, safetensors, MP4)
 * stays under its temporary name and joins the group; h3_outgroup_commit renames them all into place,
 * h3_outgroup_abort removes them. A command with several outputs thus leaves all of them or none, and the
 * files that were at those paths before survive any failure or interrupt before the commit. Groups nest
 * (strictly: the last begun ends first); committing an inner group hands its outputs to the outer one. */
typedef struct h3_outgroup {
    struct h3_outgroup *outer;
    struct h3_outgroup_entry *v;
    int n, cap;
} h3_outgroup;
void h3_outgroup_begin(h3_outgroup *g);
/* Renames every output into place (in the order they were finished). When one rename fails, the outputs
 * already placed and the temporaries left are removed and the failure is returned. */
h3_status h3_outgroup_commit(h3_outgroup *g);
void h3_outgroup_abort(h3_outgroup *g);
/* Sets the thread's open groups aside: files committed until h3_outgroup_resume are placed at once (a
 * checkpoint, which must be on disk when its writer returns, not when the run's outputs appear). */
void *h3_outgroup_suspend(void);
void h3_outgroup_resume(void *suspended);

/* ---- one command's paths -------------------------------------------------------------------------------
 *
 * The inputs and outputs of one command, checked against each other before any work: an output that is the
 * same file as an input (the same device and inode where both exist, so symlinks and hard links count; the
 * same normalized path where the output does not exist yet) or as a file inside an input folder would
 * replace what the command reads; two outputs on one path (or one on another's temporary name, or inside
 * another's folder) would overwrite each other. Each is refused with H3_ERR_INVALID naming both options. */
typedef struct h3_pathset {
    struct h3_path_entry *v;
    int n, cap;
    struct h3_path_file *files; /* regular files inside input folders */
    int64_t n_files, cap_files;
} h3_pathset;
void h3_pathset_init(h3_pathset *s);
void h3_pathset_free(h3_pathset *s);
/* An input, a file or a folder (want_file: only a file is right here). A FIFO, device or socket is refused,
 * and a folder where a file is wanted; a path that does not exist is left to the reader to report. The
 * regular files of a folder (up to 4 levels, 20000 files) are noted, so that no output replaces one. */
h3_status h3_pathset_input(h3_pathset *s, const char *what, const char *path, int want_file);
/* An output: h3_check_output, then the checks above against every path added before or after. */
h3_status h3_pathset_output(h3_pathset *s, const char *what, const char *path, h3_out_kind kind);

/* Bytes of the open regular file fd that sit in the page cache (mincore over a read-only mapping, a window at a
 * time), or -1 when that cannot be known: not a regular file, not mappable, or a file this process neither owns
 * nor may write (Linux then reports every page as cached). What a read of it will cost: the cached part at
 * memory speed, the rest at the disk's. */
int64_t h3_fd_cached_bytes(int fd);

/* Sorted list of entry names in a directory (excluding . and ..). Free with h3_strlist_free. */
h3_status h3_list_dir(const char *dir, char ***names, int *count);
void h3_strlist_free(char **names, int count);

#endif
