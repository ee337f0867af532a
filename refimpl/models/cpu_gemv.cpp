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
// - with 2-6 rows, one pass: tiles of 4 weight rows x 2-3 rows of x or 2 x 4-6 (all of x in
//   registers), each prefetching its weight rows' next group; the FMAs then run while the weights
//   stream, where a streaming pass and passes over L1 took turns (121 SmolLM2 products + head,
//   means of 4 interleaved rounds: 4 rows 22.6 -> 22.3 ms, 5 rows 26.1 -> 24.6, 6 rows 30.2 -> 27.8);
// - with 7 or more rows, the first row streams the 8 weight rows in, and the others reuse them
//   from L1, 4 weight rows x 3 rows of x at once (12 accumulators + 3 x vectors + 1 weight vector =
//   the 16 AVX2 registers; 4 leftover rows of x as 3 x 4 and 2 x 4 tiles, 2 as 4 x 2), while
//   prefetching the next group's rows; at up to 16 rows, weight rows longer than ~768 floats
//   (down_proj's 1536: 8 rows = 48 KB, more than L1) go by k ranges of 512, the accumulators
//   parked in memory between ranges;
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

#define KC 512  // k range that keeps 8 weight rows (16 KB) and a few rows of x in L1
#define RC 16   // up to this many rows of x, long weight rows go by k ranges

// Output columns n[0 .. NB) (weight rows w[0 .. NB)) for x rows r0 .. r0 + RB, over k in [k0, k1).
// `ahead` > 0: while computing, prefetch `ahead` floats past each weight row's k. `state`: the
// accumulators carried between k ranges (loaded when k0 > 0, stored when k1 < K); the last range
// finishes the sums.
template <int NB, int RB>
static inline void block(const float* const* w, const int* n, const float* x, float* y, const float* add, int K, int N,
                         int r0, int ahead = 0, int k0 = 0, int k1 = 1 << 30, __m256* state = nullptr) {
    const int K8 = K & ~7, end = k1 < K8 ? k1 : K8;
    __m256 acc[NB][RB];
    for (int i = 0; i < NB; i++)
        for (int j = 0; j < RB; j++) acc[i][j] = k0 ? state[i * RB + j] : _mm256_setzero_ps();
    for (int k = k0; k < end; k += 8) {
        if (ahead)
            for (int i = 0; i < NB; i++) _mm_prefetch((const char*)(w[i] + ahead + k), _MM_HINT_T0);
        __m256 xv[RB];
        for (int j = 0; j < RB; j++) xv[j] = _mm256_loadu_ps(x + (size_t)(r0 + j) * K + k);
        for (int i = 0; i < NB; i++) {
            __m256 wv = _mm256_loadu_ps(w[i] + k);
            for (int j = 0; j < RB; j++) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
        }
    }
    if (state && k1 < K) {  // a range before the last: park the sums
        for (int i = 0; i < NB; i++)
            for (int j = 0; j < RB; j++) state[i * RB + j] = acc[i][j];
        return;
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

// The rows of x after the first (1 .. R - 1, R >= 7) for the 8 weight rows over k in [k0, k1): 4 x 3
// tiles, and what is left: 4 rows of x as 3 x 4, 3 x 4 and 2 x 4 tiles (a 4 x 1 tile has 4 FMA
// chains, too few to keep the FMA units busy), 2 rows as 4 x 2. `state`: 8 RC + 32 sums, each tile's
// own in a row (a 4 x 3 or 4 x 2 tile at x row j of half h from h RC + 4 (j - 1), the 3 x 4 tiles
// from 8 RC on).
static inline void rest8(const float* const* w, const int* n, const float* x, float* y, const float* add, int R,
                         int K, int N, int ahead, int k0, int k1, __m256* state) {
    const int m = R - 1, r = 1 + 3 * (m % 3 == 1 ? (m - 4) / 3 : m / 3);  // 4 x 3 tiles up to row r
    for (int h = 0; h < 8; h += 4)  // each half's 4 weight rows stay in L1 across its tiles
        for (int j = 1; j < r; j += 3) block<4, 3>(w + h, n + h, x, y, add, K, N, j, ahead, k0, k1, state + h * RC + 4 * (j - 1));
    if (R - r == 4) {
        block<3, 4>(w, n, x, y, add, K, N, r, ahead, k0, k1, state + 8 * RC);
        block<3, 4>(w + 3, n + 3, x, y, add, K, N, r, ahead, k0, k1, state + 8 * RC + 12);
        block<2, 4>(w + 6, n + 6, x, y, add, K, N, r, ahead, k0, k1, state + 8 * RC + 24);
    } else if (R - r == 2) {
        for (int h = 0; h < 8; h += 4) block<4, 2>(w + h, n + h, x, y, add, K, N, r, ahead, k0, k1, state + h * RC + 4 * (r - 1));
    }
}

// 8 weight rows (one from each slab: w, output columns n) times every row of x: one streaming pass
// at 1 row, one pass of register tiles at 2-6, a streaming pass then tiles over L1 above.
static inline void group8(const float* const* w, const int* n, const float* x, float* y, const float* add, int R,
                          int K, int N) {
    switch (R) {  // 2-6 rows: one pass, every row of x in registers, each weight vector loaded once
        case 2: for (int i = 0; i < 8; i += 4) block<4, 2>(w + i, n + i, x, y, add, K, N, 0, K); return;
        case 3: for (int i = 0; i < 8; i += 4) block<4, 3>(w + i, n + i, x, y, add, K, N, 0, K); return;
        case 4: for (int i = 0; i < 8; i += 2) block<2, 4>(w + i, n + i, x, y, add, K, N, 0, K); return;
        case 5: for (int i = 0; i < 8; i += 2) block<2, 5>(w + i, n + i, x, y, add, K, N, 0, K); return;
        case 6: for (int i = 0; i < 8; i += 2) block<2, 6>(w + i, n + i, x, y, add, K, N, 0, K); return;
    }
    if (K <= KC + KC / 2 || R == 1 || R > RC) {
        block<8, 1>(w, n, x, y, add, K, N, 0);
        if (R > 1) rest8(w, n, x, y, add, R, K, N, K, 0, 1 << 30, nullptr);
        return;
    }
    alignas(32) __m256 first[8], state[8 * RC + 32];
    for (int k0 = 0; k0 < K; k0 += KC) {
        const int k1 = k0 + KC < K ? k0 + KC : 1 << 30, ahead = k0 + KC < K ? KC : K - k0;
        block<8, 1>(w, n, x, y, add, K, N, 0, 0, k0, k1, first);
        rest8(w, n, x, y, add, R, K, N, ahead, k0, k1, state);
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
// in an order that does not depend on how many rows came with it. Attention scores 4 keys at a
// time (4 independent chains), sums its values in registers, and takes e^x 8 lanes at a time
// (exp8), as SwiGLU does: on SmolLM2 at 5 rows, attention 2.6 -> 1.7 ms a step and SwiGLU 1.4
// -> 0.2 (scalar expf before). The build passes -ffp-contract=off: a scalar `s += a * b` is then a
// multiply and an add wherever the compiler inlines it (with contraction it was an FMA in one
// copy and not in another, and a key's score depended on whether it came in a group of 4).
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

// e^x for 8 floats: x = n ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two parts, so n ln 2 is exact),
// e^r by the degree-7 polynomial of Cephes' expf (S. Moshier, "Methods and Programs for
// Mathematical Functions", 1989; ~1 ulp), times 2^n built in the exponent bits. x is clamped to
// [-88.38, 88.38] and anything below gives 0 (a masked score is -inf). Every element gets the same
// operations wherever it sits, so a vector tail (`exp_n`) keeps the batch-invariance.
static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-88.3762626647949f), hi = _mm256_set1_ps(88.3762626647949f);
    const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 q = _mm256_set1_ps(1.9875691500e-4f);
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.3981999507e-3f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(8.3334519073e-3f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(4.1665795894e-2f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.6666665459e-1f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_fmadd_ps(q, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), _mm256_cmp_ps(x, lo, _CMP_GE_OQ));
}

// y[i] = e^(x[i] - shift) for n floats, 8 at a time (the last few through a padded copy).
static inline void exp_n(const float* x, float* y, int n, float shift) {
    const __m256 s = _mm256_set1_ps(shift);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
    if (i < n) {
        float t[8] = {0};
        for (int j = i; j < n; j++) t[j - i] = x[j];
        _mm256_storeu_ps(t, exp8(_mm256_sub_ps(_mm256_loadu_ps(t), s)));
        for (int j = i; j < n; j++) y[j] = t[j - i];
    }
}

// Attention scores of one query against n keys (n, D): p[j] = dot(q, k_j) * scale (+ mask[j]).
// Four keys at a time, each in its own chain (a lone chain of D / 8 dependent FMAs waits on the
// FMA latency); every score is still dot()'s sequence of operations.
static void scores(const float* qv, const float* keys, float* p, int n, int D, float scale, const float* mask) {
    const int D8 = D & ~7;
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const float* k0 = keys + (size_t)j * D;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int d = 0; d < D8; d += 8) {
            const __m256 qd = _mm256_loadu_ps(qv + d);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + d), qd, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + D + d), qd, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + 2 * D + d), qd, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + 3 * D + d), qd, a3);
        }
        float s[4] = {hsum(a0), hsum(a1), hsum(a2), hsum(a3)};
        for (int u = 0; u < 4; u++) {
            for (int d = D8; d < D; d++) s[u] += qv[d] * k0[(size_t)u * D + d];
            p[j + u] = s[u] * scale + (mask ? mask[j + u] : 0.0f);
        }
    }
    for (; j < n; j++) p[j] = dot(qv, keys + (size_t)j * D, D) * scale + (mask ? mask[j] : 0.0f);
}

// out[d] = (sum_j p[j] v_j[d]) / sum over the n values (n, D), summed in order of j for every d;
// 64 columns at a time held in 8 registers (a sum kept in memory would be loaded and stored per j).
static void weighted_sum(const float* p, const float* values, float* out, int n, int D, float sum) {
    int d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) {
        __m256 a[8];
        for (int c = 0; c < 8; c++) a[c] = _mm256_setzero_ps();
        for (int j = 0; j < n; j++) {
            const __m256 pj = _mm256_set1_ps(p[j]);
            const float* v = values + (size_t)j * D + d0;
            for (int c = 0; c < 8; c++) a[c] = _mm256_add_ps(a[c], _mm256_mul_ps(pj, _mm256_loadu_ps(v + 8 * c)));
        }
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(out + d0 + 8 * c, a[c]);
    }
    for (int d = d0; d < D; d++) {
        float s = 0.0f;
        for (int j = 0; j < n; j++) s += p[j] * values[(size_t)j * D + d];
        out[d] = s;
    }
    for (int d = 0; d < D; d++) out[d] = sum > 0.0f ? out[d] / sum : 0.0f;
}

// One layer, run by every thread of the region: each stage is a worksharing loop whose implicit
// barrier makes its output visible to the next. p: this thread's attention probabilities (P + Q).
static void layer_body(const Layer* L, float* p) {
    const int B = L->B, Q = L->Q, P = L->P, R = B * Q, D = L->D, H = L->H, Hkv = L->Hkv, hd = D / 2;
    const int width = (H + 2 * Hkv) * D, Lk = P + Q, I = L->I;
    float acc[512];  // one rotated head (D <= 512, checked by the caller)
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
        scores(qv, L->keys + kv, p, n, D, L->scale, m);
        float top = -INFINITY, sum = 0.0f;
        for (int j = 0; j < n; j++) top = p[j] > top ? p[j] : top;
        if (top == -INFINITY)
            for (int j = 0; j < n; j++) p[j] = 0.0f;
        else
            exp_n(p, p, n, top);
        for (int j = 0; j < n; j++) sum += p[j];
        float* dst = L->o + (size_t)r * H * D + (size_t)hh * D;  // (B, Q, H, D)
        weighted_sum(p, L->values + kv, dst, n, D, sum);
    }
    products(L->w_o, L->o, L->out, L->x, R, H * D, L->hidden);  // out = x + o_proj(o)
    rmsnorm_rows(L->out, L->norm2, L->h, R, L->hidden, L->eps);
    products(L->w_gate_up, L->h, L->gu, nullptr, R, L->hidden, 2 * I);
    const int chunks = (I + 63) / 64;
#pragma omp for schedule(static)
    for (int i = 0; i < R * chunks; i++) {  // SwiGLU: silu(gate) * up = gate / (1 + e^-gate) * up, 64 at a time
        const int r = i / chunks, c0 = i % chunks * 64, c1 = c0 + 64 < I ? c0 + 64 : I;
        const float *g = L->gu + (size_t)r * 2 * I, *u = g + I;
        float e[64], ng[64];
        for (int c = c0; c < c1; c++) ng[c - c0] = -g[c];
        exp_n(ng, e, c1 - c0, 0.0f);
        for (int c = c0; c < c1; c++) L->a[(size_t)r * I + c] = g[c] / (1.0f + e[c - c0]) * u[c];
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
