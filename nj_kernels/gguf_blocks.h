/* GGUF blocks, dequantised in registers with the gguf package's own fp32 operations (bit for bit
 * its values): F32 0, F16 1, Q4_0 2, Q4_1 3, Q8_0 8, Q4_K 12, Q6_K 14, BF16 30 (GGML type ids).
 * A row is K / block-size blocks; the K loop steps by step_of(type) elements: one 32-weight
 * block (or sub-block) of a quantised type, one vector of a float type. prep() reads a step's
 * scales once, chunk() dequantises its c-th vector. Used by quant_linear.c. */
#ifndef NJ_GGUF_BLOCKS_H
#define NJ_GGUF_BLOCKS_H

#include <string.h>

#include "simd.h"

#if !defined(__F16C__)
#error "GGUF blocks need F16C"
#endif

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q8_0 = 8, T_Q4_K = 12, T_Q6_K = 14, T_BF16 = 30 };

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

static inline int step_of(int type) {
    return (type == T_F32 || type == T_F16 || type == T_BF16) ? VW : 32;
}

typedef struct {
    vec a, b;       /* scales: Q8_0/Q4_0 d; Q4_1 d, m; Q4_K d*sc, -(dmin*m); Q6_K the two d*sc */
    veci raw[HALF]; /* Q4_0/Q4_1: the 16 nibble bytes, zero-extended */
} prep_t;

/* Exactness of the fused forms: a f16 scale has 11 significant bits, so d*q (q < 16) and the
 * Q4_K products d*sc (sc < 64) and (d*sc)*q are exact in fp32; then (d*q)+m rounds once, as
 * fma(d, q, m) does, and likewise (d*sc)*q - dmin*m. The reference's mul-then-add and our fma
 * give the same bits. On AVX-512 a Q4_0 / Q4_1 block's 16 possible weights are computed so
 * (a vector of q = 0..15) and each weight is looked up by its nibble (one permute): the same
 * values, fewer operations. */
static inline __attribute__((always_inline)) prep_t prep(int type, const uint8_t* row, int k) {
    prep_t p = {0};
    switch (type) {
        case T_Q8_0: {
            const uint8_t* b = row + (size_t)(k / 32) * 34;
            p.a = VSET(f16(b));
            break;
        }
        case T_Q4_0: {
            const uint8_t* b = row + (size_t)(k / 32) * 18;
#if VW == 16 /* the block's 16 possible weights, d*(q-8), looked up by q (one permute a vector) */
            p.a = VMUL(VSET(f16(b)), _mm512_set_ps(7, 6, 5, 4, 3, 2, 1, 0, -1, -2, -3, -4, -5, -6, -7, -8));
#else
            p.a = VSET(f16(b));
#endif
            for (int h = 0; h < HALF; h++) p.raw[h] = u8x(b + 2 + h * VW);
            break;
        }
        case T_Q4_1: {
            const uint8_t* b = row + (size_t)(k / 32) * 20;
#if VW == 16 /* the 16 possible weights (d*q)+m (the fused form: see above), looked up by q */
            p.a = VFMA(VSET(f16(b)), _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                       VSET(f16(b + 2)));
#else
            p.a = VSET(f16(b));
            p.b = VSET(f16(b + 2));
#endif
            for (int h = 0; h < HALF; h++) p.raw[h] = u8x(b + 4 + h * VW);
            break;
        }
        case T_Q4_K: {
            const uint8_t* b = row + (size_t)(k / 256) * 144;
            int sc, mn;
            q4k_scale_min(b + 4, (k % 256) / 32, &sc, &mn);
            p.a = VSET(f16(b) * (float)sc);
            p.b = VSET(-(f16(b + 2) * (float)mn));
            break;
        }
        case T_Q6_K: {
            const uint8_t* b = row + (size_t)(k / 256) * 210;
            int g = (k % 256) / 16;
            float d = f16(b + 208);
            p.a = VSET(d * (float)(int8_t)b[192 + g]);
            p.b = VSET(d * (float)(int8_t)b[193 + g]);
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
            veci r = p->raw[c % HALF];
            veci q = c < HALF ? IAND(r, ISET1(15)) : ISRL(r, 4);
#if VW == 16
            return _mm512_permutexvar_ps(q, p->a);
#else
            return VMUL(p->a, VCVT(ISUB(q, ISET1(8))));
#endif
        }
        case T_Q4_1: {
            veci r = p->raw[c % HALF];
            veci q = c < HALF ? IAND(r, ISET1(15)) : ISRL(r, 4);
#if VW == 16
            return _mm512_permutexvar_ps(q, p->a);
#else
            return VFMA(p->a, VCVT(q), p->b);
#endif
        }
        case T_Q4_K: {
            const uint8_t* b = row + (size_t)(k / 256) * 144;
            int s = (k % 256) / 32;
            veci q = u8x(b + 16 + (s / 2) * 32 + c * VW);
            q = (s & 1) ? ISRL(q, 4) : IAND(q, ISET1(15));
            return VFMA(p->a, VCVT(q), p->b);
        }
        case T_Q6_K: {
            const uint8_t* b = row + (size_t)(k / 256) * 210;
            int r = e % 128, h = (e % 256) / 128;
            veci lo = u8x(b + h * 64 + r % 64);
            lo = (r / 64) ? ISRL(lo, 4) : IAND(lo, ISET1(15));
            veci hi = IAND(ISRL(u8x(b + 128 + h * 32 + r % 32), 2 * (r / 32)), ISET1(3));
            veci q = ISUB(IOR(lo, ISLL(hi, 4)), ISET1(32));
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

#endif /* NJ_GGUF_BLOCKS_H */
