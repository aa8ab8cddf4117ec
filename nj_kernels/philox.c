/* Keyed sampling on the CPU: Philox-4x32 uniforms, and the whole keyed draw of a row.
 *
 * nj_kernels/philox.py (``uniforms_torch``) and worker/engine/keyed.py (``keyed_draw_torch``)
 * are the references, in torch ops; these compute the same numbers one element at a time
 * instead of ~250 (Philox) and ~25 (the draw) torch ops over all of them.
 *
 * Uniform of token id at (seed, position) in counter space ``stream``: counter (id >> 2,
 * position low, position high, stream), key (seed low, seed high), ``rounds`` rounds; word
 * id & 3 of the output, (w + 0.5) / 2^32. */
#include <math.h>
#include <stdint.h>

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

static inline double philox_uniform(uint64_t seed, uint64_t pos, uint64_t id, uint32_t stream,
                                    int32_t rounds) {
    uint32_t c0 = (uint32_t)(id >> 2), c1 = (uint32_t)pos, c2 = (uint32_t)(pos >> 32), c3 = stream;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int32_t i = 0; i < rounds; i++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(0xD2511F53u, c0, &hi0, &lo0);
        mulhilo(0xCD9E8D57u, c2, &hi1, &lo1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    const uint32_t w[4] = {c0, c1, c2, c3};
    return ((double)w[id & 3] + 0.5) * (1.0 / 4294967296.0);
}

/* out[e] = the uniform of token ids[e] at (seeds[r], positions[r]), r = rows[e]. */
void nj_philox_uniforms(const int64_t *seeds, const int64_t *positions, const int64_t *rows,
                        const int64_t *ids, int64_t n, int64_t stream, int32_t rounds,
                        double *out) {
    for (int64_t e = 0; e < n; e++) {
        const int64_t r = rows[e];
        out[e] = philox_uniform((uint64_t)seeds[r], (uint64_t)positions[r], (uint64_t)ids[e],
                                (uint32_t)stream, rounds);
    }
}

/* One keyed draw per row of probs [n, vocab] (row stride ``stride``): the exponential race,
 * each token of probability >= head_floor on its own clock -log(U_v) / p_v, the rest as one
 * group on -log(U_tail) / p_tail whose winner, when it wins, is found by inverse CDF over the
 * group in id order with a second uniform (worker/engine/keyed.py says why). The earliest clock
 * wins; ties go to the lowest id. A clock's log is taken only where its cheap lower bound
 * (1 - U) / p (as -log U >= 1 - U) can still beat the earliest so far. */
void nj_keyed_draw(const float *probs, int64_t n, int64_t vocab, int64_t stride,
                   const int64_t *seeds, const int64_t *positions, double head_floor,
                   int64_t stream_token, int64_t stream_tail, int32_t rounds, int64_t *out) {
    for (int64_t r = 0; r < n; r++) {
        const float *p = probs + r * stride;
        const uint64_t seed = (uint64_t)seeds[r], pos = (uint64_t)positions[r];
        double best = INFINITY, tail = 0.0;
        int64_t token = vocab;
        for (int64_t v = 0; v < vocab; v++) {
            const double pv = (double)p[v];
            if (!(pv >= head_floor)) {
                tail += pv;
                continue;
            }
            const double u = philox_uniform(seed, pos, (uint64_t)v, (uint32_t)stream_token, rounds);
            if ((1.0 - u) / pv > best) continue; /* -log u >= 1 - u: this clock is later */
            const double clock = -log(u) / pv;
            if (clock < best) {
                best = clock;
                token = v;
            }
        }
        if (tail > 0.0) {
            const double u0 = philox_uniform(seed, pos, 0, (uint32_t)stream_tail, rounds);
            if (-log(u0) / tail < best) {
                const double target =
                    philox_uniform(seed, pos, 1, (uint32_t)stream_tail, rounds) * tail;
                double cum = 0.0;
                token = vocab - 1;
                for (int64_t v = 0; v < vocab; v++) {
                    const double pv = (double)p[v];
                    if (pv >= head_floor) continue;
                    cum += pv;
                    if (cum > target) {
                        token = v;
                        break;
                    }
                }
            }
        }
        out[r] = token;
    }
}
