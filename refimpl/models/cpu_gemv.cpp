// Matrix-vector products for a CPU decode step, written to stream the weights at memory speed,
// and (below) a whole Llama decoder layer built on them.
//
// y[r, n] = add[r, n] + sum_k x[r, k] * W[n, k]     x (R, K), W (N, K), y and add (R, N)
//
// A decode step multiplies 1 to ~16 rows by every weight matrix once, so its floor is the time
// to read the weights (chapter 00, appendix 04c). These habits get close to it (refimpl/models/cpu_gemv.py):
// - the weight is packed once into panels of 8 output rows stored k-major (pack() in cpu_gemv.py):
//   a k step of a panel is one 8-lane vector, multiplied by a broadcast x[r, k] into that row's
//   accumulator. No horizontal sums: lane c of panel p's accumulator is output 8 p + c (the
//   register-blocked "outer product" kernel of GotoBLAS / BLIS);
// - enough independent FMA chains to cover the FMA latency, and few loads per FMA: 1-2 rows of x
//   take 4 panels at once (4-8 chains), 3 rows and more 2 panels in tiles of 3-6 rows (6-12), the
//   first tile streaming the panels into L1 / L2 and the others reusing them;
// - the panels taken together come from far-apart slabs of the thread's share, so each is one
//   long sequential stream (4 or 2 of them), and the tile that streams them prefetches 4 KB ahead,
//   but for 1-2 rows of fp32 panels, whose 4 streams the hardware prefetcher follows (the prefetch
//   instructions then only cost; 3 rows and more, over 2 streams, gain from it: below);
// - each thread (torch's OpenMP threads) reads one contiguous share of the panels;
// - built with -mavx512f (a CPU with AVX-512: cpu_gemv.py's build_flags), 3 rows and more multiply two
//   panels in one 16-lane vector, up to 16 rows a tile (tile16): fewer passes over the panels for a prefill;
// - every output element is the same sequence of operations whatever R and the blocking: one FMA
//   chain over k = 0 .. K - 1, then + add. So a row scored inside a block of R rows gets exactly
//   the bits it gets alone, the property greedy verification relies on (a draft token's logits do
//   not depend on how many were drafted).
// Before the panels the weight was read row-major, 8 rows at a time, with an 8-lane chain per
// output and a horizontal sum: same speed at 1 row, but 17 rows of tiny's products ran at ~45
// GFLOP/s (2 threads) where the panels run at ~85, and a 16-token SmolLM2 step took ~72 ms where it
// takes ~45 (refimpl/bench, --suite latency, measures yours).
#include <immintrin.h>
#include <omp.h>
#include <stddef.h>

static inline float hsum(__m256 v) {  // ((l0+l4)+(l1+l5)) + ((l2+l6)+(l3+l7)), always in this order
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 odd = _mm_movehdup_ps(s);
    __m128 pair = _mm_add_ps(s, odd);
    return _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehl_ps(odd, pair)));
}

#define PW 8        // outputs per panel: one 8-lane vector
#define AHEAD 1024  // weights: how far ahead in its panel a tile that streams it prefetches (128 k steps)
#define MAXZ 16     // AVX-512 builds: rows per two-panel tile (tile16), 16 accumulators of its 32 registers

// The packed layout (refimpl/models/cpu_gemv.py: pack): panel p holds weight rows p PW .. p PW + PW - 1
// as K rows of PW floats, P[(p K + k) PW + c] = W[p PW + c, k] (zeros past N). A k step of a panel
// is one 8-lane vector, multiplied by one broadcast x[r, k] per row of x.

// A k step of a panel: 8 fp32 weights, or 8 fp16 ones widened to fp32 (F16C's vcvtph2ps; exact, so
// a weight whose values are fp16 numbers gives the same bits from either panel, at half the bytes).
static inline __m256 load8(const float* w) { return _mm256_loadu_ps(w); }
static inline __m256 load8(const unsigned short* w) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)w)); }
// int8 panels (pack(weight, int8=True)): 8 weights widened exactly; the row's scale multiplies the sum.
static inline __m256 load8(const signed char* w) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)w)));
}

template <int RB, int NP>
static inline void finish(const float* t, const int* p, float* y, const float* add, int N, int r0, const float* scale);

// Output columns of NP panels (wp, panel numbers p) for x rows r0 .. r0 + RB: RB x NP accumulators,
// lane c of each the chain over k of one output element. `ahead`: prefetch distance (0 = none).
template <int RB, int NP, typename WT>
static inline void tile(const WT* const* wp, const int* p, const float* x, float* y, const float* add, int K, int N,
                        int r0, int ahead, const float* scale) {
    __m256 acc[RB][NP];
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
        for (int i = 0; i < NP; i++) acc[r][i] = _mm256_setzero_ps();
    const float* xr = x + (size_t)r0 * K;
    for (int k = 0; k < K; k++) {
        if (ahead)
#pragma GCC unroll 16
            for (int i = 0; i < NP; i++) _mm_prefetch((const char*)(wp[i] + (size_t)k * PW + ahead), _MM_HINT_T0);
        __m256 w[NP];
#pragma GCC unroll 16
        for (int i = 0; i < NP; i++) w[i] = load8(wp[i] + (size_t)k * PW);
#pragma GCC unroll 16
        for (int r = 0; r < RB; r++) {
            const __m256 b = _mm256_broadcast_ss(xr + (size_t)r * K + k);
#pragma GCC unroll 16
            for (int i = 0; i < NP; i++) acc[r][i] = _mm256_fmadd_ps(w[i], b, acc[r][i]);
        }
    }
    // through memory, stored by unrolled loops: indexing acc in the loops below would make g++ keep
    // acc on the stack and store every accumulator at every k step (measured 2-3x slower)
    alignas(64) float t[RB][NP][PW];
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
        for (int i = 0; i < NP; i++) _mm256_store_ps(t[r][i], acc[r][i]);
    finish<RB, NP>(&t[0][0][0], p, y, add, N, r0, scale);
}

// A tile's sums t[r][i][c] (output p[i] PW + c of row r0 + r) to y: times the row's scale (int8
// panels), then + add.
template <int RB, int NP>
static inline void finish(const float* t, const int* p, float* y, const float* add, int N, int r0, const float* scale) {
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NP; i++) {
            const int n = p[i] * PW;
            const float* s = t + (r * NP + i) * PW;
            float* yr = y + (size_t)(r0 + r) * N;
            const float* ar = add ? add + (size_t)(r0 + r) * N : nullptr;
            if (n + PW <= N) {  // scale (int8 panels): the sum times its row's scale, then + add
                const __m256 sum = _mm256_load_ps(s);
                const __m256 v = scale ? _mm256_mul_ps(sum, _mm256_loadu_ps(scale + n)) : sum;
                _mm256_storeu_ps(yr + n, ar ? _mm256_add_ps(_mm256_loadu_ps(ar + n), v) : v);
            } else {
                for (int c = 0; n + c < N; c++) {
                    const float v = scale ? s[c] * scale[n + c] : s[c];
                    yr[n + c] = ar ? ar[n + c] + v : v;
                }
            }
        }
}

#ifdef __AVX512F__
// AVX-512 builds (cpu_gemv.py adds -mavx512f where the CPU has it): RB rows x 2 panels with the two
// panels side by side in one 16-lane vector (lanes 0-7 panel 0, 8-15 panel 1), so half the
// multiply-add instructions of tile<RB, 2>, and up to MAXZ rows a tile (AVX2's 16 registers hold 6):
// fewer passes over the panels. Each lane is the same FMA chain over k as in tile<RB, 2>: the same
// bits (tested against the AVX2 build). Measurements: bench_results/experiments/2026-11-28_eagle3_avx512_build/.
template <int RB, typename WT>
static inline void tile16(const WT* const* wp, const int* p, const float* x, float* y, const float* add, int K,
                          int N, int r0, int ahead, const float* scale) {
    __m512 acc[RB];
#pragma GCC unroll 32
    for (int r = 0; r < RB; r++) acc[r] = _mm512_setzero_ps();
    const float* xr = x + (size_t)r0 * K;
    for (int k = 0; k < K; k++) {
        if (ahead) {
            _mm_prefetch((const char*)(wp[0] + (size_t)k * PW + ahead), _MM_HINT_T0);
            _mm_prefetch((const char*)(wp[1] + (size_t)k * PW + ahead), _MM_HINT_T0);
        }
        const __m512d lo = _mm512_castpd256_pd512(_mm256_castps_pd(load8(wp[0] + (size_t)k * PW)));
        const __m512 w = _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(load8(wp[1] + (size_t)k * PW)), 1));
#pragma GCC unroll 32
        for (int r = 0; r < RB; r++) acc[r] = _mm512_fmadd_ps(w, _mm512_set1_ps(xr[(size_t)r * K + k]), acc[r]);
    }
    alignas(64) float t[RB][2][PW];
#pragma GCC unroll 32
    for (int r = 0; r < RB; r++) _mm512_store_ps(&t[r][0][0], acc[r]);
    finish<RB, 2>(&t[0][0][0], p, y, add, N, r0, scale);
}
#endif

// Every row of x (R >= 3, or leftovers) against NP panels: ceil(R / 6) tiles of 3-6 rows (as even as
// can be; fewer when R is), the first one streaming the panels in, the others reading them again
// from L1 / L2. AVX-512 builds: two panels go to tile16, ceil(R / MAXZ) tiles.
template <int NP, typename WT>
static inline void panels(const WT* const* w, const int* p, const float* x, float* y, const float* add, int R,
                          int K, int N, const float* scale) {
#ifdef __AVX512F__
    const bool wide = NP == 2;  // tile16
#else
    const bool wide = false;
#endif
    const int most = wide ? MAXZ : 6, tiles = (R + most - 1) / most, base = R / tiles, extra = R % tiles;
    for (int j = 0, r0 = 0; j < tiles; j++) {
        const int rb = base + (j < extra), ahead = j ? 0 : AHEAD;
#ifdef __AVX512F__
        if (wide) {
            switch (rb) {
#define Z(n) case n: tile16<n, WT>(w, p, x, y, add, K, N, r0, ahead, scale); break;
                Z(1) Z(2) Z(3) Z(4) Z(5) Z(6) Z(7) Z(8) Z(9) Z(10) Z(11) Z(12) Z(13) Z(14) Z(15) Z(16)
#undef Z
            }
            r0 += rb;
            continue;
        }
#endif
        switch (rb) {
            case 1: tile<1, NP, WT>(w, p, x, y, add, K, N, r0, ahead, scale); break;
            case 2: tile<2, NP, WT>(w, p, x, y, add, K, N, r0, ahead, scale); break;
            case 3: tile<3, NP, WT>(w, p, x, y, add, K, N, r0, ahead, scale); break;
            case 4: tile<4, NP, WT>(w, p, x, y, add, K, N, r0, ahead, scale); break;
            case 5: tile<5, NP, WT>(w, p, x, y, add, K, N, r0, ahead, scale); break;
            default: tile<6, NP, WT>(w, p, x, y, add, K, N, r0, ahead, scale); break;
        }
        r0 += rb;
    }
}

// One product, run by every thread of the enclosing region. Thread t owns the contiguous panels
// lo .. hi and cuts them into NS slabs: its j-th step takes the j-th panel of every slab, so it
// reads NS long sequential streams at once. 1-2 rows: 4 slabs (4-8 accumulator chains: 1 row is
// bound by memory, not by the FMA latency; 8 slabs read no faster); 3 rows and more: 2 (6-12 chains
// a tile). 3 rows over 4 slabs would hold 12 accumulators + 4 weights + 1 broadcast: 17 of AVX2's 16
// registers, so g++ would spill them to the stack every k step; 3-4 rows of fp32 panels over 4 slabs
// without the prefetch were faster on one machine and much slower on another with twice the read
// bandwidth (bench_results/experiments/2026-11-28_eagle3_avx512_build/), so 3 rows and more take 2
// slabs with the prefetch everywhere. One stream reads slower: 4-6 rows over one 16-wide panel at a
// time (1 stream, 8-12 chains) is slower than 2 streams of 8-wide panels. Leftover panels go one at a time.
// A barrier ends it, as a worksharing loop would.
template <typename WT>
static void products(const WT* P, const float* x, float* y, const float* add, int R, int K, int N,
                     const float* scale = nullptr) {
    const int t = omp_get_thread_num(), T = omp_get_num_threads(), np = (N + PW - 1) / PW;
    const int lo = (int)((long long)np * t / T), hi = (int)((long long)np * (t + 1) / T);
    const int NS = R <= 2 ? 4 : 2, S = (hi - lo) / NS;  // slabs (above)
    const size_t stride = (size_t)K * PW;
    for (int j = 0; j < S; j++) {
        int ps[4];
        const WT* w[4];
        for (int i = 0; i < NS; i++) ps[i] = lo + i * S + j, w[i] = P + ps[i] * stride;
        if (R == 1)  // fp32 panels over 4 streams: no software prefetch, the hardware's keeps up (above)
            tile<1, 4>(w, ps, x, y, add, K, N, 0, sizeof(WT) == 4 ? 0 : AHEAD, scale);
        else if (R == 2)
            tile<2, 4>(w, ps, x, y, add, K, N, 0, sizeof(WT) == 4 ? 0 : AHEAD, scale);
        else
            panels<2>(w, ps, x, y, add, R, K, N, scale);
    }
    for (int q = lo + NS * S; q < hi; q++) {
        const WT* w = P + q * stride;
        panels<1>(&w, &q, x, y, add, R, K, N, scale);
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

// The same products on panels of fp16 weights (pack(weight, half=True)): half the bytes to read.
extern "C" void refimpl_gemv_f16(const unsigned short* W, const float* x, float* y, const float* add,
                                 int R, int K, int N, int threads) {
#pragma omp parallel num_threads(threads) if (threads > 1 && N >= 64)
    products(W, x, y, add, R, K, N);
}

// The same products on int8 panels (pack(weight, int8=True)): a quarter of the bytes, each output row's
// sum times its scale (the weight's values are scale * q, q an integer in [-127, 127]).
extern "C" void refimpl_gemv_i8(const signed char* W, const float* scale, const float* x, float* y,
                                const float* add, int R, int K, int N, int threads) {
#pragma omp parallel num_threads(threads) if (threads > 1 && N >= 64)
    products(W, x, y, add, R, K, N, scale);
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
#include <string.h>

struct Layer {          // mirrored by refimpl/models/cpu_gemv.py (LayerArgs)
    int B, Q, P, cap;   // batch, new tokens, cached positions, cache capacity
    int hidden, H, Hkv, D, I, threads, mask_batch, mask_len;  // mask (mask_batch, Q, mask_len) or none
    float eps, scale;
    const float *norm1, *w_qkv, *w_o, *norm2, *w_gate_up, *w_down;
    const float *x, *cos2, *sin2, *mask;   // x (B, Q, hidden); cos2 = [cos, cos], sin2 = [-sin, sin] (B, Q, D)
    float *out, *keys, *values;            // out (B, Q, hidden); cache buffers (B, Hkv, cap, D)
    float *h, *t, *o, *gu, *a;             // scratch: (R, K1), (R, (H + 2 Hkv) D), (R, H D), (R, 2 I), (R, I)
    const float *e, *norm_e;  // EAGLE-3's draft layer (else null): q/k/v read [norm_e(e); norm1(x)], K1 = 2 hidden
    int half;                 // the matrices are 1: fp16 panels (pack(w, half=True)), 2: int8 ones, 0: fp32 ones
    const float *s_qkv, *s_o, *s_gate_up, *s_down;  // int8 panels: each matrix's row scales
};

static inline float dot(const float* u, const float* v, int n) {  // an 8-lane chain, hsum, then the tail
    const int n8 = n & ~7;
    __m256 acc = _mm256_setzero_ps();
    for (int k = 0; k < n8; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(u + k), _mm256_loadu_ps(v + k), acc);
    float s = hsum(acc);
    for (int k = n8; k < n; k++) s += u[k] * v[k];
    return s;
}

// Row r of y starts at y + r * ys (ys = n, or 2 n when two normed inputs sit side by side).
static void rmsnorm_rows(const float* x, const float* w, float* y, int R, int n, float eps, int ys) {
#pragma omp for schedule(static)
    for (int r = 0; r < R; r++) {  // y = w * (x / sqrt(mean(x^2) + eps)), as LlamaRMSNorm
        const float* xr = x + (size_t)r * n;
        const float inv = 1.0f / sqrtf(dot(xr, xr, n) / (float)n + eps);
        for (int k = 0; k < n; k++) y[(size_t)r * ys + k] = w[k] * (xr[k] * inv);
    }
}

// A product of the layer on its fp32, fp16 or int8 panels (scale: the int8 matrix's row scales).
static inline void product(const Layer* L, const float* w, const float* scale, const float* x, float* y,
                           const float* add, int R, int K, int N) {
    if (L->half == 2)
        products((const signed char*)w, x, y, add, R, K, N, scale);
    else if (L->half)
        products((const unsigned short*)w, x, y, add, R, K, N);
    else
        products(w, x, y, add, R, K, N);
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

// hsum of 8 vectors at once, each in hsum's order: the halves added, then two rounds of pair sums
// (an add commutes, so hadd's x0 + x1 is hsum's). out[j] = hsum(a[j]).
static inline void hsum8(const __m256* a, float* out) {
    __m256 s[4];
    for (int i = 0; i < 4; i++)  // [a_2i lanes 0-3 + 4-7, a_2i+1 lanes 0-3 + 4-7]
        s[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x31));
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
    alignas(32) float t[8];  // h = [a0, a2, a4, a6, a1, a3, a5, a7]
    _mm256_store_ps(t, h);
    for (int i = 0; i < 4; i++) out[2 * i] = t[i], out[2 * i + 1] = t[4 + i];
}

// Attention scores of one query against n keys (n, D): p[j] = dot(q, k_j) * scale (+ mask[j]).
// Eight keys at a time, each in its own chain (a lone chain of D / 8 dependent FMAs waits on the
// FMA latency) and their horizontal sums together; every score is still dot()'s sequence of operations.
static void scores(const float* qv, const float* keys, float* p, int n, int D, float scale, const float* mask) {
    const int D8 = D & ~7;
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        const float* k0 = keys + (size_t)j * D;
        __m256 a[8];
        for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_ps();
        for (int d = 0; d < D8; d += 8) {
            const __m256 qd = _mm256_loadu_ps(qv + d);
            for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + (size_t)u * D + d), qd, a[u]);
        }
        float s[8];
        hsum8(a, s);
        for (int u = 0; u < 8; u++) {
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
    const int K1 = L->e ? 2 * L->hidden : L->hidden;  // the q/k/v product's input width
    if (L->e)  // EAGLE-3 (arXiv 2503.01840, vLLM's llama_eagle3.py): [norm_e(embedding); norm1(feature)]
        rmsnorm_rows(L->e, L->norm_e, L->h, R, L->hidden, L->eps, K1);
    rmsnorm_rows(L->x, L->norm1, L->h + (K1 - L->hidden), R, L->hidden, L->eps, K1);
    product(L, L->w_qkv, L->s_qkv, L->h, L->t, nullptr, R, K1, width);
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
    product(L, L->w_o, L->s_o, L->o, L->out, L->x, R, H * D, L->hidden);  // out = x + o_proj(o)
    rmsnorm_rows(L->out, L->norm2, L->h, R, L->hidden, L->eps, L->hidden);
    product(L, L->w_gate_up, L->s_gate_up, L->h, L->gu, nullptr, R, L->hidden, 2 * I);
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
    product(L, L->w_down, L->s_down, L->a, L->out, L->out, R, I, L->hidden);  // out += down_proj(a)
}

// RMSNorm of R rows of n (rmsnorm_rows, on the calling thread): an EAGLE draft's final norm before its
// head, one call where torch's RMSNorm on a few rows is ~6 small operations (~30 us warm, ~230 cold).
extern "C" void refimpl_rmsnorm(const float* x, const float* w, float* y, int R, int n, float eps) {
    rmsnorm_rows(x, w, y, R, n, eps, n);
}

// Each row's cached positions src[b, 0 .. k-1] copied to dst .. dst + k - 1 in n buffers (B, H, cap, D): a
// tree's compaction after its verification, every layer's keys and values in one call. A row's k
// positions go through `tmp` first, so a source that a destination overlaps is read before it is written.
extern "C" void refimpl_move_slots(float* const* bufs, int n, int B, int H, int cap, int D, int dst,
                                   const long long* src, int k) {
    float* tmp = new float[(size_t)k * D];
    for (int j = 0; j < n; j++)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                float* base = bufs[j] + ((size_t)b * H + h) * cap * D;
                for (int i = 0; i < k; i++)
                    memcpy(tmp + (size_t)i * D, base + (size_t)src[(size_t)b * k + i] * D, sizeof(float) * D);
                memcpy(base + (size_t)dst * D, tmp, sizeof(float) * k * D);
            }
    delete[] tmp;
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
