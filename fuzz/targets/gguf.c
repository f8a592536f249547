/* GGUF files: the header (version, counts, key/value pairs, arrays, tensor infos, alignment, offsets), the
 * llama.cpp and ComfyUI-GGUF name and shape mappings, and the block formats' decoding. The input is a whole
 * file; every tensor is reached as a view, as f32 and as a weight decoded to f32 (fz_walk_weights). */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_quiet(1);
    fz_walk_weights(fz_write("in.gguf", data, size));
    fz_quiet(0);
    fz_end("gguf", 0);
    return 0;
}
