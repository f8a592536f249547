#define _GNU_SOURCE
#include "base/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"

/* ---- inputs -------------------------------------------------------------------------------------------- */

static const char *mode_kind(mode_t m) {
    if (S_ISREG(m)) return "a regular file";
    if (S_ISDIR(m)) return "a folder";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISLNK(m)) return "a symbolic link";
    return "something other than a file";
}

const char *h3_path_kind(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? mode_kind(st.st_mode) : NULL;
}

static h3_status not_regular_input(const char *path, mode_t m) {
    if (S_ISDIR(m)) return H3_ERR(H3_ERR_IO, "%s is a folder; a file is expected here", path);
    return H3_ERR(H3_ERR_IO, "%s is %s, not a regular file: h3run reads its inputs only from regular files",
                  path, mode_kind(m));
}

h3_status h3_open_input(const char *path, int *fd_out, uint64_t *size) {
    *fd_out = -1;
    struct stat a, b;
    if (stat(path, &a) != 0) return H3_ERR(H3_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (!S_ISREG(a.st_mode)) return not_regular_input(path, a.st_mode);
    /* O_NONBLOCK: should the path have become a FIFO since the stat, open() returns instead of waiting. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return H3_ERR(H3_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (fstat(fd, &b) != 0) {
        int e = errno;
        close(fd);
        return H3_ERR(H3_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(b.st_mode) || a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
        close(fd);
        return H3_ERR(H3_ERR_IO, "%s changed while it was being opened (it is now %s)", path,
                      mode_kind(b.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    if (size) *size = (uint64_t)b.st_size;
    return H3_OK;
}

h3_status h3_mmap_open(const char *path, h3_mmap *out) {
    memset(out, 0, sizeof *out);
    out->fd = -1;
    int fd;
    uint64_t size;
    H3_TRY(h3_open_input(path, &fd, &size));
    if (size > SIZE_MAX) {
        close(fd);
        return H3_ERR(H3_ERR_IO, "%s is too large to map (%llu bytes)", path, (unsigned long long)size);
    }
    out->fd = fd;
    out->size = (size_t)size;
    if (out->size == 0) return H3_OK;
    void *p = mmap(NULL, out->size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        out->fd = -1;
        return H3_ERR(H3_ERR_IO, "cannot map %s (%zu bytes): %s", path, out->size, strerror(e));
    }
    out->data = p;
    return H3_OK;
}

void h3_mmap_close(h3_mmap *m) {
    if (m->data) munmap(m->data, m->size);
    if (m->fd >= 0) close(m->fd);
    m->data = NULL;
    m->size = 0;
    m->fd = -1;
}

h3_status h3_pread_exact(int fd, const char *path, void *buf, size_t n, uint64_t offset) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)offset);
        if (r < 0) {
            if (errno == EINTR) continue;
            return H3_ERR(H3_ERR_IO, "read of %s at offset %llu failed: %s", path, (unsigned long long)offset,
                          strerror(errno));
        }
        if (r == 0)
            return H3_ERR(H3_ERR_IO, "%s ends early: %zu bytes missing at offset %llu", path, n,
                          (unsigned long long)offset);
        p += r;
        n -= (size_t)r;
        offset += (uint64_t)r;
    }
    return H3_OK;
}

h3_status h3_read_file(const char *path, size_t max_size, char **out, size_t *out_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    int fd;
    uint64_t size;
    H3_TRY(h3_open_input(path, &fd, &size));
    if (size > max_size) {
        close(fd);
        return H3_ERR(H3_ERR_FORMAT, "%s is %llu bytes; at most %zu expected for this kind of file", path,
                      (unsigned long long)size, max_size);
    }
    size_t n = (size_t)size;
    char *buf = h3_malloc(n + 1, H3_MEM_IO);
    if (!buf) {
        close(fd);
        return H3_ERR_NOMEM;
    }
    h3_status s = h3_pread_exact(fd, path, buf, n, 0);
    close(fd);
    if (s != H3_OK) {
        h3_free(buf);
        return s;
    }
    buf[n] = 0;
    *out = buf;
    if (out_len) *out_len = n;
    return H3_OK;
}

int h3_path_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int h3_path_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int h3_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

char *h3_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    int slash = a > 0 && dir[a - 1] != '/';
    char *p = h3_malloc(a + b + 2, H3_MEM_OTHER);
    if (!p) return NULL;
    memcpy(p, dir, a);
    if (slash) p[a++] = '/';
    memcpy(p + a, name, b + 1);
    return p;
}

const char *h3_path_base(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

char *h3_path_dir(const char *path) {
    const char *sl = strrchr(path, '/');
    if (!sl) return h3_strdup(".");
    if (sl == path) return h3_strdup("/");
    return h3_strndup(path, (size_t)(sl - path));
}

int h3_str_ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && memcmp(s + a - b, suffix, b) == 0;
}

int h3_str_starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* ---- outputs ------------------------------------------------------------------------------------------- */

/* path without trailing slashes ("frames/" -> "frames"; "/" stays). NULL when out of memory. */
static char *strip_slashes(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    return h3_strndup(path, n);
}

/* "<path>.partial" (trailing slashes dropped). NULL when out of memory. */
static char *partial_name(const char *path) {
    char *p = strip_slashes(path);
    if (!p) return NULL;
    size_t n = strlen(p);
    char *t = h3_malloc(n + 9, H3_MEM_OTHER);
    if (t) {
        memcpy(t, p, n);
        memcpy(t + n, ".partial", 9);
    }
    h3_free(p);
    return t;
}

static int dir_is_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d)) != NULL) empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

h3_status h3_check_output(const char *path, const char *what, h3_out_kind kind) {
    const char *w = what ? what : "", *sp = what ? " " : "";
    if (!path || !*path) return H3_ERR(H3_ERR_INVALID, "%s needs a path", what ? what : "an output");
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            if (kind == H3_OUT_FILE)
                return H3_ERR(H3_ERR_INVALID, "%s%s%s is a folder; give a file name", w, sp, path);
            if (!dir_is_empty(path))
                return H3_ERR(
                    H3_ERR_INVALID,
                    "%s%s%s is a folder that is not empty: frames go into a new or empty folder (h3run "
                    "fills a temporary folder beside it and moves it into place; it never mixes them "
                    "with files already there or deletes those); give another folder or empty this one",
                    w, sp, path);
        } else if (S_ISREG(st.st_mode)) {
            if (kind == H3_OUT_DIR)
                return H3_ERR(H3_ERR_INVALID, "%s%s%s is a file; give a folder", w, sp, path);
        } else {
            return H3_ERR(
                H3_ERR_INVALID,
                "%s%s%s is %s: h3run writes its outputs only to regular files (a file renamed into place "
                "would replace it); give a file name",
                w, sp, path, mode_kind(st.st_mode));
        }
    }
    char *p = strip_slashes(path), *dir = p ? h3_path_dir(p) : NULL, *tmp = partial_name(path);
    h3_status s = H3_OK;
    if (!p || !dir || !tmp) {
        s = H3_ERR(H3_ERR_NOMEM, "out of memory");
    } else if (!h3_path_is_dir(dir)) {
        s = H3_ERR(H3_ERR_INVALID, "%s%s%s: the folder %s does not exist (create it first)", w, sp, path,
                   dir);
    } else if (access(dir, W_OK | X_OK) != 0) {
        s = H3_ERR(H3_ERR_INVALID, "%s%s%s: the folder %s is not writable", w, sp, path, dir);
    } else if (lstat(tmp, &st) == 0 && !(S_ISREG(st.st_mode) && kind != H3_OUT_DIR) &&
               !(S_ISDIR(st.st_mode) && kind != H3_OUT_FILE)) {
        s = H3_ERR(H3_ERR_INVALID,
                   "%s%s%s: %s exists and is %s; h3run writes this output there first: remove it", w, sp,
                   path, tmp, mode_kind(st.st_mode));
    }
    h3_free(p);
    h3_free(dir);
    h3_free(tmp);
    return s;
}

/* A write must not replace anything but a regular file (h3_check_output says the same up front). */
static h3_status target_ok(const char *path, int is_dir) {
    struct stat st;
    if (stat(path, &st) != 0) return H3_OK;
    if (is_dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode)) return H3_OK;
    if (S_ISDIR(st.st_mode)) return H3_ERR(H3_ERR_IO, "%s is a folder; a file name is needed here", path);
    if (is_dir && S_ISREG(st.st_mode))
        return H3_ERR(H3_ERR_IO, "%s is a file; a folder is needed here", path);
    return H3_ERR(H3_ERR_IO, "%s is %s: h3run writes its outputs only to regular files", path,
                  mode_kind(st.st_mode));
}

/* A fresh, empty temporary file: a stale regular file of that name (a killed run's) is replaced, anything
 * else is refused; O_EXCL | O_NOFOLLOW, so the file created is a new one and no link is followed. */
static h3_status partial_create(const char *tmp, int *fd) {
    *fd = -1;
    struct stat st;
    if (lstat(tmp, &st) == 0) {
        if (!S_ISREG(st.st_mode))
            return H3_ERR(H3_ERR_IO, "%s exists and is %s; h3run writes an output there first: remove it",
                          tmp, mode_kind(st.st_mode));
        if (unlink(tmp) != 0 && errno != ENOENT)
            return H3_ERR(H3_ERR_IO, "cannot replace the stale %s: %s", tmp, strerror(errno));
    }
    *fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (*fd < 0) return H3_ERR(H3_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    return H3_OK;
}

static void remove_tmp(const char *tmp, int is_dir) {
    if (is_dir)
        h3_out_remove_dir(tmp);
    else
        unlink(tmp);
}

void h3_out_remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *p = h3_path_join(dir, e->d_name);
            struct stat st;
            if (p && lstat(p, &st) == 0 && !S_ISDIR(st.st_mode)) unlink(p);
            h3_free(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* Renames tmp to path now; removes tmp when that fails. */
static h3_status place_now(const char *tmp, const char *path, int is_dir) {
    h3_status s = target_ok(path, is_dir);
    if (s == H3_OK && rename(tmp, path) != 0) {
        int e = errno;
        if (is_dir && (e == ENOTEMPTY || e == EEXIST))
            s = H3_ERR(H3_ERR_IO,
                       "%s is no longer empty (files appeared in it during the run): the frames were "
                       "not moved there",
                       path);
        else
            s = H3_ERR(H3_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(e));
    }
    if (s != H3_OK) remove_tmp(tmp, is_dir);
    return s;
}

struct h3_outgroup_entry {
    char *tmp, *path;
    int is_dir;
};

/* The innermost open group of this thread (outputs are written by the thread that runs the command). */
static _Thread_local h3_outgroup *g_group;

static h3_status group_add(h3_outgroup *g, const char *tmp, const char *path, int is_dir) {
    if (g->n == g->cap) {
        int nc = g->cap ? 2 * g->cap : 8;
        struct h3_outgroup_entry *v = h3_realloc(g->v, (size_t)nc * sizeof *v, H3_MEM_OTHER);
        if (!v) return H3_ERR(H3_ERR_NOMEM, "out of memory");
        g->v = v;
        g->cap = nc;
    }
    struct h3_outgroup_entry *e = &g->v[g->n];
    e->tmp = h3_strdup(tmp);
    e->path = h3_strdup(path);
    e->is_dir = is_dir;
    if (!e->tmp || !e->path) {
        h3_free(e->tmp);
        h3_free(e->path);
        return H3_ERR(H3_ERR_NOMEM, "out of memory");
    }
    g->n++;
    return H3_OK;
}

static void group_free(h3_outgroup *g) {
    for (int i = 0; i < g->n; i++) {
        h3_free(g->v[i].tmp);
        h3_free(g->v[i].path);
    }
    h3_free(g->v);
    g->v = NULL;
    g->n = g->cap = 0;
}

void h3_outgroup_begin(h3_outgroup *g) {
    memset(g, 0, sizeof *g);
    g->outer = g_group;
    g_group = g;
}

h3_status h3_outgroup_commit(h3_outgroup *g) {
    g_group = g->outer;
    h3_status s = H3_OK;
    int i = 0;
    if (g->outer) {
        for (; i < g->n && s == H3_OK; i++)
            s = group_add(g->outer, g->v[i].tmp, g->v[i].path, g->v[i].is_dir);
        /* entry i-1 (the one that failed) and later stay with this group: removed here; the outer one has
         * the rest */
        if (s != H3_OK)
            for (int j = i - 1; j < g->n; j++) remove_tmp(g->v[j].tmp, g->v[j].is_dir);
    } else {
        for (; i < g->n; i++) {
            s = place_now(g->v[i].tmp, g->v[i].path, g->v[i].is_dir);
            if (s != H3_OK) break;
        }
        if (s != H3_OK) { /* all or none: the ones placed go, and the temporaries after the failed one */
            for (int j = 0; j < i; j++) remove_tmp(g->v[j].path, g->v[j].is_dir);
            for (int j = i + 1; j < g->n; j++) remove_tmp(g->v[j].tmp, g->v[j].is_dir);
        }
    }
    group_free(g);
    return s;
}

void *h3_outgroup_suspend(void) {
    h3_outgroup *g = g_group;
    g_group = NULL;
    return g;
}

void h3_outgroup_resume(void *suspended) {
    g_group = suspended;
}

void h3_outgroup_abort(h3_outgroup *g) {
    g_group = g->outer;
    for (int i = 0; i < g->n; i++) remove_tmp(g->v[i].tmp, g->v[i].is_dir);
    group_free(g);
}

h3_status h3_out_place(const char *tmp, const char *path, int is_dir) {
    if (!g_group) return place_now(tmp, path, is_dir);
    h3_status s = target_ok(path, is_dir);
    if (s == H3_OK) s = group_add(g_group, tmp, path, is_dir);
    if (s != H3_OK) remove_tmp(tmp, is_dir);
    return s;
}

static void outfile_clear(h3_outfile *o) {
    h3_free(o->path);
    h3_free(o->tmp_path);
    memset(o, 0, sizeof *o);
}

h3_status h3_out_reserve(const char *path, char **tmp_path) {
    *tmp_path = NULL;
    H3_TRY(target_ok(path, 0));
    char *tmp = partial_name(path);
    if (!tmp) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    int fd;
    h3_status s = partial_create(tmp, &fd);
    if (s != H3_OK) {
        h3_free(tmp);
        return s;
    }
    close(fd);
    *tmp_path = tmp;
    return H3_OK;
}

h3_status h3_out_open(const char *path, h3_outfile *o) {
    memset(o, 0, sizeof *o);
    H3_TRY(target_ok(path, 0));
    o->path = h3_strdup(path);
    o->tmp_path = partial_name(path);
    if (!o->path || !o->tmp_path) {
        outfile_clear(o);
        return H3_ERR_NOMEM;
    }
    int fd;
    h3_status s = partial_create(o->tmp_path, &fd);
    if (s == H3_OK) {
        o->f = fdopen(fd, "wb");
        if (!o->f) {
            s = H3_ERR(H3_ERR_IO, "cannot create %s: %s", o->tmp_path, strerror(errno));
            close(fd);
            unlink(o->tmp_path);
        }
    }
    if (s != H3_OK) outfile_clear(o);
    return s;
}

static h3_status out_finish(h3_outfile *o, int now) {
    h3_status s = H3_OK;
    if (o->f) {
        int bad = ferror(o->f);
        if (fclose(o->f) != 0 || bad) s = H3_ERR(H3_ERR_IO, "writing %s failed (disk full?)", o->tmp_path);
        o->f = NULL;
    }
    if (s != H3_OK)
        unlink(o->tmp_path);
    else
        s = now ? place_now(o->tmp_path, o->path, 0) : h3_out_place(o->tmp_path, o->path, 0);
    outfile_clear(o);
    return s;
}

h3_status h3_out_commit(h3_outfile *o) {
    return out_finish(o, 0);
}

h3_status h3_out_commit_now(h3_outfile *o) {
    return out_finish(o, 1);
}

void h3_out_abort(h3_outfile *o) {
    if (o->f) fclose(o->f);
    if (o->tmp_path) unlink(o->tmp_path);
    outfile_clear(o);
}

/* ---- one command's paths ------------------------------------------------------------------------------- */

enum { ROLE_IN = 0, ROLE_OUT, ROLE_TEMP };

struct h3_path_entry {
    char *what, *path, *norm; /* norm: absolute, symlinks of existing parts resolved, no trailing slash */
    int role, is_dir;         /* is_dir: an output folder (or its temporary folder) */
    int owner;                /* the output a temporary belongs to; an entry's own index otherwise */
    int exists;
    uint64_t dev, ino;
};

struct h3_path_file {
    uint64_t dev, ino;
    int owner; /* the input folder it is in */
};

void h3_pathset_init(h3_pathset *s) {
    memset(s, 0, sizeof *s);
}

void h3_pathset_free(h3_pathset *s) {
    for (int i = 0; i < s->n; i++) {
        h3_free(s->v[i].what);
        h3_free(s->v[i].path);
        h3_free(s->v[i].norm);
    }
    h3_free(s->v);
    h3_free(s->files);
    memset(s, 0, sizeof *s);
}

/* Lexical normalization of an absolute path: "." and empty parts dropped, ".." takes one part back. */
static void collapse(char *p) {
    char *out = p, *in = p;
    while (*in) {
        while (*in == '/') in++;
        char *seg = in;
        while (*in && *in != '/') in++;
        size_t n = (size_t)(in - seg);
        if (n == 0 || (n == 1 && seg[0] == '.')) continue;
        if (n == 2 && seg[0] == '.' && seg[1] == '.') {
            while (out > p && *--out != '/') {
            }
            continue;
        }
        *out++ = '/';
        memmove(out, seg, n);
        out += n;
    }
    if (out == p) *out++ = '/';
    *out = 0;
}

/* The absolute form of a path: realpath() where it exists, else its folder's realpath() and its name, else
 * the lexical form. NULL when out of memory. */
static char *norm_path(const char *path) {
    char *p = strip_slashes(path);
    if (!p) return NULL;
    char *out = NULL;
    char *real = realpath(p, NULL);
    if (real) {
        out = h3_strdup(real);
        free(real);
        h3_free(p);
        return out;
    }
    char *dir = h3_path_dir(p);
    const char *base = h3_path_base(p);
    char *rdir = dir && strcmp(base, ".") && strcmp(base, "..") ? realpath(dir, NULL) : NULL;
    if (rdir) {
        out = h3_path_join(rdir, base);
        free(rdir);
    } else if (dir) {
        char cwd[4096];
        const char *pre = p[0] == '/' ? "" : getcwd(cwd, sizeof cwd) ? cwd : "/";
        size_t a = strlen(pre), b = strlen(p);
        out = h3_malloc(a + b + 2, H3_MEM_OTHER);
        if (out) {
            memcpy(out, pre, a);
            out[a] = '/';
            memcpy(out + a + 1, p, b + 1);
            collapse(out);
        }
    }
    h3_free(dir);
    h3_free(p);
    return out;
}

static int add_entry(h3_pathset *s, const char *what, const char *path, int role, int is_dir, int owner) {
    if (s->n == s->cap) {
        int nc = s->cap ? 2 * s->cap : 16;
        struct h3_path_entry *v = h3_realloc(s->v, (size_t)nc * sizeof *v, H3_MEM_OTHER);
        if (!v) return -1;
        s->v = v;
        s->cap = nc;
    }
    struct h3_path_entry *e = &s->v[s->n];
    memset(e, 0, sizeof *e);
    e->what = h3_strdup(what ? what : "");
    e->path = h3_strdup(path);
    e->norm = norm_path(path);
    if (!e->what || !e->path || !e->norm) {
        h3_free(e->what);
        h3_free(e->path);
        h3_free(e->norm);
        return -1;
    }
    e->role = role;
    e->is_dir = is_dir;
    e->owner = owner < 0 ? s->n : owner;
    struct stat st;
    if (stat(path, &st) == 0) {
        e->exists = 1;
        e->dev = (uint64_t)st.st_dev;
        e->ino = (uint64_t)st.st_ino;
    }
    return s->n++;
}

static int same_file(const struct h3_path_entry *a, const struct h3_path_entry *b) {
    if (a->exists && b->exists) return a->dev == b->dev && a->ino == b->ino;
    return strcmp(a->norm, b->norm) == 0;
}

static int inside(const char *child, const char *dir) {
    size_t n = strlen(dir);
    if (n == 1 && dir[0] == '/') return child[0] == '/' && child[1] != 0;
    return strncmp(child, dir, n) == 0 && child[n] == '/';
}

/* An output (or its temporary) that replaces an input, described for the message. */
static h3_status replaces_input(const h3_pathset *s, const struct h3_path_entry *out, const char *in_what,
                                const char *in_path, int in_folder) {
    const struct h3_path_entry *o = &s->v[out->owner];
    if (out->role == ROLE_TEMP)
        return H3_ERR(
            H3_ERR_INVALID,
            "%s %s: its temporary file %s is %s %s %s, which writing it would destroy; give another "
            "path",
            o->what, o->path, out->path, in_folder ? "a file of the input" : "the input", in_what, in_path);
    return H3_ERR(H3_ERR_INVALID,
                  "%s %s is %s %s %s: an output must not replace what the command reads; give another path",
                  o->what, o->path, in_folder ? "a file of the input" : "the input", in_what, in_path);
}

/* Entry i against every other entry, and (an output) against the files of input folders. */
static h3_status check_entry(const h3_pathset *s, int i) {
    const struct h3_path_entry *e = &s->v[i];
    for (int j = 0; j < s->n; j++) {
        const struct h3_path_entry *f = &s->v[j];
        if (j == i || f->owner == e->owner) continue;
        if (e->role == ROLE_IN && f->role == ROLE_IN) continue;
        if (e->role == ROLE_IN || f->role == ROLE_IN) {
            const struct h3_path_entry *in = e->role == ROLE_IN ? e : f, *out = in == e ? f : e;
            if (same_file(in, out)) return replaces_input(s, out, in->what, in->path, 0);
            continue;
        }
        const struct h3_path_entry *eo = &s->v[e->owner], *fo = &s->v[f->owner];
        if (same_file(e, f)) {
            if (e->role == ROLE_OUT && f->role == ROLE_OUT)
                return H3_ERR(H3_ERR_INVALID,
                              "%s %s and %s %s name the same file; give each output its own path", fo->what,
                              fo->path, eo->what, eo->path);
            const struct h3_path_entry *t = e->role == ROLE_TEMP ? e : f, *other = t == e ? f : e;
            return H3_ERR(
                H3_ERR_INVALID, "%s %s is the temporary file of %s %s (%s); give each output its own path",
                s->v[other->owner].what, other->path, s->v[t->owner].what, s->v[t->owner].path, t->path);
        }
        if ((f->is_dir && inside(e->norm, f->norm)) || (e->is_dir && inside(f->norm, e->norm))) {
            const struct h3_path_entry *d = f->is_dir && inside(e->norm, f->norm) ? fo : eo,
                                       *c = d == fo ? eo : fo;
            return H3_ERR(H3_ERR_INVALID,
                          "%s %s lies inside the folder of %s %s, which is written whole; put it elsewhere",
                          c->what, c->path, d->what, d->path);
        }
    }
    if (e->role != ROLE_IN && e->exists)
        for (int64_t k = 0; k < s->n_files; k++)
            if (s->files[k].dev == e->dev && s->files[k].ino == e->ino)
                return replaces_input(s, e, s->v[s->files[k].owner].what, s->v[s->files[k].owner].path, 1);
    return H3_OK;
}

enum { WALK_DEPTH = 4, WALK_FILES = 20000 };

/* Notes the regular files under dir (symlinks followed; the depth bounds any loop). */
static h3_status walk(h3_pathset *s, const char *dir, int depth, int owner) {
    if (depth > WALK_DEPTH) return H3_OK;
    DIR *d = opendir(dir);
    if (!d) return H3_OK; /* unreadable: its reader says so */
    h3_status st = H3_OK;
    struct dirent *e;
    while (st == H3_OK && s->n_files < WALK_FILES && (e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = h3_path_join(dir, e->d_name);
        if (!p) {
            st = H3_ERR(H3_ERR_NOMEM, "out of memory");
            break;
        }
        struct stat sb;
        if (stat(p, &sb) == 0) {
            if (S_ISDIR(sb.st_mode)) {
                st = walk(s, p, depth + 1, owner);
            } else if (S_ISREG(sb.st_mode)) {
                if (s->n_files == s->cap_files) {
                    int64_t nc = s->cap_files ? 2 * s->cap_files : 64;
                    struct h3_path_file *v = h3_realloc(s->files, (size_t)nc * sizeof *v, H3_MEM_OTHER);
                    if (!v)
                        st = H3_ERR(H3_ERR_NOMEM, "out of memory");
                    else {
                        s->files = v;
                        s->cap_files = nc;
                    }
                }
                if (st == H3_OK) s->files[s->n_files++] = (struct h3_path_file){sb.st_dev, sb.st_ino, owner};
            }
        }
        h3_free(p);
    }
    closedir(d);
    return st;
}

h3_status h3_pathset_input(h3_pathset *s, const char *what, const char *path, int want_file) {
    if (!path) return H3_OK;
    const char *w = what ? what : "", *sp = what ? " " : "";
    struct stat st;
    if (stat(path, &st) != 0) return H3_OK;
    if (S_ISDIR(st.st_mode) && want_file)
        return H3_ERR(H3_ERR_INVALID, "%s%s%s is a folder; give a file", w, sp, path);
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
        return H3_ERR(
            H3_ERR_INVALID,
            "%s%s%s is %s, not a regular file: h3run reads its inputs only from regular files; give the "
            "file itself",
            w, sp, path, mode_kind(st.st_mode));
    int i = add_entry(s, what, path, ROLE_IN, 0, -1);
    if (i < 0) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    H3_TRY(check_entry(s, i));
    if (S_ISDIR(st.st_mode)) {
        const int64_t first = s->n_files;
        H3_TRY(walk(s, path, 1, i));
        for (int j = 0; j < s->n; j++) {
            const struct h3_path_entry *o = &s->v[j];
            if (o->role == ROLE_IN || !o->exists) continue;
            for (int64_t k = first; k < s->n_files; k++)
                if (s->files[k].dev == o->dev && s->files[k].ino == o->ino)
                    return replaces_input(s, o, what ? what : "", path, 1);
        }
    }
    return H3_OK;
}

h3_status h3_pathset_output(h3_pathset *s, const char *what, const char *path, h3_out_kind kind) {
    H3_TRY(h3_check_output(path, what, kind));
    const int is_dir = kind != H3_OUT_FILE;
    int i = add_entry(s, what, path, ROLE_OUT, is_dir, -1);
    if (i < 0) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    H3_TRY(check_entry(s, i));
    char *tmp = partial_name(path);
    int t = tmp ? add_entry(s, what, tmp, ROLE_TEMP, is_dir, i) : -1;
    h3_free(tmp);
    if (t < 0) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    return check_entry(s, t);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

h3_status h3_list_dir(const char *dir, char ***names, int *count) {
    *names = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return H3_ERR(H3_ERR_IO, "cannot list %s: %s", dir, strerror(errno));
    char **v = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    h3_status st = H3_OK;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (n == cap) {
            int nc = cap ? cap * 2 : 16;
            char **nv = h3_realloc(v, (size_t)nc * sizeof *v, H3_MEM_OTHER);
            if (!nv) {
                st = H3_ERR_NOMEM;
                break;
            }
            v = nv;
            cap = nc;
        }
        v[n] = h3_strdup(e->d_name);
        if (!v[n]) {
            st = H3_ERR_NOMEM;
            break;
        }
        n++;
    }
    closedir(d);
    if (st != H3_OK) {
        h3_strlist_free(v, n);
        return st;
    }
    if (n > 1) qsort(v, (size_t)n, sizeof *v, cmp_str);
    *names = v;
    *count = n;
    return H3_OK;
}

void h3_strlist_free(char **names, int count) {
    if (!names) return;
    for (int i = 0; i < count; i++) h3_free(names[i]);
    h3_free(names);
}

int64_t h3_fd_cached_bytes(int fd) {
    struct stat sb;
    char proc[64];
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) return -1;
    if (sb.st_size == 0) return 0;
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    if (sb.st_uid != geteuid() && geteuid() != 0 && faccessat(AT_FDCWD, proc, W_OK, AT_EACCESS) != 0)
        return -1;
    const long ps = sysconf(_SC_PAGESIZE);
    const int64_t page = ps >= 4096 ? ps : 4096, window = (int64_t)1 << 30;
    unsigned char *vec = malloc((size_t)(window / page));
    if (!vec) return -1;
    int64_t cached = 0;
    for (int64_t off = 0; off < (int64_t)sb.st_size; off += window) {
        const int64_t len = (int64_t)sb.st_size - off < window ? (int64_t)sb.st_size - off : window;
        void *p = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, fd, (off_t)off);
        if (p == MAP_FAILED) {
            free(vec);
            return -1;
        }
        const int64_t n = (len + page - 1) / page;
        const int ok = mincore(p, (size_t)len, vec) == 0;
        munmap(p, (size_t)len);
        if (!ok) {
            free(vec);
            return -1;
        }
        for (int64_t i = 0; i < n; i++)
            if (vec[i] & 1) cached += i == n - 1 ? len - i * page : page;
    }
    free(vec);
    return cached;
}
