/* A single-core streaming read: the sum of n floats, no stores. benchmarks/floor_bench.py
 * times it over a buffer larger than the caches to measure the read bandwidth one core gets:
 * the memory floor of a decode forward is weight bytes / this rate.
 *
 * The loop is the fastest of the read loops tried on the project's machine (2026-12-04,
 * interleaved rounds): two vector accumulators and a prefetch into L2 of every other line
 * 1 KiB ahead read 18.9-19.9 GB/s where four accumulators without a prefetch read 14.6-15.3,
 * a prefetch of every line 17.8-18.1 and four parallel streams 16.4-16.6. A slower loop would
 * flatter the forward: the floor is the best read. */
#include "simd.h"

float nj_stream_read(const float* p, size_t n) {
    vec a = VZERO(), b = VZERO();
    size_t i = 0;
    for (; i + 2 * VW <= n; i += 2 * VW) {
        _mm_prefetch((const char*)(p + i + 256), _MM_HINT_T1);
        a = VADD(a, VLOAD(p + i));
        b = VADD(b, VLOAD(p + i + VW));
    }
    float s = vsum(VADD(a, b));
    for (; i < n; i++) s += p[i];
    return s;
}
