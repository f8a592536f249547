/* Shard indexes (*.safetensors.index.json): the input is the index, beside two fixed shards (shard-1 and
 * shard-2.safetensors, three small tensors each). Opened as a file and as the folder that holds it; every
 * tensor the index maps is loaded. Names that leave the folder are allowed (an index may point anywhere), but
 * not into /dev, /proc or /sys while the refusal of devices and FIFOs (F7) is open. */
#include <string.h>

#include "fuzz.h"
#include "io/safetensors.h"

static void write_shard(const char *rel, const char *const names[3], h3_dtype dt) {
    h3_st_writer *w = NULL;
    static const float v[8] = {1, -2, 3.5f, 0, 0.25f, -1e3f, 7, 8};
    const int64_t shapes[3][2] = {{2, 4}, {8, 1}, {3, 1}};
    h3_status st = h3_st_writer_new(&w);
    for (int i = 0; i < 3 && st == H3_OK; i++) st = h3_st_writer_add(w, names[i], dt, 2, shapes[i], v);
    if (st == H3_OK) st = h3_st_writer_write(w, fz_path(rel), 0);
    h3_st_writer_free(w);
    if (st != H3_OK) abort();
}

static void setup(void) {
    static int done;
    if (done) return;
    done = 1;
    const char *a[3] = {"a.weight", "a.bias", "b.weight"}, *b[3] = {"c.weight", "d.weight", "d.bias"};
    fz_mkdir("fixed");
    write_shard("fixed/shard-1.safetensors", a, H3_F32);
    write_shard("fixed/shard-2.safetensors", b, H3_F32);
    fz_keep();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    if (fz_open_finding("F7")) {
        static const char *const special[] = {"/dev", "/proc", "/sys"};
        for (int i = 0; i < 3; i++)
            if (fz_contains(data, size, special[i])) return 0;
    }
    fz_quiet(1);
    const char *index = fz_write("fixed/model.safetensors.index.json", data, size);
    fz_walk_weights(index);
    fz_walk_weights(fz_path("fixed"));
    fz_quiet(0);
    fz_end("shard_index", 0);
    return 0;
}
