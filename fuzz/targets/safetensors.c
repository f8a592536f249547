/* safetensors files: the header (length, JSON, dtypes, shapes, offsets, metadata) and the data behind it,
 * with ComfyUI's quantization markers and scales. The input is a whole file; every tensor is reached as a
 * view, as f32 and as a weight (fz_walk_weights). */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_quiet(1);
    fz_walk_weights(fz_write("in.safetensors", data, size));
    fz_quiet(0);
    fz_end("safetensors", 0);
    return 0;
}
