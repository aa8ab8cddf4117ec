/* y[M,N] = x[M,K] @ dequant(w)[N,K]^T (+ bias[N]) in fp32, straight from GGUF blocks, on a CPU
 * with AVX2+FMA+F16C (AVX-512 where the compiler targets it). Built and loaded by
 * nj_kernels/quant_linear.py.
 *
 * Weights stay in their GGUF encoding: row n is row_bytes bytes (K / block-size blocks). Types
 * (GGML ids): F32 0, F16 1, Q4_0 2, Q4_1 3, Q8_0 8, Q4_K 12, Q6_K 14, BF16 30.
 *
 * Exact dequantisation: a weight is computed with the same fp32 operations, in the same order,
 * as the gguf package's numpy reference (gguf.quants): Q4_0 d*(q-8), Q4_1 (d*q)+m, Q8_0 q*d,
 * Q4_K (d*sc)*q - (dmin*m), Q6_K (d*sc)*q; F16/BF16 convert exactly. The file is compiled with
 * -ffp-contract=off, so no mul+add pair is fused into one rounding behind our back.
 *
 * Batch invariance: the (m, n) dot product is accumulated exactly as skinny_linear.c does it:
 * lane-wise FMAs over K in VW-wide chunks (tail zero-padded), then the same horizontal-sum tree,
 * four columns at a time. That order never depends on M. Few rows (M <= MB) dequantise each
 * VW-chunk of a weight block in registers and multiply it into every row; more rows dequantise
 * a tile of NB weight rows to fp32 once and run the same accumulation over it, so both paths
 * give every row the same bits (and the same bits as skinny_linear on the dequantised matrix).
 */
#include <immintrin.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "quant_linear needs AVX2, FMA and F16C"
#endif

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q8_0 = 8, T_Q4_K = 12, T_Q6_K = 14, T_BF16 = 30 };

#if defined(__AVX512F__)
typedef __m512 vec;
typedef __m512i ivec;
#define VW 16
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VSET1(s) _mm512_set1_ps(s)
#define VCVT(i) _mm512_cvtepi32_ps(i)
#define ISET1(s) _mm512_set1_epi32(s)
#define IAND(a, b) _mm512_and_si512(a, b)
#define ISRL(a, n) _mm512_srli_epi32(a, n)
#define ISLL(a, n) _mm512_slli_epi32(a, n)
#define IOR(a, b) _mm512_or_si512(a, b)
#define ISUB(a, b) _mm512_sub_epi32(a, b)
/* VW bytes at p, zero- or sign-extended to 32-bit lanes */
static inline ivec u8x(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)); }
static inline ivec i8x(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)); }
static inline vec f16x(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
static inline vec bf16x(const uint8_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
static inline vec vload_tail(const float* p, int n) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}
static inline __m128 vsum4(vec a, vec b, vec c, vec d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512 s = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
#define NB 4   /* weight rows per block (the tile path and few rows) */
#define MBR 4  /* up to this many input rows: NB weight rows at a time, dequantised in registers */
#define NB2 2  /* up to MBR2 rows: NB2 weight rows at a time, dequantised in registers */
#define MBR2 8
#define MBT 6  /* more rows: input rows per pass over a dequantised fp32 tile */
#else
typedef __m256 vec;
typedef __m256i ivec;
#define VW 8
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VSET1(s) _mm256_set1_ps(s)
#define VCVT(i) _mm256_cvtepi32_ps(i)
#define ISET1(s) _mm256_set1_epi32(s)
#define IAND(a, b) _mm256_and_si256(a, b)
#define ISRL(a, n) _mm256_srli_epi32(a, n)
#define ISLL(a, n) _mm256_slli_epi32(a, n)
#define IOR(a, b) _mm256_or_si256(a, b)
#define ISUB(a, b) _mm256_sub_epi32(a, b)
static inline ivec u8x(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
static inline ivec i8x(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
static inline vec f16x(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
static inline vec bf16x(const uint8_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
static inline vec vload_tail(const float* p, int n) {
    float buf[VW] = {0};
    for (int i = 0; i < n; i++) buf[i] = p[i];
    return _mm256_loadu_ps(buf);
}
static inline __m128 vsum4(vec a, vec b, vec c, vec d) {
    __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    __m256 s = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x44), _mm256_shuffle_ps(ab, cd, 0xEE));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}
#define NB 4 /* 16 vector registers: MB * NB accumulators plus the weights must fit */
#define MBR 2
#define NB2 2
#define MBR2 4
#define MBT 2
#endif

#define PF 8   /* prefetch weight rows this many rows ahead */
#define NT 64  /* weight rows per fp32 tile (many rows): 64 x K floats stay in L2 */
#define HALF (16 / VW) /* vectors per 16 packed nibble bytes */

/* Every f16 value as fp32 (exact: _cvtsh_ss), filled when the library loads: a block's scale
 * is then one broadcast load, not a load, a conversion and a broadcast (as ggml does). */
static float f16_table[1 << 16];

__attribute__((constructor)) static void fill_f16_table(void) {
    for (int i = 0; i < (1 << 16); i++) f16_table[i] = _cvtsh_ss((unsigned short)i);
}

static inline float f16(const uint8_t* p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_table[h];
}

/* Q4_K: the 6-bit scale and min of sub-block s (ggml's get_scale_min_k4). */
static inline void q4k_scale_min(const uint8_t* sc, int s, int* d, int* m) {
    if (s < 4) {
        *d = sc[s] & 63;
        *m = sc[s + 4] & 63;
    } else {
        *d = (sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4);
        *m = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
}

/* Elements per step of the K loop: one 32-weight block (or sub-block) of a quantised type, one
 * vector of a float type. A step's scales are read once (``prep``), then each of its vectors is
 * dequantised (``chunk``). */
static inline int step_of(int type) {
    return (type == T_F32 || type == T_F16 || type == T_BF16) ? VW : 32;
}

typedef struct {
    vec a, b;       /* scales: Q8_0/Q4_0 d; Q4_1 d, m; Q4_K d*sc, -(dmin*m); Q6_K the two d*sc */
    ivec raw[HALF]; /* Q4_0/Q4_1: the 16 nibble bytes, zero-extended */
} prep_t;

/* Exactness of the fused forms: a f16 scale has 11 significant bits, so d*q (q < 16) and the
 * Q4_K products d*sc (sc < 64) and (d*sc)*q are exact in fp32; then (d*q)+m rounds once, as
 * fma(d, q, m) does, and likewise (d*sc)*q - dmin*m. The reference's mul-then-add and our fma
 * give the same bits. */
static inline __attribute__((always_inline)) prep_t prep(int type, const uint8_t* row, int k) {
    prep_t p = {0};
    switch (type) {
        case T_Q8_0: {
            const uint8_t* b = row + (size_t)(k / 32) * 34;
            p.a = VSET1(f16(b));
            break;
        }
        case T_Q4_0: {
            const uint8_t* b = row + (size_t)(k / 32) * 18;
            p.a = VSET1(f16(b));
            for (int h = 0; h < HALF; h++) p.raw[h] = u8x(b + 2 + h * VW);
            break;
        }
        case T_Q4_1: {
            const uint8_t* b = row + (size_t)(k / 32) * 20;
            p.a = VSET1(f16(b));
            p.b = VSET1(f16(b + 2));
            for (int h = 0; h < HALF; h++) p.raw[h] = u8x(b + 4 + h * VW);
            break;
        }
        case T_Q4_K: {
            const uint8_t* b = row + (size_t)(k / 256) * 144;
            int sc, mn;
            q4k_scale_min(b + 4, (k % 256) / 32, &sc, &mn);
            p.a = VSET1(f16(b) * (float)sc);
            p.b = VSET1(-(f16(b + 2) * (float)mn));
            break;
        }
        case T_Q6_K: {
            const uint8_t* b = row + (size_t)(k / 256) * 210;
            int g = (k % 256) / 16;
            float d = f16(b + 208);
            p.a = VSET1(d * (float)(int8_t)b[192 + g]);
            p.b = VSET1(d * (float)(int8_t)b[193 + g]);
            break;
        }
        default:
            break;
    }
    return p;
}

/* Vector c of the step at k: elements k + c*VW .. k + c*VW + VW-1. */
static inline __attribute__((always_inline)) vec chunk(int type, const uint8_t* row, int k, int c, const prep_t* p) {
    int e = k + c * VW;
    switch (type) {
        case T_F32:
            return VLOAD((const float*)row + e);
        case T_F16:
            return f16x(row + 2 * (size_t)e);
        case T_BF16:
            return bf16x(row + 2 * (size_t)e);
        case T_Q8_0:
            return VMUL(VCVT(i8x(row + (size_t)(k / 32) * 34 + 2 + c * VW)), p->a);
        case T_Q4_0: {
            ivec r = p->raw[c % HALF];
            ivec q = c < HALF ? IAND(r, ISET1(15)) : ISRL(r, 4);
            return VMUL(p->a, VCVT(ISUB(q, ISET1(8))));
        }
        case T_Q4_1: {
            ivec r = p->raw[c % HALF];
            ivec q = c < HALF ? IAND(r, ISET1(15)) : ISRL(r, 4);
            return VFMA(p->a, VCVT(q), p->b);
        }
        case T_Q4_K: {
            const uint8_t* b = row + (size_t)(k / 256) * 144;
            int s = (k % 256) / 32;
            ivec q = u8x(b + 16 + (s / 2) * 32 + c * VW);
            q = (s & 1) ? ISRL(q, 4) : IAND(q, ISET1(15));
            return VFMA(p->a, VCVT(q), p->b);
        }
        case T_Q6_K: {
            const uint8_t* b = row + (size_t)(k / 256) * 210;
            int r = e % 128, h = (e % 256) / 128;
            ivec lo = u8x(b + h * 64 + r % 64);
            lo = (r / 64) ? ISRL(lo, 4) : IAND(lo, ISET1(15));
            ivec hi = IAND(ISRL(u8x(b + 128 + h * 32 + r % 32), 2 * (r / 32)), ISET1(3));
            ivec q = ISUB(IOR(lo, ISLL(hi, 4)), ISET1(32));
            return VMUL(c * VW < 16 ? p->a : p->b, VCVT(q));
        }
        default:
            return VZERO();
    }
}

/* The last, partial vector of a float row (F32/F16/BF16: quantised rows are whole blocks). */
static inline vec deq_tail(int type, const uint8_t* row, int k, int n) {
    float buf[VW] = {0};
    for (int i = 0; i < n; i++) {
        if (type == T_F32) {
            memcpy(&buf[i], row + 4 * (size_t)(k + i), 4);
        } else if (type == T_F16) {
            buf[i] = f16(row + 2 * (size_t)(k + i));
        } else {
            uint32_t u = (uint32_t)row[2 * (size_t)(k + i)] << 16 | (uint32_t)row[2 * (size_t)(k + i) + 1] << 24;
            memcpy(&buf[i], &u, 4);
        }
    }
    return VLOAD(buf);
}

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

/* Row `row` of a weight, K elements, dequantised into out. */
static inline __attribute__((always_inline)) void dequant_row(int type, const uint8_t* row, int K, float* out) {
    const int st = step_of(type);
    int k = 0;
    for (; k + st <= K; k += st) {
        prep_t p = prep(type, row, k);
        for (int c = 0; c < st / VW; c++) VSTORE(out + k + c * VW, chunk(type, row, k, c, &p));
    }
    if (k < K) {
        float buf[VW];
        VSTORE(buf, deq_tail(type, row, k, K - k));
        memcpy(out + k, buf, sizeof(float) * (size_t)(K - k));
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
