/* Finding the weight sets under a path: a file, a shard index, a component folder, or a model folder holding
 * several components (the official FL2VA/ folder, a diffusers folder, a ComfyUI models/ folder). */
#ifndef H3_IO_DISCOVER_H
#define H3_IO_DISCOVER_H

#include "base/status.h"

/* Called once per weight set found, with a path h3_st_open accepts. Return nonzero to stop. */
typedef int (*h3_discover_fn)(const char *set_path, void *user);

/* Visits sets under path: a folder with one shard index is one set; a folder of files named like shards
 * ("...-00001-of-00013.safetensors") is one set; otherwise each .safetensors file is its own set. Folders without
 * weights are searched to depth 3. H3_ERR_NOT_FOUND when nothing is found. */
h3_status h3_discover_sets(const char *path, h3_discover_fn fn, void *user);

#endif
