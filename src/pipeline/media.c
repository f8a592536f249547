#include "pipeline/media.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if H3_HAVE_MEDIA
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/channel_layout.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>
#endif

#include "base/alloc.h"
#include "base/fs.h"
#include "base/log.h"

#if H3_HAVE_MEDIA
/* ---- libav's messages go to the log, never to stderr
 * -------------------------------------------------------- */

static void av_log_to_h3(void *avcl, int level, const char *fmt, va_list vl) {
    (void)avcl;
    if (level > AV_LOG_WARNING || !h3_log_enabled(H3_LOG_DEBUG)) return;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, vl);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = 0;
    if (n) h3_log(H3_LOG_DEBUG, "libav: %s", buf);
}

static pthread_once_t g_av_once = PTHREAD_ONCE_INIT;
static void av_setup(void) {
    av_log_set_callback(av_log_to_h3);
}

static const char *averr(int e, char *buf, size_t n) {
    if (av_strerror(e, buf, n) < 0) snprintf(buf, n, "libav error %d", e);
    return buf;
}

#endif

/* ---- pixels
 * ----------------------------------------------------------------------------------------------------- */

int h3_media_available(void) {
#if H3_HAVE_MEDIA
    return 1;
#else
    return 0;
#endif
}

/* h3_unit_to_u8, written so that compilers vectorize it without special flags (no branches, no float
 * compares): the clamp on the float's bits (above 1, +inf and +NaN to 1; negatives, -0, -inf and -NaN to +0;
 * then any NaN to 0), the product rounded to float32, then rounding half to even by adding 2^23 (the sum is
 * exact to the unit for 0..255, its low 8 bits are the level). The product and the sum must round separately
 * (no fused multiply-add: ISO C mode, as the build uses, does not contract); the tests compare every level's
 * ties with an independent reference. */
static inline uint8_t unit_to_u8(float x) {
    int32_t i, c;
    memcpy(&i, &x, sizeof i);
    c = i < 0x3f800000 ? i : 0x3f800000;
    c = c > 0 ? c : 0;
    c = (i & 0x7fffffff) > 0x7f800000 ? 0 : c;
    float v;
    memcpy(&v, &c, sizeof v);
    const float p = v * 255.0f;
    const float q = p + 8388608.0f;
    uint32_t u;
    memcpy(&u, &q, sizeof u);
    return (uint8_t)u;
}

uint8_t h3_unit_to_u8(float x) {
    return unit_to_u8(x);
}

/* Planar float RGB -> packed RGB24 (width*3 bytes per row, rows contiguous): each plane's run of a row to
 * levels (the loop that vectorizes), then interleaved. */
static void planar_to_rgb24(const float *rgb, int64_t plane_stride, int64_t row_stride, int w, int h,
                            uint8_t *out) {
    enum { RUN = 512 };
    uint8_t lv[3][RUN];
    for (int y = 0; y < h; y++) {
        uint8_t *o = out + (size_t)y * (size_t)w * 3;
        for (int x0 = 0; x0 < w; x0 += RUN) {
            const int n = w - x0 < RUN ? w - x0 : RUN;
            for (int c = 0; c < 3; c++) {
                const float *src = rgb + c * plane_stride + (int64_t)y * row_stride + x0;
                for (int x = 0; x < n; x++) lv[c][x] = unit_to_u8(src[x]);
            }
            for (int x = 0; x < n; x++) {
                o[3 * (x0 + x)] = lv[0][x];
                o[3 * (x0 + x) + 1] = lv[1][x];
                o[3 * (x0 + x) + 2] = lv[2][x];
            }
        }
    }
}

/* ---- delivery size
 * --------------------------------------------------------------------------------------------- */

h3_status h3_media_check_output_size(int64_t width, int64_t height) {
    if (width >= 2 && height >= 2 && width <= H3_MEDIA_MAX_SIDE && height <= H3_MEDIA_MAX_SIDE &&
        width % 2 == 0 && height % 2 == 0)
        return H3_OK;
    if (width < 1 || height < 1 || width > H3_MEDIA_MAX_SIDE || height > H3_MEDIA_MAX_SIDE)
        return H3_ERR(H3_ERR_INVALID,
                      "output size %lldx%lld: each side must be an even number from 2 to %d (H.264 4:2:0)",
                      (long long)width, (long long)height, H3_MEDIA_MAX_SIDE);
    /* odd: the even sizes either side, each odd side rounded down or up (never past the limits) */
    const int64_t wl = width - (width % 2), hl = height - (height % 2);
    const int64_t wu = width + (width % 2), hu = height + (height % 2);
    return H3_ERR(H3_ERR_INVALID,
                  "output size %lldx%lld: H.264 4:2:0 (yuv420p) needs even sides; use %lldx%lld or %lldx%lld",
                  (long long)width, (long long)height, (long long)(wl < 2 ? 2 : wl),
                  (long long)(hl < 2 ? 2 : hl), (long long)(wu > H3_MEDIA_MAX_SIDE ? wl : wu),
                  (long long)(hu > H3_MEDIA_MAX_SIDE ? hl : hu));
}

#if H3_HAVE_MEDIA
struct h3_frame_scaler {
    struct SwsContext *sws;
    int sw, sh, dw, dh;
};

h3_status h3_frame_scaler_new(int src_w, int src_h, int dst_w, int dst_h, h3_frame_scaler **out) {
    *out = NULL;
    if (src_w < 1 || src_h < 1 || dst_w < 1 || dst_h < 1 || src_w > H3_MEDIA_MAX_SIDE ||
        src_h > H3_MEDIA_MAX_SIDE || dst_w > H3_MEDIA_MAX_SIDE || dst_h > H3_MEDIA_MAX_SIDE)
        return H3_ERR(H3_ERR_INVALID, "cannot scale %dx%d frames to %dx%d (sides 1..%d)", src_w, src_h, dst_w,
                      dst_h, H3_MEDIA_MAX_SIDE);
    pthread_once(&g_av_once, av_setup);
    h3_frame_scaler *s = h3_calloc(1, sizeof *s, H3_MEM_IO);
    if (!s) return H3_ERR(H3_ERR_NOMEM, "out of memory for a frame scaler");
    /* full-resolution chroma in and out: swscale works on RGB through its own YUV, which it would otherwise
     * subsample horizontally, blurring colour edges */
    s->sws = sws_getContext(src_w, src_h, AV_PIX_FMT_RGB24, dst_w, dst_h, AV_PIX_FMT_RGB24,
                            SWS_LANCZOS | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT | SWS_FULL_CHR_H_INP, NULL,
                            NULL, NULL);
    if (!s->sws) {
        h3_free(s);
        return H3_ERR(H3_ERR_NOMEM, "creating a %dx%d to %dx%d Lanczos scaler", src_w, src_h, dst_w, dst_h);
    }
    s->sw = src_w;
    s->sh = src_h;
    s->dw = dst_w;
    s->dh = dst_h;
    *out = s;
    return H3_OK;
}

void h3_frame_scaler_run(h3_frame_scaler *s, const uint8_t *src, uint8_t *dst) {
    const uint8_t *in[4] = {src, NULL, NULL, NULL};
    uint8_t *o[4] = {dst, NULL, NULL, NULL};
    const int in_stride[4] = {s->sw * 3, 0, 0, 0}, out_stride[4] = {s->dw * 3, 0, 0, 0};
    sws_scale(s->sws, in, in_stride, 0, s->sh, o, out_stride);
}

void h3_frame_scaler_free(h3_frame_scaler *s) {
    if (!s) return;
    sws_freeContext(s->sws);
    h3_free(s);
}
#else
struct h3_frame_scaler {
    int unused;
};
h3_status h3_frame_scaler_new(int src_w, int src_h, int dst_w, int dst_h, h3_frame_scaler **out) {
    (void)src_w, (void)src_h, (void)dst_w, (void)dst_h;
    *out = NULL;
    return H3_ERR(H3_ERR_UNSUPPORTED,
                  "this h3run was built without libswscale (cmake -DH3_MEDIA=OFF): it cannot scale frames");
}
void h3_frame_scaler_run(h3_frame_scaler *s, const uint8_t *src, uint8_t *dst) {
    (void)s, (void)src, (void)dst;
}
void h3_frame_scaler_free(h3_frame_scaler *s) {
    (void)s;
}
#endif

/* ---- MP4
 * ------------------------------------------------------------------------------------------------------- */

h3_status h3_mp4_check_preset(const char *preset, const char *what) {
    static const char *const presets[] = {"ultrafast", "superfast", "veryfast", "faster",   "fast",
                                          "medium",    "slow",      "slower",   "veryslow", "placebo"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(preset, presets[i])) return H3_OK;
    return H3_ERR(
        H3_ERR_INVALID,
        "%s%sunknown x264 preset '%s': choose ultrafast, superfast, veryfast, faster, fast, medium, slow, "
        "slower, veryslow or placebo",
        what ? what : "", what ? ": " : "", preset);
}

void h3_mp4_opts_default(h3_mp4_opts *o, int width, int height) {
    memset(o, 0, sizeof *o);
    o->width = width;
    o->height = height;
    o->fps = 24;
    o->sample_rate = 32000;
    o->channels = 2;
    o->crf = 18;
    o->preset = "medium";
    o->audio_bitrate = 128000;
}

#if H3_HAVE_MEDIA
/* The writer and its encoder thread. Frames wait in a ring of `depth` slots, each a copy of one frame as
 * planar float RGB ([3, height, width], rows contiguous), allocated the first time the ring reaches it. The
 * caller fills the slot after the last queued one and queues it; the thread takes the oldest, converts it to
 * 8 bits and YUV and hands it to x264, and writes the packets that come back. The caller writes the audio
 * itself; mux_mu keeps the two threads' packets apart in the muxer. After the thread has stopped (finish,
 * abort) the caller owns everything again. */
struct h3_mp4 {
    h3_mp4_opts o;
    char *path, *tmp;
    AVFormatContext *oc;
    AVCodecContext *venc, *aenc;
    AVStream *vst, *ast;
    struct SwsContext *sws;
    AVFrame *vframe, *aframe;
    AVPacket *pkt, *vpkt;            /* the caller's (audio, the flush) and the encoder thread's */
    uint8_t *rgb;                    /* [height, width, 3], the encoder thread's */
    uint8_t *src_rgb;                /* [src_height, src_width, 3] before scaling (NULL: no scaling) */
    h3_frame_scaler *scaler;         /* src -> delivery size (NULL: none) */
    int64_t nframes, nsamples, apts; /* frames queued, audio samples written */
    int afill, frame_size, small_last;
    h3_status failed; /* a failure the caller has seen: only finish and abort are accepted after it */
    /* the queue (mu guards head, count, closing, stop and the thread's failure) */
    pthread_mutex_t mu, mux_mu;
    pthread_cond_t cv_work, cv_space;
    int sync_made, thread_on;
    pthread_t thread;
    float **slot; /* [depth] */
    int depth, head, count, closing, stop;
    int64_t encoded;   /* frames the thread has handed to x264 (the next one's pts) */
    h3_status wfailed; /* the encoder thread's failure and its message */
    char wmsg[512];
};

int64_t h3_mp4_frames(const h3_mp4 *m) {
    return m ? m->nframes : 0;
}
int64_t h3_mp4_audio_samples(const h3_mp4 *m) {
    return m ? m->nsamples : 0;
}

/* Tells the encoder thread to stop (stop: at once, dropping what is queued; else once the queue is empty) and
 * waits for it. */
static void stop_encoder(h3_mp4 *m, int stop) {
    if (!m->thread_on) return;
    pthread_mutex_lock(&m->mu);
    if (stop) m->stop = 1;
    m->closing = 1;
    pthread_cond_broadcast(&m->cv_work);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->thread, NULL);
    m->thread_on = 0;
}

static void mp4_free(h3_mp4 *m, int remove_partial) {
    if (!m) return;
    stop_encoder(m, 1);
    avcodec_free_context(&m->venc);
    avcodec_free_context(&m->aenc);
    if (m->oc) {
        if (m->oc->pb) avio_closep(&m->oc->pb);
        avformat_free_context(m->oc);
    }
    sws_freeContext(m->sws);
    av_frame_free(&m->vframe);
    av_frame_free(&m->aframe);
    av_packet_free(&m->pkt);
    av_packet_free(&m->vpkt);
    if (remove_partial && m->tmp) unlink(m->tmp);
    for (int i = 0; m->slot && i < m->depth; i++) h3_free(m->slot[i]);
    h3_free(m->slot);
    if (m->sync_made) {
        pthread_mutex_destroy(&m->mu);
        pthread_mutex_destroy(&m->mux_mu);
        pthread_cond_destroy(&m->cv_work);
        pthread_cond_destroy(&m->cv_space);
    }
    h3_free(m->rgb);
    h3_free(m->src_rgb);
    h3_frame_scaler_free(m->scaler);
    h3_free(m->path);
    h3_free(m->tmp);
    h3_free(m);
}

void h3_mp4_abort(h3_mp4 *m) {
    mp4_free(m, 1);
}

/* Sends a frame (NULL flushes) and writes every packet the encoder returns through pkt. Called by the encoder
 * thread (video) and the caller (audio; the flush once the thread has stopped). */
static h3_status encode(h3_mp4 *m, AVCodecContext *enc, AVStream *st, AVFrame *frame, AVPacket *pkt) {
    char eb[128];
    int r = avcodec_send_frame(enc, frame);
    if (r < 0)
        return H3_ERR(H3_ERR_IO, "%s: encoding %s: %s", m->path, enc->codec->name, averr(r, eb, sizeof eb));
    for (;;) {
        r = avcodec_receive_packet(enc, pkt);
        if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) return H3_OK;
        if (r < 0)
            return H3_ERR(H3_ERR_IO, "%s: encoding %s: %s", m->path, enc->codec->name,
                          averr(r, eb, sizeof eb));
        av_packet_rescale_ts(pkt, enc->time_base, st->time_base);
        pkt->stream_index = st->index;
        pthread_mutex_lock(&m->mux_mu);
        r = av_interleaved_write_frame(m->oc, pkt);
        pthread_mutex_unlock(&m->mux_mu);
        if (r < 0) return H3_ERR(H3_ERR_IO, "%s: writing: %s", m->tmp, averr(r, eb, sizeof eb));
    }
}

static h3_status open_video(h3_mp4 *m) {
    char eb[128], crf[16];
    const AVCodec *codec = avcodec_find_encoder_by_name("libx264");
    if (!codec)
        return H3_ERR(H3_ERR_UNSUPPORTED, "this libavcodec has no libx264 encoder: install a build with x264 "
                                          "(Debian's libavcodec has it)");
    m->vst = avformat_new_stream(m->oc, NULL);
    m->venc = avcodec_alloc_context3(codec);
    if (!m->vst || !m->venc) return H3_ERR(H3_ERR_NOMEM, "out of memory creating the H.264 encoder");
    AVCodecContext *c = m->venc;
    c->width = m->o.width;
    c->height = m->o.height;
    c->pix_fmt = AV_PIX_FMT_YUV420P;
    c->time_base = (AVRational){1, m->o.fps};
    c->framerate = (AVRational){m->o.fps, 1};
    c->sample_aspect_ratio = (AVRational){1, 1};
    c->color_range = AVCOL_RANGE_MPEG;
    c->colorspace = AVCOL_SPC_BT709;
    c->color_primaries = AVCOL_PRI_BT709;
    c->color_trc = AVCOL_TRC_BT709;
    c->thread_count = 0;
    if (m->oc->oformat->flags & AVFMT_GLOBALHEADER) c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    snprintf(crf, sizeof crf, "%d", m->o.crf);
    av_opt_set(c->priv_data, "preset", m->o.preset ? m->o.preset : "medium", 0);
    av_opt_set(c->priv_data, "crf", crf, 0);
    int r = avcodec_open2(c, codec, NULL);
    if (r < 0)
        return H3_ERR(H3_ERR_IO, "opening the H.264 encoder (%dx%d, preset %s): %s", c->width, c->height,
                      m->o.preset ? m->o.preset : "medium", averr(r, eb, sizeof eb));
    r = avcodec_parameters_from_context(m->vst->codecpar, c);
    if (r < 0) return H3_ERR(H3_ERR_NOMEM, "H.264 stream parameters: %s", averr(r, eb, sizeof eb));
    m->vst->time_base = c->time_base;
    m->vst->avg_frame_rate = c->framerate;
    m->vst->sample_aspect_ratio = c->sample_aspect_ratio;

    m->vframe = av_frame_alloc();
    if (!m->vframe) return H3_ERR(H3_ERR_NOMEM, "out of memory for a video frame");
    m->vframe->format = c->pix_fmt;
    m->vframe->width = c->width;
    m->vframe->height = c->height;
    m->vframe->color_range = c->color_range;
    m->vframe->colorspace = c->colorspace;
    m->vframe->color_primaries = c->color_primaries;
    m->vframe->color_trc = c->color_trc;
    r = av_frame_get_buffer(m->vframe, 0);
    if (r < 0) return H3_ERR(H3_ERR_NOMEM, "video frame buffer: %s", averr(r, eb, sizeof eb));

    m->sws = sws_getContext(c->width, c->height, AV_PIX_FMT_RGB24, c->width, c->height, AV_PIX_FMT_YUV420P,
                            SWS_BICUBIC | SWS_ACCURATE_RND, NULL, NULL, NULL);
    if (!m->sws) return H3_ERR(H3_ERR_NOMEM, "creating the RGB to YUV converter");
    /* Source RGB is full range; destination BT.709 limited range, as the stream is tagged. */
    const int *coef709 = sws_getCoefficients(SWS_CS_ITU709);
    sws_setColorspaceDetails(m->sws, coef709, 1, coef709, 0, 0, 1 << 16, 1 << 16);
    size_t nrgb;
    if (!h3_mul_size((size_t)c->width * 3, (size_t)c->height, &nrgb))
        return H3_ERR(H3_ERR_INVALID, "frame too large");
    m->rgb = h3_malloc(nrgb, H3_MEM_IO);
    if (!m->rgb) return H3_ERR(H3_ERR_NOMEM, "out of memory for an RGB frame (%zu bytes)", nrgb);
    if (m->o.src_width != m->o.width || m->o.src_height != m->o.height) {
        H3_TRY(h3_frame_scaler_new(m->o.src_width, m->o.src_height, m->o.width, m->o.height, &m->scaler));
        m->src_rgb = h3_malloc((size_t)m->o.src_width * (size_t)m->o.src_height * 3, H3_MEM_IO);
        if (!m->src_rgb) return H3_ERR(H3_ERR_NOMEM, "out of memory for an RGB frame");
    }
    return H3_OK;
}

static h3_status open_audio(h3_mp4 *m) {
    char eb[128];
    const AVCodec *codec = avcodec_find_encoder_by_name("aac");
    if (!codec) codec = avcodec_find_encoder(AV_CODEC_ID_AAC);
    if (!codec) return H3_ERR(H3_ERR_UNSUPPORTED, "this libavcodec has no AAC encoder");
    m->ast = avformat_new_stream(m->oc, NULL);
    m->aenc = avcodec_alloc_context3(codec);
    if (!m->ast || !m->aenc) return H3_ERR(H3_ERR_NOMEM, "out of memory creating the AAC encoder");
    AVCodecContext *c = m->aenc;
    c->sample_fmt = AV_SAMPLE_FMT_FLTP;
    c->sample_rate = m->o.sample_rate;
    av_channel_layout_default(&c->ch_layout, m->o.channels);
    c->bit_rate = m->o.audio_bitrate;
    c->time_base = (AVRational){1, m->o.sample_rate};
    if (m->oc->oformat->flags & AVFMT_GLOBALHEADER) c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    int r = avcodec_open2(c, codec, NULL);
    if (r < 0)
        return H3_ERR(H3_ERR_IO, "opening the AAC encoder (%d Hz, %d channels): %s", c->sample_rate,
                      m->o.channels, averr(r, eb, sizeof eb));
    r = avcodec_parameters_from_context(m->ast->codecpar, c);
    if (r < 0) return H3_ERR(H3_ERR_NOMEM, "AAC stream parameters: %s", averr(r, eb, sizeof eb));
    m->ast->time_base = c->time_base;
    m->frame_size = c->frame_size > 0 ? c->frame_size : 1024;
    m->small_last = (codec->capabilities & AV_CODEC_CAP_SMALL_LAST_FRAME) != 0;
    m->aframe = av_frame_alloc();
    if (!m->aframe) return H3_ERR(H3_ERR_NOMEM, "out of memory for an audio frame");
    m->aframe->format = c->sample_fmt;
    m->aframe->nb_samples = m->frame_size;
    m->aframe->sample_rate = c->sample_rate;
    r = av_channel_layout_copy(&m->aframe->ch_layout, &c->ch_layout);
    if (r >= 0) r = av_frame_get_buffer(m->aframe, 0);
    if (r < 0) return H3_ERR(H3_ERR_NOMEM, "audio frame buffer: %s", averr(r, eb, sizeof eb));
    return H3_OK;
}

/* One frame from m->rgb through swscale into x264 (the encoder thread). */
static h3_status put_rgb24(h3_mp4 *m) {
    char eb[128];
    int r = av_frame_make_writable(m->vframe);
    if (r < 0) return H3_ERR(H3_ERR_NOMEM, "video frame: %s", averr(r, eb, sizeof eb));
    const uint8_t *src[1] = {m->rgb};
    const int src_stride[1] = {m->o.width * 3};
    sws_scale(m->sws, src, src_stride, 0, m->o.height, m->vframe->data, m->vframe->linesize);
    m->vframe->pts = m->encoded;
    H3_TRY(encode(m, m->venc, m->vst, m->vframe, m->vpkt));
    m->encoded++;
    return H3_OK;
}

/* The encoder thread: the oldest queued frame, converted and encoded, until the queue is closed and empty or
 * the writer stops; a failure is kept for the caller's next call. */
static void *encoder_main(void *arg) {
    h3_mp4 *m = arg;
    const int64_t w = m->o.src_width, h = m->o.src_height;
    pthread_mutex_lock(&m->mu);
    for (;;) {
        while (!m->count && !m->closing) pthread_cond_wait(&m->cv_work, &m->mu);
        if (m->stop || !m->count) break;
        const float *f = m->slot[m->head];
        pthread_mutex_unlock(&m->mu);
        if (m->scaler) { /* to 8 bits at the render size, then Lanczos to the delivery size */
            planar_to_rgb24(f, w * h, w, (int)w, (int)h, m->src_rgb);
            h3_frame_scaler_run(m->scaler, m->src_rgb, m->rgb);
        } else {
            planar_to_rgb24(f, w * h, w, (int)w, (int)h, m->rgb);
        }
        const h3_status st = put_rgb24(m);
        pthread_mutex_lock(&m->mu);
        if (st != H3_OK) {
            m->wfailed = st;
            snprintf(m->wmsg, sizeof m->wmsg, "%s", h3_last_error_message());
            pthread_cond_broadcast(&m->cv_space);
            break;
        }
        m->head = (m->head + 1) % m->depth;
        m->count--;
        pthread_cond_broadcast(&m->cv_space);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

/* The queue's depth for this frame size (H3_MP4_QUEUE_FRAMES, fewer for frames so large that the queue would
 * pass H3_MP4_QUEUE_BYTES, never below 2), and the thread. */
static h3_status start_encoder(h3_mp4 *m) {
    const int64_t frame = (int64_t)3 * m->o.src_width * m->o.src_height * (int64_t)sizeof(float);
    int64_t d = H3_MP4_QUEUE_BYTES / frame;
    m->depth = (int)(d > H3_MP4_QUEUE_FRAMES ? H3_MP4_QUEUE_FRAMES : d < 2 ? 2 : d);
    m->slot = h3_calloc((size_t)m->depth, sizeof *m->slot, H3_MEM_IO);
    if (!m->slot) return H3_ERR(H3_ERR_NOMEM, "out of memory for the frame queue");
    pthread_mutex_init(&m->mu, NULL);
    pthread_mutex_init(&m->mux_mu, NULL);
    pthread_cond_init(&m->cv_work, NULL);
    pthread_cond_init(&m->cv_space, NULL);
    m->sync_made = 1;
    const int r = pthread_create(&m->thread, NULL, encoder_main, m);
    if (r != 0) return H3_ERR(H3_ERR_NOMEM, "cannot start the video encoder's thread: %s", strerror(r));
    m->thread_on = 1;
    return H3_OK;
}

h3_status h3_mp4_open(const char *path, const h3_mp4_opts *opts, h3_mp4 **out) {
    *out = NULL;
    pthread_once(&g_av_once, av_setup);
    const h3_mp4_opts *o = opts;
    if (!path || !*path) return H3_ERR(H3_ERR_INVALID, "an output path is required");
    if (o->width <= 0 || o->height <= 0 || o->width % 2 || o->height % 2 || o->width > 16384 ||
        o->height > 16384)
        return H3_ERR(H3_ERR_INVALID, "%s: H.264 4:2:0 needs an even frame size up to 16384; got %dx%d", path,
                      o->width, o->height);
    if (o->src_width < 0 || o->src_height < 0 || o->src_width > 16384 || o->src_height > 16384 ||
        !o->src_width != !o->src_height)
        return H3_ERR(H3_ERR_INVALID, "%s: bad source frame size %dx%d", path, o->src_width, o->src_height);
    if (o->fps < 1 || o->fps > 240)
        return H3_ERR(H3_ERR_INVALID, "%s: fps must be 1..240; got %d", path, o->fps);
    if (o->sample_rate &&
        (o->sample_rate < 8000 || o->sample_rate > 192000 || o->channels < 1 || o->channels > 2))
        return H3_ERR(H3_ERR_INVALID,
                      "%s: audio must be 8..192 kHz with 1 or 2 channels; got %d Hz, %d channels", path,
                      o->sample_rate, o->channels);
    if (o->crf < 0 || o->crf > 51)
        return H3_ERR(H3_ERR_INVALID, "%s: crf must be 0..51; got %d", path, o->crf);
    /* x264 prints an unknown preset to stderr itself: check the name first. */
    if (o->preset) H3_TRY(h3_mp4_check_preset(o->preset, path));

    h3_status st = H3_OK;
    char eb[128];
    h3_mp4 *m = h3_calloc(1, sizeof *m, H3_MEM_IO);
    if (!m) return H3_ERR(H3_ERR_NOMEM, "out of memory for an MP4 writer");
    m->o = *o;
    if (m->o.audio_bitrate <= 0) m->o.audio_bitrate = 128000;
    if (!m->o.src_width) {
        m->o.src_width = m->o.width;
        m->o.src_height = m->o.height;
    }
    m->path = h3_strdup(path);
    if (!m->path) H3_FAIL(H3_ERR_NOMEM, "out of memory for an MP4 writer");
    /* The temporary file is created here (a fresh regular file; see base/fs.h), then opened by libavformat.
     */
    H3_CHECK(h3_out_reserve(path, &m->tmp));

    int r = avformat_alloc_output_context2(&m->oc, NULL, "mp4", m->tmp);
    if (r < 0 || !m->oc) H3_FAIL(H3_ERR_NOMEM, "creating the MP4 muxer: %s", averr(r, eb, sizeof eb));
    H3_CHECK_CTX(open_video(m), "%s", path);
    if (m->o.sample_rate) H3_CHECK_CTX(open_audio(m), "%s", path);
    m->pkt = av_packet_alloc();
    m->vpkt = av_packet_alloc();
    if (!m->pkt || !m->vpkt) H3_FAIL(H3_ERR_NOMEM, "out of memory for a packet");

    r = avio_open(&m->oc->pb, m->tmp, AVIO_FLAG_WRITE);
    if (r < 0) H3_FAIL(H3_ERR_IO, "cannot create %s: %s", m->tmp, averr(r, eb, sizeof eb));
    AVDictionary *mux_opts = NULL;
    av_dict_set(&mux_opts, "movflags", "+faststart", 0);
    r = avformat_write_header(m->oc, &mux_opts);
    av_dict_free(&mux_opts);
    if (r < 0) H3_FAIL(H3_ERR_IO, "%s: writing the MP4 header: %s", m->tmp, averr(r, eb, sizeof eb));
    H3_CHECK(start_encoder(m));
done:
    if (st != H3_OK) {
        mp4_free(m, 1);
        return st;
    }
    *out = m;
    return H3_OK;
}

/* The encoder thread's failure, reported once with its own message; from then on the writer is failed. */
static h3_status encoder_failure(h3_mp4 *m) {
    pthread_mutex_lock(&m->mu);
    const h3_status wf = m->wfailed;
    char msg[sizeof m->wmsg];
    snprintf(msg, sizeof msg, "%s", m->wmsg);
    pthread_mutex_unlock(&m->mu);
    if (wf == H3_OK) return H3_OK;
    m->failed = wf;
    return H3_ERR(wf, "%s", msg);
}

static h3_status check_usable(h3_mp4 *m) {
    if (!m) return H3_ERR(H3_ERR_INVALID, "no MP4 writer");
    if (m->failed)
        return H3_ERR(m->failed, "%s: an earlier write failed; the file was not finished", m->path);
    return encoder_failure(m);
}

h3_status h3_mp4_write_frame(h3_mp4 *m, const float *rgb, int64_t plane_stride, int64_t row_stride) {
    H3_TRY(check_usable(m));
    const int64_t w = m->o.src_width, h = m->o.src_height;
    if (!rgb || row_stride < w || plane_stride < row_stride * (h - 1) + w) {
        m->failed = H3_ERR_INVALID;
        return H3_ERR(H3_ERR_INVALID,
                      "%s: frame %lld: planes of %dx%d floats do not fit plane stride %lld, row stride %lld",
                      m->path, (long long)m->nframes, m->o.src_width, m->o.src_height,
                      (long long)plane_stride, (long long)row_stride);
    }
    /* a free slot: the one after the queued frames (the thread reads only those) */
    pthread_mutex_lock(&m->mu);
    while (m->count == m->depth && m->wfailed == H3_OK) pthread_cond_wait(&m->cv_space, &m->mu);
    const int k = (m->head + m->count) % m->depth;
    pthread_mutex_unlock(&m->mu);
    H3_TRY(encoder_failure(m));
    if (!m->slot[k]) {
        m->slot[k] = h3_malloc((size_t)(3 * w * h) * sizeof(float), H3_MEM_IO);
        if (!m->slot[k]) {
            m->failed = H3_ERR_NOMEM;
            return H3_ERR(H3_ERR_NOMEM, "%s: out of memory for the frame queue (%lld bytes a frame)", m->path,
                          (long long)(3 * w * h * (int64_t)sizeof(float)));
        }
    }
    for (int64_t c = 0; c < 3; c++)
        for (int64_t y = 0; y < h; y++)
            memcpy(m->slot[k] + (c * h + y) * w, rgb + c * plane_stride + y * row_stride,
                   (size_t)w * sizeof(float));
    pthread_mutex_lock(&m->mu);
    m->count++;
    pthread_cond_signal(&m->cv_work);
    pthread_mutex_unlock(&m->mu);
    m->nframes++;
    return H3_OK;
}

static h3_status flush_audio_frame(h3_mp4 *m, int nb) {
    m->aframe->nb_samples = nb;
    m->aframe->pts = m->apts;
    m->apts += nb;
    h3_status st = encode(m, m->aenc, m->ast, m->aframe, m->pkt);
    m->afill = 0;
    return st;
}

h3_status h3_mp4_write_audio(h3_mp4 *m, const float *left, const float *right, int64_t n) {
    H3_TRY(check_usable(m));
    if (!m->aenc) {
        m->failed = H3_ERR_INVALID;
        return H3_ERR(H3_ERR_INVALID, "%s: the writer was opened without an audio track", m->path);
    }
    if (n < 0 || (n > 0 && !left)) {
        m->failed = H3_ERR_INVALID;
        return H3_ERR(H3_ERR_INVALID, "%s: bad audio buffer (%lld samples)", m->path, (long long)n);
    }
    if (!right) right = left;
    char eb[128];
    int64_t i = 0;
    while (i < n) {
        if (m->afill == 0) {
            int r = av_frame_make_writable(m->aframe);
            if (r < 0) {
                m->failed = H3_ERR_NOMEM;
                return H3_ERR(H3_ERR_NOMEM, "audio frame: %s", averr(r, eb, sizeof eb));
            }
            m->aframe->nb_samples = m->frame_size;
        }
        int64_t take = m->frame_size - m->afill;
        if (take > n - i) take = n - i;
        float *dl = (float *)m->aframe->data[0] + m->afill;
        for (int64_t k = 0; k < take; k++) dl[k] = left[i + k];
        if (m->o.channels == 2) {
            float *dr = (float *)m->aframe->data[1] + m->afill;
            for (int64_t k = 0; k < take; k++) dr[k] = right[i + k];
        }
        m->afill += (int)take;
        i += take;
        m->nsamples += take;
        if (m->afill == m->frame_size) {
            h3_status st = flush_audio_frame(m, m->frame_size);
            if (st != H3_OK) {
                m->failed = st;
                return st;
            }
        }
    }
    return H3_OK;
}

h3_status h3_mp4_finish(h3_mp4 *m) {
    if (!m) return H3_ERR(H3_ERR_INVALID, "no MP4 writer");
    stop_encoder(m, m->failed != H3_OK); /* the queued frames are encoded first */
    h3_status st = check_usable(m);
    char eb[128];
    if (st != H3_OK) goto done;
    if (m->nframes == 0) H3_FAIL(H3_ERR_INVALID, "%s: no video frames were written", m->path);
    if (m->aenc) {
        if (m->afill > 0) {
            int nb = m->afill;
            if (!m->small_last) { /* pad the last frame with silence */
                for (int c = 0; c < m->o.channels; c++)
                    memset((float *)m->aframe->data[c] + m->afill, 0,
                           (size_t)(m->frame_size - m->afill) * sizeof(float));
                nb = m->frame_size;
            }
            H3_CHECK(flush_audio_frame(m, nb));
        }
        H3_CHECK(encode(m, m->aenc, m->ast, NULL, m->pkt));
    }
    H3_CHECK(encode(m, m->venc, m->vst, NULL, m->pkt));
    int r = av_write_trailer(m->oc);
    if (r < 0) H3_FAIL(H3_ERR_IO, "%s: finishing the MP4: %s", m->tmp, averr(r, eb, sizeof eb));
    r = avio_closep(&m->oc->pb);
    if (r < 0) H3_FAIL(H3_ERR_IO, "%s: closing: %s", m->tmp, averr(r, eb, sizeof eb));
    st = h3_out_place(m->tmp, m->path, 0); /* or to the open output group; on failure the file is removed */
done:
    mp4_free(m, st != H3_OK);
    return st;
}
#else /* built without libav (-DH3_MEDIA=OFF): every MP4 call says so */

#define H3_NO_MEDIA_MSG                                                                                      \
    "this h3run was built without MP4 and PNG support (cmake -DH3_MEDIA=OFF): rebuild with libav"
struct h3_mp4 {
    int unused;
};
h3_status h3_mp4_open(const char *path, const h3_mp4_opts *opts, h3_mp4 **out) {
    (void)opts;
    *out = NULL;
    return H3_ERR(H3_ERR_UNSUPPORTED, "%s: " H3_NO_MEDIA_MSG, path);
}
int64_t h3_mp4_frames(const h3_mp4 *m) {
    (void)m;
    return 0;
}
int64_t h3_mp4_audio_samples(const h3_mp4 *m) {
    (void)m;
    return 0;
}
h3_status h3_mp4_write_frame(h3_mp4 *m, const float *rgb, int64_t plane_stride, int64_t row_stride) {
    (void)m, (void)rgb, (void)plane_stride, (void)row_stride;
    return H3_ERR(H3_ERR_UNSUPPORTED, H3_NO_MEDIA_MSG);
}
h3_status h3_mp4_write_audio(h3_mp4 *m, const float *left, const float *right, int64_t n) {
    (void)m, (void)left, (void)right, (void)n;
    return H3_ERR(H3_ERR_UNSUPPORTED, H3_NO_MEDIA_MSG);
}
h3_status h3_mp4_finish(h3_mp4 *m) {
    (void)m;
    return H3_ERR(H3_ERR_UNSUPPORTED, H3_NO_MEDIA_MSG);
}
void h3_mp4_abort(h3_mp4 *m) {
    (void)m;
}
#endif

/* ---- PNG
 * ---------------------------------------------------------------------------------------------------------
 */

#if H3_HAVE_MEDIA
static h3_status png_encode_write(const char *path, const uint8_t *rgb24, int w, int h, int now) {
    pthread_once(&g_av_once, av_setup);
    char eb[128];
    h3_status st = H3_OK;
    AVCodecContext *c = NULL;
    AVFrame *f = NULL;
    AVPacket *pkt = NULL;
    h3_outfile of = {0};
    int opened = 0;
    const AVCodec *codec = avcodec_find_encoder(AV_CODEC_ID_PNG);
    if (!codec) return H3_ERR(H3_ERR_UNSUPPORTED, "this libavcodec has no PNG encoder");
    c = avcodec_alloc_context3(codec);
    f = av_frame_alloc();
    pkt = av_packet_alloc();
    if (!c || !f || !pkt) H3_FAIL(H3_ERR_NOMEM, "out of memory for the PNG encoder");
    c->width = w;
    c->height = h;
    c->pix_fmt = AV_PIX_FMT_RGB24;
    c->time_base = (AVRational){1, 24};
    int r = avcodec_open2(c, codec, NULL);
    if (r < 0) H3_FAIL(H3_ERR_IO, "%s: opening the PNG encoder: %s", path, averr(r, eb, sizeof eb));
    f->format = AV_PIX_FMT_RGB24;
    f->width = w;
    f->height = h;
    f->data[0] = (uint8_t *)rgb24;
    f->linesize[0] = w * 3;
    f->pts = 0;
    r = avcodec_send_frame(c, f);
    if (r >= 0) r = avcodec_send_frame(c, NULL);
    if (r < 0) H3_FAIL(H3_ERR_IO, "%s: PNG encoding: %s", path, averr(r, eb, sizeof eb));
    H3_CHECK(h3_out_open(path, &of));
    opened = 1;
    for (;;) {
        r = avcodec_receive_packet(c, pkt);
        if (r == AVERROR_EOF || r == AVERROR(EAGAIN)) break;
        if (r < 0) H3_FAIL(H3_ERR_IO, "%s: PNG encoding: %s", path, averr(r, eb, sizeof eb));
        if (fwrite(pkt->data, 1, (size_t)pkt->size, of.f) != (size_t)pkt->size)
            H3_FAIL(H3_ERR_IO, "%s: writing: %s", of.tmp_path, strerror(errno));
        av_packet_unref(pkt);
    }
    opened = 0;
    H3_CHECK(now ? h3_out_commit_now(&of) : h3_out_commit(&of));
done:
    if (opened) h3_out_abort(&of);
    avcodec_free_context(&c);
    av_frame_free(&f);
    av_packet_free(&pkt);
    return st;
}

#else
static h3_status png_encode_write(const char *path, const uint8_t *rgb24, int w, int h, int now) {
    (void)rgb24, (void)w, (void)h, (void)now;
    return H3_ERR(H3_ERR_UNSUPPORTED, "%s: " H3_NO_MEDIA_MSG, path);
}
#endif

/* One frame, converted and encoded; now: renamed into place at once (a file inside a temporary folder). */
static h3_status png_write(const char *path, const float *rgb, int64_t plane_stride, int64_t row_stride,
                           int width, int height, int now) {
    if (width <= 0 || height <= 0 || width > 16384 || height > 16384 || !rgb || row_stride < width ||
        plane_stride < row_stride * (height - 1) + width)
        return H3_ERR(H3_ERR_INVALID, "%s: bad PNG frame (%dx%d, plane stride %lld, row stride %lld)", path,
                      width, height, (long long)plane_stride, (long long)row_stride);
    uint8_t *buf = h3_malloc((size_t)width * (size_t)height * 3, H3_MEM_IO);
    if (!buf) return H3_ERR(H3_ERR_NOMEM, "out of memory for a PNG frame");
    planar_to_rgb24(rgb, plane_stride, row_stride, width, height, buf);
    h3_status st = png_encode_write(path, buf, width, height, now);
    h3_free(buf);
    return st;
}

h3_status h3_png_write(const char *path, const float *rgb, int64_t plane_stride, int64_t row_stride,
                       int width, int height) {
    return png_write(path, rgb, plane_stride, row_stride, width, height, 0);
}

/* 1 when every entry of dir is a name this writer uses (frame_NNNNN.png, and its .partial), i.e. the folder
 * is a temporary folder an interrupted run left. */
static int only_frames(const char *dir) {
    char **names = NULL;
    int n = 0;
    if (h3_list_dir(dir, &names, &n) != H3_OK) {
        h3_clear_error();
        return 0;
    }
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        const char *e = names[i];
        ok = h3_str_starts_with(e, "frame_") &&
             (h3_str_ends_with(e, ".png") || h3_str_ends_with(e, ".png.partial"));
    }
    h3_strlist_free(names, n);
    return ok;
}

static h3_status png_seq_dir(const char *dir, h3_png_seq *out);

h3_status h3_png_seq_open(const char *dir, int width, int height, h3_png_seq *out) {
    return h3_png_seq_open_scaled(dir, width, height, width, height, out);
}

h3_status h3_png_seq_open_scaled(const char *dir, int src_w, int src_h, int width, int height,
                                 h3_png_seq *out) {
    memset(out, 0, sizeof *out);
    if (width <= 0 || height <= 0 || src_w <= 0 || src_h <= 0)
        return H3_ERR(H3_ERR_INVALID, "%s: bad PNG size %dx%d", dir, width, height);
    if (src_w != width || src_h != height) {
        H3_TRY(h3_frame_scaler_new(src_w, src_h, width, height, &out->scaler));
        out->src_rgb = h3_malloc((size_t)src_w * (size_t)src_h * 3, H3_MEM_IO);
        out->dst_rgb = h3_malloc((size_t)width * (size_t)height * 3, H3_MEM_IO);
        if (!out->src_rgb || !out->dst_rgb) {
            h3_png_seq_close(out);
            return H3_ERR(H3_ERR_NOMEM, "out of memory for a scaled PNG frame");
        }
    }
    out->src_width = src_w;
    out->src_height = src_h;
    out->width = width;
    out->height = height;
    h3_status ps = png_seq_dir(dir, out);
    if (ps != H3_OK) h3_png_seq_close(out);
    return ps;
}

/* The sequence's folders: DIR checked, DIR.partial made (out's scaler already set). */
static h3_status png_seq_dir(const char *dir, h3_png_seq *out) {
    if (h3_path_exists(dir) && !h3_path_is_dir(dir))
        return H3_ERR(H3_ERR_IO, "%s exists and is not a folder", dir);
    if (h3_path_is_dir(dir)) {
        char **names = NULL;
        int n = 0;
        H3_TRY(h3_list_dir(dir, &names, &n));
        h3_strlist_free(names, n);
        if (n > 0)
            return H3_ERR(H3_ERR_IO,
                          "%s is a folder that is not empty: frames go into a new or empty folder (nothing "
                          "already there is mixed with them or deleted)",
                          dir);
    }
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    char *tmp = h3_malloc(len + 9, H3_MEM_IO);
    out->dir = h3_strndup(dir, len);
    if (!out->dir || !tmp) {
        h3_free(tmp);
        h3_png_seq_close(out);
        return H3_ERR(H3_ERR_NOMEM, "out of memory");
    }
    snprintf(tmp, len + 9, "%s.partial", out->dir);
    h3_status s = H3_OK;
    struct stat st;
    if (lstat(tmp, &st) == 0) { /* an interrupted run's: reused when it holds only frames */
        if (!S_ISDIR(st.st_mode) || !only_frames(tmp))
            s = H3_ERR(
                H3_ERR_IO,
                "%s exists and is not a temporary folder of frames h3run left; frames are written there "
                "first: remove it",
                tmp);
        else
            h3_out_remove_dir(tmp);
    }
    if (s == H3_OK && mkdir(tmp, 0777) != 0)
        s = H3_ERR(H3_ERR_IO, "cannot create the folder %s: %s", tmp, strerror(errno));
    if (s != H3_OK) { /* nothing of ours to remove: what is at tmp stays */
        h3_free(tmp);
        h3_png_seq_close(out);
        return s;
    }
    out->tmp = tmp; /* from here on the folder is this sequence's: h3_png_seq_close removes it */
    return H3_OK;
}

h3_status h3_png_seq_write(h3_png_seq *s, const float *rgb, int64_t plane_stride, int64_t row_stride) {
    if (!s->tmp) return H3_ERR(H3_ERR_INVALID, "the PNG sequence is not open");
    char name[32];
    snprintf(name, sizeof name, "frame_%05lld.png", (long long)s->next);
    char *path = h3_path_join(s->tmp, name);
    if (!path) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    h3_status st;
    if (s->scaler) { /* as the MP4 writer scales: 8 bits at the given size, then Lanczos */
        const int w = s->src_width, h = s->src_height;
        if (!rgb || row_stride < w || plane_stride < row_stride * (h - 1) + w)
            st = H3_ERR(H3_ERR_INVALID, "%s: bad PNG frame (%dx%d, plane stride %lld, row stride %lld)", path,
                        w, h, (long long)plane_stride, (long long)row_stride);
        else {
            planar_to_rgb24(rgb, plane_stride, row_stride, w, h, s->src_rgb);
            h3_frame_scaler_run(s->scaler, s->src_rgb, s->dst_rgb);
            st = png_encode_write(path, s->dst_rgb, s->width, s->height, 1);
        }
    } else {
        st = png_write(path, rgb, plane_stride, row_stride, s->width, s->height, 1);
    }
    h3_free(path);
    if (st == H3_OK) s->next++;
    return st;
}

h3_status h3_png_seq_finish(h3_png_seq *s) {
    if (!s->tmp) return H3_ERR(H3_ERR_INVALID, "the PNG sequence is not open");
    h3_status st = h3_out_place(s->tmp, s->dir, 1); /* removes the temporary folder when it fails */
    h3_free(s->tmp);
    s->tmp = NULL;
    h3_png_seq_close(s);
    return st;
}

void h3_png_seq_close(h3_png_seq *s) {
    if (s->tmp) h3_out_remove_dir(s->tmp);
    h3_free(s->dir);
    h3_free(s->tmp);
    h3_frame_scaler_free(s->scaler);
    h3_free(s->src_rgb);
    h3_free(s->dst_rgb);
    memset(s, 0, sizeof *s);
}

/* ---- WAV
 * ---------------------------------------------------------------------------------------------------------
 */

static void le16(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void le32(uint8_t *p, uint32_t v) {
    le16(p, v);
    le16(p + 2, v >> 16);
}

static int16_t to_s16(float x) {
    if (!(x == x)) return 0;
    if (x >= 1.0f) return 32767;
    if (x <= -1.0f) return -32767;
    return (int16_t)lrint((double)x * 32767.0);
}

h3_status h3_wav_write(const char *path, const float *left, const float *right, int64_t n, int channels,
                       int sample_rate) {
    if (channels < 1 || channels > 2 || sample_rate < 1 || n < 0 || (n > 0 && !left))
        return H3_ERR(H3_ERR_INVALID, "%s: bad WAV request (%d channels, %d Hz, %lld samples)", path,
                      channels, sample_rate, (long long)n);
    uint64_t data_bytes = (uint64_t)n * (uint64_t)channels * 2;
    if (data_bytes > 0xFFFFFFFFu - 36)
        return H3_ERR(H3_ERR_INVALID, "%s: %lld samples do not fit a WAV file (4 GB)", path, (long long)n);
    if (!right) right = left;
    h3_status st = H3_OK;
    h3_outfile of = {0};
    int opened = 0;
    enum { CHUNK = 4096 };
    int16_t *buf = h3_malloc(CHUNK * 2 * sizeof(int16_t), H3_MEM_IO);
    if (!buf) return H3_ERR(H3_ERR_NOMEM, "out of memory for WAV output");
    uint8_t hdr[44];
    memcpy(hdr, "RIFF", 4);
    le32(hdr + 4, (uint32_t)(36 + data_bytes));
    memcpy(hdr + 8, "WAVEfmt ", 8);
    le32(hdr + 16, 16);
    le16(hdr + 20, 1); /* PCM */
    le16(hdr + 22, (uint32_t)channels);
    le32(hdr + 24, (uint32_t)sample_rate);
    le32(hdr + 28, (uint32_t)sample_rate * (uint32_t)channels * 2);
    le16(hdr + 32, (uint32_t)channels * 2);
    le16(hdr + 34, 16);
    memcpy(hdr + 36, "data", 4);
    le32(hdr + 40, (uint32_t)data_bytes);
    H3_CHECK(h3_out_open(path, &of));
    opened = 1;
    if (fwrite(hdr, 1, sizeof hdr, of.f) != sizeof hdr)
        H3_FAIL(H3_ERR_IO, "%s: writing: %s", of.tmp_path, strerror(errno));
    for (int64_t i = 0; i < n; i += CHUNK) {
        int64_t m = n - i < CHUNK ? n - i : CHUNK;
        for (int64_t k = 0; k < m; k++) {
            int16_t l = to_s16(left[i + k]);
            if (channels == 2) {
                int16_t r = to_s16(right[i + k]);
                uint8_t *p = (uint8_t *)&buf[2 * k];
                le16(p, (uint16_t)l);
                le16(p + 2, (uint16_t)r);
            } else {
                le16((uint8_t *)&buf[k], (uint16_t)l);
            }
        }
        size_t bytes = (size_t)m * (size_t)channels * 2;
        if (fwrite(buf, 1, bytes, of.f) != bytes)
            H3_FAIL(H3_ERR_IO, "%s: writing: %s", of.tmp_path, strerror(errno));
    }
    opened = 0;
    H3_CHECK(h3_out_commit(&of));
done:
    if (opened) h3_out_abort(&of);
    h3_free(buf);
    return st;
}
