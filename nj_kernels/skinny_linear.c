/* y[M,N] = x[M,K] @ w[N,K]^T (+ bias[N]) in fp32 for few rows (M), on a CPU with AVX2+FMA
 * (AVX-512 where the compiler targets it). Built and loaded by nj_kernels/cpu_linear.py; the vector
 * helpers are in simd.h.
 *
 * Why: for 2-16 rows the BLAS that torch calls on this CPU takes paths slower than its own
 * 1-row product (a 5-row product of SmolLM2's weights cost 1.5-2x a 1-row one), although at
 * these sizes the product is bound by reading the weights once. This kernel reads each block
 * of NB weight rows once, from DRAM, and multiplies it by every input row from cache, so a
 * speculative verification of a few rows costs about what a plain decode row does.
 *
 * Batch invariance: the (m, n) dot product is always accumulated the same way (lane-wise over
 * K in VW-wide chunks, the tail zero-padded, then one fixed horizontal-sum tree, four columns
 * at a time), whatever M is and wherever row m sits in the batch, so a row's result does not
 * depend on its batch.
 */
#include "simd.h"

#define NB 4 /* weight rows per block */
#define MB 6 /* input rows per pass over a block (MB * NB accumulators in registers) */
#define PF 8 /* prefetch the weight rows this many rows ahead, on the first pass */

static inline __attribute__((always_inline)) void block(
    const float* x, const float* w, const float* bias, float* y,
    int m0, int mn, int n0, int nn, int N, int K) {
    vec acc[MB][NB];
    for (int i = 0; i < mn; i++)
        for (int j = 0; j < nn; j++) acc[i][j] = VZERO();
    int k = 0;
    for (; k + VW <= K; k += VW) {
        vec wv[NB];
        for (int j = 0; j < nn; j++) wv[j] = VLOAD(w + (size_t)(n0 + j) * K + k);
        if (m0 == 0 && n0 + PF + NB <= N)
            for (int j = 0; j < NB; j++)
                _mm_prefetch((const char*)(w + (size_t)(n0 + PF + j) * K + k), _MM_HINT_T0);
        for (int i = 0; i < mn; i++) {
            vec xv = VLOAD(x + (size_t)(m0 + i) * K + k);
            for (int j = 0; j < nn; j++) acc[i][j] = VFMA(xv, wv[j], acc[i][j]);
        }
    }
    if (k < K) {
        int r = K - k;
        vec wv[NB];
        for (int j = 0; j < nn; j++) wv[j] = vload_tail(w + (size_t)(n0 + j) * K + k, r);
        for (int i = 0; i < mn; i++) {
            vec xv = vload_tail(x + (size_t)(m0 + i) * K + k, r);
            for (int j = 0; j < nn; j++) acc[i][j] = VFMA(xv, wv[j], acc[i][j]);
        }
    }
    if (nn == NB) {
        for (int i = 0; i < mn; i++) {
            __m128 s = vsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
            if (bias) s = _mm_add_ps(s, _mm_loadu_ps(bias + n0));
            _mm_storeu_ps(y + (size_t)(m0 + i) * N + n0, s);
        }
        return;
    }
    for (int i = 0; i < mn; i++)
        for (int j = 0; j < nn; j++) {
            vec z = VZERO();
            float s = _mm_cvtss_f32(vsum4(acc[i][j], z, z, z));
            if (bias) s += bias[n0 + j];
            y[(size_t)(m0 + i) * N + n0 + j] = s;
        }
}

void skinny_linear(const float* x, const float* w, const float* bias, float* y, int M, int N, int K) {
    for (int n0 = 0; n0 < N; n0 += NB) {
        int nn = N - n0 < NB ? N - n0 : NB;
        for (int m0 = 0; m0 < M; m0 += MB) {
            int mn = M - m0 < MB ? M - m0 : MB;
            if (nn < NB) {
                block(x, w, bias, y, m0, mn, n0, nn, N, K);
                continue;
            }
            /* constant sizes, so the accumulators stay in registers */
            switch (mn) {
                case 6: block(x, w, bias, y, m0, 6, n0, NB, N, K); break;
                case 5: block(x, w, bias, y, m0, 5, n0, NB, N, K); break;
                case 4: block(x, w, bias, y, m0, 4, n0, NB, N, K); break;
                case 3: block(x, w, bias, y, m0, 3, n0, NB, N, K); break;
                case 2: block(x, w, bias, y, m0, 2, n0, NB, N, K); break;
                default: block(x, w, bias, y, m0, 1, n0, NB, N, K); break;
            }
        }
    }
}
