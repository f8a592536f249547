/* Reading a clip back (media.h, h3_clip_read): the first video and audio streams of any file libavformat
 * opens, decoded whole into memory: frames to planar float RGB (BT.709 limited range, as h3run writes them),
 * sound to float per channel. For checks of what was written (the adherence check, tests), not for long
 * videos. */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "pipeline/geometry.h"
#include "pipeline/media.h"

#if H3_HAVE_MEDIA
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/opt.h>
#include <libavutil/pixdesc.h>
#include <libswresample/swresample.h>
#include <libswscale/swscale.h>

static h3_status av_fail(int err, const char *what, const char *path) {
    char msg[128];
    av_strerror(err, msg, sizeof msg);
    return H3_ERR(H3_ERR_IO, "%s %s: %s", what, path, msg);
}

/* Opens a regular file (libavformat would wait on a FIFO forever) with libavformat and reads its streams' info;
 * what names the file in messages ("the image"; NULL: a clip). */
static h3_status open_media(const char *path, const char *what, AVFormatContext **fmt) {
    int fd;
    H3_TRY(h3_open_input(path, &fd, NULL));
    close(fd);
    char msg[64];
    int e = avformat_open_input(fmt, path, NULL, NULL);
    if (e < 0) {
        snprintf(msg, sizeof msg, "opening%s%s", what ? " " : "", what ? what : "");
        return av_fail(e, msg, path);
    }
    if ((e = avformat_find_stream_info(*fmt, NULL)) < 0) {
        snprintf(msg, sizeof msg, "reading %s", what ? what : "the streams of");
        return av_fail(e, msg, path);
    }
    return H3_OK;
}

/* Appends to a growing float array. */
static int grow(float **a, int64_t *cap, int64_t need) {
    if (need <= *cap) return 1;
    int64_t nc = *cap ? *cap : 1 << 16;
    while (nc < need) nc *= 2;
    float *n = h3_realloc(*a, (size_t)nc * sizeof(float), H3_MEM_IO);
    if (!n) return 0;
    *a = n;
    *cap = nc;
    return 1;
}

typedef struct {
    h3_clip *c;
    struct SwsContext *sws;
    uint8_t *rgb24;
    int64_t cap_rgb, cap_l, cap_r;
} reader;

static h3_status take_video(reader *r, const AVFrame *f) {
    h3_clip *c = r->c;
    if (!r->sws) {
        c->width = f->width;
        c->height = f->height;
        r->sws = sws_getContext(f->width, f->height, (enum AVPixelFormat)f->format, f->width, f->height,
                                AV_PIX_FMT_RGB24, SWS_BILINEAR, NULL, NULL, NULL);
        r->rgb24 = h3_malloc((size_t)f->width * f->height * 3, H3_MEM_IO);
        if (!r->sws || !r->rgb24) return H3_ERR(H3_ERR_NOMEM, "out of memory for the frame converter");
        const int *coef709 = sws_getCoefficients(SWS_CS_ITU709);
        sws_setColorspaceDetails(r->sws, coef709, 0, coef709, 1, 0, 1 << 16, 1 << 16);
    }
    if (f->width != c->width || f->height != c->height)
        return H3_ERR(H3_ERR_FORMAT, "the video changes size mid-stream (%dx%d to %dx%d)", c->width,
                      c->height, f->width, f->height);
    uint8_t *dst[1] = {r->rgb24};
    int dst_stride[1] = {3 * c->width};
    sws_scale(r->sws, (const uint8_t *const *)f->data, f->linesize, 0, f->height, dst, dst_stride);
    const int64_t P = (int64_t)c->width * c->height;
    if (!grow(&c->rgb, &r->cap_rgb, (c->frames + 1) * 3 * P)) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    float *o = c->rgb + c->frames * 3 * P;
    for (int64_t i = 0; i < P; i++)
        for (int k = 0; k < 3; k++) o[k * P + i] = r->rgb24[3 * i + k] / 255.0f;
    c->frames++;
    return H3_OK;
}

static float sample_at(const AVFrame *f, int ch, int i) {
    const int planar = av_sample_fmt_is_planar((enum AVSampleFormat)f->format);
    const int nch = f->ch_layout.nb_channels;
    const uint8_t *base = planar ? f->extended_data[ch] : f->extended_data[0];
    const int idx = planar ? i : i * nch + ch;
    switch (av_get_packed_sample_fmt((enum AVSampleFormat)f->format)) {
        case AV_SAMPLE_FMT_FLT:
            return ((const float *)base)[idx];
        case AV_SAMPLE_FMT_DBL:
            return (float)((const double *)base)[idx];
        case AV_SAMPLE_FMT_S16:
            return ((const int16_t *)base)[idx] / 32768.0f;
        case AV_SAMPLE_FMT_S32:
            return (float)(((const int32_t *)base)[idx] / 2147483648.0);
        default:
            return 0.0f;
    }
}

static h3_status take_audio(reader *r, const AVFrame *f) {
    h3_clip *c = r->c;
    const int nch = f->ch_layout.nb_channels;
    c->channels = nch;
    c->sample_rate = f->sample_rate;
    if (!grow(&c->left, &r->cap_l, c->samples + f->nb_samples) ||
        !grow(&c->right, &r->cap_r, c->samples + f->nb_samples))
        return H3_ERR(H3_ERR_NOMEM, "out of memory");
    for (int i = 0; i < f->nb_samples; i++) {
        c->left[c->samples + i] = sample_at(f, 0, i);
        c->right[c->samples + i] = sample_at(f, nch > 1 ? 1 : 0, i);
    }
    c->samples += f->nb_samples;
    return H3_OK;
}

/* Sends pkt (NULL: flush) to dec and takes every frame it gives. */
static h3_status decode(reader *r, AVCodecContext *dec, const AVPacket *pkt, AVFrame *fr, int video,
                        const char *path) {
    int e = avcodec_send_packet(dec, pkt);
    if (e < 0 && e != AVERROR_EOF) return av_fail(e, "decoding", path);
    for (;;) {
        e = avcodec_receive_frame(dec, fr);
        if (e == AVERROR(EAGAIN) || e == AVERROR_EOF) return H3_OK;
        if (e < 0) return av_fail(e, "decoding", path);
        h3_status st = video ? take_video(r, fr) : take_audio(r, fr);
        av_frame_unref(fr);
        if (st != H3_OK) return st;
    }
}

static h3_status open_dec(AVFormatContext *fmt, int idx, AVCodecContext **out, const char *path) {
    const AVCodecParameters *par = fmt->streams[idx]->codecpar;
    const AVCodec *codec = avcodec_find_decoder(par->codec_id);
    if (!codec)
        return H3_ERR(H3_ERR_UNSUPPORTED, "%s: no decoder for its %s stream", path,
                      avcodec_get_name(par->codec_id));
    AVCodecContext *d = avcodec_alloc_context3(codec);
    if (!d) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    int e = avcodec_parameters_to_context(d, par);
    if (e >= 0) e = avcodec_open2(d, codec, NULL);
    if (e < 0) {
        avcodec_free_context(&d);
        return av_fail(e, "opening the decoder of", path);
    }
    *out = d;
    return H3_OK;
}

h3_status h3_clip_read(const char *path, h3_clip *out) {
    memset(out, 0, sizeof *out);
    AVFormatContext *fmt = NULL;
    AVCodecContext *vd = NULL, *ad = NULL;
    AVPacket *pkt = av_packet_alloc();
    AVFrame *fr = av_frame_alloc();
    reader r;
    memset(&r, 0, sizeof r);
    r.c = out;
    h3_status st = H3_OK;
    int e;
    if (!pkt || !fr) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    H3_CHECK(open_media(path, NULL, &fmt));
    const int vi = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, NULL, 0);
    const int ai = av_find_best_stream(fmt, AVMEDIA_TYPE_AUDIO, -1, -1, NULL, 0);
    if (vi < 0) H3_FAIL(H3_ERR_FORMAT, "%s has no video stream", path);
    H3_CHECK(open_dec(fmt, vi, &vd, path));
    if (ai >= 0) H3_CHECK(open_dec(fmt, ai, &ad, path));
    {
        AVRational fr_rate = fmt->streams[vi]->avg_frame_rate;
        out->fps = fr_rate.den ? av_q2d(fr_rate) : 0;
    }
    while ((e = av_read_frame(fmt, pkt)) >= 0) {
        if (pkt->stream_index == vi)
            st = decode(&r, vd, pkt, fr, 1, path);
        else if (ad && pkt->stream_index == ai)
            st = decode(&r, ad, pkt, fr, 0, path);
        av_packet_unref(pkt);
        if (st != H3_OK) goto done;
    }
    if (e != AVERROR_EOF) {
        st = av_fail(e, "reading", path);
        goto done;
    }
    H3_CHECK(decode(&r, vd, NULL, fr, 1, path));
    if (ad) H3_CHECK(decode(&r, ad, NULL, fr, 0, path));
    if (out->frames == 0) H3_FAIL(H3_ERR_FORMAT, "%s: its video stream holds no frames", path);
done:
    sws_freeContext(r.sws);
    h3_free(r.rgb24);
    avcodec_free_context(&vd);
    avcodec_free_context(&ad);
    avformat_close_input(&fmt);
    av_packet_free(&pkt);
    av_frame_free(&fr);
    if (st != H3_OK) h3_clip_free(out);
    return st;
}

/* A converter of decoded pictures like fr to packed RGB8 at their size, with the file's own range and matrix:
 * JPEG's full-range "yuvj" formats as their plain twins with the range said (swscale's way); limited range only
 * for YUV that does not say full (grey, palette and RGB pictures are full range). NULL when out of memory. */
static struct SwsContext *rgb_sws(const AVFrame *fr) {
    enum AVPixelFormat pf = (enum AVPixelFormat)fr->format;
    const AVPixFmtDescriptor *d = av_pix_fmt_desc_get(pf);
    const int yuv = d && d->nb_components >= 3 && !(d->flags & (AV_PIX_FMT_FLAG_RGB | AV_PIX_FMT_FLAG_PAL));
    int full = !yuv || fr->color_range == AVCOL_RANGE_JPEG;
    static const enum AVPixelFormat jf[][2] = {{AV_PIX_FMT_YUVJ420P, AV_PIX_FMT_YUV420P},
                                               {AV_PIX_FMT_YUVJ422P, AV_PIX_FMT_YUV422P},
                                               {AV_PIX_FMT_YUVJ444P, AV_PIX_FMT_YUV444P},
                                               {AV_PIX_FMT_YUVJ440P, AV_PIX_FMT_YUV440P},
                                               {AV_PIX_FMT_YUVJ411P, AV_PIX_FMT_YUV411P}};
    for (size_t i = 0; i < sizeof jf / sizeof jf[0]; i++)
        if (pf == jf[i][0]) {
            pf = jf[i][1];
            full = 1;
        }
    struct SwsContext *sws = sws_getContext(fr->width, fr->height, pf, fr->width, fr->height, AV_PIX_FMT_RGB24,
                                            SWS_POINT | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT, NULL, NULL, NULL);
    if (sws) {
        const int *coef = sws_getCoefficients(fr->colorspace == AVCOL_SPC_BT709 ? SWS_CS_ITU709 : SWS_CS_ITU601);
        sws_setColorspaceDetails(sws, coef, full, sws_getCoefficients(SWS_CS_DEFAULT), 1, 0, 1 << 16, 1 << 16);
    }
    return sws;
}

h3_status h3_image_read(const char *path, int64_t max_pixels, uint8_t **rgb, int *w, int *h) {
    *rgb = NULL;
    *w = *h = 0;
    AVFormatContext *fmt = NULL;
    AVCodecContext *vd = NULL;
    AVPacket *pkt = av_packet_alloc();
    AVFrame *fr = av_frame_alloc();
    struct SwsContext *sws = NULL;
    uint8_t *out = NULL;
    h3_status st = H3_OK;
    int e, got = 0;
    if (!pkt || !fr) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    H3_CHECK(open_media(path, "the image", &fmt));
    const int vi = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, NULL, 0);
    if (vi < 0) H3_FAIL(H3_ERR_FORMAT, "%s is not an image (no picture in it)", path);
    {
        const AVCodecParameters *par = fmt->streams[vi]->codecpar;
        if ((int64_t)par->width * par->height > max_pixels)
            H3_FAIL(H3_ERR_INVALID, "%s is %dx%d: above the %lld pixels an image may have", path, par->width,
                    par->height, (long long)max_pixels);
    }
    H3_CHECK(open_dec(fmt, vi, &vd, path));
    while (!got && (e = av_read_frame(fmt, pkt)) >= 0) {
        if (pkt->stream_index == vi) {
            e = avcodec_send_packet(vd, pkt);
            if (e >= 0 || e == AVERROR(EAGAIN)) {
                e = avcodec_receive_frame(vd, fr);
                if (e >= 0)
                    got = 1;
                else if (e != AVERROR(EAGAIN)) {
                    av_packet_unref(pkt);
                    st = av_fail(e, "decoding the image", path);
                    goto done;
                }
            } else {
                av_packet_unref(pkt);
                st = av_fail(e, "decoding the image", path);
                goto done;
            }
        }
        av_packet_unref(pkt);
    }
    if (!got) { /* flush: decoders that hold the frame until the end */
        avcodec_send_packet(vd, NULL);
        if (avcodec_receive_frame(vd, fr) >= 0) got = 1;
    }
    if (!got) H3_FAIL(H3_ERR_FORMAT, "%s: no picture could be decoded (truncated or not an image)", path);
    if (fr->width < 1 || fr->height < 1) H3_FAIL(H3_ERR_FORMAT, "%s: the picture has no pixels", path);
    if ((int64_t)fr->width * fr->height > max_pixels)
        H3_FAIL(H3_ERR_INVALID, "%s is %dx%d: above the %lld pixels an image may have", path, fr->width,
                fr->height, (long long)max_pixels);
    if (fr->decode_error_flags || (fr->flags & AV_FRAME_FLAG_CORRUPT))
        H3_FAIL(H3_ERR_FORMAT, "%s: the picture is damaged (truncated or corrupt data)", path);
    sws = rgb_sws(fr);
    out = h3_malloc((size_t)fr->width * (size_t)fr->height * 3, H3_MEM_IO);
    if (!sws || !out) H3_FAIL(H3_ERR_NOMEM, "out of memory for a %dx%d image", fr->width, fr->height);
    {
        uint8_t *dst[1] = {out};
        int dst_stride[1] = {3 * fr->width};
        if (sws_scale(sws, (const uint8_t *const *)fr->data, fr->linesize, 0, fr->height, dst, dst_stride) !=
            fr->height)
            H3_FAIL(H3_ERR_FORMAT, "%s: its pixel format (%s) could not be converted to RGB", path,
                    av_get_pix_fmt_name((enum AVPixelFormat)fr->format));
    }
    *w = fr->width;
    *h = fr->height;
    *rgb = out;
    out = NULL;
done:
    h3_free(out);
    sws_freeContext(sws);
    avcodec_free_context(&vd);
    avformat_close_input(&fmt);
    av_packet_free(&pkt);
    av_frame_free(&fr);
    return st;
}

/* Converted samples into the soundtrack: planar float, `nch` channels (1 or 2), appended up to max. */
static h3_status sound_take(h3_sound *o, int64_t *cap, float *const *planes, int n, int nch, int64_t max) {
    if (o->samples + n > max) n = (int)(max - o->samples);
    if (n <= 0) return H3_OK;
    if (!grow(&o->left, cap, o->samples + n)) return H3_ERR(H3_ERR_NOMEM, "out of memory for the soundtrack");
    int64_t cap2 = *cap;
    float *r = h3_realloc(o->right, (size_t)cap2 * sizeof(float), H3_MEM_IO);
    if (!r) return H3_ERR(H3_ERR_NOMEM, "out of memory for the soundtrack");
    o->right = r;
    memcpy(o->left + o->samples, planes[0], (size_t)n * sizeof(float));
    memcpy(o->right + o->samples, planes[nch > 1 ? 1 : 0], (size_t)n * sizeof(float)); /* mono: both sides */
    o->samples += n;
    return H3_OK;
}

h3_status h3_sound_read(const char *path, int rate, int64_t max_samples, h3_sound *out) {
    memset(out, 0, sizeof *out);
    AVFormatContext *fmt = NULL;
    AVCodecContext *ad = NULL;
    AVPacket *pkt = av_packet_alloc();
    AVFrame *fr = av_frame_alloc();
    SwrContext *swr = NULL;
    float *buf[2] = {NULL, NULL};
    int buf_cap = 0, nch = 0;
    int64_t cap = 0;
    h3_status st = H3_OK;
    int e;
    if (!pkt || !fr) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    if (rate < 1 || max_samples < 1) H3_FAIL(H3_ERR_INVALID, "reading a soundtrack at %d Hz", rate);
    H3_CHECK(open_media(path, "the soundtrack", &fmt));
    const int ai = av_find_best_stream(fmt, AVMEDIA_TYPE_AUDIO, -1, -1, NULL, 0);
    if (ai < 0) H3_FAIL(H3_ERR_FORMAT, "%s has no audio stream", path);
    H3_CHECK(open_dec(fmt, ai, &ad, path));
    out->src_rate = ad->sample_rate;
    out->src_channels = ad->ch_layout.nb_channels;
    if (out->src_rate < 1 || out->src_channels < 1)
        H3_FAIL(H3_ERR_FORMAT, "%s: its audio stream says %d Hz and %d channels", path, out->src_rate,
                out->src_channels);
    nch = out->src_channels == 1 ? 1 : 2; /* mono stays mono (copied to both sides), the rest to stereo */
    {
        AVChannelLayout ol;
        av_channel_layout_default(&ol, nch);
        e = swr_alloc_set_opts2(&swr, &ol, AV_SAMPLE_FMT_FLTP, rate, &ad->ch_layout, ad->sample_fmt,
                                ad->sample_rate, 0, NULL);
        if (e >= 0) e = swr_init(swr);
        av_channel_layout_uninit(&ol);
        if (e < 0) {
            st = av_fail(e, "resampling the soundtrack of", path);
            goto done;
        }
    }
    int eof = 0;
    while (!eof && out->samples < max_samples) {
        e = av_read_frame(fmt, pkt);
        if (e == AVERROR_EOF) {
            eof = 1;
            e = avcodec_send_packet(ad, NULL);
        } else if (e < 0) {
            st = av_fail(e, "reading", path);
            goto done;
        } else if (pkt->stream_index != ai) {
            av_packet_unref(pkt);
            continue;
        } else {
            e = avcodec_send_packet(ad, pkt);
            av_packet_unref(pkt);
        }
        if (e < 0 && e != AVERROR_EOF) {
            st = av_fail(e, "decoding the soundtrack", path);
            goto done;
        }
        for (;;) {
            e = avcodec_receive_frame(ad, fr);
            if (e == AVERROR(EAGAIN) || e == AVERROR_EOF) break;
            if (e < 0) {
                st = av_fail(e, "decoding the soundtrack", path);
                goto done;
            }
            const int want = swr_get_out_samples(swr, fr->nb_samples);
            if (want > buf_cap) {
                for (int k = 0; k < 2; k++) {
                    h3_free(buf[k]);
                    buf[k] = h3_malloc((size_t)want * sizeof(float), H3_MEM_IO);
                    if (!buf[k]) H3_FAIL(H3_ERR_NOMEM, "out of memory for the soundtrack");
                }
                buf_cap = want;
            }
            const int got = swr_convert(swr, (uint8_t **)buf, buf_cap, (const uint8_t **)fr->extended_data,
                                        fr->nb_samples);
            av_frame_unref(fr);
            if (got < 0) {
                st = av_fail(got, "resampling the soundtrack of", path);
                goto done;
            }
            H3_CHECK(sound_take(out, &cap, buf, got, nch, max_samples));
        }
    }
    for (int got = 1; got > 0 && out->samples < max_samples;) { /* what the resampler still holds */
        if (buf_cap < 4096) {
            for (int k = 0; k < 2; k++) {
                h3_free(buf[k]);
                buf[k] = h3_malloc(4096 * sizeof(float), H3_MEM_IO);
                if (!buf[k]) H3_FAIL(H3_ERR_NOMEM, "out of memory for the soundtrack");
            }
            buf_cap = 4096;
        }
        got = swr_convert(swr, (uint8_t **)buf, buf_cap, NULL, 0);
        if (got > 0) H3_CHECK(sound_take(out, &cap, buf, got, nch, max_samples));
    }
    if (out->samples == 0) H3_FAIL(H3_ERR_FORMAT, "%s: its audio stream holds no samples", path);
    out->rate = rate;
done:
    h3_free(buf[0]);
    h3_free(buf[1]);
    swr_free(&swr);
    avcodec_free_context(&ad);
    avformat_close_input(&fmt);
    av_packet_free(&pkt);
    av_frame_free(&fr);
    if (st != H3_OK) h3_sound_free(out);
    return st;
}


typedef struct {
    struct SwsContext *sws;
    uint8_t *rgb;
    int64_t n, cap, max_frames, max_pixels;
    int w, h;
    const char *path;
} vreader;

static h3_status vtake(vreader *r, const AVFrame *f) {
    if (r->n >= r->max_frames) return H3_OK;
    if (!r->sws) {
        if (f->width < 1 || f->height < 1) return H3_ERR(H3_ERR_FORMAT, "%s: a frame has no pixels", r->path);
        if ((int64_t)f->width * f->height > r->max_pixels)
            return H3_ERR(H3_ERR_INVALID, "%s is %dx%d: above the %lld pixels a frame may have", r->path, f->width,
                          f->height, (long long)r->max_pixels);
        r->w = f->width;
        r->h = f->height;
        r->sws = rgb_sws(f);
        if (!r->sws) return H3_ERR(H3_ERR_NOMEM, "out of memory for the frame converter");
    }
    if (f->width != r->w || f->height != r->h)
        return H3_ERR(H3_ERR_FORMAT, "%s: the video changes size mid-stream (%dx%d to %dx%d)", r->path, r->w, r->h,
                      f->width, f->height);
    const size_t fb = (size_t)r->w * (size_t)r->h * 3;
    if (r->n == r->cap) {
        const int64_t nc = r->cap ? 2 * r->cap : 16;
        uint8_t *p = h3_realloc(r->rgb, (size_t)nc * fb, H3_MEM_IO);
        if (!p) return H3_ERR(H3_ERR_NOMEM, "out of memory for the frames of %s", r->path);
        r->rgb = p;
        r->cap = nc;
    }
    uint8_t *dst[1] = {r->rgb + (size_t)r->n * fb};
    int dst_stride[1] = {3 * r->w};
    if (sws_scale(r->sws, (const uint8_t *const *)f->data, f->linesize, 0, f->height, dst, dst_stride) != f->height)
        return H3_ERR(H3_ERR_FORMAT, "%s: its pixel format (%s) could not be converted to RGB", r->path,
                      av_get_pix_fmt_name((enum AVPixelFormat)f->format));
    r->n++;
    return H3_OK;
}

static h3_status vdecode(vreader *r, AVCodecContext *dec, const AVPacket *pkt, AVFrame *fr) {
    int e = avcodec_send_packet(dec, pkt);
    if (e < 0 && e != AVERROR_EOF) return av_fail(e, "decoding", r->path);
    for (;;) {
        e = avcodec_receive_frame(dec, fr);
        if (e == AVERROR(EAGAIN) || e == AVERROR_EOF) return H3_OK;
        if (e < 0) return av_fail(e, "decoding", r->path);
        h3_status st = vtake(r, fr);
        av_frame_unref(fr);
        if (st != H3_OK) return st;
    }
}

h3_status h3_video_read(const char *path, double max_seconds, int64_t max_pixels, h3_video_frames *out) {
    memset(out, 0, sizeof *out);
    AVFormatContext *fmt = NULL;
    AVCodecContext *vd = NULL;
    AVPacket *pkt = av_packet_alloc();
    AVFrame *fr = av_frame_alloc();
    vreader r;
    memset(&r, 0, sizeof r);
    r.max_pixels = max_pixels;
    r.path = path;
    h3_status st = H3_OK;
    int e;
    if (!pkt || !fr) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    H3_CHECK(open_media(path, "the video", &fmt));
    const int vi = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, NULL, 0);
    if (vi < 0) H3_FAIL(H3_ERR_FORMAT, "%s has no video stream", path);
    {
        const AVStream *vs = fmt->streams[vi];
        AVRational q = vs->avg_frame_rate.num && vs->avg_frame_rate.den ? vs->avg_frame_rate : vs->r_frame_rate;
        out->fps = q.den ? av_q2d(q) : 0;
    }
    const int64_t max_frames = (int64_t)ceil(max_seconds * (out->fps > 0 ? out->fps : H3_FPS)) + 1;
    r.max_frames = max_frames;
    H3_CHECK(open_dec(fmt, vi, &vd, path));
    while (r.n < max_frames && (e = av_read_frame(fmt, pkt)) >= 0) {
        if (pkt->stream_index == vi) st = vdecode(&r, vd, pkt, fr);
        av_packet_unref(pkt);
        if (st != H3_OK) goto done;
    }
    if (r.n < max_frames) {
        if (e != AVERROR_EOF) {
            st = av_fail(e, "reading", path);
            goto done;
        }
        H3_CHECK(vdecode(&r, vd, NULL, fr));
    }
    if (r.n == 0) H3_FAIL(H3_ERR_FORMAT, "%s: its video stream holds no frames", path);
    out->rgb = r.rgb;
    out->frames = r.n;
    out->width = r.w;
    out->height = r.h;
    r.rgb = NULL;
done:
    sws_freeContext(r.sws);
    h3_free(r.rgb);
    avcodec_free_context(&vd);
    avformat_close_input(&fmt);
    av_packet_free(&pkt);
    av_frame_free(&fr);
    return st;
}

#else /* built without libav (-DH3_MEDIA=OFF) */
h3_status h3_video_read(const char *path, double max_seconds, int64_t max_pixels, h3_video_frames *out) {
    (void)max_seconds, (void)max_pixels;
    memset(out, 0, sizeof *out);
    return H3_ERR(H3_ERR_UNSUPPORTED, "%s: this h3run was built without reading videos (cmake -DH3_MEDIA=OFF)",
                  path);
}

h3_status h3_sound_read(const char *path, int rate, int64_t max_samples, h3_sound *out) {
    (void)rate, (void)max_samples;
    memset(out, 0, sizeof *out);
    return H3_ERR(H3_ERR_UNSUPPORTED, "%s: this h3run was built without reading sound (cmake -DH3_MEDIA=OFF)",
                  path);
}

h3_status h3_image_read(const char *path, int64_t max_pixels, uint8_t **rgb, int *w, int *h) {
    (void)max_pixels;
    *rgb = NULL;
    *w = *h = 0;
    return H3_ERR(H3_ERR_UNSUPPORTED,
                  "%s: this h3run was built without reading images (cmake -DH3_MEDIA=OFF)", path);
}

h3_status h3_clip_read(const char *path, h3_clip *out) {
    memset(out, 0, sizeof *out);
    return H3_ERR(H3_ERR_UNSUPPORTED, "%s: this h3run was built without reading MP4s (cmake -DH3_MEDIA=OFF)",
                  path);
}
#endif

void h3_sound_free(h3_sound *s) {
    if (!s) return;
    h3_free(s->left);
    h3_free(s->right);
    memset(s, 0, sizeof *s);
}

void h3_clip_free(h3_clip *c) {
    if (!c) return;
    h3_free(c->rgb);
    h3_free(c->left);
    h3_free(c->right);
    memset(c, 0, sizeof *c);
}

void h3_video_frames_free(h3_video_frames *v) {
    if (!v) return;
    h3_free(v->rgb);
    memset(v, 0, sizeof *v);
}
