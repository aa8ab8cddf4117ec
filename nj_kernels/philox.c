/* Philox-4x32 uniforms for keyed sampling: nj_kernels/philox.py (``uniforms_torch``) is the
 * reference, and this computes exactly its numbers (integer arithmetic, then one exact
 * conversion), one element at a time instead of ~250 torch ops over all of them.
 *
 * Element e is token ids[e] of row r = rows[e]: counter (id >> 2, position low, position
 * high, stream), key (seed low, seed high), ``rounds`` rounds; the uniform is word id & 3 of
 * the output, (w + 0.5) / 2^32. */
#include <stdint.h>

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

void nj_philox_uniforms(const int64_t *seeds, const int64_t *positions, const int64_t *rows,
                        const int64_t *ids, int64_t n, int64_t stream, int32_t rounds,
                        double *out) {
    for (int64_t e = 0; e < n; e++) {
        const int64_t r = rows[e];
        const uint64_t seed = (uint64_t)seeds[r], pos = (uint64_t)positions[r];
        const uint64_t id = (uint64_t)ids[e];
        uint32_t c0 = (uint32_t)(id >> 2), c1 = (uint32_t)pos, c2 = (uint32_t)(pos >> 32);
        uint32_t c3 = (uint32_t)stream;
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
        out[e] = ((double)w[id & 3] + 0.5) * (1.0 / 4294967296.0);
    }
}
