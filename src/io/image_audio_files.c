#include "io/image_audio_files.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fs.h"

static uint32_t g_crc_table[256];
static pthread_once_t g_crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        g_crc_table[n] = c;
    }
}

uint32_t h3_crc32(uint32_t crc, const void *data, size_t n) {
    pthread_once(&g_crc_once, crc_init);
    const uint8_t *p = data;
    uint32_t c = crc ^ 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = g_crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t h3_adler32(uint32_t adler, const void *data, size_t n) {
    const uint8_t *p = data;
    uint32_t a = adler & 0xFFFF, b = adler >> 16;
    while (n > 0) {
        size_t k = n < 5552 ? n : 5552; /* the most bytes before b can overflow 32 bits */
        n -= k;
        while (k--) {
            a += *p++;
            b += a;
        }
        a %= 65521;
        b %= 65521;
    }
    return (b << 16) | a;
}

uint8_t h3_unit_to_u8(float x) {
    if (!(x > 0.0f)) return 0;
    if (x >= 1.0f) return 255;
    return (uint8_t)nearbyintf(x * 255.0f);
}

static void be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}
static void le32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static void le16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* A PNG chunk: length, type, data, CRC over type and data. */
static h3_status png_chunk(h3_outfile *o, const char *type, const uint8_t *data, uint32_t n) {
    uint8_t hd[8];
    be32(hd, n);
    memcpy(hd + 4, type, 4);
    uint32_t crc = h3_crc32(h3_crc32(0, type, 4), data, n);
    uint8_t tl[4];
    be32(tl, crc);
    if (fwrite(hd, 1, 8, o->f) != 8 || (n && fwrite(data, 1, n, o->f) != n) || fwrite(tl, 1, 4, o->f) != 4)
        return H3_ERR(H3_ERR_IO, "%s: write failed", o->path);
    return H3_OK;
}

h3_status h3_png_write_rgb8(const char *path, const uint8_t *rgb, int64_t width, int64_t height, int64_t stride) {
    if (width < 1 || height < 1 || width > (1 << 24) || height > (1 << 24) || stride < 3 * width)
        return H3_ERR(H3_ERR_INVALID, "PNG of %lld × %lld pixels (row stride %lld): sizes out of range", (long long)width,
                      (long long)height, (long long)stride);
    /* The zlib stream: header, stored blocks of at most 65535 bytes over the filtered rows (filter byte 0 + RGB),
     * Adler-32 of those rows. */
    size_t row = 1 + 3 * (size_t)width, raw, nblocks, zlen;
    if (!h3_mul_size(row, (size_t)height, &raw)) return H3_ERR(H3_ERR_INVALID, "PNG too large");
    nblocks = (raw + 65534) / 65535;
    zlen = 2 + raw + 5 * nblocks + 4;
    if (zlen > 0x7FFFFFFFu) return H3_ERR(H3_ERR_INVALID, "PNG of %zu bytes is too large for one IDAT chunk", zlen);
    uint8_t *z = h3_malloc(zlen, H3_MEM_IO);
    if (!z) return H3_ERR_NOMEM;
    size_t o = 0, in_block = 0, left = raw;
    uint32_t adler = 1;
    z[o++] = 0x78; /* deflate, 32 KB window */
    z[o++] = 0x01; /* no preset dictionary, fastest; (0x78 << 8 | 0x01) % 31 == 0 */
    uint8_t *line = h3_malloc(row, H3_MEM_IO);
    if (!line) {
        h3_free(z);
        return H3_ERR_NOMEM;
    }
    for (int64_t y = 0; y < height; y++) {
        line[0] = 0; /* filter: none */
        memcpy(line + 1, rgb + y * stride, row - 1);
        adler = h3_adler32(adler, line, row);
        for (size_t i = 0; i < row;) {
            if (in_block == 0) {
                size_t n = left < 65535 ? left : 65535;
                z[o++] = left <= 65535 ? 1 : 0; /* BFINAL on the last block, BTYPE 00 (stored) */
                le16(z + o, (uint16_t)n);
                le16(z + o + 2, (uint16_t)~n);
                o += 4;
                in_block = n;
                left -= n;
            }
            size_t k = row - i < in_block ? row - i : in_block;
            memcpy(z + o, line + i, k);
            o += k;
            i += k;
            in_block -= k;
        }
    }
    h3_free(line);
    be32(z + o, adler);
    o += 4;
    h3_outfile out;
    h3_status st = h3_out_open(path, &out);
    if (st == H3_OK) {
        static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
        uint8_t ihdr[13];
        be32(ihdr, (uint32_t)width);
        be32(ihdr + 4, (uint32_t)height);
        ihdr[8] = 8;  /* bits per sample */
        ihdr[9] = 2;  /* truecolour RGB */
        ihdr[10] = 0; /* deflate */
        ihdr[11] = 0; /* adaptive filtering (every row uses filter 0) */
        ihdr[12] = 0; /* no interlace */
        if (fwrite(sig, 1, 8, out.f) != 8) st = H3_ERR(H3_ERR_IO, "%s: write failed", out.path);
        if (st == H3_OK) st = png_chunk(&out, "IHDR", ihdr, 13);
        if (st == H3_OK) st = png_chunk(&out, "IDAT", z, (uint32_t)o);
        if (st == H3_OK) st = png_chunk(&out, "IEND", NULL, 0);
        if (st == H3_OK) st = h3_out_commit(&out);
        else h3_out_abort(&out);
    }
    h3_free(z);
    return st;
}

h3_status h3_wav_write_pcm16(const char *path, const float *samples, int64_t frames, int channels, int sample_rate) {
    if (frames < 0 || channels < 1 || channels > 64 || sample_rate < 1 || sample_rate > 1000000)
        return H3_ERR(H3_ERR_INVALID, "WAV of %lld frames, %d channels at %d Hz: out of range", (long long)frames,
                      channels, sample_rate);
    uint64_t data = (uint64_t)frames * (uint64_t)channels * 2;
    if (data > 0xFFFFFFFFull - 36) return H3_ERR(H3_ERR_INVALID, "%llu bytes of samples do not fit a WAV file",
                                                 (unsigned long long)data);
    uint8_t h[44];
    memcpy(h, "RIFF", 4);
    le32(h + 4, (uint32_t)(36 + data));
    memcpy(h + 8, "WAVEfmt ", 8);
    le32(h + 16, 16);                                        /* fmt chunk size */
    le16(h + 20, 1);                                         /* PCM */
    le16(h + 22, (uint16_t)channels);
    le32(h + 24, (uint32_t)sample_rate);
    le32(h + 28, (uint32_t)sample_rate * (uint32_t)channels * 2); /* bytes per second */
    le16(h + 32, (uint16_t)(channels * 2));                  /* block align */
    le16(h + 34, 16);                                        /* bits per sample */
    memcpy(h + 36, "data", 4);
    le32(h + 40, (uint32_t)data);
    h3_outfile out;
    H3_TRY(h3_out_open(path, &out));
    h3_status st = H3_OK;
    if (fwrite(h, 1, 44, out.f) != 44) st = H3_ERR(H3_ERR_IO, "%s: write failed", out.path);
    uint8_t buf[4096];
    size_t nb = 0;
    int64_t total = frames * channels;
    for (int64_t i = 0; i < total && st == H3_OK; i++) {
        float x = samples[i];
        x = x > 1.0f ? 1.0f : (x < -1.0f ? -1.0f : (x == x ? x : 0.0f));
        int16_t q = (int16_t)lrint((double)x * 32767.0);
        le16(buf + nb, (uint16_t)q);
        nb += 2;
        if (nb == sizeof buf || i + 1 == total) {
            if (fwrite(buf, 1, nb, out.f) != nb) st = H3_ERR(H3_ERR_IO, "%s: write failed", out.path);
            nb = 0;
        }
    }
    if (st == H3_OK) st = h3_out_commit(&out);
    else h3_out_abort(&out);
    return st;
}
