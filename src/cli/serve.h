/* h3run serve's pieces: the job store (SQLite) and the request reader, shared by cmd_serve.c and the tests.
 *
 * The store is one SQLite file in WAL mode with synchronous=FULL: a job the server answered 201 for is on
 * disk before the answer goes out, and every change of state is a committed transaction, so a process killed
 * at any instant (kill -9) finds on restart every job it had accepted, in order. Jobs are numbered from 1 in
 * the order they were accepted and run in that order, one at a time.
 *
 * JSON goes through jansson with the library's allocator: call h3_json_init (base/json.h) before making any,
 * and free json_dumps's text with h3_free.
 */
#ifndef H3_CLI_SERVE_H
#define H3_CLI_SERVE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "pipeline/generate.h"

/* ---- the store -------------------------------------------------------------------------------------------
 */

/* The states of a job: queued, planning (its run checks and plans it), running (a stage, a step, an ETA),
 * done, failed (with the message generate would print), cancelled. */
#define H3_JOB_QUEUED    "queued"
#define H3_JOB_PLANNING  "planning"
#define H3_JOB_RUNNING   "running"
#define H3_JOB_DONE      "done"
#define H3_JOB_FAILED    "failed"
#define H3_JOB_CANCELLED "cancelled"

typedef struct h3_store h3_store;

/* Opens (creating when new) the store at path. */
h3_status h3_store_open(const char *path, h3_store **out);
void h3_store_close(h3_store *s);
/* Jobs that were planning or running when the server died go back to the queue, in their places; returns how
 * many (negative on a database error, with the message set). */
int h3_store_requeue_interrupted(h3_store *s);
/* A new queued job holding the request (JSON text); *id its number. */
h3_status h3_store_add(h3_store *s, const char *request, int64_t *id);
/* The oldest queued job: *id (0 when none) and its request (h3_malloc'd). */
h3_status h3_store_next(h3_store *s, int64_t *id, char **request);
/* Sets a job's state, and its message and report when given (NULL: left as they are). started/finished times
 * follow the state (planning stamps started; done, failed, cancelled stamp finished). */
h3_status h3_store_set_state(h3_store *s, int64_t id, const char *state, const char *message,
                             const char *report);
/* The job as a JSON object {id, state, request, created, started, finished, message, report} (new reference);
 * H3_ERR_NOT_FOUND when there is none. */
h3_status h3_store_get(h3_store *s, int64_t id, json_t **job);
/* Every job, oldest first (a new JSON array). */
h3_status h3_store_list(h3_store *s, json_t **jobs);
h3_status h3_store_delete(h3_store *s, int64_t id);
/* Jobs in that state (NULL: all). */
int64_t h3_store_count(h3_store *s, const char *state);

/* ---- requests --------------------------------------------------------------------------------------------
 */

/* The largest request body the server reads: a prompt of H3_MAX_PROMPT_BYTES, escaped, and keyframe images as
 * base64 (each at most H3_SERVE_MAX_IMAGE bytes decoded). */
#define H3_SERVE_MAX_BODY  (64 * 1024 * 1024)
#define H3_SERVE_MAX_IMAGE (16 * 1024 * 1024)

/* The options a job takes: the names of `generate`'s options that a client may give (no paths: outputs are
 * the server's). */
#define H3_SERVE_OPTIONS                                                                                     \
    "prompt, frames, seconds, window, overlap, more_prompts, size, steps, sampler, scheduler, seed, "            \
    "x264_preset, wav, latents, refine, output_size, shift, first_frame, last_frame, keyframes, loras, cache, "  \
    "audio"

/* A job's request as the client sent it: checked for JSON, types, unknown options and the values every
 * request must have (the request's own rules, frames and canvas among them, come from h3_request_resolve).
 * Fills r->req (the prompt points into the json object, which must outlive r) and the flags; a seed the
 * client did not give is drawn here and written back into the object, so a job run again after a crash makes
 * the same clip. H3_ERR_INVALID with a message naming the option and the fix. defaults_small: the small
 * model's length and canvas when none is given. */
typedef struct h3_serve_request {
    h3_generate_request gen;
    int wav, latents;                         /* also write the WAV, the latents */
    char kf_path[H3_MAX_KEYFRAMES][1024];     /* the keyframes' files under the uploads folder */
    char lora_path[H3_MAX_LORAS][1024];       /* the LoRAs' files under the server's LoRA folder */
    char audio_path[1024];                    /* the soundtrack's file under the uploads folder */
} h3_serve_request;
/* Keyframes (fl2va): "first_frame" and "last_frame" (an image each) and "keyframes" ([{"image", "frame"}], a
 * frame from 0), in that packed order, at most H3_MAX_KEYFRAMES in all. A client sends each image as base64 (a
 * data: URL's prefix allowed); the server stores it under DATA/uploads/ (h3_serve_store_uploads) and the stored
 * request names it "upload:<32 hex digits>.<ext>", the only form this parser takes, resolved under uploads_dir (NULL:
 * uploads refused). A soundtrack ("audio": a sound file, generate's --audio) travels the same way. */
/* LoRAs: "loras" ([{"name", "strength"}], strength 1 when left out, -100 to 100) names files of the server's LoRA
 * folder lora_dir (NULL: LoRAs refused): a plain file name ending in .safetensors (no '/', not starting with '.'),
 * at most H3_MAX_LORAS, that must be a regular file there; the DiT merges or attaches them as generate's --lora
 * does. */
h3_status h3_serve_parse_request(json_t *obj, int defaults_small, const char *uploads_dir, const char *lora_dir,
                                 h3_serve_request *out);
/* The .safetensors files of lora_dir as [{"name", "bytes"}], sorted by name (an empty array when the folder is
 * NULL or unreadable). */
json_t *h3_serve_list_loras(const char *lora_dir);

/* Replaces every keyframe image of a client's request by the file it is written to: base64 decoded (at most
 * H3_SERVE_MAX_IMAGE bytes, a data: URL's prefix allowed), written atomically as uploads_dir/<32 random hex
 * digits>.<ext> (ext from the content: png, jpg, webp, gif, bmp, ppm, tif, else img), the value set to
 * "upload:<hex>.<ext>". A value that is not base64, is empty or too large, or already
 * names an upload is H3_ERR_INVALID naming the option. Files written before a failure are removed. */
h3_status h3_serve_store_uploads(json_t *obj, const char *uploads_dir);
/* Removes the uploads a stored request names (nothing else: names are checked to be 32 hex digits and an
 * extension). */
void h3_serve_remove_uploads(json_t *obj, const char *uploads_dir);

#endif
