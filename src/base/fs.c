#define _GNU_SOURCE
#include "base/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"

h3_status h3_mmap_open(const char *path, h3_mmap *out) {
    memset(out, 0, sizeof *out);
    out->fd = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return H3_ERR(H3_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return H3_ERR(H3_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return H3_ERR(H3_ERR_IO, "%s is not a regular file", path);
    }
    out->fd = fd;
    out->size = (size_t)st.st_size;
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
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return H3_ERR(H3_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return H3_ERR(H3_ERR_IO, "%s is not a readable regular file", path);
    }
    if ((uint64_t)st.st_size > max_size) {
        close(fd);
        return H3_ERR(H3_ERR_FORMAT, "%s is %lld bytes; at most %zu expected for this kind of file", path,
                      (long long)st.st_size, max_size);
    }
    size_t n = (size_t)st.st_size;
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

h3_status h3_out_open(const char *path, h3_outfile *o) {
    memset(o, 0, sizeof *o);
    size_t n = strlen(path);
    o->path = h3_strdup(path);
    o->tmp_path = h3_malloc(n + 16, H3_MEM_OTHER);
    if (!o->path || !o->tmp_path) {
        h3_free(o->path);
        h3_free(o->tmp_path);
        memset(o, 0, sizeof *o);
        return H3_ERR_NOMEM;
    }
    snprintf(o->tmp_path, n + 16, "%s.partial", path);
    o->f = fopen(o->tmp_path, "wb");
    if (!o->f) {
        int e = errno;
        h3_status s = H3_ERR(H3_ERR_IO, "cannot create %s: %s", o->tmp_path, strerror(e));
        h3_free(o->path);
        h3_free(o->tmp_path);
        memset(o, 0, sizeof *o);
        return s;
    }
    return H3_OK;
}

h3_status h3_out_commit(h3_outfile *o) {
    h3_status s = H3_OK;
    if (o->f) {
        int bad = ferror(o->f);
        if (fclose(o->f) != 0 || bad) s = H3_ERR(H3_ERR_IO, "writing %s failed (disk full?)", o->tmp_path);
        o->f = NULL;
    }
    if (s == H3_OK && rename(o->tmp_path, o->path) != 0)
        s = H3_ERR(H3_ERR_IO, "cannot rename %s to %s: %s", o->tmp_path, o->path, strerror(errno));
    if (s != H3_OK) unlink(o->tmp_path);
    h3_free(o->path);
    h3_free(o->tmp_path);
    memset(o, 0, sizeof *o);
    return s;
}

void h3_out_abort(h3_outfile *o) {
    if (o->f) fclose(o->f);
    if (o->tmp_path) unlink(o->tmp_path);
    h3_free(o->path);
    h3_free(o->tmp_path);
    memset(o, 0, sizeof *o);
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
