/* Qwen3-VL's vision tower, image processor and vision rows in the text encoder, against computations written
 * here independently: smart_resize on sizes worked out from transformers' formula, get_rope_index's positions
 * for a two-image prompt written out, the ViT's rotary table from its definition, and a tiny random model
 * (official names, config.json) whose tower and text encoder run against a naive float64 implementation. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "io/safetensors.h"
#include "models/text_encoder.h"
#include "models/vision.h"
#include "pipeline/media.h"
#include "testutil.h"

/* ---- the processor ----------------------------------------------------------------------------------------
 */

static void test_smart_resize(void) {
    /* factor 32, min 65536, max 16777216 (Qwen3-VL): h, w -> h', w' (round half to even, then the bounds) */
    static const int64_t tab[][4] = {
        {480, 640, 480, 640},     {500, 700, 512, 704}, /* 15.625 -> 16, 21.875 -> 22 */
        {48, 80, 224, 352},       /* 1.5 -> 2, 2.5 -> 2 (half to even); below min: ceil(h·√(min/hw)/32) */
        {1008, 1040, 1024, 1024}, /* 31.5 -> 32, 32.5 -> 32 */
        {8000, 6000, 4704, 3520}, /* above max: floor(h/β/32) */
        {1, 200, 32, 3648},       {100, 1, 2560, 32},   {224, 224, 256, 256},
        {720, 1280, 704, 1280},   {3000, 40, 3008, 32},
    };
    h3_vis_config c;
    h3_vis_config_default(&c);
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        int64_t h, w;
        CHECK_OK(h3_vis_smart_resize(&c, tab[i][0], tab[i][1], &h, &w));
        CHECK(h == tab[i][2] && w == tab[i][3], "smart_resize(%lld, %lld) = (%lld, %lld), want (%lld, %lld)",
              (long long)tab[i][0], (long long)tab[i][1], (long long)h, (long long)w, (long long)tab[i][2],
              (long long)tab[i][3]);
    }
    int64_t h, w;
    CHECK_ERR(h3_vis_smart_resize(&c, 10, 2001, &h, &w), H3_ERR_INVALID, "aspect ratio");
    CHECK_ERR(h3_vis_smart_resize(&c, 0, 5, &h, &w), H3_ERR_INVALID, "no pixels");
}

static void test_preprocess(void) {
    /* 64x96 with min_pixels below it: no resize; every value is (v/255 − 0.5)/0.5 at its patch position */
    h3_vis_config c;
    h3_vis_config_default(&c);
    c.min_pixels = 1024;
    const int W = 96, H = 64;
    uint8_t *img = h3_malloc((size_t)W * H * 3, H3_MEM_IO);
    for (int i = 0; i < W * H * 3; i++) img[i] = (uint8_t)(t_rand_u64() & 255);
    h3_tensor px;
    int64_t g[3];
    CHECK_OK(h3_vis_preprocess(&c, img, W, H, &px, g));
    CHECK(g[0] == 1 && g[1] == 4 && g[2] == 6, "grid [%lld, %lld, %lld]", (long long)g[0], (long long)g[1],
          (long long)g[2]);
    CHECK(px.shape[0] == 24 && px.shape[1] == 1536, "pixel_values shape");
    int bad = 0;
    const float *pv = px.data;
    for (int64_t r = 0; r < 24 && !bad; r++) {
        /* row r = ((bh·3 + bw)·2 + mh)·2 + mw */
        const int64_t mw = r % 2, mh = (r / 2) % 2, bw = (r / 4) % 3, bh = r / 12;
        const int64_t py = (bh * 2 + mh) * 16, pxx = (bw * 2 + mw) * 16;
        for (int64_t k = 0; k < 1536; k++) {
            const int64_t ch = k / 512, x = k % 16, y = (k / 16) % 16; /* (c, tp, ph, pw); tp repeats */
            const float want = (float)(((double)img[((py + y) * W + pxx + x) * 3 + ch] / 255.0 - 0.5) / 0.5);
            if (fabsf(pv[r * 1536 + k] - want) > 1e-6f) bad = 1;
        }
    }
    CHECK(!bad, "patch layout or normalization differs from (c, tp, ph, pw) of patch (bh·2+mh, bw·2+mw)");
    h3_tensor_free(&px);
    /* a constant image stays constant through the bicubic resize (normalized 8-bit weights) */
    memset(img, 77, (size_t)W * H * 3);
    uint8_t out[40 * 30 * 3];
    CHECK_OK(h3_vis_resize_bicubic_tv(img, W, H, out, 40, 30));
    int same = 1;
    for (size_t i = 0; i < sizeof out; i++) same &= out[i] == 77;
    CHECK(same, "a constant image changed through the resize");
    h3_free(img);
}

static const uint8_t k_tv_64x3[] = {79, 83, 163, 80, 84, 160, 82, 87, 154, 88, 92, 142, 97, 99, 125, 106, 107, 105, 115, 116, 87, 120, 125, 79, 118, 136, 83, 113, 149, 88, 106, 161, 97, 102, 169, 109, 102, 168, 117, 109, 157, 127, 118, 138, 138, 130, 117, 147, 141, 100, 153, 150, 93, 152, 160, 95, 142, 172, 103, 126, 181, 114, 110, 184, 125, 97, 183, 134, 93, 169, 144, 97, 149, 155, 108, 128, 163, 118, 114, 168, 127, 108, 166, 130, 114, 156, 127, 126, 142, 121, 138, 126, 115, 146, 113, 111, 143, 104, 115, 131, 97, 125, 115, 93, 139, 98, 90, 151, 87, 90, 158, 87, 92, 153, 93, 98, 138, 102, 105, 118, 114, 115, 98, 121, 124, 84, 123, 134, 83, 118, 146, 87, 112, 159, 95, 106, 169, 106, 105, 173, 117, 108, 166, 125, 117, 150, 136, 128, 130, 146, 138, 110, 154, 149, 98, 156, 158, 96, 150, 169, 102, 137, 180, 112, 120, 184, 124, 105, 188, 133, 96, 179, 142, 98, 161, 151, 106, 141, 159, 116, 124, 166, 126, 112, 171, 133, 106, 174, 136, 103, 175, 137, 126, 102, 92, 127, 103, 92, 129, 106, 94, 134, 112, 97, 140, 121, 102, 147, 131, 107, 153, 139, 113, 155, 143, 121, 151, 139, 131, 144, 130, 144, 136, 120, 155, 127, 112, 164, 120, 109, 164, 111, 113, 153, 102, 119, 135, 94, 128, 116, 89, 137, 101, 88, 145, 94, 94, 155, 96, 100, 166, 103, 110, 173, 113, 119, 177, 122, 127, 178, 131, 136, 165, 140, 147, 147, 150, 155, 128, 157, 159, 114, 163, 155, 109, 164, 142, 113, 160, 123, 123, 153, 104, 134, 144, 90, 142, 135, 87, 142, 127, 93, 135, 119, 104, 125, 110, 117, 115, 103, 129, 110, 98, 136, 111, 97, 144, 118, 101, 150, 129, 106, 155, 139, 113, 157, 145, 120, 156, 145, 129, 151, 137, 141, 143, 127, 154, 134, 118, 164, 126, 113, 168, 118, 115, 162, 109, 123, 147, 101, 134, 128, 94, 143, 110, 90, 146, 99, 93, 139, 97, 99, 123, 102, 108, 104, 111, 118, 86, 121, 126, 76, 130, 135, 80, 138, 143, 85, 147, 150, 95, 155, 156, 106, 163, 161, 112, 168, 163, 115, 171, 164, 116, 171, 171, 121, 125, 171, 122, 126, 170, 125, 129, 158, 131, 136, 140, 139, 146, 120, 149, 157, 102, 157, 164, 94, 162, 167, 98, 162, 158, 109, 160, 143, 122, 156, 126, 135, 150, 112, 140, 142, 106, 139, 130, 111, 133, 115, 122, 127, 100, 135, 123, 88, 143, 123, 84, 142, 132, 87, 129, 141, 95, 110, 152, 105, 89, 159, 115, 73, 158, 124, 68, 147, 134, 72, 131, 146, 78, 114, 155, 88, 103, 159, 99, 99, 155, 108, 103, 141, 119, 111, 121, 130, 122, 100, 141, 132, 86, 148, 141, 82, 151, 151, 87, 147, 162, 99, 141, 168, 112, 135, 173, 124, 132, 168, 133, 135, 153, 142, 144, 132, 151, 155, 113, 159, 163, 99, 164, 169, 98, 166, 166, 106, 164, 153, 119, 161, 136, 133, 156, 120, 142, 149, 110, 143, 140, 110, 139, 125, 119, 133, 110, 132, 127, 96, 143, 125, 88, 147, 130, 87, 139, 139, 94, 122, 150, 103, 101, 160, 114, 82, 162, 123, 71, 156, 132, 72, 142, 141, 80, 126, 149, 90, 112, 156, 101, 103, 161, 108, 98, 164, 111, 95, 165, 112};
static const uint8_t k_tv_13x20[] = {0, 49, 108, 27, 86, 171, 64, 123, 208, 101, 186, 245, 138, 223, 0, 201, 255, 37, 238, 15, 74, 0, 52, 111, 30, 89, 174, 67, 126, 211, 104, 189, 248, 141, 226, 3, 204, 255, 40, 1, 60, 119, 38, 97, 153, 75, 134, 190, 112, 168, 227, 149, 205, 11, 183, 242, 48, 220, 26, 85, 4, 63, 122, 41, 100, 156, 78, 137, 193, 115, 171, 230, 152, 208, 14, 186, 245, 51, 28, 98, 157, 65, 135, 101, 113, 172, 138, 150, 116, 175, 187, 153, 38, 131, 190, 75, 168, 53, 123, 31, 101, 160, 68, 138, 104, 116, 175, 141, 153, 119, 178, 190, 156, 41, 134, 193, 78, 69, 146, 205, 106, 183, 32, 161, 220, 69, 198, 47, 106, 235, 84, 79, 62, 121, 116, 99, 94, 171, 72, 149, 208, 109, 186, 35, 164, 223, 72, 201, 50, 109, 238, 87, 82, 65, 124, 119, 109, 156, 215, 146, 193, 0, 171, 230, 36, 208, 14, 74, 245, 51, 119, 29, 89, 156, 67, 134, 181, 112, 159, 218, 149, 196, 2, 174, 233, 39, 211, 17, 77, 248, 55, 122, 32, 92, 159, 157, 99, 158, 194, 136, 25, 114, 173, 62, 151, 40, 112, 188, 77, 167, 55, 127, 204, 105, 182, 124, 160, 102, 161, 197, 139, 28, 117, 176, 65, 154, 43, 115, 191, 93, 170, 58, 130, 207, 197, 28, 87, 234, 65, 73, 43, 102, 110, 80, 88, 165, 117, 125, 207, 103, 180, 244, 158, 222, 53, 200, 31, 90, 237, 68, 76, 46, 105, 113, 83, 91, 168, 120, 146, 210, 106, 183, 247, 193, 5, 66, 230, 42, 115, 20, 81, 152, 59, 130, 166, 96, 167, 203, 145, 181, 240, 159, 218, 30, 196, 8, 69, 233, 45, 118, 23, 84, 155, 62, 133, 169, 99, 147, 206, 148, 184, 243, 130, 36, 110, 167, 73, 164, 51, 125, 201, 103, 179, 103, 140, 216, 140, 194, 118, 177, 96, 155, 61, 133, 39, 113, 170, 76, 167, 54, 128, 204, 106, 182, 106, 143, 84, 143, 197, 121, 180, 62, 85, 159, 99, 122, 200, 100, 174, 237, 152, 215, 35, 189, 252, 72, 230, 50, 109, 28, 87, 110, 65, 88, 162, 102, 125, 203, 103, 177, 240, 155, 218, 38, 192, 16, 75, 233, 53, 112, 49, 127, 150, 90, 164, 187, 142, 165, 224, 143, 202, 22, 180, 239, 63, 217, 37, 100, 15, 78, 152, 52, 130, 153, 93, 167, 190, 145, 168, 227, 146, 205, 25, 183, 3, 66, 220, 40, 103, 85, 176, 82, 139, 213, 119, 191, 97, 156, 75, 134, 58, 112, 171, 112, 149, 73, 149, 51, 127, 201, 88, 179, 85, 142, 216, 122, 194, 100, 159, 78, 137, 61, 115, 39, 115, 152, 76, 152, 134, 207, 19, 183, 244, 56, 222, 34, 93, 12, 71, 107, 49, 108, 156, 86, 122, 193, 100, 171, 232, 137, 210, 22, 186, 247, 59, 225, 37, 96, 15, 74, 110, 52, 88, 159, 89, 125, 196, 176, 184, 15, 162, 221, 52, 199, 30, 94, 8, 72, 149, 45, 109, 135, 87, 164, 172, 142, 150, 209, 179, 187, 18, 165, 224, 55, 202, 33, 97, 11, 75, 152, 48, 130, 138, 90, 167, 175, 224, 113, 55, 91, 150, 92, 128, 70, 147, 48, 125, 197, 85, 162, 64, 140, 212, 101, 190, 79, 138, 227, 116, 58, 94, 153, 95, 131, 73, 150, 51, 128, 200, 88, 178, 67, 143, 215, 104, 250, 56, 103, 34, 93, 140, 71, 118, 185, 96, 163, 223, 133, 200, 7, 178, 238, 44, 216, 22, 81, 253, 59, 106, 37, 96, 143, 74, 121, 188, 99, 166, 226, 136, 204, 10, 181, 241, 47, 217, 66, 143, 44, 103, 180, 81, 158, 153, 136, 131, 190, 173, 168, 17, 146, 205, 54, 183, 32, 91, 220, 69, 146, 47, 106, 183, 84, 161, 156, 139, 134, 193, 176, 171, 20, 149, 208, 57, 148, 114, 184, 92, 151, 221, 129, 199, 84, 177, 62, 121, 214, 99, 65, 77, 136, 102, 114, 80, 139, 151, 117, 187, 95, 154, 224, 132, 202, 87, 180, 65, 124, 217, 102, 68, 80, 139, 105, 96, 152, 211, 130, 189, 248, 167, 226, 32, 204, 10, 69, 241, 47, 103, 25, 84, 140, 62, 118, 177, 99, 155, 214, 133, 192, 251, 170, 229, 35, 207, 13, 72, 244, 50, 106, 28, 87, 143, 78, 163, 222, 141, 200, 255, 178, 237, 14, 215, 0, 51, 252, 29, 114, 7, 66, 151, 44, 129, 188, 81, 166, 225, 144, 203, 255, 181, 240, 17, 218, 0, 54, 255, 32, 117, 10, 69, 154};

/* The processor's resize (h3_vis_resize_bicubic_tv) of the same 13x7 image against torchvision 0.26 / torch 2.11's
 * transforms.v2.functional.resize(uint8 tensor, BICUBIC, antialias=True), what transformers 5's Qwen2-VL processor
 * runs: up in width and down in height, and up in height alone; byte for byte. */
static void test_resize_tv(void) {
    static const struct {
        int w, h;
        const uint8_t *want;
    } cases[] = {{64, 3, k_tv_64x3}, {13, 20, k_tv_13x20}};
    uint8_t src[13 * 7 * 3];
    for (int y = 0; y < 7; y++)
        for (int x = 0; x < 13; x++)
            for (int c = 0; c < 3; c++) src[(y * 13 + x) * 3 + c] = (uint8_t)((x * 37 + y * 101 + c * 59) % 256);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int n = cases[i].w * cases[i].h * 3;
        uint8_t *dst = malloc((size_t)n);
        CHECK_OK(h3_vis_resize_bicubic_tv(src, 13, 7, dst, cases[i].w, cases[i].h));
        int diff = 0;
        for (int j = 0; j < n; j++) diff += dst[j] != cases[i].want[j];
        CHECK(diff == 0, "13x7 -> %dx%d: %d bytes differ from torchvision's", cases[i].w, cases[i].h, diff);
        free(dst);
    }
}

static void test_bad_images(void) {
    char p[512];
    uint8_t *rgb;
    int w, h;
    CHECK_ERR(h3_image_read(t_tmp_path("no_such_image.png", p, sizeof p), H3_IMAGE_MAX_PIXELS, &rgb, &w, &h),
              H3_ERR_IO, "no_such_image");
    FILE *f = fopen(t_tmp_path("garbage.png", p, sizeof p), "wb");
    fputs("\x89PNG\r\n\x1a\nnot really", f);
    fclose(f);
    h3_status st = h3_image_read(p, H3_IMAGE_MAX_PIXELS, &rgb, &w, &h);
    CHECK(st != H3_OK && rgb == NULL, "a broken PNG was read");
    h3_clear_error();
    f = fopen(t_tmp_path("empty.jpg", p, sizeof p), "wb");
    fclose(f);
    st = h3_image_read(p, H3_IMAGE_MAX_PIXELS, &rgb, &w, &h);
    CHECK(st != H3_OK && rgb == NULL, "an empty file was read");
    h3_clear_error();
}

/* ---- positions --------------------------------------------------------------------------------------------
 */

enum { IMG = 60, VS = 61, VE = 59 };
/* [1, 2, VS, IMG×6, VE, 3, VS, IMG, VE, 4] with grids [1, 4, 6] and [1, 2, 2] */
static const int32_t g_ids[15] = {1, 2, VS, IMG, IMG, IMG, IMG, IMG, IMG, VE, 3, VS, IMG, VE, 4};
static const int64_t g_grid[2][3] = {{1, 4, 6}, {1, 2, 2}};
static const int64_t g_pos[3][15] = {
    {0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 8, 9, 10, 11},
    {0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 8, 9, 10, 11},
    {0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8, 9, 10, 11},
};

static void tiny_vis_config(h3_vis_config *c) {
    h3_vis_config_default(c);
    c->image_token_id = IMG;
    c->vision_start_token_id = VS;
    c->video_token_id = 62;
}

static void test_rope_index(void) {
    h3_vis_config c;
    tiny_vis_config(&c);
    int64_t pos[3 * 15], nv = 0;
    CHECK_OK(h3_vision_rope_index(&c, g_ids, 15, g_grid, 2, pos, &nv));
    CHECK(nv == 7, "image tokens %lld, want 7", (long long)nv);
    CHECK(!memcmp(pos, g_pos, sizeof pos), "positions differ from get_rope_index's written out");
    /* disagreements */
    CHECK_ERR(h3_vision_rope_index(&c, g_ids, 15, g_grid, 1, pos, &nv), H3_ERR_INVALID, "more image blocks");
    const int64_t big[2][3] = {{1, 4, 8}, {1, 2, 2}};
    CHECK_ERR(h3_vision_rope_index(&c, g_ids, 15, big, 2, pos, &nv), H3_ERR_INVALID, "needs 8 image tokens");
    const int64_t small[2][3] = {{1, 2, 6}, {1, 2, 2}};
    CHECK_ERR(h3_vision_rope_index(&c, g_ids, 15, small, 2, pos, &nv), H3_ERR_INVALID, "more image tokens");
    int32_t bad[15];
    memcpy(bad, g_ids, sizeof bad);
    bad[2] = 5;
    CHECK_ERR(h3_vision_rope_index(&c, bad, 15, g_grid, 2, pos, &nv), H3_ERR_INVALID, "vision-start");
    /* the text encoder's mRoPE tables with these positions: frequency j reads t, h or w as the sections say
     */
    h3_te_config tc;
    h3_te_config_default(&tc);
    tc.head_dim = 8;
    tc.mrope_section[0] = 2;
    tc.mrope_section[1] = 1;
    tc.mrope_section[2] = 1;
    float cs[15 * 8], sn[15 * 8];
    h3_te_mrope_tables(&tc, pos, 15, cs, sn);
    static const int axis[4] = {0, 1, 2, 0}; /* j=1 < 3·1 -> h, j=2 < 3·1 -> w, j=3 -> t */
    double err = 0;
    for (int r = 0; r < 15; r++)
        for (int j = 0; j < 4; j++) {
            const double a = (double)g_pos[axis[j]][r] * pow(tc.rope_theta, -2.0 * j / 8.0);
            err = fmax(err, fabs(cs[r * 8 + j] - cos(a)) + fabs(sn[r * 8 + j + 4] - sin(a)));
        }
    CHECK(err < 1e-5, "mRoPE tables off by %.3g", err);
}

static void test_vit_rope(void) {
    h3_vis_config c;
    tiny_vis_config(&c);
    c.hidden = 16;
    c.heads = 2; /* D = 8: 2 frequencies per axis */
    const int64_t gr[1][3] = {{1, 4, 6}};
    float cs[24 * 8], sn[24 * 8];
    h3_vision_rope_tables(&c, gr, 1, cs, sn);
    double err = 0;
    for (int r = 0; r < 24; r++) {
        const int mw = r % 2, mh = (r / 2) % 2, bw = (r / 4) % 3, bh = r / 12, y = bh * 2 + mh,
                  x = bw * 2 + mw;
        const double a[4] = {y * 1.0, y * pow(10000.0, -0.5), x * 1.0, x * pow(10000.0, -0.5)};
        for (int j = 0; j < 8; j++)
            err = fmax(err, fabs(cs[r * 8 + j] - cos(a[j % 4])) + fabs(sn[r * 8 + j] - sin(a[j % 4])));
    }
    CHECK(err < 1e-5, "ViT rotary table off by %.3g", err);
}

/* ---- a tiny model against float64 -------------------------------------------------------------------------
 */

enum { TC = 32, TL = 3, TH = 4, TKV = 2, TD = 8, TF = 48, TV = 64 };                      /* text */
enum { VH = 16, VHEADS = 2, VD = 8, VF = 24, VP = 2, VDEPTH = 3, VSIDE = 4, VCOLS = 24 }; /* vision */
static const int g_deep[2] = {0, 2};

typedef struct {
    const char *name;
    int nd;
    int64_t s[5];
    double scale, bias; /* values bias + scale·N(0,1) */
    float *v;
} tw;

static tw g_w[200];
static int g_nw;

static float *W(const char *fmt, ...) H3_PRINTF(1, 2);
static float *W(const char *fmt, ...) {
    char n[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(n, sizeof n, fmt, ap);
    va_end(ap);
    for (int i = 0; i < g_nw; i++)
        if (!strcmp(g_w[i].name, n)) return g_w[i].v;
    t_fail_at(__FILE__, __LINE__, "no weight %s", n);
    exit(1);
}

static void add(const char *name, int nd, int64_t a, int64_t b, double scale, double bias) {
    tw *t = &g_w[g_nw++];
    t->name = h3_strdup(name);
    t->nd = nd;
    t->s[0] = a;
    t->s[1] = b;
    t->scale = scale;
    t->bias = bias;
    int64_t n = nd == 1 ? a : a * b;
    t->v = h3_malloc((size_t)n * sizeof(float), H3_MEM_OTHER);
    for (int64_t i = 0; i < n; i++) t->v[i] = (float)(bias + scale * t_randn());
}

static void build_weights(void) {
    char n[160];
    g_nw = 0;
    add("model.language_model.embed_tokens.weight", 2, TV, TC, 1.0, 0);
    for (int l = 0; l < TL; l++) {
#define A(s, nd, a, b, sc, bi)                                                                               \
    (snprintf(n, sizeof n, "model.language_model.layers.%d.%s", l, s), add(n, nd, a, b, sc, bi))
        A("input_layernorm.weight", 1, TC, 0, 0.1, 1);
        A("post_attention_layernorm.weight", 1, TC, 0, 0.1, 1);
        A("self_attn.q_proj.weight", 2, TH * TD, TC, 1 / sqrt(TC), 0);
        A("self_attn.k_proj.weight", 2, TKV * TD, TC, 1 / sqrt(TC), 0);
        A("self_attn.v_proj.weight", 2, TKV * TD, TC, 1 / sqrt(TC), 0);
        A("self_attn.o_proj.weight", 2, TC, TH * TD, 0.5 / sqrt(TH * TD), 0);
        A("self_attn.q_norm.weight", 1, TD, 0, 0.1, 1);
        A("self_attn.k_norm.weight", 1, TD, 0, 0.1, 1);
        A("mlp.gate_proj.weight", 2, TF, TC, 1 / sqrt(TC), 0);
        A("mlp.up_proj.weight", 2, TF, TC, 1 / sqrt(TC), 0);
        A("mlp.down_proj.weight", 2, TC, TF, 0.5 / sqrt(TF), 0);
#undef A
    }
    add("model.language_model.norm.weight", 1, TC, 0, 0.1, 1);
    add("model.visual.patch_embed.proj.weight", 2, VH, VCOLS, 1 / sqrt(VCOLS), 0); /* stored 5-D below */
    add("model.visual.patch_embed.proj.bias", 1, VH, 0, 0.1, 0);
    add("model.visual.pos_embed.weight", 2, VSIDE * VSIDE, VH, 0.5, 0);
    for (int l = 0; l < VDEPTH; l++) {
#define B(s, nd, a, b, sc, bi)                                                                               \
    (snprintf(n, sizeof n, "model.visual.blocks.%d.%s", l, s), add(n, nd, a, b, sc, bi))
        B("norm1.weight", 1, VH, 0, 0.1, 1);
        B("norm1.bias", 1, VH, 0, 0.1, 0);
        B("norm2.weight", 1, VH, 0, 0.1, 1);
        B("norm2.bias", 1, VH, 0, 0.1, 0);
        B("attn.qkv.weight", 2, 3 * VH, VH, 1 / sqrt(VH), 0);
        B("attn.qkv.bias", 1, 3 * VH, 0, 0.1, 0);
        B("attn.proj.weight", 2, VH, VH, 0.5 / sqrt(VH), 0);
        B("attn.proj.bias", 1, VH, 0, 0.1, 0);
        B("mlp.linear_fc1.weight", 2, VF, VH, 1 / sqrt(VH), 0);
        B("mlp.linear_fc1.bias", 1, VF, 0, 0.1, 0);
        B("mlp.linear_fc2.weight", 2, VH, VF, 0.5 / sqrt(VF), 0);
        B("mlp.linear_fc2.bias", 1, VH, 0, 0.1, 0);
#undef B
    }
    for (int k = -1; k < 2; k++) {
        char p[96];
        if (k < 0)
            snprintf(p, sizeof p, "model.visual.merger.");
        else
            snprintf(p, sizeof p, "model.visual.deepstack_merger_list.%d.", k);
        const int nw = k < 0 ? VH : 4 * VH;
#define M(s, nd, a, b, sc, bi) (snprintf(n, sizeof n, "%s%s", p, s), add(n, nd, a, b, sc, bi))
        M("norm.weight", 1, nw, 0, 0.1, 1);
        M("norm.bias", 1, nw, 0, 0.1, 0);
        M("linear_fc1.weight", 2, 4 * VH, 4 * VH, 1 / sqrt(4 * VH), 0);
        M("linear_fc1.bias", 1, 4 * VH, 0, 0.1, 0);
        M("linear_fc2.weight", 2, TC, 4 * VH, 1 / sqrt(4 * VH), 0);
        M("linear_fc2.bias", 1, TC, 0, 0.1, 0);
#undef M
    }
}

static void write_model(const char *dir) {
    char p[600];
    mkdir(dir, 0755);
    h3_st_writer *w;
    CHECK_OK(h3_st_writer_new(&w));
    for (int i = 0; i < g_nw; i++) {
        const tw *t = &g_w[i];
        if (!strcmp(t->name, "model.visual.patch_embed.proj.weight")) {
            const int64_t s5[5] = {VH, 3, 2, VP, VP};
            CHECK_OK(h3_st_writer_add(w, t->name, H3_F32, 5, s5, t->v));
        } else {
            CHECK_OK(h3_st_writer_add(w, t->name, H3_F32, t->nd, t->s, t->v));
        }
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_OK(h3_st_writer_write(w, p, 0));
    h3_st_writer_free(w);
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    fprintf(
        f,
        "{\"architectures\": [\"Qwen3VLForConditionalGeneration\"], \"image_token_id\": %d, "
        "\"video_token_id\": 62,"
        " \"vision_start_token_id\": %d, \"text_config\": {\"hidden_size\": %d, \"num_hidden_layers\": %d,"
        " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, \"intermediate_size\": "
        "%d,"
        " \"vocab_size\": %d, \"rms_norm_eps\": 1e-6, \"rope_theta\": 5000000.0, \"rope_scaling\": "
        "{\"rope_type\":"
        " \"default\", \"mrope_section\": [2, 1, 1], \"mrope_interleaved\": true}}, \"vision_config\": "
        "{\"depth\": %d,"
        " \"hidden_size\": %d, \"intermediate_size\": %d, \"num_heads\": %d, \"in_channels\": 3, "
        "\"patch_size\": %d,"
        " \"temporal_patch_size\": 2, \"spatial_merge_size\": 2, \"out_hidden_size\": %d, "
        "\"num_position_embeddings\":"
        " %d, \"deepstack_visual_indexes\": [%d, %d], \"hidden_act\": \"gelu_pytorch_tanh\"}}",
        IMG, VS, TC, TL, TH, TKV, TD, TF, TV, VDEPTH, VH, VF, VHEADS, VP, TC, VSIDE * VSIDE, g_deep[0],
        g_deep[1]);
    fclose(f);
}

/* ---- the float64 reference ---- */

static void lin64(const double *x, int64_t n, int64_t k, const float *w, const float *b, int64_t m,
                  double *y) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < m; o++) {
            double s = b ? b[o] : 0;
            for (int64_t j = 0; j < k; j++) s += x[i * k + j] * w[o * k + j];
            y[i * m + o] = s;
        }
}

static void ln64(double *x, int64_t n, int64_t c, const float *w, const float *b) {
    for (int64_t i = 0; i < n; i++) {
        double m = 0, v = 0;
        for (int64_t j = 0; j < c; j++) m += x[i * c + j];
        m /= c;
        for (int64_t j = 0; j < c; j++) v += (x[i * c + j] - m) * (x[i * c + j] - m);
        v /= c;
        for (int64_t j = 0; j < c; j++) x[i * c + j] = (x[i * c + j] - m) / sqrt(v + 1e-6) * w[j] + b[j];
    }
}

static void rms64(double *x, int64_t n, int64_t c, const float *w) {
    for (int64_t i = 0; i < n; i++) {
        double s = 0;
        for (int64_t j = 0; j < c; j++) s += x[i * c + j] * x[i * c + j];
        const double r = 1 / sqrt(s / c + 1e-6);
        for (int64_t j = 0; j < c; j++) x[i * c + j] *= r * w[j];
    }
}

/* rotate-half with angles ang [D/2] on one head of D */
static void rope64(double *h, const double *ang, int D) {
    for (int j = 0; j < D / 2; j++) {
        const double a = h[j], b = h[j + D / 2], c = cos(ang[j]), s = sin(ang[j]);
        h[j] = a * c - b * s;
        h[j + D / 2] = b * c + a * s;
    }
}

/* softmax attention of query rows [q0, q1) over key rows [k0, k1) (causal: keys up to the query) */
static void attn64(const double *q, const double *k, const double *v, double *o, int64_t s0, int64_t s1,
                   int H, int Hk, int D, int causal, int64_t qld, int64_t kld) {
    double *p = malloc((size_t)(s1 - s0) * sizeof *p);
    for (int64_t i = s0; i < s1; i++)
        for (int h = 0; h < H; h++) {
            const int hk = h / (H / Hk);
            const int64_t e = causal ? i + 1 : s1;
            double mx = -1e300, sum = 0;
            for (int64_t j = s0; j < e; j++) {
                double d = 0;
                for (int c = 0; c < D; c++) d += q[i * qld + h * D + c] * k[j * kld + hk * D + c];
                p[j - s0] = d / sqrt(D);
                if (p[j - s0] > mx) mx = p[j - s0];
            }
            for (int64_t j = s0; j < e; j++) sum += (p[j - s0] = exp(p[j - s0] - mx));
            for (int c = 0; c < D; c++) {
                double a = 0;
                for (int64_t j = s0; j < e; j++) a += p[j - s0] * v[j * kld + hk * D + c];
                o[i * qld + h * D + c] = a / sum;
            }
        }
    free(p);
}

static double gelu_tanh(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* merger k (-1: the final one) of x [N, VH] into out [N/4, TC] */
static void merger64(int k, const double *x, int64_t N, double *out) {
    char p[96];
    if (k < 0)
        snprintf(p, sizeof p, "model.visual.merger.");
    else
        snprintf(p, sizeof p, "model.visual.deepstack_merger_list.%d.", k);
    double *h = malloc((size_t)N * VH * sizeof *h), *f = malloc((size_t)N / 4 * 4 * VH * sizeof *f);
    memcpy(h, x, (size_t)N * VH * sizeof *h);
    if (k < 0)
        ln64(h, N, VH, W("%snorm.weight", p), W("%snorm.bias", p));
    else
        ln64(h, N / 4, 4 * VH, W("%snorm.weight", p), W("%snorm.bias", p));
    lin64(h, N / 4, 4 * VH, W("%slinear_fc1.weight", p), W("%slinear_fc1.bias", p), 4 * VH, f);
    for (int64_t i = 0; i < N / 4 * 4 * VH; i++) f[i] = 0.5 * f[i] * (1 + erf(f[i] / sqrt(2)));
    lin64(f, N / 4, 4 * VH, W("%slinear_fc2.weight", p), W("%slinear_fc2.bias", p), TC, out);
    free(h);
    free(f);
}

/* the tower: embeds [M, TC] and deep[2] [M, TC], M = N/4 */
static void vision64(const float *pix, const int64_t (*grid)[3], int n_img, int64_t N, double *emb,
                     double **deep) {
    double *x = calloc((size_t)N * VH, sizeof *x), *h = malloc((size_t)N * VH * sizeof *h),
           *qkv = malloc((size_t)N * 3 * VH * sizeof *qkv), *o = malloc((size_t)N * VH * sizeof *o),
           *f = malloc((size_t)N * VF * sizeof *f), *px = malloc((size_t)N * VCOLS * sizeof *px);
    double(*ang)[VD / 2] = malloc((size_t)N * sizeof *ang);
    for (int64_t i = 0; i < N * VCOLS; i++) px[i] = pix[i];
    lin64(px, N, VCOLS, W("model.visual.patch_embed.proj.weight"), W("model.visual.patch_embed.proj.bias"),
          VH, x);
    const float *tab = W("model.visual.pos_embed.weight");
    int64_t r = 0;
    for (int i = 0; i < n_img; i++) {
        const int64_t gh = grid[i][1], gw = grid[i][2];
        for (int64_t bh = 0; bh < gh / 2; bh++)
            for (int64_t bw = 0; bw < gw / 2; bw++)
                for (int mh = 0; mh < 2; mh++)
                    for (int mw = 0; mw < 2; mw++, r++) {
                        const int64_t y = bh * 2 + mh, xx = bw * 2 + mw;
                        const double fy = gh > 1 ? (double)y * (VSIDE - 1) / (double)(gh - 1) : 0,
                                     fx = gw > 1 ? (double)xx * (VSIDE - 1) / (double)(gw - 1) : 0;
                        const int y0 = (int)fy, x0 = (int)fx, y1 = y0 + 1 < VSIDE ? y0 + 1 : VSIDE - 1,
                                  x1 = x0 + 1 < VSIDE ? x0 + 1 : VSIDE - 1;
                        const double dy = fy - y0, dx = fx - x0;
                        for (int c = 0; c < VH; c++)
                            x[r * VH + c] += (1 - dy) * (1 - dx) * tab[(y0 * VSIDE + x0) * VH + c] +
                                             (1 - dy) * dx * tab[(y0 * VSIDE + x1) * VH + c] +
                                             dy * (1 - dx) * tab[(y1 * VSIDE + x0) * VH + c] +
                                             dy * dx * tab[(y1 * VSIDE + x1) * VH + c];
                        /* rotary: head_dim 8 -> 2 frequencies per axis of 10000^(−2j/4) */
                        for (int j = 0; j < 2; j++) {
                            ang[r][j] = (double)y * pow(10000.0, -2.0 * j / 4.0);
                            ang[r][2 + j] = (double)xx * pow(10000.0, -2.0 * j / 4.0);
                        }
                    }
    }
    int nd = 0;
    for (int l = 0; l < VDEPTH; l++) {
        char p[64];
        snprintf(p, sizeof p, "model.visual.blocks.%d.", l);
        memcpy(h, x, (size_t)N * VH * sizeof *h);
        ln64(h, N, VH, W("%snorm1.weight", p), W("%snorm1.bias", p));
        lin64(h, N, VH, W("%sattn.qkv.weight", p), W("%sattn.qkv.bias", p), 3 * VH, qkv);
        for (int64_t i = 0; i < N; i++)
            for (int hd = 0; hd < VHEADS; hd++) {
                rope64(&qkv[i * 3 * VH + hd * VD], ang[i], VD);
                rope64(&qkv[i * 3 * VH + VH + hd * VD], ang[i], VD);
            }
        /* per image; q, k, v are column blocks of qkv (row stride 3·VH) */
        int64_t s0 = 0;
        double *ob = calloc((size_t)N * 3 * VH, sizeof *ob);
        for (int i = 0; i < n_img; i++) {
            const int64_t len = grid[i][1] * grid[i][2];
            attn64(qkv, qkv + VH, qkv + 2 * VH, ob, s0, s0 + len, VHEADS, VHEADS, VD, 0, 3 * VH, 3 * VH);
            s0 += len;
        }
        for (int64_t i = 0; i < N; i++)
            for (int c = 0; c < VH; c++) o[i * VH + c] = ob[i * 3 * VH + c];
        free(ob);
        lin64(o, N, VH, W("%sattn.proj.weight", p), W("%sattn.proj.bias", p), VH, h);
        for (int64_t i = 0; i < N * VH; i++) x[i] += h[i];
        memcpy(h, x, (size_t)N * VH * sizeof *h);
        ln64(h, N, VH, W("%snorm2.weight", p), W("%snorm2.bias", p));
        lin64(h, N, VH, W("%smlp.linear_fc1.weight", p), W("%smlp.linear_fc1.bias", p), VF, f);
        for (int64_t i = 0; i < N * VF; i++) f[i] = gelu_tanh(f[i]);
        lin64(f, N, VF, W("%smlp.linear_fc2.weight", p), W("%smlp.linear_fc2.bias", p), VH, h);
        for (int64_t i = 0; i < N * VH; i++) x[i] += h[i];
        if (nd < 2 && g_deep[nd] == l) merger64(nd, x, N, deep[nd]), nd++;
    }
    merger64(-1, x, N, emb);
    free(x);
    free(h);
    free(qkv);
    free(o);
    free(f);
    free(px);
    free(ang);
}

/* hidden_states[0..TL] of the prompt with the vision rows, as transformers records them */
static void text64(const int32_t *ids, int64_t n, const int64_t (*pos)[15], const double *emb, double **deep,
                   double **hs) {
    const int QW = TH * TD, KW = TKV * TD;
    double *x = malloc((size_t)n * TC * sizeof *x), *h = malloc((size_t)n * TC * sizeof *h),
           *q = malloc((size_t)n * QW * sizeof *q), *k = malloc((size_t)n * KW * sizeof *k),
           *v = malloc((size_t)n * KW * sizeof *v), *o = malloc((size_t)n * QW * sizeof *o),
           *g = malloc((size_t)n * TF * sizeof *g), *u = malloc((size_t)n * TF * sizeof *u);
    const float *E = W("model.language_model.embed_tokens.weight");
    int64_t vr[16], nv = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] == IMG) {
            vr[nv] = i;
            for (int c = 0; c < TC; c++) x[i * TC + c] = emb[nv * TC + c];
            nv++;
        } else {
            for (int c = 0; c < TC; c++) x[i * TC + c] = E[ids[i] * TC + c];
        }
    }
    memcpy(hs[0], x, (size_t)n * TC * sizeof *x);
    for (int l = 0; l < TL; l++) {
        char p[64];
        snprintf(p, sizeof p, "model.language_model.layers.%d.", l);
        memcpy(h, x, (size_t)n * TC * sizeof *h);
        rms64(h, n, TC, W("%sinput_layernorm.weight", p));
        lin64(h, n, TC, W("%sself_attn.q_proj.weight", p), NULL, QW, q);
        lin64(h, n, TC, W("%sself_attn.k_proj.weight", p), NULL, KW, k);
        lin64(h, n, TC, W("%sself_attn.v_proj.weight", p), NULL, KW, v);
        rms64(q, n * TH, TD, W("%sself_attn.q_norm.weight", p));
        rms64(k, n * TKV, TD, W("%sself_attn.k_norm.weight", p));
        for (int64_t i = 0; i < n; i++) {
            double ang[TD / 2];
            for (int j = 0; j < TD / 2; j++) {
                /* sections [2, 1, 1]: j = 1 -> h, j = 2 -> w, j = 0, 3 -> t */
                const int ax = j == 1 ? 1 : j == 2 ? 2 : 0;
                ang[j] = (double)pos[ax][i] * pow(5e6, -2.0 * j / TD);
            }
            for (int hd = 0; hd < TH; hd++) rope64(&q[i * QW + hd * TD], ang, TD);
            for (int hd = 0; hd < TKV; hd++) rope64(&k[i * KW + hd * TD], ang, TD);
        }
        attn64(q, k, v, o, 0, n, TH, TKV, TD, 1, QW, KW);
        lin64(o, n, QW, W("%sself_attn.o_proj.weight", p), NULL, TC, h);
        for (int64_t i = 0; i < n * TC; i++) x[i] += h[i];
        memcpy(h, x, (size_t)n * TC * sizeof *h);
        rms64(h, n, TC, W("%spost_attention_layernorm.weight", p));
        lin64(h, n, TC, W("%smlp.gate_proj.weight", p), NULL, TF, g);
        lin64(h, n, TC, W("%smlp.up_proj.weight", p), NULL, TF, u);
        for (int64_t i = 0; i < n * TF; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        lin64(g, n, TF, W("%smlp.down_proj.weight", p), NULL, TC, h);
        for (int64_t i = 0; i < n * TC; i++) x[i] += h[i];
        memcpy(hs[l + 1], x, (size_t)n * TC * sizeof *x); /* recorded before the deepstack addition */
        if (l < 2)
            for (int64_t r = 0; r < nv; r++)
                for (int c = 0; c < TC; c++) x[vr[r] * TC + c] += deep[l][r * TC + c];
    }
    /* the last state is after the final norm (of the state with any addition) */
    memcpy(hs[TL], x, (size_t)n * TC * sizeof *x);
    rms64(hs[TL], n, TC, W("model.language_model.norm.weight"));
    free(x);
    free(h);
    free(q);
    free(k);
    free(v);
    free(o);
    free(g);
    free(u);
}

static void test_tiny_model(void) {
    char dir[512];
    t_tmp_path("vision_tiny", dir, sizeof dir);
    build_weights();
    write_model(dir);
    h3_exec ex;
    CHECK_OK(h3_exec_init(&ex, 2));
    h3_text_encoder *te = NULL;
    h3_vision *vis = NULL;
    CHECK_OK(h3_text_encoder_open(dir, NULL, &te));
    CHECK_OK(h3_vision_open(te, NULL, &vis));
    if (!vis) {
        h3_text_encoder_close(te);
        h3_exec_free(&ex);
        return;
    }
    const h3_vis_config *vc = h3_vision_config(vis);
    CHECK(vc->depth == VDEPTH && vc->hidden == VH && vc->n_deep == 2 && vc->deep_idx[1] == 2 &&
              vc->patch == VP,
          "vision config not read from config.json");
    const int64_t N = 24 + 4, M = N / 4;
    h3_tensor px, emb, deep[2];
    CHECK_OK(h3_tensor_alloc2(&px, H3_PLACE_HOST, H3_F32, N, VCOLS, H3_MEM_OTHER));
    t_fill_uniform(px.data, (size_t)(N * VCOLS), -1, 1);
    CHECK_OK(h3_tensor_alloc2(&emb, H3_PLACE_HOST, H3_F32, M, TC, H3_MEM_OTHER));
    for (int k = 0; k < 2; k++)
        CHECK_OK(h3_tensor_alloc2(&deep[k], H3_PLACE_HOST, H3_F32, M, TC, H3_MEM_OTHER));
    /* the tower alone, for one image and for both */
    double *re = malloc((size_t)M * TC * sizeof *re),
           *rd[2] = {malloc((size_t)M * TC * 8), malloc((size_t)M * TC * 8)};
    for (int n_img = 1; n_img <= 2; n_img++) {
        const int64_t Ni = n_img == 1 ? 24 : N, Mi = Ni / 4;
        h3_tensor pxi, ei, di[2];
        CHECK_OK(h3_tensor_narrow(&px, 0, 0, Ni, &pxi));
        CHECK_OK(h3_tensor_narrow(&emb, 0, 0, Mi, &ei));
        for (int k = 0; k < 2; k++) CHECK_OK(h3_tensor_narrow(&deep[k], 0, 0, Mi, &di[k]));
        CHECK_OK(h3_vision_forward(vis, &ex, H3_PLACE_HOST, &pxi, g_grid, n_img, &ei, di));
        vision64(px.data, g_grid, n_img, Ni, re, rd);
        EXPECT_CLOSE(n_img == 1 ? "tower, one image: merger" : "tower, two images: merger", ei.data, re,
                     (size_t)(Mi * TC), 1e-5);
        EXPECT_CLOSE("tower: deepstack 0", di[0].data, rd[0], (size_t)(Mi * TC), 1e-5);
        EXPECT_CLOSE("tower: deepstack 1", di[1].data, rd[1], (size_t)(Mi * TC), 1e-5);
    }
    /* the prompt through the text encoder: every hidden state against the reference */
    double *hs[TL + 1];
    for (int l = 0; l <= TL; l++) hs[l] = malloc((size_t)15 * TC * sizeof(double));
    text64(g_ids, 15, g_pos, re, rd, hs);
    h3_tensor out;
    CHECK_OK(h3_tensor_alloc2(&out, H3_PLACE_HOST, H3_F32, 15, TC, H3_MEM_OTHER));
    for (int l = 0; l <= TL; l++) {
        CHECK_OK(h3_vision_encode_prompt(vis, te, &ex, H3_PLACE_HOST, g_ids, 15, &px, g_grid, 2, l, &out));
        char what[64];
        snprintf(what, sizeof what, "hidden_states[%d] with two images", l);
        EXPECT_CLOSE(what, out.data, hs[l], (size_t)(15 * TC), 1e-4);
    }
    /* a mismatch of tokens and grids is refused before anything runs */
    CHECK_ERR(h3_vision_encode_prompt(vis, te, &ex, H3_PLACE_HOST, g_ids, 15, &px, g_grid, 1, 1, &out),
              H3_ERR_INVALID, "pixel_values must be");
    h3_tensor_free(&out);
    for (int l = 0; l <= TL; l++) free(hs[l]);
    free(re);
    free(rd[0]);
    free(rd[1]);
    h3_tensor_free(&px);
    h3_tensor_free(&emb);
    for (int k = 0; k < 2; k++) h3_tensor_free(&deep[k]);
    h3_vision_close(vis);
    h3_text_encoder_close(te);
    /* files without a config.json */
    char p[512];
    CHECK_OK(h3_text_encoder_open(t_src_path("tests/fixtures/text_encoder/comfy.safetensors", p, sizeof p),
                                  NULL, &te));
    if (te) { /* no config: the release's vision shapes are expected, and this tiny tower is refused in the
                 binder's form */
        CHECK_ERR(h3_vision_open(te, NULL, &vis), H3_ERR_FORMAT, "ViT stem 0 needs [hidden, channels");
        h3_text_encoder_close(te);
    }
    h3_exec_free(&ex);
    for (int i = 0; i < g_nw; i++) {
        h3_free((void *)g_w[i].name);
        h3_free(g_w[i].v);
    }
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        {"smart_resize", test_smart_resize},
        {"preprocess", test_preprocess},
        {"resize_tv", test_resize_tv},
        {"bad_images", test_bad_images},
        {"rope_index", test_rope_index},
        {"vit_rope", test_vit_rope},
        {"tiny_model", test_tiny_model},
        {NULL, NULL},
    };
    return t_main("vision", cases, argc, argv);
}
