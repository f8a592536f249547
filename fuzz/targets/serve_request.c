/* A job's request as h3run serve reads it (src/cli/serve_request.c): the input is the body of POST /api/jobs,
 * parsed as JSON; an object goes through h3_serve_parse_request (types, ranges, unknown options, the seed
 * drawn into it, the keyframes' upload references, the LoRAs' names), and a request it accepts through h3_request_resolve (17n+5
 * frames, the canvas, the steps), as the server's check does before planning. Nothing is written and no model
 * or image is read. */
#include "base/json.h"
#include "cli/serve.h"
#include "fuzz.h"
#include "pipeline/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    h3_json_init();
    fz_quiet(1);
    json_error_t e;
    json_t *obj = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &e);
    if (!obj) return 0;
    for (int small = 0; small < 2; small++) {
        h3_serve_request sr;
        /* keyframe references resolve to paths under this folder: parsing never opens them */
        if (h3_serve_parse_request(obj, small, "/h3-fuzz-uploads", "/h3-fuzz-loras", &sr) == H3_OK) {
            h3_request q = sr.gen.req;
            h3_request_warnings w;
            h3_request_resolve(&q, &w);
        }
        h3_clear_error();
    }
    json_decref(obj);
    return 0;
}
