/* Media output of a generate run: MP4 (H.264 yuv420p at 24 fps + AAC stereo at 32 kHz) through libavformat
 * and libavcodec, fed frame by frame so the decoded video never has to be in memory whole; PNG frames; WAV.
 *
 * Every file is written under "<path>.partial" and renamed to <path> only when complete (PNG frames: into a
 * temporary folder moved into place whole), so an interrupted or failed run never leaves a file that looks
 * finished: a failure removes the partial file. Outputs go only to regular files (base/fs.h); while an output
 * group is open (h3_outgroup_begin) finished files wait under their temporary names until the group commits.
 *
 * Pixels come as the video VAE produces them: planar float RGB in [0, 1] (values outside are clamped, NaN
 * counts as 0), plane k of a frame at rgb + k*plane_stride, row y at + y*row_stride; a frame of a [3, T, H,
 * W] chunk is (chunk + t*H*W, plane_stride = T*H*W, row_stride = W). They become 8-bit by h3_unit_to_u8
 * (round(255*x), as numpy rounds float32 arrays), then BT.709 limited-range YUV 4:2:0 (the stream is tagged
 * so). Audio comes as float samples in [-1, 1] per channel.
 *
 * This is the one writer of images and sound in h3run: `h3run decode` writes its PNG frames and WAV files
 * here too.
 */
#ifndef H3_PIPELINE_MEDIA_H
#define H3_PIPELINE_MEDIA_H

#include <stdint.h>

#include "base/status.h"

typedef struct h3_mp4_opts {
    int width,
        height; /* the encoded (delivery) size: even, 2..16384 (a request's canvas is a multiple of 32) */
    int src_width, src_height; /* the size of the frames h3_mp4_write_frame takes; 0: width x height. When it
                                * differs, each frame is scaled to width x height on the writer's thread
                                * (h3_frame_scaler: Lanczos), one frame at a time */
    int fps;                   /* 24 */
    int sample_rate;           /* 32000; 0 writes no audio track */
    int channels;              /* 1 or 2 (2 for H3) */
    int crf;                   /* x264 constant rate factor, 0..51 (default 18: visually lossless) */
    const char *preset;        /* x264 preset (default "medium") */
    int audio_bitrate;         /* AAC bits per second (default 128000) */
} h3_mp4_opts;

/* 1 when this build writes MP4 and PNG (libav), 0 when it was built with -DH3_MEDIA=OFF (WAV only). */
int h3_media_available(void);

/* H3_ERR_INVALID naming the valid x264 presets unless preset is one; what (may be NULL) prefixes the message.
 */
h3_status h3_mp4_check_preset(const char *preset, const char *what);
/* Defaults for a width x height clip of H3: 24 fps, 32 kHz stereo, crf 18, preset medium, 128 kb/s. */
void h3_mp4_opts_default(h3_mp4_opts *o, int width, int height);

typedef struct h3_mp4 h3_mp4;

/* The video is encoded on the writer's own thread, so that a caller producing frames (the video VAE) goes on
 * with the next ones while x264 encodes the last: h3_mp4_write_frame copies the frame into a queue and
 * returns; the thread converts and encodes the queued frames in order. The queue holds at most
 * H3_MP4_QUEUE_FRAMES frames and at most H3_MP4_QUEUE_BYTES of them (never fewer than 2), as planar float RGB
 * (12 bytes a pixel: 6.3 MB a frame at 960x544), allocated as it first fills, counted as H3_MEM_IO; a caller
 * that gets ahead of the encoder by that much waits in h3_mp4_write_frame. 32 frames are more than one of the
 * video VAE's temporal chunks (about 18 frames), so a decode that is faster than the encoder on average is
 * not held up by it. */
#define H3_MP4_QUEUE_FRAMES 32
#define H3_MP4_QUEUE_BYTES  ((int64_t)256 << 20)

/* Creates "<path>.partial", the encoders and the encoder thread. */
h3_status h3_mp4_open(const char *path, const h3_mp4_opts *opts, h3_mp4 **out);
/* Appends one frame (see the pixel convention above): checks it, copies it into the queue and returns
 * (waiting first only while the queue is full). A failure of the encoder thread (a write error, a full disk)
 * is returned by the next call of any function below. */
h3_status h3_mp4_write_frame(h3_mp4 *m, const float *rgb, int64_t plane_stride, int64_t row_stride);
/* Appends n samples per channel: left[n] and right[n] (right is ignored for a mono track; for a stereo track
 * a NULL right repeats left), encoded on the calling thread. Audio and video may be written in any order and
 * in any number of calls. */
h3_status h3_mp4_write_audio(h3_mp4 *m, const float *left, const float *right, int64_t n);
/* Frames accepted (queued or encoded) and audio samples written so far. */
int64_t h3_mp4_frames(const h3_mp4 *m);
int64_t h3_mp4_audio_samples(const h3_mp4 *m);
/* Waits for the queued frames to be encoded, flushes the encoders, writes the index, renames "<path>.partial"
 * to <path> and frees the writer. After any failed call the writer only accepts h3_mp4_finish (which then
 * removes the partial file and returns the failure) or h3_mp4_abort. */
h3_status h3_mp4_finish(h3_mp4 *m);
/* Stops without a file: drops the queued frames, stops the thread (after the frame it is encoding), removes
 * "<path>.partial" and frees the writer. NULL is a no-op. */
void h3_mp4_abort(h3_mp4 *m);

/* A float of the pixel convention as an 8-bit level: clamped to [0, 1] (NaN counts as 0), multiplied by 255
 * in float32 and rounded half to even: numpy's (x * 255).round() on a float32 array, what diffusers' image
 * postprocessing does. */
uint8_t h3_unit_to_u8(float x);

/* ---- delivery size ------------------------------------------------------------------------------------
 *
 * Frames are scaled to a delivery size (`--output-size`) by libswscale's Lanczos filter (SWS_LANCZOS, 3
 * lobes, with SWS_ACCURATE_RND and full-resolution chroma in and out, so no channel is subsampled on the way)
 * from packed 8-bit RGB to packed 8-bit RGB, each channel on its own: the same pixels for the MP4 and the PNG
 * frames. The aspect ratio may change (the frame is stretched, never cropped). One frame at a time: memory
 * does not depend on the clip's length. */
#define H3_MEDIA_MAX_SIDE 16384
/* A delivery size for the MP4 (H.264 4:2:0) and PNG writers: both sides even (yuv420p) and 2..16384;
 * H3_ERR_INVALID naming the nearest even sizes otherwise ("1919x1080: ... use 1918x1080 or 1920x1080"). */
h3_status h3_media_check_output_size(int64_t width, int64_t height);

typedef struct h3_frame_scaler h3_frame_scaler;
/* A scaler of src_w x src_h packed RGB24 frames to dst_w x dst_h (each 1..16384). */
h3_status h3_frame_scaler_new(int src_w, int src_h, int dst_w, int dst_h, h3_frame_scaler **out);
/* src [src_h, src_w, 3] (rows contiguous) -> dst [dst_h, dst_w, 3]. */
void h3_frame_scaler_run(h3_frame_scaler *s, const uint8_t *src, uint8_t *dst);
void h3_frame_scaler_free(h3_frame_scaler *s);

/* One PNG (8-bit RGB) of a frame in the pixel convention above, written atomically. */
h3_status h3_png_write(const char *path, const float *rgb, int64_t plane_stride, int64_t row_stride,
                       int width, int height);
/* PNG frames DIR/frame_00000.png, DIR/frame_00001.png, ..., written into the temporary folder "DIR.partial"
 * beside DIR, which h3_png_seq_finish moves into place whole (or hands to the open output group, base/fs.h):
 * an interrupted run never leaves frames that look finished, and never touches files already in DIR. DIR
 * must not exist or be an empty folder (a folder that holds anything is refused); a "DIR.partial" that an
 * interrupted run left (frame files only) is emptied and reused, anything else of that name is refused. */
typedef struct h3_png_seq {
    char *dir, *tmp;           /* tmp: NULL once finished or closed */
    int width, height;         /* the frames written */
    int src_width, src_height; /* the frames given (scaled to width x height when they differ) */
    h3_frame_scaler *scaler;
    uint8_t *src_rgb, *dst_rgb; /* one frame each, while scaling */
    int64_t next;
} h3_png_seq;
h3_status h3_png_seq_open(const char *dir, int width, int height, h3_png_seq *out);
/* The same, for frames of src_w x src_h written as width x height PNGs (scaled as the MP4's frames are). */
h3_status h3_png_seq_open_scaled(const char *dir, int src_w, int src_h, int width, int height,
                                 h3_png_seq *out);
h3_status h3_png_seq_write(h3_png_seq *s, const float *rgb, int64_t plane_stride, int64_t row_stride);
/* Moves the frames into place (see above) and closes the sequence. */
h3_status h3_png_seq_finish(h3_png_seq *s);
/* Closes the sequence; unfinished, its temporary folder and the frames in it are removed. */
void h3_png_seq_close(h3_png_seq *s);

/* A 16-bit PCM WAV of n samples per channel (channels 1 or 2; right ignored for mono; NULL right with 2
 * channels repeats left), written atomically. Samples are clamped to [-1, 1] (NaN counts as 0) and become
 * round(x * 32767), computed in double, half to even. */
h3_status h3_wav_write(const char *path, const float *left, const float *right, int64_t n, int channels,
                       int sample_rate);

/* ---- reading a clip back (media_read.c) ------------------------------------------------------------------
 */

/* A decoded clip, whole in memory: frames as planar float RGB in [0, 1] (frame t, plane c at rgb + (t·3 +
 * c)·H·W, BT.709 limited range undone as h3run writes it), sound as float per channel (right = left for
 * mono). */
typedef struct h3_clip {
    int width, height;
    int64_t frames;
    double fps;
    float *rgb;
    int sample_rate, channels; /* 0 without an audio stream */
    int64_t samples;
    float *left, *right;
} h3_clip;
/* The first video stream (and audio stream, if any) of a file libavformat opens (MP4 among them). */
h3_status h3_clip_read(const char *path, h3_clip *out);
void h3_clip_free(h3_clip *c);

/* A soundtrack: the first audio stream of any file libavformat opens (WAV, FLAC, MP3, AAC, an MP4's sound, ...),
 * decoded and resampled (libswresample) to `rate` Hz, planar float: mono is copied to both sides, two or more
 * channels are mixed to stereo (libswresample's default matrix). At most max_samples are kept (the rest is not
 * decoded). H3_ERR_IO for a file that cannot be read, H3_ERR_FORMAT for one without sound. */
typedef struct h3_sound {
    float *left, *right; /* [samples] each */
    int64_t samples;
    int rate;                      /* of left/right */
    int src_rate, src_channels;    /* the file's */
} h3_sound;
h3_status h3_sound_read(const char *path, int rate, int64_t max_samples, h3_sound *out);
void h3_sound_free(h3_sound *s);

/* An image file's first frame (PNG, JPEG, WebP, BMP, ... whatever libavformat opens) as packed RGB8 [h, w, 3]
 * (h3_malloc; alpha dropped, as PIL's convert("RGB") does; YUV converted with the file's own range and
 * matrix). Refused: a missing/unreadable/truncated file (H3_ERR_IO or H3_ERR_FORMAT), no video stream, and an
 * image above max_pixels (H3_ERR_INVALID, checked before decoding when the header says the size). */
#define H3_IMAGE_MAX_PIXELS ((int64_t)1 << 28)

/* A video file's first max_seconds (its first ceil(max_seconds · rate) + 1 frames, of its first video stream) as packed RGB8 [frames, h, w, 3], converted
 * as h3_image_read converts a picture, with the rate its stream says (avg_frame_rate, else r_frame_rate; 0 when
 * it says none). Refused as h3_image_read refuses, and a frame above max_pixels (H3_ERR_INVALID). */
typedef struct h3_video_frames {
    uint8_t *rgb;
    int64_t frames;
    int width, height;
    double fps;
} h3_video_frames;
h3_status h3_video_read(const char *path, double max_seconds, int64_t max_pixels, h3_video_frames *out);
void h3_video_frames_free(h3_video_frames *v);
h3_status h3_image_read(const char *path, int64_t max_pixels, uint8_t **rgb, int *w, int *h);

#endif
