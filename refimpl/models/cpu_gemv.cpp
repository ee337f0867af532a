// Matrix-vector products for a CPU decode step, written to stream the weights at memory speed,
// and (below) a whole Llama decoder layer built on them.
//
// y[r, n] = add[r, n] + sum_k x[r, k] * W[n, k]     x (R, K), W (N, K) row-major, y and add (R, N)
//
// A decode step multiplies 1 to ~16 rows by every weight matrix once, so its floor is the time
// to read the weights (chapter 00, appendix 04c). These habits get close to it (refimpl/models/cpu_gemv.py):
// - the weight is read in its own row-major layout, 8 output rows at a time (8 independent
//   accumulator chains: enough loads in flight to keep the memory bus busy), and those 8 rows
//   come from 8 far-apart slabs of the thread's share, so each is one long sequential stream;
// - with R > 1 rows, the first row streams the 8 weight rows in, and the others reuse them from
//   L1, 4 weight rows x 3 rows of x at once (12 accumulators + 3 x vectors + 1 weight vector =
//   the 16 AVX2 registers), while prefetching the next group's rows;
// - each thread (torch's OpenMP threads) reads one contiguous share of the rows;
// - every output element is the same sequence of operations whatever R and the blocking: an
//   8-lane FMA chain over k in steps of 8, a fixed horizontal sum, then the scalar tail. So a
//   row scored inside a block of R rows gets exactly the bits it gets alone, the property greedy
//   verification relies on (a draft token's logits do not depend on how many were drafted).
#include <immintrin.h>
#include <omp.h>
#include <stddef.h>

static inline float hsum(__m256 v) {  // ((l0+l4)+(l1+l5)) + ((l2+l6)+(l3+l7)), always in this order
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 odd = _mm_movehdup_ps(s);
    __m128 pair = _mm_add_ps(s, odd);
    return _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehl_ps(odd, pair)));
}

// Output columns n[0 .. NB) (weight rows w[0 .. NB)) for x rows r0 .. r0 + RB. `ahead`: while
// computing, prefetch the row after each weight row (the next group's, in the same slab).
template <int NB, int RB>
static inline void block(const float* const* w, const int* n, const float* x, float* y, const float* add, int K, int N,
                         int r0, bool ahead = false) {
    const int K8 = K & ~7;
    __m256 acc[NB][RB];
    for (int i = 0; i < NB; i++)
        for (int j = 0; j < RB; j++) acc[i][j] = _mm256_setzero_ps();
    for (int k = 0; k < K8; k += 8) {
        if (ahead)
            for (int i = 0; i < NB; i++) _mm_prefetch((const char*)(w[i] + K + k), _MM_HINT_T0);
        __m256 xv[RB];
        for (int j = 0; j < RB; j++) xv[j] = _mm256_loadu_ps(x + (size_t)(r0 + j) * K + k);
        for (int i = 0; i < NB; i++) {
            __m256 wv = _mm256_loadu_ps(w[i] + k);
            for (int j = 0; j < RB; j++) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < NB; i++)
        for (int j = 0; j < RB; j++) {
            const float* xr = x + (size_t)(r0 + j) * K;
            float s = hsum(acc[i][j]);
            for (int k = K8; k < K; k++) s += xr[k] * w[i][k];  // K % 8 leftovers
            size_t o = (size_t)(r0 + j) * N + n[i];
            y[o] = add ? add[o] + s : s;
        }
}

// 8 output columns (weight rows w, columns n) for every row of x. The first row of x streams the 8
// weight rows in (8 sequential streams); the others reuse them from L1, 4 weight rows x 3 rows of
// x at a time, and meanwhile prefetch the next group's rows, so the memory bus keeps streaming
// while the cores compute (121 SmolLM2 products + LM head, same run: 5 rows 34.4 ms against 36.6
// without, 8 rows 37.8 against 43.4).
static inline void group8(const float* const* w, const int* n, const float* x, float* y, const float* add, int R,
                          int K, int N) {
    block<8, 1>(w, n, x, y, add, K, N, 0);
    for (int h = 0; h < 8 && R > 1; h += 4) {
        int r = 1;
        for (; r + 3 <= R; r += 3) block<4, 3>(w + h, n + h, x, y, add, K, N, r, true);
        if (R - r == 2) block<4, 2>(w + h, n + h, x, y, add, K, N, r, true);
        else if (R - r == 1) block<4, 1>(w + h, n + h, x, y, add, K, N, r, true);
    }
}

// One product, run by every thread of the enclosing region. Thread t owns the contiguous rows
// lo .. hi of W and cuts them into 8 slabs of S rows; its j-th group is the j-th row of every
// slab, so it reads 8 long sequential streams, each in its own pages. (8 adjacent rows instead,
// 8 streams 2.3 KB apart that share pages, read SmolLM2's K = 576 matrices ~1.35x slower on the
// course machine.) The hi - lo - 8 S leftover rows go one at a time. A barrier ends it, as a
// worksharing loop would.
static void products(const float* W, const float* x, float* y, const float* add, int R, int K, int N) {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int lo = (int)((long long)N * t / T), hi = (int)((long long)N * (t + 1) / T), S = (hi - lo) / 8;
    const float* w[8];
    int n[8];
    for (int j = 0; j < S; j++) {
        for (int i = 0; i < 8; i++) n[i] = lo + i * S + j, w[i] = W + (size_t)n[i] * K;
        group8(w, n, x, y, add, R, K, N);
    }
    for (int m = lo + 8 * S; m < hi; m++) {
        const float* wm = W + (size_t)m * K;
        for (int r = 0; r < R; r++) block<1, 1>(&wm, &m, x, y, add, K, N, r);
    }
#pragma omp barrier
}

// The threads are torch's own (OpenMP, the same runtime torch loaded): one pool for every
// operation of a step, so a thread that just ran torch's softmax is the one that runs the next
// product, and no two pools fight for the two cores.
extern "C" void refimpl_gemv(const float* W, const float* x, float* y, const float* add,
                             int R, int K, int N, int threads) {
#pragma omp parallel num_threads(threads) if (threads > 1 && N >= 64)
    products(W, x, y, add, R, K, N);
}

// ---- Whole decoder layers in one parallel region (the lean forward's default on an AVX2 CPU) ----
// Between two products of a step the threads stay inside one OpenMP region (a barrier, not a
// fork and join), and the stages that read no weights -- RMSNorm, rotary, the cache write,
// attention, SwiGLU -- are a few loops instead of ~15 torch calls. Each stage keeps the
// batch-invariance above: a row's norm, rotation and attention are computed from that row alone,
// in an order that does not depend on how many rows came with it.
#include <math.h>

struct Layer {          // mirrored by refimpl/models/cpu_gemv.py (LayerArgs)
    int B, Q, P, cap;   // batch, new tokens, cached positions, cache capacity
    int hidden, H, Hkv, D, I, threads, mask_batch, mask_len;  // mask (mask_batch, Q, mask_len) or none
    float eps, scale;
    const float *norm1, *w_qkv, *w_o, *norm2, *w_gate_up, *w_down;
    const float *x, *cos2, *sin2, *mask;   // x (B, Q, hidden); cos2 = [cos, cos], sin2 = [-sin, sin] (B, Q, D)
    float *out, *keys, *values;            // out (B, Q, hidden); cache buffers (B, Hkv, cap, D)
    float *h, *t, *o, *gu, *a;             // scratch: (R, hidden), (R, (H + 2 Hkv) D), (R, H D), (R, 2 I), (R, I)
};

static inline float dot(const float* u, const float* v, int n) {  // the order of block<1, 1>
    const int n8 = n & ~7;
    __m256 acc = _mm256_setzero_ps();
    for (int k = 0; k < n8; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(u + k), _mm256_loadu_ps(v + k), acc);
    float s = hsum(acc);
    for (int k = n8; k < n; k++) s += u[k] * v[k];
    return s;
}

static void rmsnorm_rows(const float* x, const float* w, float* y, int R, int n, float eps) {
#pragma omp for schedule(static)
    for (int r = 0; r < R; r++) {  // y = w * (x / sqrt(mean(x^2) + eps)), as LlamaRMSNorm
        const float* xr = x + (size_t)r * n;
        const float inv = 1.0f / sqrtf(dot(xr, xr, n) / (float)n + eps);
        for (int k = 0; k < n; k++) y[(size_t)r * n + k] = w[k] * (xr[k] * inv);
    }
}

// One layer, run by every thread of the region: each stage is a worksharing loop whose implicit
// barrier makes its output visible to the next. p: this thread's attention probabilities (P + Q).
static void layer_body(const Layer* L, float* p) {
    const int B = L->B, Q = L->Q, P = L->P, R = B * Q, D = L->D, H = L->H, Hkv = L->Hkv, hd = D / 2;
    const int width = (H + 2 * Hkv) * D, Lk = P + Q, I = L->I;
    float acc[512];  // one head's output (D <= 512, checked by the caller)
    rmsnorm_rows(L->x, L->norm1, L->h, R, L->hidden, L->eps);
    products(L->w_qkv, L->h, L->t, nullptr, R, L->hidden, width);
#pragma omp for schedule(static)
    for (int i = 0; i < R * (H + 2 * Hkv); i++) {  // rotate q in place, k into the cache; copy v
        const int r = i / (H + 2 * Hkv), j = i % (H + 2 * Hkv), b = r / Q, q = r % Q;
        float* src = L->t + (size_t)r * width + (size_t)j * D;
        if (j >= H + Hkv) {
            float* dst = L->values + (((size_t)b * Hkv + (j - H - Hkv)) * L->cap + P + q) * D;
            for (int d = 0; d < D; d++) dst[d] = src[d];
            continue;
        }
        const float *c = L->cos2 + (size_t)r * D, *s = L->sin2 + (size_t)r * D;
        for (int d = 0; d < D; d++) acc[d] = src[d] * c[d] + src[(d + hd) % D] * s[d];
        float* dst = j < H ? src : L->keys + (((size_t)b * Hkv + (j - H)) * L->cap + P + q) * D;
        for (int d = 0; d < D; d++) dst[d] = acc[d];
    }
#pragma omp for schedule(static)
    for (int i = 0; i < B * H * Q; i++) {  // softmax(q k^T * scale + mask) v, one query and head
        const int b = i / (H * Q), hh = (i / Q) % H, q = i % Q, r = b * Q + q;
        const float* qv = L->t + (size_t)r * width + (size_t)hh * D;
        const size_t kv = ((size_t)b * Hkv + hh / (H / Hkv)) * L->cap * D;
        const float* m = L->mask ? L->mask + ((size_t)(L->mask_batch > 1 ? b : 0) * Q + q) * L->mask_len : nullptr;
        const int n = m ? Lk : P + q + 1;  // without a mask: causal
        float top = -INFINITY, sum = 0.0f;
        for (int j = 0; j < n; j++) {
            p[j] = dot(qv, L->keys + kv + (size_t)j * D, D) * L->scale + (m ? m[j] : 0.0f);
            top = p[j] > top ? p[j] : top;
        }
        for (int d = 0; d < D; d++) acc[d] = 0.0f;
        for (int j = 0; j < n; j++) {
            p[j] = top == -INFINITY ? 0.0f : expf(p[j] - top);
            sum += p[j];
            const float* v = L->values + kv + (size_t)j * D;
            for (int d = 0; d < D; d++) acc[d] += p[j] * v[d];
        }
        float* dst = L->o + (size_t)r * H * D + (size_t)hh * D;  // (B, Q, H, D)
        for (int d = 0; d < D; d++) dst[d] = sum > 0.0f ? acc[d] / sum : 0.0f;
    }
    products(L->w_o, L->o, L->out, L->x, R, H * D, L->hidden);  // out = x + o_proj(o)
    rmsnorm_rows(L->out, L->norm2, L->h, R, L->hidden, L->eps);
    products(L->w_gate_up, L->h, L->gu, nullptr, R, L->hidden, 2 * I);
#pragma omp for schedule(static)
    for (int i = 0; i < R * I; i++) {  // SwiGLU: silu(gate) * up
        const float g = L->gu[(size_t)(i / I) * 2 * I + i % I], u = L->gu[(size_t)(i / I) * 2 * I + I + i % I];
        L->a[i] = g / (1.0f + expf(-g)) * u;
    }
    products(L->w_down, L->a, L->out, L->out, R, I, L->hidden);  // out += down_proj(a)
}

// `count` layers in a row (each one's out is the next one's x) in one OpenMP region: between two
// layers, as between two stages, the threads meet at a barrier instead of a join and a fork.
extern "C" void refimpl_layers(const Layer* layers, int count) {
#pragma omp parallel num_threads(layers[0].threads) if (layers[0].threads > 1)
    {
        float* p = new float[layers[0].P + layers[0].Q];
        for (int l = 0; l < count; l++) layer_body(layers + l, p);
        delete[] p;
    }
}
