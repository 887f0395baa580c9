/* One decode step of the native decoder (kvviz.engine.model: Decoder.step_static) for one token on a CPU, in one call:
 * every layer's RMSNorm, Q/K/V, RoPE, the K/V written into the static cache at `pos`, attention over positions
 * 0..pos, O, the residuals, the gated SiLU MLP, then the final norm and the LM head. The matrices are multiplied by
 * kvviz's own kernels (int8_gemv.c, f32_gemv.c), passed in as function pointers, so each product is the one the
 * uncompiled step computes; what this file adds is everything between them, which in torch is ~480 operator calls a
 * step (5 ms on SmolLM2 compiled or not, against ~8 ms of products). llama.cpp likewise hands a whole step to C
 * once (llama_decode builds the step's ggml graph and llama_context::graph_compute runs all of it through
 * ggml_backend_sched_graph_compute_async, src/llama-context.cpp); here on the same weights and the same cache the
 * pages read, its speed set beside llama.cpp's by bench/quantized_vs_llamacpp.py. Built at first use by
 * kvviz/engine/kernels/step.py; AVX2 and FMA only.
 * On more than one thread (OpenMP, torch's own pool, as the kernels) the attention heads are shared out too: at two
 * threads 1,500 cached positions cost 11.0 ms a token instead of 14.2 on SmolLM2 int8.
 *
 * A matrix is 5 int64s: its data (int8 rows or the float32 kernel's packed groups), its bfloat16 row scales (int8;
 * 0 for float32), its bias (float32, or 0), N and K. A layer is 24: the two norms' weights, its K and V buffers
 * ([H_kv, max_len, d] float32, batch 1), then Q/K/V, O, gate/up and down as matrices.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

typedef int (*int8_linear_fn)(const float *x, int64_t m, const int8_t *q, const uint16_t *scale, float *y, int64_t n,
                              int64_t k, int threads);
typedef void (*f32_linear_fn)(const float *x, const float *p, float *y, int64_t n, int64_t k, int threads);

enum { MATRIX = 5, LAYER = 4 + 4 * MATRIX };

typedef struct {
    int8_linear_fn int8;
    f32_linear_fn f32;
    int threads;
} kernels;

/* y[n] = x[k] · Wᵀ (+ bias) through the matrix's own kernel; 0 on success. */
static int linear(const kernels *kn, const int64_t *w, const float *x, float *y) {
    int64_t n = w[3], k = w[4];
    if (w[1]) {
        if (kn->int8(x, 1, (const int8_t *)w[0], (const uint16_t *)w[1], y, n, k, kn->threads)) return 1;
    } else {
        kn->f32(x, (const float *)w[0], y, n, k, kn->threads);
    }
    if (w[2])
        for (int64_t i = 0; i < n; i++) y[i] += ((const float *)w[2])[i];
    return 0;
}

static float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Σ a·b over n floats (a head's d, a multiple of 8; d_model, any width where the matrices are int8) */
static float dot(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y = x / sqrt(mean(x²) + eps) · w (F.rms_norm) */
static void rms_norm(const float *x, const float *w, float eps, int64_t n, float *y) {
    float inv = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * inv * w[i];
}

/* x·cos + roll(x, d/2)·signed_sin over one head (model.apply_rotary; the sin table carries rotate_half's sign) */
static void rotate(float *x, const float *cos, const float *sin, int64_t d) {
    float r[d];
    int64_t half = d / 2;
    for (int64_t i = 0; i < d; i++) r[i] = x[i] * cos[i] + x[(i + half) % d] * sin[i];
    memcpy(x, r, sizeof(float) * d);
}

/* dims: n_layers, d_model, n_heads, n_kv_heads, d_head, d_ff, max_len. h [d_model]: the token's embedding in, the
 * last hidden state out (before the final norm). probs: NULL, or [n_layers][n_heads][max_len], each head's
 * probabilities over the whole buffer (0 past pos). 0 on success, 1 when scratch memory or a kernel's failed. */
int kvviz_step(const int64_t *layers, const int64_t *final_norm_and_head, const int64_t *dims, float eps,
               void *int8_fn, void *f32_fn, int threads, const float *cos, const float *sin, int64_t pos, float *h,
               float *logits, float *probs) {
    int64_t n_layers = dims[0], dm = dims[1], hq = dims[2], hkv = dims[3], d = dims[4], dff = dims[5],
            max_len = dims[6];
    kernels kn = {(int8_linear_fn)int8_fn, (f32_linear_fn)f32_fn, threads};
    int64_t n_qkv = (hq + 2 * hkv) * d, group = hq / hkv;
    float scale = 1.0f / sqrtf((float)d);
    float *x = malloc(sizeof(float) * (dm + n_qkv + hq * d + dm + 2 * dff + dff + hq * max_len));
    if (!x) return 1;
    float *qkv = x + dm, *att = qkv + n_qkv, *o = att + hq * d, *gu = o + dm, *act = gu + 2 * dff, *ps = act + dff;
    int err = 0;
    for (int64_t l = 0; l < n_layers && !err; l++) {
        const int64_t *L = layers + l * LAYER;
        float *kbuf = (float *)L[2], *vbuf = (float *)L[3];
        rms_norm(h, (const float *)L[0], eps, dm, x);
        if ((err = linear(&kn, L + 4, x, qkv))) break;
        for (int64_t head = 0; head < hq + hkv; head++) rotate(qkv + head * d, cos, sin, d);
        for (int64_t g = 0; g < hkv; g++) {  /* the new position's K and V into the cache at pos */
            memcpy(kbuf + (g * max_len + pos) * d, qkv + (hq + g) * d, sizeof(float) * d);
            memcpy(vbuf + (g * max_len + pos) * d, qkv + (hq + hkv + g) * d, sizeof(float) * d);
        }
        /* the heads on the kernels' threads (each its own row of scores), as the products are */
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (int64_t head = 0; head < hq; head++) {
            const float *q = qkv + head * d, *kg = kbuf + (head / group) * max_len * d,
                        *vg = vbuf + (head / group) * max_len * d;
            float *p = ps + head * max_len;
            float mx = -INFINITY, sum = 0.0f;
            for (int64_t t = 0; t <= pos; t++) {
                p[t] = dot(q, kg + t * d, d) * scale;
                mx = fmaxf(mx, p[t]);
            }
            for (int64_t t = 0; t <= pos; t++) sum += (p[t] = expf(p[t] - mx));
            __m256 acc[d / 8];
            for (int64_t i = 0; i < d / 8; i++) acc[i] = _mm256_setzero_ps();
            for (int64_t t = 0; t <= pos; t++) {
                __m256 pt = _mm256_set1_ps(p[t] /= sum);
                for (int64_t i = 0; i < d / 8; i++)
                    acc[i] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vg + t * d + 8 * i), acc[i]);
            }
            for (int64_t i = 0; i < d / 8; i++) _mm256_storeu_ps(att + head * d + 8 * i, acc[i]);
            if (probs) {
                float *row = probs + (l * hq + head) * max_len;
                memcpy(row, p, sizeof(float) * (pos + 1));
                memset(row + pos + 1, 0, sizeof(float) * (max_len - pos - 1));
            }
        }
        if ((err = linear(&kn, L + 4 + MATRIX, att, o))) break;
        for (int64_t i = 0; i < dm; i++) h[i] += o[i];
        rms_norm(h, (const float *)L[1], eps, dm, x);
        if ((err = linear(&kn, L + 4 + 2 * MATRIX, x, gu))) break;
        for (int64_t i = 0; i < dff; i++) act[i] = gu[i] / (1.0f + expf(-gu[i])) * gu[dff + i];
        if ((err = linear(&kn, L + 4 + 3 * MATRIX, act, o))) break;
        for (int64_t i = 0; i < dm; i++) h[i] += o[i];
    }
    if (!err) {
        rms_norm(h, (const float *)final_norm_and_head[0], eps, dm, x);
        err = linear(&kn, final_norm_and_head + 1, x, logits);
    }
    free(x);
    return err;
}
