#include "io/discover.h"

#include <string.h>

#include "base/alloc.h"
#include "base/fs.h"

static int looks_like_shard(const char *name) {
    const char *p = strstr(name, "-of-");
    return p && p > name && h3_str_ends_with(name, ".safetensors");
}

/* Returns 1 when fn asked to stop, 0 otherwise; *found counts sets. */
static h3_status visit(const char *dir, int depth, h3_discover_fn fn, void *user, int *found, int *stop) {
    char **names;
    int n;
    H3_TRY(h3_list_dir(dir, &names, &n));
    h3_status st = H3_OK;
    int n_index = 0, n_st = 0, n_shard = 0;
    for (int i = 0; i < n; i++) {
        if (h3_str_ends_with(names[i], ".safetensors.index.json"))
            n_index++;
        else if (h3_str_ends_with(names[i], ".safetensors")) {
            n_st++;
            n_shard += looks_like_shard(names[i]);
        }
    }
    if (n_index == 1 || (n_st > 0 && n_shard == n_st && n_index == 0)) {
        (*found)++;
        *stop = fn(dir, user);
    } else if (n_index > 1) {
        for (int i = 0; i < n && !*stop; i++) {
            if (!h3_str_ends_with(names[i], ".safetensors.index.json")) continue;
            char *p = h3_path_join(dir, names[i]);
            if (!p) {
                st = H3_ERR_NOMEM;
                break;
            }
            (*found)++;
            *stop = fn(p, user);
            h3_free(p);
        }
    } else if (n_st > 0) {
        for (int i = 0; i < n && !*stop; i++) {
            if (!h3_str_ends_with(names[i], ".safetensors")) continue;
            char *p = h3_path_join(dir, names[i]);
            if (!p) {
                st = H3_ERR_NOMEM;
                break;
            }
            (*found)++;
            *stop = fn(p, user);
            h3_free(p);
        }
    }
    if (n_index == 0 && n_st == 0 && depth < 3) {
        for (int i = 0; i < n && !*stop && st == H3_OK; i++) {
            if (names[i][0] == '.') continue;
            char *p = h3_path_join(dir, names[i]);
            if (!p) {
                st = H3_ERR_NOMEM;
                break;
            }
            if (h3_path_is_dir(p)) st = visit(p, depth + 1, fn, user, found, stop);
            h3_free(p);
        }
    }
    h3_strlist_free(names, n);
    return st;
}

h3_status h3_discover_sets(const char *path, h3_discover_fn fn, void *user) {
    if (!h3_path_exists(path)) return H3_ERR(H3_ERR_NOT_FOUND, "%s does not exist", path);
    if (!h3_path_is_dir(path)) {
        fn(path, user);
        return H3_OK;
    }
    int found = 0, stop = 0;
    H3_TRY(visit(path, 0, fn, user, &found, &stop));
    if (!found) return H3_ERR(H3_ERR_NOT_FOUND, "no .safetensors weights under %s", path);
    return H3_OK;
}
