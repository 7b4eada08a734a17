// The machine's read bandwidth as the int8 decode kernels read a weight matrix: the
// ceiling a decode step streams its weights against. Four ways over the same buffer,
// two threads each reading its half, best of ten:
//   sequential      one 64-byte load after another (the plain streaming read);
//   16 rows         sixteen rows of K bytes read a 64-byte step of each at a time, as
//                   `q8_rows16_blocked_vnni` and `q4_rows16_vnni` do, no prefetch;
//   + row prefetch  the same with the next pass's line of each row prefetched each step;
//   + memory order  the same with the next pass's lines prefetched in memory order.
// Build and run (x86-64 with AVX-512F):
//   cc -O2 -mavx512f -pthread bench/read_bandwidth.c -o /tmp/read_bandwidth
//   /tmp/read_bandwidth 150 576     # MiB of buffer, row bytes (SmolLM2's 576)
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t total, row;
static char *buf;
static int mode;
enum { THREADS = 2 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *run(void *arg) {
    long id = (long)arg;
    size_t per = total / THREADS, pass = 16 * row;
    per -= per % pass;
    const char *p = buf + id * per;
    __m512i acc = _mm512_setzero_si512();
    if (mode == 0) {
        for (size_t i = 0; i < per; i += 64) acc = _mm512_add_epi32(acc, _mm512_loadu_si512(p + i));
    } else {
        for (size_t at = 0; at < per; at += pass) {
            const char *b = p + at, *next = b + pass;
            for (size_t c = 0; c < row; c += 64)
                for (size_t r = 0; r < 16; r++) {
                    if (mode == 2) _mm_prefetch(next + r * row + c, _MM_HINT_T0);
                    if (mode == 3) _mm_prefetch(next + (c / 64 * 16 + r) * 64, _MM_HINT_T0);
                    acc = _mm512_add_epi32(acc, _mm512_loadu_si512(b + r * row + c));
                }
        }
    }
    volatile int sink = _mm512_reduce_add_epi32(acc);
    (void)sink;
    return NULL;
}

int main(int argc, char **argv) {
    total = (size_t)(argc > 1 ? atol(argv[1]) : 150) << 20;
    row = argc > 2 ? (size_t)atol(argv[2]) : 576;
    if (row == 0 || row % 64) {
        fprintf(stderr, "row bytes must be a positive multiple of 64\n");
        return 1;
    }
    buf = aligned_alloc(64, total + 16 * row + 64);
    if (!buf) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    memset(buf, 1, total + 16 * row + 64);
    const char *names[] = {"sequential", "16 rows", "16 rows + row prefetch", "16 rows + memory order"};
    printf("read bandwidth, %zu MiB, rows of %zu bytes, %d threads, GB/s (best of 10)\n", total >> 20, row, THREADS);
    for (mode = 0; mode < 4; mode++) {
        double best = 0;
        for (int rep = 0; rep < 10; rep++) {
            pthread_t th[THREADS];
            double t0 = now();
            for (long i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, run, (void *)i);
            for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
            double gbs = total / (now() - t0) / 1e9;
            if (gbs > best) best = gbs;
        }
        printf("%-26s %6.1f\n", names[mode], best);
    }
    return 0;
}
