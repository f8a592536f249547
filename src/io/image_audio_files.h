/* Minimal image and sound files for debugging output (h3run decode): 8-bit RGB PNG and 16-bit PCM WAV.
 *
 * The PNG is uncompressed: its zlib stream holds stored deflate blocks (no compression), with the Adler-32 of the
 * rows and a CRC-32 per chunk, which every decoder reads. Files are written under "<path>.partial" and renamed when
 * complete. The real output path (MP4 with H.264 and AAC) is src/pipeline's.
 */
#ifndef H3_IO_IMAGE_AUDIO_FILES_H
#define H3_IO_IMAGE_AUDIO_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* CRC-32 (ISO 3309, as PNG and zlib use it) and Adler-32, continued from a previous value (start with 0 and 1). */
uint32_t h3_crc32(uint32_t crc, const void *data, size_t n);
uint32_t h3_adler32(uint32_t adler, const void *data, size_t n);

/* rgb: height rows of width pixels, 3 bytes each (R, G, B), rows `stride` bytes apart (>= 3·width). */
h3_status h3_png_write_rgb8(const char *path, const uint8_t *rgb, int64_t width, int64_t height, int64_t stride);

/* samples: frames × channels interleaved, in [-1, 1] (clamped), written as signed 16-bit PCM: round(x · 32767). */
h3_status h3_wav_write_pcm16(const char *path, const float *samples, int64_t frames, int channels, int sample_rate);

/* A float in [0, 1] (clamped; NaN -> 0) as an 8-bit level: round(x · 255), ties to even as numpy rounds. */
uint8_t h3_unit_to_u8(float x);

#endif
