/* A single-core streaming read: the sum of n floats, four vector accumulators, no stores.
 * benchmarks/floor_bench.py times it over a buffer larger than the caches to measure the read
 * bandwidth one core gets (the memory floor of a decode forward: weight bytes / this rate). */
#include "simd.h"

float nj_stream_read(const float* p, size_t n) {
    vec a0 = VZERO(), a1 = VZERO(), a2 = VZERO(), a3 = VZERO();
    size_t i = 0;
    for (; i + 4 * VW <= n; i += 4 * VW) {
        a0 = VADD(a0, VLOAD(p + i));
        a1 = VADD(a1, VLOAD(p + i + VW));
        a2 = VADD(a2, VLOAD(p + i + 2 * VW));
        a3 = VADD(a3, VLOAD(p + i + 3 * VW));
    }
    float s = vsum(VADD(VADD(a0, a1), VADD(a2, a3)));
    for (; i < n; i++) s += p[i];
    return s;
}
