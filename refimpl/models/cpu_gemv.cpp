// Matrix-vector products for a CPU decode step, written to stream the weights at memory speed.
//
// y[r, n] = add[r, n] + sum_k x[r, k] * W[n, k]     x (R, K), W (N, K) row-major, y and add (R, N)
//
// A decode step multiplies 1 to ~16 rows by every weight matrix once, so its floor is the time
// to read the weights (chapter 00, appendix 04c). Three habits get close to it (refimpl/models/cpu_gemv.py):
// - the weight is read in its own row-major layout, 8 output rows at a time (8 independent
//   accumulator chains: enough loads in flight to keep the memory bus busy);
// - with R > 1 rows, the first row streams the 8 weight rows in from memory, and the others reuse
//   them from L1, 4 weight rows x 3 rows of x at once (12 accumulators + 3 x vectors + 1 weight
//   vector = the 16 AVX2 registers);
// - each thread (torch's OpenMP threads, static schedule) reads one contiguous share of the rows;
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

// Output rows n0 .. n0 + NB of x rows r0 .. r0 + RB.
template <int NB, int RB>
static inline void block(const float* W, const float* x, float* y, const float* add, int K, int N, int n0, int r0) {
    const int K8 = K & ~7;
    __m256 acc[NB][RB];
    for (int i = 0; i < NB; i++)
        for (int j = 0; j < RB; j++) acc[i][j] = _mm256_setzero_ps();
    for (int k = 0; k < K8; k += 8) {
        __m256 xv[RB];
        for (int j = 0; j < RB; j++) xv[j] = _mm256_loadu_ps(x + (size_t)(r0 + j) * K + k);
        for (int i = 0; i < NB; i++) {
            __m256 w = _mm256_loadu_ps(W + (size_t)(n0 + i) * K + k);
            for (int j = 0; j < RB; j++) acc[i][j] = _mm256_fmadd_ps(w, xv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < NB; i++)
        for (int j = 0; j < RB; j++) {
            const float* wr = W + (size_t)(n0 + i) * K;
            const float* xr = x + (size_t)(r0 + j) * K;
            float s = hsum(acc[i][j]);
            for (int k = K8; k < K; k++) s += xr[k] * wr[k];  // K % 8 leftovers
            size_t o = (size_t)(r0 + j) * N + n0 + i;
            y[o] = add ? add[o] + s : s;
        }
}

// 8 output rows (or the N % 8 leftovers, one at a time) for every row of x.
static inline void rows8(const float* W, const float* x, float* y, const float* add, int R, int K, int N, int n0) {
    if (n0 + 8 > N) {
        for (int n = n0; n < N; n++)
            for (int r = 0; r < R; r++) block<1, 1>(W, x, y, add, K, N, n, r);
        return;
    }
    block<8, 1>(W, x, y, add, K, N, n0, 0);  // the first row streams the 8 weight rows in ...
    for (int h = n0; h < n0 + 8; h += 4) {  // ... and the others reuse them from L1, 3 rows a pass
        int r = 1;
        for (; r + 3 <= R; r += 3) block<4, 3>(W, x, y, add, K, N, h, r);
        if (R - r == 2) block<4, 2>(W, x, y, add, K, N, h, r);
        else if (R - r == 1) block<4, 1>(W, x, y, add, K, N, h, r);
    }
}

// The threads are torch's own (OpenMP, the same runtime torch loaded): one pool for every
// operation of a step, so a thread that just ran torch's softmax is the one that runs the next
// product, and no two pools fight for the two cores.
extern "C" void refimpl_gemv(const float* W, const float* x, float* y, const float* add,
                             int R, int K, int N, int threads) {
    const int groups = (N + 7) / 8;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && N >= 64)
    for (int g = 0; g < groups; g++) rows8(W, x, y, add, R, K, N, 8 * g);
}
