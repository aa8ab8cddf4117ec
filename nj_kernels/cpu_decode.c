/* Every decoder layer of a Llama-family model over a few rows, in one call: the decode path
 * of the fp32 CPU engine (decode rows, speculative verifications, short prompt chunks: up to
 * cpu_decode.py's max_rows(); every forward of a model whose matrices are all GGUF blocks,
 * whatever its row count: see "Weights" below). Built with
 * skinny_linear.c into one library by nj_kernels/cpu_linear.py; called by cpu_decode.py.
 *
 * Why: at batch 1 a forward of SmolLM2-135M reads 538 MB of weights, 28-30 ms at the best
 * read bandwidth of one core of the project's machine; run op by op from torch, the ~15 small
 * ops of each of its 30 layers (norms, rotary, the KV write, a gather of the pages and SDPA,
 * SiLU, residuals) cost another 8-20 ms of dispatch and copies (BENCHMARKS.md "fp32 decode at
 * the memory floor"). Here a layer is norm -> qkv -> (q/k norm) -> rotary
 * -> KV write -> paged attention read in place -> o-proj -> residual -> norm -> gate/up ->
 * SiLU * up -> down -> residual, with the products through skinny_linear and everything else
 * on rows that stay in cache.
 *
 * Row independence: every row's output depends only on its own input, its position and the
 * keys/values its attention reads, never on the other rows or their number (the products are
 * batch-invariant, norms and rotary are per row, a row's attention walks its own keys in
 * position order with fixed reduction trees). A verification row therefore computes exactly
 * what a decode row at the same position computes.
 *
 * Arithmetic: fp32 throughout, as transformers (RMSNorm x * 1/sqrt(mean(x^2) + eps) * w,
 * rotary x*cos - rotate_half(x)*sin, softmax(q.k * scale) v, silu(g) * u); the order of sums
 * differs from torch's, so results agree to rounding, not bit for bit.
 *
 * Weights: a matrix is plain row-major fp32 (skinny_linear) or GGUF blocks (Q4_1, Q8_0, ... as
 * the file stores them), multiplied by quant_linear.c's own quant_linear through its address
 * (quant_linear.h): the same compiled code the op-by-op path calls, batch-invariant for every
 * row count, so a model whose matrices are all blocks may run any number of rows here.
 */
#include <stdlib.h>
#include <string.h>

#include "quant_linear.h"
#include "simd.h"

void skinny_linear(const float* x, const float* w, const float* bias, float* y, int M, int N, int K);

/* A weight matrix [N, K]: plain row-major fp32 floats (fn NULL: skinny_linear), or N rows of
 * row_bytes bytes of GGUF blocks of GGML type `type`, multiplied by fn (quant_linear.c's
 * quant_linear, from the library the weight's Python object binds). Field order = cpu_decode.py's. */
typedef struct {
    const void* w;
    nj_quant_linear_t* fn;
    int64_t type, row_bytes;
} nj_matrix;

/* One layer's weights (NULL where the model has none; the four matrices are required);
 * field order = cpu_decode.py's. */
typedef struct {
    const float *input_norm;
    nj_matrix qkv;
    const float *qkv_bias, *qk_norm;
    nj_matrix o;
    const float *o_bias, *post_norm;
    nj_matrix gate_up;
    const float *gate_up_bias;
    nj_matrix down;
    const float *down_bias;
} nj_layer;

typedef struct {
    int64_t num_layers, hidden, heads, kv_heads, head_dim, intermediate;
    int64_t num_blocks, block_size; /* the KV cache [layers, 2, num_blocks, block_size, kv_heads, head_dim] */
    int64_t rope_positions;         /* rows of the cos / sin tables */
    float eps, scale;
    int32_t threads;                /* threads a GGUF product of more than a few rows may use */
} nj_dims;

/* num_seqs sequences of num_queries consecutive rows each, from row_start; sequence b's block
 * table is tables[b * table_stride ...]. */
typedef struct {
    int64_t row_start, num_seqs, num_queries, table_stride;
    const int32_t* tables;
} nj_group;

enum { NJ_OK = 0, NJ_NO_MEMORY = 1, NJ_BAD_POSITION = 2, NJ_BAD_SLOT = 3, NJ_BAD_BLOCK = 4, NJ_BAD_ROWS = 5, NJ_BAD_DIMS = 6,
       NJ_BAD_WEIGHT = 7 };
#define NJ_MAX_HEAD_DIM 512
#define NJ_MAX_HEADS 1024

/* y[m, n] = x[m, k] @ w^T (+ bias): NJ_OK, or NJ_NO_MEMORY / NJ_BAD_WEIGHT from the block kernel. */
static inline int layer_linear(const float* x, const nj_matrix* w, const float* bias, float* y, int m, int n, int k,
                               int threads) {
    if (!w->fn) {
        skinny_linear(x, (const float*)w->w, bias, y, m, n, k);
        return NJ_OK;
    }
    int rc = w->fn((int)w->type, (const uint8_t*)w->w, (size_t)w->row_bytes, x, bias, y, m, n, k, threads);
    return rc == 0 ? NJ_OK : rc == -2 ? NJ_NO_MEMORY : NJ_BAD_WEIGHT;
}

static inline float sqrt_f(float v) { return _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(v))); }

/* y = w * (x * 1/sqrt(mean(x^2) + eps)); y may be x. */
static void rms_norm_row(const float* x, const float* w, float* y, int n, float eps) {
    vec acc = VZERO();
    int k = 0;
    for (; k + VW <= n; k += VW) {
        vec v = VLOAD(x + k);
        acc = VFMA(v, v, acc);
    }
    if (k < n) {
        vec v = vload_tail(x + k, n - k);
        acc = VFMA(v, v, acc);
    }
    vec r = VSET(1.0f / sqrt_f(vsum(acc) / (float)n + eps));
    for (k = 0; k + VW <= n; k += VW) VSTORE(y + k, VMUL(VLOAD(w + k), VMUL(VLOAD(x + k), r)));
    if (k < n) vstore_tail(y + k, VMUL(vload_tail(w + k, n - k), VMUL(vload_tail(x + k, n - k), r)), n - k);
}

/* Rotary on `heads` consecutive heads of width d, halves rotated: x1*c - x2*s, x2*c + x1*s. */
static void rope_row(float* x, int heads, int d, const float* c, const float* s) {
    int half = d / 2;
    for (int h = 0; h < heads; h++) {
        float* p = x + (size_t)h * d;
        for (int i = 0; i < half; i++) {
            float a = p[i], b = p[i + half];
            p[i] = a * c[i] - b * s[i];
            p[i + half] = b * c[i] + a * s[i];
        }
    }
}

/* silu(g) * u over n values: g / (1 + exp(-g)) * u, lane-wise (the tail the same way). */
static void silu_mul_row(const float* g, const float* u, float* y, int n) {
    vec one = VSET(1.0f);
    int k = 0;
    for (; k + VW <= n; k += VW) {
        vec gv = VLOAD(g + k);
        vec sv = VDIV(gv, VADD(one, vexp(VSUB(VZERO(), gv))));
        VSTORE(y + k, VMUL(sv, VLOAD(u + k)));
    }
    if (k < n) {
        vec gv = vload_tail(g + k, n - k);
        vec sv = VDIV(gv, VADD(one, vexp(VSUB(VZERO(), gv))));
        vstore_tail(y + k, VMUL(sv, vload_tail(u + k, n - k)), n - k);
    }
}

/* One row's attention over its positions 0..n-1, for every query head:
 *   out_h = sum_t softmax(q_h . k_t * scale)_t v_t,   k_t, v_t of KV head h / g.
 * Page by page, and in a page KV head by KV head, so the keys (then the values) of a page are
 * read once, close together in time, for every head; the query heads of one KV head are taken
 * together (passes of up to 4 at width 64, 2 at 128, else 1), so each key and value is loaded
 * once for them. Per head the arithmetic is fixed whatever the batch: a score is one FMA chain
 * over the head's width, reduced by vsum4 four keys at a time (each the same way, so a score
 * does not depend on its neighbours); the softmax and the sum of the values run in position
 * order (the value accumulators are kept in `out` between pages: a store and a load are
 * exact). */
typedef struct {
    const float* kc;      /* this layer's key cache: slot s, KV head kh at kc + s * row + kh * d */
    const float* vc;      /* its value cache, the same layout */
    const int32_t* table; /* the row's block table */
    int bs, n, d, g, kv_heads;
    size_t row;           /* floats a slot: kv_heads * d */
    float scale;
} attn_row;

/* acc + q * k lane-wise over d floats, in VW chunks (the tail zero-padded). */
static inline __attribute__((always_inline)) vec key_dot(const float* q, const float* k, vec acc, const int d) {
    int i = 0;
    for (; i + VW <= d; i += VW) acc = VFMA(VLOAD(q + i), VLOAD(k + i), acc);
    if (i < d) acc = VFMA(vload_tail(q + i, d - i), vload_tail(k + i, d - i), acc);
    return acc;
}

/* Scores of hb heads (q: hb consecutive heads) against the m keys of one page from slot j0 on
 * (key j at k + j * row), into s[h * n + t0 + j]. */
static inline __attribute__((always_inline)) void page_scores(
    const attn_row* a, const float* q, const float* k, int in_page, int t0, float* s, const int d, const int hb) {
    const __m128 sv = _mm_set1_ps(a->scale);
    for (int j0 = 0; j0 < in_page; j0 += 4) {
        int m = in_page - j0 < 4 ? in_page - j0 : 4;
        for (int h = 0; h < hb; h++) {
            const float* qh = q + (size_t)h * d;
            vec acc[4] = {VZERO(), VZERO(), VZERO(), VZERO()};
            if (m == 4) { /* a constant count keeps the accumulators in registers */
                for (int j = 0; j < 4; j++) acc[j] = key_dot(qh, k + (size_t)(j0 + j) * a->row, acc[j], d);
            } else {
                for (int j = 0; j < m; j++) acc[j] = key_dot(qh, k + (size_t)(j0 + j) * a->row, acc[j], d);
            }
            float s4[4];
            _mm_storeu_ps(s4, _mm_mul_ps(vsum4(acc[0], acc[1], acc[2], acc[3]), sv));
            for (int j = 0; j < m; j++) s[(size_t)h * a->n + t0 + j0 + j] = s4[j];
        }
    }
}

/* out_h += e_h[t] v_t over the page's values (v + j * row), for hb heads; the accumulators
 * come from and go back to out. */
static inline __attribute__((always_inline)) void page_values(
    const attn_row* a, float* out, const float* v, int in_page, int t0, const float* e, const int d, const int hb) {
    enum { MAXV = NJ_MAX_HEAD_DIM / VW + 1 };
    const int nv = d / VW, rem = d - nv * VW;
    vec acc[hb][MAXV];
    for (int h = 0; h < hb; h++) {
        for (int i = 0; i < nv; i++) acc[h][i] = VLOAD(out + (size_t)h * d + i * VW);
        if (rem) acc[h][nv] = vload_tail(out + (size_t)h * d + nv * VW, rem);
    }
    for (int j = 0; j < in_page; j++) {
        const float* vj = v + (size_t)j * a->row;
        for (int h = 0; h < hb; h++) {
            vec w = VSET(e[(size_t)h * a->n + t0 + j]);
            for (int i = 0; i < nv; i++) acc[h][i] = VFMA(w, VLOAD(vj + i * VW), acc[h][i]);
            if (rem) acc[h][nv] = VFMA(w, vload_tail(vj + nv * VW, rem), acc[h][nv]);
        }
    }
    for (int h = 0; h < hb; h++) {
        for (int i = 0; i < nv; i++) VSTORE(out + (size_t)h * d + i * VW, acc[h][i]);
        if (rem) vstore_tail(out + (size_t)h * d + nv * VW, acc[h][nv], rem);
    }
}

/* One page's keys (values = 0) or values (values = 1) for every head, KV head by KV head, the
 * query heads of each in passes whose accumulators fit in registers (constant widths). */
static void attend_page(const attn_row* a, const float* q, float* out, float* s, int page, int in_page, int t0, int values) {
    const int d = a->d, g = a->g;
    size_t slot0 = (size_t)a->table[page] * a->bs * a->row;
    if ((page + 1) * a->bs < a->n) { /* the next page, while this one is read (ctx 2000: -12 % attention) */
        const char* next = (const char*)((values ? a->vc : a->kc) + (size_t)a->table[page + 1] * a->bs * a->row);
        for (size_t b = 0; b < sizeof(float) * a->bs * a->row; b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
    }
    for (int kh = 0; kh < a->kv_heads; kh++) {
        const float* base = (values ? a->vc : a->kc) + slot0 + (size_t)kh * d;
        int h = kh * g, end = h + g;
        const int hb = d == 64 ? 4 : d == 128 ? 2 : 1;
        while (h < end) {
            int c = end - h < hb ? end - h : hb;
            float* sh = s + (size_t)h * a->n;
            const float* qh = q + (size_t)h * d;
            float* oh = out + (size_t)h * d;
#define NJ_PAGE(D, HB) (values ? page_values(a, oh, base, in_page, t0, sh, D, HB) \
                               : page_scores(a, qh, base, in_page, t0, sh, D, HB))
            if (d == 64 && c == 4) NJ_PAGE(64, 4);
            else if (d == 64 && c == 3) NJ_PAGE(64, 3);
            else if (d == 64 && c == 2) NJ_PAGE(64, 2);
            else if (d == 64) NJ_PAGE(64, 1);
            else if (d == 128 && c == 2) NJ_PAGE(128, 2);
            else if (d == 128) NJ_PAGE(128, 1);
            else NJ_PAGE(d, 1);
#undef NJ_PAGE
            h += c;
        }
    }
}

/* The row's attention: out [heads * d], s: heads * n floats of scratch. */
static void attend_row(const attn_row* a, const float* q, float* out, float* s, int heads) {
    const int n = a->n, bs = a->bs;
    for (int t0 = 0, page = 0; t0 < n; t0 += bs, page++)
        attend_page(a, q, out, s, page, n - t0 < bs ? n - t0 : bs, t0, 0);
    float inv[NJ_MAX_HEADS];
    for (int h = 0; h < heads; h++) {
        float* sh = s + (size_t)h * n;
        float mx = sh[0];
        for (int t = 1; t < n; t++) mx = sh[t] > mx ? sh[t] : mx;
        vec mv = VSET(mx), sum = VZERO();
        int t = 0;
        for (; t + VW <= n; t += VW) {
            vec e = vexp(VSUB(VLOAD(sh + t), mv));
            VSTORE(sh + t, e);
            sum = VADD(sum, e);
        }
        if (t < n) {
            vstore_tail(sh + t, vexp(VSUB(vload_tail(sh + t, n - t), mv)), n - t);
            sum = VADD(sum, vload_tail(sh + t, n - t));
        }
        inv[h] = 1.0f / vsum(sum);
    }
    memset(out, 0, sizeof(float) * (size_t)heads * a->d);
    for (int t0 = 0, page = 0; t0 < n; t0 += bs, page++)
        attend_page(a, q, out, s, page, n - t0 < bs ? n - t0 : bs, t0, 1);
    for (int h = 0; h < heads; h++) {
        float* o = out + (size_t)h * a->d;
        vec iv = VSET(inv[h]);
        int i = 0;
        for (; i + VW <= a->d; i += VW) VSTORE(o + i, VMUL(VLOAD(o + i), iv));
        if (i < a->d) vstore_tail(o + i, VMUL(vload_tail(o + i, a->d - i), iv), a->d - i);
    }
}

/* hidden [T, hidden] in place: every layer over the rows. positions, slots: [T]; cos / sin:
 * [rope_positions, head_dim / 2]; kv: the cache. Returns NJ_OK, or an NJ_* error before any
 * write when an index is out of range (nothing is computed then); a block product that fails
 * (NJ_NO_MEMORY, NJ_BAD_WEIGHT) stops the layers where it happens, the cache partly written. */
int nj_decode_layers(const nj_dims* dims, const nj_layer* layers, float* hidden, int T,
                     const int64_t* positions, const int64_t* slots, const float* cos_t, const float* sin_t,
                     const nj_group* groups, int num_groups, float* kv) {
    const int hd = (int)dims->hidden, H = (int)dims->heads, KVH = (int)dims->kv_heads, D = (int)dims->head_dim;
    const int I = (int)dims->intermediate, bs = (int)dims->block_size, half = D / 2;
    const int nqkv = (H + 2 * KVH) * D, g = H / KVH;
    const size_t slot_row = (size_t)KVH * D, cache_rows = (size_t)dims->num_blocks * bs;

    /* Each row's block table; every index checked before anything is written. */
    if (D <= 0 || D > NJ_MAX_HEAD_DIM || D % 2 || KVH <= 0 || H % KVH || H > NJ_MAX_HEADS || T <= 0) return NJ_BAD_DIMS;
    const int32_t** table = calloc((size_t)T, sizeof(*table));
    if (!table) return NJ_NO_MEMORY;
    int max_keys = 1;
    for (int gi = 0; gi < num_groups; gi++) {
        const nj_group* gr = &groups[gi];
        int64_t rows = gr->num_seqs * gr->num_queries;
        if (gr->row_start < 0 || gr->num_queries <= 0 || gr->row_start + rows > T) { free(table); return NJ_BAD_ROWS; }
        for (int64_t r = 0; r < rows; r++) {
            int row = (int)(gr->row_start + r);
            const int32_t* tb = gr->tables + (r / gr->num_queries) * gr->table_stride;
            int64_t p = positions[row];
            if (p < 0 || p >= dims->rope_positions || p / bs >= gr->table_stride) { free(table); return NJ_BAD_POSITION; }
            for (int64_t b = 0; b <= p / bs; b++)
                if (tb[b] < 0 || tb[b] >= dims->num_blocks) { free(table); return NJ_BAD_BLOCK; }
            if (slots[row] < 0 || (size_t)slots[row] >= cache_rows) { free(table); return NJ_BAD_SLOT; }
            if (table[row]) { free(table); return NJ_BAD_ROWS; } /* two groups claim the row */
            table[row] = tb;
            if (p + 1 > max_keys) max_keys = (int)(p + 1);
        }
    }
    for (int r = 0; r < T; r++)
        if (!table[r]) { free(table); return NJ_BAD_ROWS; } /* a row in no group */

    size_t width = (size_t)(nqkv > 2 * I ? nqkv : 2 * I);
    if ((size_t)hd > width) width = hd;
    float* x = malloc(sizeof(float) * (size_t)T * hd);
    float* big = malloc(sizeof(float) * (size_t)T * width);        /* qkv rows, then gate/up rows */
    float* attn = malloc(sizeof(float) * (size_t)T * (H * D > I ? H * D : I)); /* attention out, then SiLU*up */
    float* sc = malloc(sizeof(float) * (size_t)H * max_keys); /* every head's scores of a row */
    if (!x || !big || !attn || !sc) {
        free(table); free(x); free(big); free(attn); free(sc);
        return NJ_NO_MEMORY;
    }

    const int threads = dims->threads > 0 ? dims->threads : 1;
    int rc = NJ_OK;
#define NJ_LINEAR(X, W, B, Y, N, K) \
    if ((rc = layer_linear(X, &L->W, L->B, Y, T, N, K, threads)) != NJ_OK) goto done
    for (int l = 0; l < dims->num_layers; l++) {
        const nj_layer* L = &layers[l];
        float* kc = kv + (size_t)l * 2 * cache_rows * slot_row;
        float* vc = kc + cache_rows * slot_row;
        for (int r = 0; r < T; r++) rms_norm_row(hidden + (size_t)r * hd, L->input_norm, x + (size_t)r * hd, hd, dims->eps);
        NJ_LINEAR(x, qkv, qkv_bias, big, nqkv, hd);
        for (int r = 0; r < T; r++) {
            float* qk = big + (size_t)r * nqkv;
            if (L->qk_norm)
                for (int h = 0; h < H + KVH; h++)
                    rms_norm_row(qk + (size_t)h * D, L->qk_norm + (size_t)h * D, qk + (size_t)h * D, D, dims->eps);
            rope_row(qk, H + KVH, D, cos_t + positions[r] * half, sin_t + positions[r] * half);
            memcpy(kc + (size_t)slots[r] * slot_row, qk + (size_t)H * D, sizeof(float) * slot_row);
            memcpy(vc + (size_t)slots[r] * slot_row, qk + (size_t)(H + KVH) * D, sizeof(float) * slot_row);
        }
        for (int r = 0; r < T; r++) {
            attn_row a = {kc, vc, table[r], bs, (int)positions[r] + 1, D, g, KVH, slot_row, dims->scale};
            attend_row(&a, big + (size_t)r * nqkv, attn + (size_t)r * H * D, sc, H);
        }
        NJ_LINEAR(attn, o, o_bias, x, hd, H * D);
        for (size_t i = 0; i < (size_t)T * hd; i++) hidden[i] = hidden[i] + x[i];
        for (int r = 0; r < T; r++) rms_norm_row(hidden + (size_t)r * hd, L->post_norm, x + (size_t)r * hd, hd, dims->eps);
        NJ_LINEAR(x, gate_up, gate_up_bias, big, 2 * I, hd);
        for (int r = 0; r < T; r++) silu_mul_row(big + (size_t)r * 2 * I, big + (size_t)r * 2 * I + I, attn + (size_t)r * I, I);
        NJ_LINEAR(attn, down, down_bias, x, hd, I);
        for (size_t i = 0; i < (size_t)T * hd; i++) hidden[i] = hidden[i] + x[i];
    }
#undef NJ_LINEAR
done:
    free(table); free(x); free(big); free(attn); free(sc);
    return rc;
}
