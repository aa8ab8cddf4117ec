/* Causal attention of query rows over the paged KV cache, one row at a time, in fp32, on a CPU
 * with AVX2+FMA (AVX-512 where the compiler targets it). Built and loaded by
 * nj_kernels/cpu_attention.py.
 *
 * Why: torch's scaled_dot_product_attention rounds a row differently depending on how many
 * query rows share the call and how far the batch pads the keys (its GEMMs take M-dependent
 * paths), so a position's output in a verification of γ+1 rows could differ from a decode
 * step's. Here every (row, head) is computed by the same fixed sequence of operations, which
 * depends only on the row's own position and the cached keys and values it attends to:
 *   s_t = scale * dot(q, k_t)   for t = 0..p (dot: lane-wise FMAs over D, one fixed reduction)
 *   e_t = exp(s_t - max_t s_t)  (simd.h's polynomial exp), Z = sum of e_t (lane-wise, fixed)
 *   out = (sum_t e_t * v_t) / Z (FMAs in t order)
 * so the output of a row does not depend on the rows, sequences or padding around it.
 *
 * Layout: q rows [T, H, D] with row stride q_stride floats; the layer's cache [2][NB][BS][KVH][D]
 * (keys then values); tables [B][MAXB] int32; ctx [B] int32 (tokens cached including this
 * step's rows); row r belongs to sequence r / NQ and sits at position ctx - NQ + r % NQ. Query
 * head h reads KV head h / (H / KVH).
 */
#include <math.h>
#include <stdlib.h>

#include "simd.h"

static inline float dot(const float* a, const float* b, int D) {
    vec acc = VZERO();
    int d = 0;
    for (; d + VW <= D; d += VW) acc = VFMA(VLOAD(a + d), VLOAD(b + d), acc);
    if (d < D) acc = VFMA(vload_tail(a + d, D - d), vload_tail(b + d, D - d), acc);
    return vsum(acc);
}

#define MAXG 16 /* query heads per KV head handled at once */
#define MAXD 256

/* One position p of one sequence, the G query heads q[g] (D floats each) of one KV head. */
static void attend(const float* const* q, float* const* out, int G, const float* kbase, const float* vbase,
                   const int32_t* table, int p, int BS, int KVH, int kvh, int D, float scale, float* s) {
    const size_t tok = (size_t)KVH * D; /* floats between consecutive tokens of a block */
    const int L = p + 1;
    for (int t = 0; t < L; t++) {
        const size_t at = ((size_t)table[t / BS] * BS + t % BS) * tok + (size_t)kvh * D;
        for (int g = 0; g < G; g++) s[(size_t)g * L + t] = dot(q[g], kbase + at, D) * scale;
    }
    float inv[MAXG];
    for (int g = 0; g < G; g++) {
        float* sg = s + (size_t)g * L;
        vec mv = VSET(-INFINITY);
        int t = 0;
        for (; t + VW <= L; t += VW) mv = VMAX(mv, VLOAD(sg + t));
        float m = hmax(mv);
        for (; t < L; t++) m = sg[t] > m ? sg[t] : m;
        vec zv = VZERO();
        for (t = 0; t + VW <= L; t += VW) {
            vec e = vexp(VSUB(VLOAD(sg + t), VSET(m)));
            VSTORE(sg + t, e);
            zv = VADD(zv, e);
        }
        if (t < L) {
            vstore_tail(sg + t, vexp(VSUB(vload_tail(sg + t, L - t), VSET(m))), L - t);
            zv = VADD(zv, vload_tail(sg + t, L - t)); /* the lanes past L add 0 */
        }
        inv[g] = 1.0f / vsum(zv);
    }
    vec acc[MAXG][MAXD / VW];
    const int nv = (D + VW - 1) / VW;
    for (int g = 0; g < G; g++)
        for (int c = 0; c < nv; c++) acc[g][c] = VZERO();
    for (int t = 0; t < L; t++) {
        const float* v = vbase + ((size_t)table[t / BS] * BS + t % BS) * tok + (size_t)kvh * D;
        for (int c = 0; c < nv; c++) {
            int n = D - c * VW < VW ? D - c * VW : VW;
            vec vv = n == VW ? VLOAD(v + c * VW) : vload_tail(v + c * VW, n);
            for (int g = 0; g < G; g++) acc[g][c] = VFMA(VSET(s[(size_t)g * L + t]), vv, acc[g][c]);
        }
    }
    for (int g = 0; g < G; g++)
        for (int c = 0; c < nv; c++) {
            int n = D - c * VW < VW ? D - c * VW : VW;
            vec o = VMUL(acc[g][c], VSET(inv[g]));
            if (n == VW) VSTORE(out[g] + c * VW, o);
            else vstore_tail(out[g] + c * VW, o, n);
        }
}

/* Returns 0; -1 for shapes it does not take (more than MAXG query heads per KV head, D over
 * MAXD), -2 when the scratch cannot be allocated. */
int paged_attention_rows(const float* q, long q_stride, const float* cache, const int32_t* tables,
                         const int32_t* ctx, float* out, int B, int NQ, int H, int KVH, int D, int NB,
                         int BS, int MAXB, float scale) {
    const int G = H / KVH;
    if (G > MAXG || D > MAXD || G * KVH != H) return -1;
    int maxctx = 0;
    for (int b = 0; b < B; b++) maxctx = ctx[b] > maxctx ? ctx[b] : maxctx;
    float* s = (float*)malloc(sizeof(float) * (size_t)G * (size_t)(maxctx + VW));
    if (!s) return -2;
    const float* kbase = cache;
    const float* vbase = cache + (size_t)NB * BS * KVH * D;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < NQ; j++) {
            const int r = b * NQ + j, p = ctx[b] - NQ + j;
            for (int kvh = 0; kvh < KVH; kvh++) {
                const float* qs[MAXG];
                float* os[MAXG];
                for (int g = 0; g < G; g++) {
                    qs[g] = q + (size_t)r * q_stride + (size_t)(kvh * G + g) * D;
                    os[g] = out + ((size_t)r * H + (size_t)(kvh * G + g)) * D;
                }
                attend(qs, os, G, kbase, vbase, tables + (size_t)b * MAXB, p, BS, KVH, kvh, D, scale, s);
            }
        }
    free(s);
    return 0;
}
