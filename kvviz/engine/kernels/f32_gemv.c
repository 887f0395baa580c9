/* y = W · x for one float32 row: x [K], W [N, K], y [N] (a decode step's product at batch 1), W read from the layout
 * kvviz_f32_pack writes: the rows in groups of 8 (the last group padded with zero rows), each group stored column
 * block by column block, 8 rows × 8 columns at a time, so that a group is one sequential stream of 32 K bytes.
 *
 * Built at first use by kvviz/engine/kernels/f32.py with the machine's C compiler, with -mavx2 -mfma only (f32.py
 * does not build it elsewhere: torch's kernels run there). Why a kernel of kvviz's own: a one-row product only streams
 * the matrix, and torch's packed kernels stream it below the memory's rate: MKL's packed sgemm keeps a one-row product
 * on one thread, and oneDNN's splits it but streams SmolLM2's matrices at 60-70 % of a plain read on two threads
 * (bench/gemv_paths.py --threads 2). Each step of the loop is what llama.cpp's f32 dot products do (ggml_vec_dot_f32,
 * ggml/src/ggml-cpu/vec.cpp: FMA over 8 floats at a time), with 8 rows sharing each load of x; read row by row, as
 * llama.cpp reads them, 8 rows are 8 short streams the hardware prefetcher does not run ahead of, hence the packed
 * layout (one stream, as MKL's and oneDNN's packed layouts make it) and a software prefetch 8 KB ahead.
 */
#include <stdint.h>
#include <immintrin.h>

#define ROWS 8              /* rows per group: one accumulator each */
#define PREFETCH_BYTES 8192 /* how far ahead of the block in hand the stream is prefetched */
#define GROUPS_PER_TASK 4   /* groups a thread takes at a time */

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* w [n, k] row-major, k a multiple of 8, into p: ceil(n / 8) · 8 · k floats. */
void kvviz_f32_pack(const float *w, float *p, int64_t n, int64_t k) {
    for (int64_t g = 0; g < n; g += ROWS)
        for (int64_t c = 0; c < k; c += 8)
            for (int64_t r = g; r < g + ROWS; r++)
                for (int64_t i = 0; i < 8; i++) *p++ = r < n ? w[r * k + c + i] : 0.0f;
}

static void group(const float *x, const float *pg, float *y, int64_t n, int64_t k, int64_t g) {
    __m256 a[ROWS];
    for (int r = 0; r < ROWS; r++) a[r] = _mm256_setzero_ps();
    for (int64_t c = 0; c < k; c += 8) {
        __m256 xv = _mm256_loadu_ps(x + c);
        const float *q = pg + c * ROWS;
        for (int r = 0; r < ROWS; r += 2) _mm_prefetch((const char *)(q + r * 8) + PREFETCH_BYTES, _MM_HINT_T0);
        for (int r = 0; r < ROWS; r++) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * 8), xv, a[r]);
    }
    for (int r = 0; r < ROWS && g + r < n; r++) y[g + r] = hsum(a[r]);
}

void kvviz_f32_linear(const float *x, const float *p, float *y, int64_t n, int64_t k, int threads) {
    int64_t groups = (n + ROWS - 1) / ROWS, tasks = (groups + GROUPS_PER_TASK - 1) / GROUPS_PER_TASK;
    (void)threads; /* read by OpenMP's pragma where the kernel was built with it */
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t t = 0; t < tasks; t++)
        for (int64_t i = t * GROUPS_PER_TASK; i < groups && i < (t + 1) * GROUPS_PER_TASK; i++)
            group(x, p + i * ROWS * k, y, n, k, i * ROWS);
}
