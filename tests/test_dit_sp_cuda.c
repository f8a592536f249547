/* The split DiT forward (h3_dit_forward_sp) over NCCL, one process and GPU a rank: each rank runs the reduced DiT
 * fixture whole on its GPU and split over the group, and the two must agree within bf16 rounding (the device's
 * activations are bf16; the split changes only which rows each GEMM sees). Also each rank's received bytes are
 * Ulysses' count (test_dit split has the formula).
 *
 * Usage: test_dit_sp_cuda [RANKS] (default 2). The parent starts RANKS copies of itself (--rank r), never touching
 * CUDA itself; rank 0 makes the NCCL id and writes it to a file the others read. Skips (exit 0) without CUDA, with
 * fewer GPUs than ranks, or without NCCL. */
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda/cuda.h"
#include "models/dit.h"
#include "tensor/comm.h"
#include "testutil.h"

extern char **environ;

enum { SKIP = 77 };

static int read_id(const char *path, unsigned char id[128]) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    const size_t n = fread(id, 1, 128, f);
    fclose(f);
    return n == 128 ? 1 : n == 0 ? -1 : 0; /* an empty file: rank 0 found no NCCL or too few GPUs */
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* relative L2 distance of a from b (testutil's t_rel_err takes its reference in double) */
static double rel_l2(const float *a, const float *b, int64_t n) {
    double *ref = malloc((size_t)n * sizeof(double) + 8);
    for (int64_t i = 0; i < n; i++) ref[i] = b[i];
    const double e = t_rel_err(a, ref, (size_t)n);
    free(ref);
    return e;
}

static h3_status to_host(h3_exec *ex, const h3_tensor *dev, h3_tensor *host) {
    H3_TRY(h3_tensor_alloc(host, H3_PLACE_HOST, H3_F32, dev->ndim, dev->shape, H3_MEM_ACTIVATIONS));
    H3_TRY(h3_copy(ex, host, dev));
    return h3_exec_sync(ex);
}

static int rank_main(int rank, int size, const char *idpath) {
    if (h3_cuda_device_count() < size) {
        printf("rank %d: %d GPUs here, %d ranks asked\n", rank, h3_cuda_device_count(), size);
        if (rank == 0) { /* let the others stop waiting */
            FILE *f = fopen(idpath, "wb");
            if (f) fclose(f);
        }
        return SKIP;
    }
    unsigned char id[128];
    if (rank == 0) {
        char tmp[1100];
        snprintf(tmp, sizeof tmp, "%s.tmp", idpath);
        FILE *f = fopen(tmp, "wb");
        const h3_status st = h3_cuda_comm_unique_id(id);
        if (f && st == H3_OK) fwrite(id, 1, 128, f);
        if (f) fclose(f);
        rename(tmp, idpath);
        if (st != H3_OK) {
            printf("rank 0: %s\n", h3_last_error());
            return SKIP;
        }
    } else {
        int got = 0;
        for (int i = 0; i < 1200 && !got; i++) { /* two minutes */
            got = read_id(idpath, id);
            if (!got) usleep(100000);
        }
        if (got <= 0) {
            printf("rank %d: no group id from rank 0\n", rank);
            return got < 0 ? SKIP : 1;
        }
    }
    h3_exec ex;
    if (h3_exec_init(&ex, 0) != H3_OK || h3_cuda_init(&ex, rank, (int64_t)8 << 30) != H3_OK) {
        fprintf(stderr, "rank %d: init failed: %s\n", rank, h3_last_error());
        return 1;
    }
    h3_comm comm;
    if (h3_cuda_comm_create(&ex, rank, size, id, &comm) != H3_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, h3_last_error());
        return 1;
    }
    char p[1024], q[1024];
    t_src_path("tests/fixtures/dit/official", p, sizeof p);
    t_src_path("tests/fixtures/dit/inputs.safetensors", q, sizeof q);
    h3_dit_open_opts go;
    memset(&go, 0, sizeof go);
    go.act_place = H3_PLACE_DEVICE;
    go.weight_place = H3_PLACE_DEVICE;
    h3_dit *d = NULL;
    h3_dit_inputs_file f;
    memset(&f, 0, sizeof f);
    CHECK_OK(h3_dit_open(p, &go, &d));
    if (d) CHECK_OK(h3_dit_upload_weights(d, &ex));
    if (d) CHECK_OK(h3_dit_inputs_read(q, h3_dit_get_config(d), &f));
    if (t_failures == 0) {
        const h3_dit_config *c = h3_dit_get_config(d);
        const int64_t Nv = f.video.shape[0], Na = f.audio.shape[0];
        h3_tensor dv, da, dt, vo[2], ao[2], hv[2], ha[2];
        CHECK_OK(h3_tensor_alloc(&dv, H3_PLACE_DEVICE, f.video.dtype, f.video.ndim, f.video.shape, H3_MEM_ACTIVATIONS));
        CHECK_OK(h3_tensor_alloc(&da, H3_PLACE_DEVICE, f.audio.dtype, f.audio.ndim, f.audio.shape, H3_MEM_ACTIVATIONS));
        CHECK_OK(h3_tensor_alloc(&dt, H3_PLACE_DEVICE, f.text.dtype, f.text.ndim, f.text.shape, H3_MEM_ACTIVATIONS));
        CHECK_OK(h3_copy(&ex, &dv, &f.video));
        CHECK_OK(h3_copy(&ex, &da, &f.audio));
        CHECK_OK(h3_copy(&ex, &dt, &f.text));
        h3_dit_inputs in = f.in;
        in.video = &dv;
        in.audio = &da;
        in.text = &dt;
        for (int k = 0; k < 2; k++) {
            CHECK_OK(h3_tensor_alloc2(&vo[k], H3_PLACE_DEVICE, H3_F32, Nv, h3_dit_video_dim(c), H3_MEM_ACTIVATIONS));
            CHECK_OK(h3_tensor_alloc2(&ao[k], H3_PLACE_DEVICE, H3_F32, Na, c->audio_dim, H3_MEM_ACTIVATIONS));
        }
        CHECK_OK(h3_dit_forward(d, &ex, &in, &vo[0], &ao[0]));
        const double t0 = now_s();
        CHECK_OK(h3_dit_forward_sp(d, &ex, &comm, &in, &vo[1], &ao[1]));
        CHECK_OK(h3_exec_sync(&ex));
        const double secs = now_s() - t0;
        for (int k = 0; k < 2; k++) {
            CHECK_OK(to_host(&ex, &vo[k], &hv[k]));
            CHECK_OK(to_host(&ex, &ao[k], &ha[k]));
        }
        const double ev = rel_l2(hv[1].data, hv[0].data, h3_tensor_numel(&hv[0]));
        const double ea = rel_l2(ha[1].data, ha[0].data, h3_tensor_numel(&ha[0]));
        const int64_t S = f.in.seq_len, n = S * (rank + 1) / size - S * rank / size;
        const int64_t blk = c->heads / size * c->head_dim * 2, row = c->hidden * 4; /* bf16 q/k/v/o, f32 stream */
        const int64_t want = c->n_layers * (3 * (S - n) + (int64_t)(size - 1) * n) * blk + (S - n) * row;
        printf("rank %d of %d: split forward %.3f ms, velocities %.2e / %.2e relative L2 off the whole forward, "
               "%lld bytes in (Ulysses: %lld)\n",
               rank, size, secs * 1e3, ev, ea, (long long)comm.bytes_in, (long long)want);
        CHECK(ev <= 1e-2 && ea <= 1e-2, "rank %d: %.2e / %.2e off", rank, ev, ea);
        CHECK(comm.bytes_in == want, "rank %d: %lld bytes in, expected %lld", rank, (long long)comm.bytes_in,
              (long long)want);
        h3_tensor *all[] = {&dv, &da, &dt, &vo[0], &vo[1], &ao[0], &ao[1], &hv[0], &hv[1], &ha[0], &ha[1]};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) h3_tensor_free(all[i]);
    }
    h3_dit_inputs_file_free(&f);
    h3_dit_close(d);
    h3_cuda_comm_destroy(&comm);
    h3_cuda_shutdown(&ex);
    h3_exec_free(&ex);
    return t_failures ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc >= 5 && !strcmp(argv[1], "--rank")) return rank_main(atoi(argv[2]), atoi(argv[3]), argv[4]);
    if (!h3_cuda_compiled()) {
        printf("test_dit_sp_cuda: skipped: this build has no CUDA\n");
        return 0;
    }
    const int size = argc > 1 ? atoi(argv[1]) : 2;
    if (size < 2 || size > 8) {
        fprintf(stderr, "test_dit_sp_cuda: 2 to 8 ranks, not '%s'\n", argv[1]);
        return 2;
    }
    char dir[] = "/tmp/h3-sp-XXXXXX", idpath[64], rs[16], ss[16];
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(idpath, sizeof idpath, "%s/id", dir);
    snprintf(ss, sizeof ss, "%d", size);
    pid_t pid[8];
    for (int r = 0; r < size; r++) {
        snprintf(rs, sizeof rs, "%d", r);
        char *av[] = {argv[0], "--rank", rs, ss, idpath, NULL};
        if (posix_spawn(&pid[r], "/proc/self/exe", NULL, NULL, av, environ) != 0) {
            perror("posix_spawn");
            return 1;
        }
    }
    int skipped = 0, failed = 0;
    for (int r = 0; r < size; r++) {
        int status = 0;
        while (waitpid(pid[r], &status, 0) < 0 && errno == EINTR) {
        }
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
        skipped += code == SKIP;
        failed += code != 0 && code != SKIP;
    }
    unlink(idpath);
    rmdir(dir);
    if (failed) {
        printf("test_dit_sp_cuda: %d of %d ranks failed\n", failed, size);
        return 1;
    }
    if (skipped) {
        printf("test_dit_sp_cuda: skipped: needs %d GPUs and NCCL (the ranks say which was missing)\n", size);
        return 0;
    }
    printf("test_dit_sp_cuda: %d ranks agree with the whole forward\n", size);
    return 0;
}
