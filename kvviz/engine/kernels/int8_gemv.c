/* y = x · (q · scale)ᵀ for a matrix stored as int8 per output channel (kvviz.engine.model.Int8Weight):
 * q [N, K] int8 row-major, scale [N] bfloat16, x [M, K] float32, y [M, N] float32.
 *
 * Built at first use by kvviz/engine/kernels/int8.py with the machine's C compiler; any compiler and CPU builds the
 * plain loop, an AVX2 CPU (with -mavx2 -mfma) the vector one. Why a kernel of kvviz's own: torch's weight-only int8
 * kernels convert every int8 weight to a float before multiplying (compute-bound at ~1/3 of the memory's rate on an
 * AVX2 CPU), while llama.cpp multiplies integers (ggml/src/ggml-cpu/arch/x86/quants.c, ggml_vec_dot_q8_0_q8_0: the
 * activations quantized to int8 per block of 32 too, by quantize_row_q8_0, multiplied by vpmaddubsw).
 * Here the activations become int16 per block of 256 (scale max|x| / 32767: each entry moves by at most 1/65534 of
 * its block's largest, finer than bfloat16's 2⁻⁹ for any entry within 1/128 of it), so that one vpmaddwd does
 * 16 multiply-adds of int8 weights (sign-extended) by int16 activations exactly in int32; a block's sum is at most
 * 256 · 127 · 32767 < 2³¹, so no int32 overflows, and each block's sum is scaled and added in float32.
 * Four rows share each activation load, and the rows 32 ahead are prefetched: four rows of ~600 bytes are too
 * short for the hardware's stream prefetcher (without it a 28 MB LM head streamed at 9 GB/s, with it 19 GB/s).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define BLOCK 256        /* activations per int16 scale */
#define PREFETCH_ROWS 32 /* how far ahead of the four rows in hand the weights are prefetched */
#define ROWS_PER_TASK 64 /* rows a thread takes at a time */

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* One row of activations to int16 per block: xq = round(x / d), d = max|x| / 32767 per block. A block holding a NaN
 * or an infinity gets d = NaN, so that every output it reaches is NaN, as a float product's would not be a number. */
static void quantize_row(const float *x, int64_t k, int16_t *xq, float *d) {
    for (int64_t i0 = 0, b = 0; i0 < k; i0 += BLOCK, b++) {
        int64_t i1 = min64(i0 + BLOCK, k);
        float amax = 0.0f;
        int finite = 1;
        for (int64_t i = i0; i < i1; i++) {
            float a = fabsf(x[i]);
            finite &= a <= FLT_MAX; /* false for NaN too */
            amax = fmaxf(amax, a);
        }
        if (!finite) {
            d[b] = NAN;
            for (int64_t i = i0; i < i1; i++) xq[i] = 0;
            continue;
        }
        float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
        d[b] = amax / 32767.0f;
        for (int64_t i = i0; i < i1; i++) xq[i] = (int16_t)lrintf(x[i] * inv);
    }
}

#ifdef __AVX2__
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* acc += 16 int8 weights at p (sign-extended to int16) times the 16 int16 activations in xv, pairwise in int32 */
#define DOT16(acc, p) \
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p))), xv))

/* Rows [r, r + 4) for every activation row; k a multiple of 16. */
static void four_rows(const int16_t *xq, const float *d, int64_t m, const int8_t *q, const uint16_t *scale, float *y,
                      int64_t n, int64_t k, int64_t r) {
    int64_t blocks = (k + BLOCK - 1) / BLOCK;
    const int8_t *q0 = q + r * k, *q1 = q0 + k, *q2 = q1 + k, *q3 = q2 + k;
    for (int64_t j = 0; j < m; j++) {
        const int16_t *xj = xq + j * k;
        __m256 f0 = _mm256_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
        for (int64_t b = 0; b < blocks; b++) {
            __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
            for (int64_t i = b * BLOCK, end = min64(i + BLOCK, k); i < end; i += 16) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xj + i));
                /* the four rows are 4k contiguous bytes: one 64-byte line ahead per 16 columns covers them */
                _mm_prefetch((const char *)(q0 + PREFETCH_ROWS * k + 4 * i), _MM_HINT_T0);
                DOT16(s0, q0 + i);
                DOT16(s1, q1 + i);
                DOT16(s2, q2 + i);
                DOT16(s3, q3 + i);
            }
            __m256 db = _mm256_set1_ps(d[j * blocks + b]);
            f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), db, f0);
            f1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), db, f1);
            f2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s2), db, f2);
            f3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s3), db, f3);
        }
        float *yj = y + j * n + r;
        yj[0] = hsum(f0) * bf16_to_f32(scale[r]);
        yj[1] = hsum(f1) * bf16_to_f32(scale[r + 1]);
        yj[2] = hsum(f2) * bf16_to_f32(scale[r + 2]);
        yj[3] = hsum(f3) * bf16_to_f32(scale[r + 3]);
    }
}
#endif

/* Row r for every activation row, in plain C (any CPU; the tail rows and any k on an AVX2 one). */
static void one_row(const int16_t *xq, const float *d, int64_t m, const int8_t *q, const uint16_t *scale, float *y,
                    int64_t n, int64_t k, int64_t r) {
    int64_t blocks = (k + BLOCK - 1) / BLOCK;
    const int8_t *qr = q + r * k;
    for (int64_t j = 0; j < m; j++) {
        const int16_t *xj = xq + j * k;
        float s = 0.0f;
        for (int64_t b = 0; b < blocks; b++) {
            int32_t acc = 0;
            for (int64_t i = b * BLOCK, end = min64(i + BLOCK, k); i < end; i++) acc += (int32_t)qr[i] * xj[i];
            s += (float)acc * d[j * blocks + b];
        }
        y[j * n + r] = s * bf16_to_f32(scale[r]);
    }
}

static void rows(const int16_t *xq, const float *d, int64_t m, const int8_t *q, const uint16_t *scale, float *y,
                 int64_t n, int64_t k, int64_t r0, int64_t r1) {
    int64_t r = r0;
#ifdef __AVX2__
    if (k % 16 == 0)
        for (; r + 4 <= r1; r += 4) four_rows(xq, d, m, q, scale, y, n, k, r);
#endif
    for (; r < r1; r++) one_row(xq, d, m, q, scale, y, n, k, r);
}

/* 0 on success, 1 when the activations' int16 copy could not be allocated. */
int kvviz_int8_linear(const float *x, int64_t m, const int8_t *q, const uint16_t *scale, float *y, int64_t n,
                      int64_t k, int threads) {
    int64_t blocks = (k + BLOCK - 1) / BLOCK;
    int16_t *xq = malloc(sizeof(int16_t) * m * k);
    float *d = malloc(sizeof(float) * m * blocks);
    if (!xq || !d) {
        free(xq);
        free(d);
        return 1;
    }
    for (int64_t j = 0; j < m; j++) quantize_row(x + j * k, k, xq + j * k, d + j * blocks);
    int64_t tasks = (n + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
    (void)threads; /* read by OpenMP's pragma where the kernel was built with it */
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t t = 0; t < tasks; t++)
        rows(xq, d, m, q, scale, y, n, k, t * ROWS_PER_TASK, min64((t + 1) * ROWS_PER_TASK, n));
    free(xq);
    free(d);
    return 0;
}
