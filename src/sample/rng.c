#include "sample/rng.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void h3_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

static double u01(uint32_t w) {
    return ((double)w + 0.5) * (1.0 / 4294967296.0);
}

/* The four normals of block b. */
static void normal_block(uint64_t seed, uint32_t stream, uint64_t b, float z[4]) {
    const uint32_t ctr[4] = {(uint32_t)b, (uint32_t)(b >> 32), stream, 0};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t w[4];
    h3_philox4x32_10(ctr, key, w);
    const double two_pi = 6.283185307179586476925286766559;
    for (int k = 0; k < 2; k++) {
        double r = sqrt(-2.0 * log(u01(w[2 * k])));
        double th = two_pi * u01(w[2 * k + 1]);
        z[2 * k] = (float)(r * cos(th));
        z[2 * k + 1] = (float)(r * sin(th));
    }
}

void h3_rng_normal_at(uint64_t seed, uint32_t stream, uint64_t pos, float *out, size_t n) {
    size_t i = 0;
    float z[4];
    while (i < n) {
        uint64_t p = pos + i;
        uint64_t b = p >> 2;
        unsigned lane = (unsigned)(p & 3);
        normal_block(seed, stream, b, z);
        for (; lane < 4 && i < n; lane++) out[i++] = z[lane];
    }
}

void h3_rng_init(h3_rng *r, uint64_t seed, uint32_t stream) {
    r->seed = seed;
    r->stream = stream;
    r->pos = 0;
}

void h3_rng_normal(h3_rng *r, float *out, size_t n) {
    h3_rng_normal_at(r->seed, r->stream, r->pos, out, n);
    r->pos += n;
}

void h3_rng_t2va_noise(uint64_t seed, float *video, size_t n_video, float *audio, size_t n_audio) {
    if (video && n_video) h3_rng_normal_at(seed, H3_RNG_STREAM_VIDEO, 0, video, n_video);
    if (audio && n_audio) h3_rng_normal_at(seed, H3_RNG_STREAM_AUDIO, 0, audio, n_audio);
}
