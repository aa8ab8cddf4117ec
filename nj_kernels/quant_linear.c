/* y[M,N] = x[M,K] @ dequant(w)[N,K]^T (+ bias[N]) in fp32, straight from GGUF blocks, on a CPU
 * with AVX2+FMA+F16C (AVX-512 where the compiler targets it). Built and loaded by
 * nj_kernels/quant_linear.py; the blocks are read by gguf_blocks.h, the vectors by simd.h.
 *
 * Exact dequantisation: a weight is computed with the same fp32 operations, in the same order,
 * as the gguf package's numpy reference (gguf.quants): Q4_0 d*(q-8), Q4_1 (d*q)+m, Q8_0 q*d,
 * Q4_K (d*sc)*q - (dmin*m), Q6_K (d*sc)*q; F16/BF16 convert exactly. The file is compiled with
 * -ffp-contract=off, so no mul+add pair is fused into one rounding behind our back.
 *
 * Batch invariance: the (m, n) dot product is accumulated exactly as skinny_linear.c does it:
 * lane-wise FMAs over K in VW-wide chunks (tail zero-padded), then the same horizontal-sum tree.
 * That order never depends on M. Up to MBR rows, NB weight rows at a time are dequantised in
 * registers and multiplied into every input row; up to MBR2 rows, NB2 weight rows at a time
 * (fewer accumulators a row); more rows dequantise NT weight rows to an fp32 tile once and run
 * the same accumulation over it, split over threads by tiles. Every path gives every row the
 * same bits (and the same bits as skinny_linear on the dequantised matrix).
 */
#include <pthread.h>
#include <stdlib.h>

#include "gguf_blocks.h"
#include "quant_linear.h"

#if defined(__AVX512F__)
#define NB 4   /* weight rows per block (few rows and the tile path) */
#define MBR 4  /* up to this many input rows: NB weight rows at a time, dequantised in registers */
#define NB2 2  /* up to MBR2 rows: NB2 weight rows at a time, dequantised in registers */
#define MBR2 8
#define MBT 6  /* more rows: input rows per pass over a dequantised fp32 tile */
#else
#define NB 4 /* 16 vector registers: MB * NB accumulators plus the weights must fit */
#define MBR 2
#define NB2 2
#define MBR2 4
#define MBT 2
#endif

#define PF 8   /* prefetch weight rows this many rows ahead */
#define NT 64  /* weight rows per fp32 tile (many rows): 64 x K floats stay in L2 */

/* Horizontal sums of acc[0..nn) (one row), plus bias, stored to y_row[n0..]. vsum4 sums each of
 * its four vectors with the same tree whatever the others hold, so a column's sum does not depend
 * on how many columns are summed with it. */
static inline __attribute__((always_inline)) void store_sums(const vec* acc, int nn, const float* bias, float* y_row, int n0) {
    if (nn == 2) {
        vec z = VZERO();
        __m128 s = vsum4(acc[0], acc[1], z, z);
        if (bias) s = _mm_add_ps(s, _mm_castpd_ps(_mm_load_sd((const double*)(bias + n0))));
        _mm_store_sd((double*)(y_row + n0), _mm_castps_pd(s));
        return;
    }
    if (nn == 4) {
        __m128 s = vsum4(acc[0], acc[1], acc[2], acc[3]);
        if (bias) s = _mm_add_ps(s, _mm_loadu_ps(bias + n0));
        _mm_storeu_ps(y_row + n0, s);
        return;
    }
    for (int j = 0; j < nn; j++) {
        vec z = VZERO();
        float s = _mm_cvtss_f32(vsum4(acc[j], z, z, z));
        if (bias) s += bias[n0 + j];
        y_row[n0 + j] = s;
    }
}

/* mn input rows (m0..) times the nn weight rows at wb (output columns n0..), accumulated in
 * skinny_linear.c's order: acc += x[k..k+VW) * w[k..k+VW) for k = 0, VW, 2VW, ...; the tail
 * zero-padded; then vsum4. MBX is the accumulator array's row capacity. */
#define BLOCK_BODY(MBX, NBX)                                                                         \
    vec acc[MBX][NBX];                                                                               \
    const uint8_t* rows[NBX];                                                                        \
    for (int j = 0; j < NBX; j++) rows[j] = wb + (size_t)(j < nn ? j : 0) * rb;                     \
    for (int i = 0; i < mn; i++)                                                                     \
        for (int j = 0; j < nn; j++) acc[i][j] = VZERO();                                            \
    const int st = step_of(type);                                                                    \
    size_t step_bytes = (size_t)st * rb / (size_t)K;                                                 \
    int pf_every = step_bytes >= 64 ? 1 : (int)(64 / (step_bytes ? step_bytes : 1));                 \
    int pf_count = 0;                                                                                \
    int k = 0;                                                                                       \
    for (; k + st <= K; k += st) {                                                                   \
        prep_t pr[NBX];                                                                              \
        for (int j = 0; j < nn; j++) pr[j] = prep(type, rows[j], k);                                 \
        if (prefetch && --pf_count <= 0) { /* one prefetch per cache line of each row PF rows on */ \
            pf_count = pf_every;                                                                     \
            for (int j = 0; j < NBX; j++)                                                            \
                _mm_prefetch((const char*)(rows[j] + PF * rb + (size_t)(k / st) * step_bytes), _MM_HINT_T0); \
        }                                                                                            \
        for (int c = 0; c < st / VW; c++) {                                                          \
            vec wv[NBX];                                                                             \
            for (int j = 0; j < nn; j++) wv[j] = chunk(type, rows[j], k, c, &pr[j]);                 \
            for (int i = 0; i < mn; i++) {                                                           \
                vec xv = VLOAD(x + (size_t)(m0 + i) * K + k + c * VW);                               \
                for (int j = 0; j < nn; j++) acc[i][j] = VFMA(xv, wv[j], acc[i][j]);                 \
            }                                                                                        \
        }                                                                                            \
    }                                                                                                \
    if (k < K) {                                                                                     \
        int r = K - k;                                                                               \
        vec wv[NBX];                                                                                 \
        for (int j = 0; j < nn; j++) wv[j] = deq_tail(type, rows[j], k, r);                          \
        for (int i = 0; i < mn; i++) {                                                               \
            vec xv = vload_tail(x + (size_t)(m0 + i) * K + k, r);                                    \
            for (int j = 0; j < nn; j++) acc[i][j] = VFMA(xv, wv[j], acc[i][j]);                     \
        }                                                                                            \
    }                                                                                                \
    for (int i = 0; i < mn; i++) store_sums(acc[i], nn, bias, y + (size_t)(m0 + i) * N, n0);

static inline __attribute__((always_inline)) void block_reg(
    int type, const uint8_t* wb, size_t rb, const float* x, const float* bias, float* y,
    int m0, int mn, int n0, int nn, int N, int K, int prefetch) {
    BLOCK_BODY(MBR, NB)
}

static inline __attribute__((always_inline)) void block_reg2(
    int type, const uint8_t* wb, size_t rb, const float* x, const float* bias, float* y,
    int m0, int mn, int n0, int nn, int N, int K, int prefetch) {
    BLOCK_BODY(MBR2, NB2)
}

static inline __attribute__((always_inline)) void block_tile(
    const uint8_t* wb, size_t rb, const float* x, const float* bias, float* y,
    int m0, int mn, int n0, int nn, int N, int K) {
    const int type = T_F32, prefetch = 0;
    BLOCK_BODY(MBT, NB)
}

/* Few rows: every block of NB weight rows is dequantised in registers, once, and multiplied into
 * all M (<= MBR) rows; constant sizes keep the accumulators in registers. */
static inline __attribute__((always_inline)) void run_reg(
    int type, const uint8_t* w, size_t rb, const float* x, const float* bias, float* y, int M, int N, int K) {
    for (int n0 = 0; n0 < N; n0 += NB) {
        int nn = N - n0 < NB ? N - n0 : NB;
        const uint8_t* wb = w + (size_t)n0 * rb;
        int pf = n0 + PF + NB <= N;
        if (nn < NB) {
            block_reg(type, wb, rb, x, bias, y, 0, M, n0, nn, N, K, 0);
            continue;
        }
        switch (M) {
#if MBR >= 4
            case 4: block_reg(type, wb, rb, x, bias, y, 0, 4, n0, NB, N, K, pf); break;
            case 3: block_reg(type, wb, rb, x, bias, y, 0, 3, n0, NB, N, K, pf); break;
#endif
            case 2: block_reg(type, wb, rb, x, bias, y, 0, 2, n0, NB, N, K, pf); break;
            default: block_reg(type, wb, rb, x, bias, y, 0, 1, n0, NB, N, K, pf); break;
        }
    }
}

/* Up to MBR2 rows: NB2 weight rows at a time (fewer accumulators per input row, so more rows fit
 * in registers), each dequantised once. */
static inline __attribute__((always_inline)) void run_reg2(
    int type, const uint8_t* w, size_t rb, const float* x, const float* bias, float* y, int M, int N, int K) {
    for (int n0 = 0; n0 < N; n0 += NB2) {
        int nn = N - n0 < NB2 ? N - n0 : NB2;
        const uint8_t* wb = w + (size_t)n0 * rb;
        int pf = n0 + PF + NB2 <= N;
        if (nn < NB2) {
            block_reg2(type, wb, rb, x, bias, y, 0, M, n0, nn, N, K, 0);
            continue;
        }
        switch (M) {
#if MBR2 >= 8
            case 8: block_reg2(type, wb, rb, x, bias, y, 0, 8, n0, NB2, N, K, pf); break;
            case 7: block_reg2(type, wb, rb, x, bias, y, 0, 7, n0, NB2, N, K, pf); break;
            case 6: block_reg2(type, wb, rb, x, bias, y, 0, 6, n0, NB2, N, K, pf); break;
            case 5: block_reg2(type, wb, rb, x, bias, y, 0, 5, n0, NB2, N, K, pf); break;
#endif
            case 4: block_reg2(type, wb, rb, x, bias, y, 0, 4, n0, NB2, N, K, pf); break;
            default: block_reg2(type, wb, rb, x, bias, y, 0, 3, n0, NB2, N, K, pf); break;
        }
    }
}

/* Many rows: NT weight rows at a time are dequantised into an fp32 tile (L2), then each group of
 * MBT input rows (L1) runs over the tile's NB-row blocks with the same accumulation order. */
static inline __attribute__((always_inline)) void run_tiled(
    int type, const uint8_t* w, size_t rb, const float* x, const float* bias, float* y, int M, int N, int K,
    float* tile, int n_begin, int n_end) {
    const size_t trb = sizeof(float) * (size_t)K;
    for (int t0 = n_begin; t0 < n_end; t0 += NT) {
        int tn = n_end - t0 < NT ? n_end - t0 : NT;
        for (int j = 0; j < tn; j++) dequant_row(type, w + (size_t)(t0 + j) * rb, K, tile + (size_t)j * K);
        for (int m0 = 0; m0 < M; m0 += MBT) {
            int mn = M - m0 < MBT ? M - m0 : MBT;
            for (int b0 = 0; b0 < tn; b0 += NB) {
                int nn = tn - b0 < NB ? tn - b0 : NB;
                const uint8_t* wb = (const uint8_t*)(tile + (size_t)b0 * K);
                if (nn < NB) {
                    block_tile(wb, trb, x, bias, y, m0, mn, t0 + b0, nn, N, K);
                    continue;
                }
                switch (mn) {
#if MBT >= 6
                    case 6: block_tile(wb, trb, x, bias, y, m0, 6, t0 + b0, NB, N, K); break;
                    case 5: block_tile(wb, trb, x, bias, y, m0, 5, t0 + b0, NB, N, K); break;
                    case 4: block_tile(wb, trb, x, bias, y, m0, 4, t0 + b0, NB, N, K); break;
                    case 3: block_tile(wb, trb, x, bias, y, m0, 3, t0 + b0, NB, N, K); break;
#endif
                    case 2: block_tile(wb, trb, x, bias, y, m0, 2, t0 + b0, NB, N, K); break;
                    default: block_tile(wb, trb, x, bias, y, m0, 1, t0 + b0, NB, N, K); break;
                }
            }
        }
    }
}

#define TYPES(X) X(T_F32) X(T_F16) X(T_BF16) X(T_Q8_0) X(T_Q4_0) X(T_Q4_1) X(T_Q4_K) X(T_Q6_K)

/* One function per type and path, so each stays small enough for its accumulators to live in
 * registers (one function holding every type spilled them). */
#define DEFINE(T)                                                                                      \
    static __attribute__((noinline)) void reg_##T(const uint8_t* w, size_t rb, const float* x,         \
                                                  const float* bias, float* y, int M, int N, int K) {  \
        run_reg(T, w, rb, x, bias, y, M, N, K);                                                        \
    }                                                                                                  \
    static __attribute__((noinline)) void reg2_##T(const uint8_t* w, size_t rb, const float* x,        \
                                                   const float* bias, float* y, int M, int N, int K) { \
        run_reg2(T, w, rb, x, bias, y, M, N, K);                                                       \
    }                                                                                                  \
    static __attribute__((noinline)) void tiled_##T(const uint8_t* w, size_t rb, const float* x,       \
                                                    const float* bias, float* y, int M, int N, int K,  \
                                                    float* tile, int n_begin, int n_end) {             \
        run_tiled(T, w, rb, x, bias, y, M, N, K, tile, n_begin, n_end);                                \
    }
TYPES(DEFINE)
#undef DEFINE

/* The tiled path over output columns [n_begin, n_end): one thread's share. */
typedef struct {
    int type;
    const uint8_t* w;
    size_t rb;
    const float *x, *bias;
    float* y;
    int M, N, K, n_begin, n_end, rc;
} share_t;

static void* run_share(void* arg) {
    share_t* s = (share_t*)arg;
    float* tile = (float*)aligned_alloc(64, (sizeof(float) * (size_t)NT * (size_t)s->K + 63) / 64 * 64);
    if (!tile) {
        s->rc = -2;
        return NULL;
    }
    switch (s->type) {
#define CASE(T)                                                                                 \
    case T: tiled_##T(s->w, s->rb, s->x, s->bias, s->y, s->M, s->N, s->K, tile, s->n_begin, s->n_end); break;
        TYPES(CASE)
#undef CASE
        default: s->rc = -1;
    }
    free(tile);
    return NULL;
}

#define MAX_THREADS 64

/* y = x @ dequant(w)^T (+ bias). Many rows (the tiled path) split the output columns, a
 * multiple of NT each, over up to `threads` threads: every output is still computed by the same
 * operations, so the result does not depend on the thread count either. Returns 0, or -1 for a
 * type it does not know, -2 when a tile or a thread cannot be had. */
int quant_linear(int type, const uint8_t* w, size_t row_bytes, const float* x, const float* bias, float* y,
                 int M, int N, int K, int threads) {
    if (M <= MBR) {
        switch (type) {
#define CASE(T) case T: reg_##T(w, row_bytes, x, bias, y, M, N, K); return 0;
            TYPES(CASE)
#undef CASE
            default: return -1;
        }
    }
    if (M <= MBR2) {
        switch (type) {
#define CASE(T) case T: reg2_##T(w, row_bytes, x, bias, y, M, N, K); return 0;
            TYPES(CASE)
#undef CASE
            default: return -1;
        }
    }
    int tiles = (N + NT - 1) / NT;
    int t = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    if (t > tiles) t = tiles;
    share_t shares[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int i = 0; i < t; i++) {
        int a = (int)((long)tiles * i / t) * NT, b = (int)((long)tiles * (i + 1) / t) * NT;
        shares[i] = (share_t){type, w, row_bytes, x, bias, y, M, N, K, a, b < N ? b : N, 0};
    }
    for (int i = 1; i < t; i++) started[i] = pthread_create(&ids[i], NULL, run_share, &shares[i]) == 0;
    for (int i = 1; i < t; i++)
        if (!started[i]) run_share(&shares[i]); /* no thread to be had: this one does it */
    run_share(&shares[0]);
    int rc = shares[0].rc;
    for (int i = 1; i < t; i++) {
        if (started[i]) pthread_join(ids[i], NULL);
        if (shares[i].rc) rc = shares[i].rc;
    }
    return rc;
}

/* out[i] = dequant(row ids[i] of w) (ids NULL: rows 0..n-1): an embedding lookup. Returns 0, or
 * -1 for an unknown type. */
int quant_dequant_rows(int type, const uint8_t* w, size_t row_bytes, const int64_t* ids, int n, int K, float* out) {
    switch (type) {
#define CASE(T)                                                                                   \
    case T:                                                                                       \
        for (int i = 0; i < n; i++)                                                               \
            dequant_row(T, w + (size_t)(ids ? ids[i] : i) * row_bytes, K, out + (size_t)i * K); \
        break;
        TYPES(CASE)
#undef CASE
        default: return -1;
    }
    return 0;
}

/* Lanes per vector of this build: 16 (AVX-512) or 8 (AVX2). */
int quant_vector_width(void) { return VW; }
