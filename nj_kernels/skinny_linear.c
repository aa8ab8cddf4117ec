/* y[M,N] = x[M,K] @ w[N,K]^T (+ bias[N]) in fp32 for few rows (M), on a CPU with AVX2+FMA
 * (AVX-512 where the compiler targets it). Built and loaded by nj_kernels/cpu_linear.py; the vector
 * helpers are in simd.h.
 *
 * Why: for 2-16 rows the BLAS that torch calls on this CPU takes paths slower than its own
 * 1-row product (a 5-row product of SmolLM2's weights cost 1.5-2x a 1-row one), although at
 * these sizes the product is bound by reading the weights once. This kernel reads each block
 * of NB weight rows once, from DRAM, and multiplies it by every input row from cache, so a
 * speculative verification of a few rows costs about what a plain decode row does.  A single
 * input row reads the weights in address order (block_stream: a decode row at the speed of a
 * plain read); more rows take the blocks in passes of up to MB rows (block), or the address
 * order where that measured faster here (stream_for). Both prefetch the weights ahead of the
 * read, into L2.
 *
 * Batch invariance: the (m, n) dot product is always accumulated the same way (lane-wise over
 * K in VW-wide chunks, the tail zero-padded, then one fixed horizontal-sum tree, four columns
 * at a time), whatever M is, wherever row m sits in the batch and in either reading order, so
 * a row's result does not depend on its batch.
 */
#include "simd.h"

#define NB 4 /* weight rows per block */
#define MB 6 /* input rows per pass over a block (MB * NB accumulators in registers) */
#define DIST_BLOCK 256   /* block: prefetch each weight row 1 KiB ahead of its read */
#define DIST_STREAM 768  /* block_stream: prefetch the weights 3 KiB ahead of the read */
/* Products of M input rows read in address order (block_stream) where stream_for[M] is set,
 * in passes of blocks (block) elsewhere; which is faster depends on the CPU (M = 2 on an AVX-512
 * AMD EPYC: stream 9.7 ms, block 16.4 ms over SmolLM2-sized weights; M = 3 on an earlier AVX2
 * EPYC: block the faster). nj_kernels/cpu_linear.py measures both on first use and sets it
 * (skinny_set_stream). Both compute the same bits, so the choice never changes a result. */
static int stream_for[MB + 1] = {0, 1, 0, 0, 0, 0, 0};

void skinny_set_stream(int m, int on) {
    if (m >= 1 && m <= MB) stream_for[m] = on != 0;
}

/* y[m0 + i, n0 + j] = the lanes of acc[i][j] summed (+ bias): vsum4 over a full block, the
 * same tree with zeros beside it for a partial one. */
static inline __attribute__((always_inline)) void finish(
    vec acc[MB][NB], const float* bias, float* y, int m0, int mn, int n0, int nn, int N) {
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
        if (m0 == 0) { /* each row's line DIST ahead; past its end, its successor's in the next block */
            int off = k + DIST_BLOCK;
            size_t skip = off >= K ? (size_t)(NB - 1) * K : 0;
            for (int j = 0; j < NB; j++) _mm_prefetch((const char*)(w + (size_t)(n0 + j) * K + off + skip), _MM_HINT_T0);
        }
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
    finish(acc, bias, y, m0, mn, n0, nn, N);
}

/* The same products as `block` (each (m, n) the same FMAs in the same order, the same sums),
 * read in another order: the NB rows one after another, so the weights stream in address
 * order (a matrix's rows are contiguous) and one prefetch DIST_STREAM ahead covers them, where
 * `block`'s NB parallel row streams leave the hardware prefetchers behind. Each weight vector
 * is multiplied by all mn input rows (reloaded from L1 for every weight row): for one pass of
 * a single input row, where reading the weights is the whole cost (SmolLM2's matrices at M = 1:
 * 1.07-1.08x the best plain read of the same bytes, `block` 1.18-1.23x; 2026-12-04, loaded VM). With more input rows the chains of dependent
 * FMAs of one weight row at a time can cost more than the order gains (Intel, M = 3: 1.20x,
 * `block` 1.11x) or less (AVX-512 EPYC, M = 2: 9.7 ms against 16.4): stream_for says, per M. */
static inline __attribute__((always_inline)) void block_stream(
    const float* x, const float* w, const float* bias, float* y,
    int mn, int n0, int nn, int N, int K) {
    vec acc[MB][NB];
    for (int j = 0; j < nn; j++) {
        const float* row = w + (size_t)(n0 + j) * K;
        vec a[MB]; /* this row's accumulators, in registers */
        for (int i = 0; i < mn; i++) a[i] = VZERO();
        int k = 0;
        for (; k + VW <= K; k += VW) {
            _mm_prefetch((const char*)(row + k + DIST_STREAM), _MM_HINT_T1);
            vec wv = VLOAD(row + k);
            for (int i = 0; i < mn; i++) a[i] = VFMA(VLOAD(x + (size_t)i * K + k), wv, a[i]);
        }
        if (k < K) {
            vec wv = vload_tail(row + k, K - k);
            for (int i = 0; i < mn; i++) a[i] = VFMA(vload_tail(x + (size_t)i * K + k, K - k), wv, a[i]);
        }
        for (int i = 0; i < mn; i++) acc[i][j] = a[i];
    }
    finish(acc, bias, y, 0, mn, n0, nn, N);
}

void skinny_linear(const float* x, const float* w, const float* bias, float* y, int M, int N, int K) {
    if (M >= 1 && M <= MB && stream_for[M]) { /* one pass over the weights: read them in address order */
        int n0 = 0;
        for (; n0 + NB <= N; n0 += NB) {
            switch (M) { /* constant sizes, so the accumulators stay in registers */
                case 6: block_stream(x, w, bias, y, 6, n0, NB, N, K); break;
                case 5: block_stream(x, w, bias, y, 5, n0, NB, N, K); break;
                case 4: block_stream(x, w, bias, y, 4, n0, NB, N, K); break;
                case 3: block_stream(x, w, bias, y, 3, n0, NB, N, K); break;
                case 2: block_stream(x, w, bias, y, 2, n0, NB, N, K); break;
                default: block_stream(x, w, bias, y, 1, n0, NB, N, K); break;
            }
        }
        if (n0 < N) block_stream(x, w, bias, y, M, n0, N - n0, N, K);
        return;
    }
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
