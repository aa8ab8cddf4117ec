/* The vector layer the CPU kernels share: AVX-512 where the compiler targets it (-march=native on
 * a CPU that has it), else AVX2 + FMA (+ F16C). `vec` holds VW floats; every helper has the same
 * meaning in both widths, so a kernel is written once. Reductions (vsum4, hsum) add lanes by one
 * fixed tree: a kernel that accumulates in a fixed order gets the same bits every call. */
#ifndef NJ_SIMD_H
#define NJ_SIMD_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if !defined(__AVX2__) || !defined(__FMA__)
#error "the CPU kernels need AVX2 and FMA"
#endif

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
/* VW bytes at p, zero- or sign-extended to 32-bit lanes; VW halves or bfloat16s as floats */
static inline ivec u8x(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)); }
static inline ivec i8x(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)); }
static inline vec f16x(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
static inline vec bf16x(const uint8_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
/* the first n floats at p, the other lanes 0 */
static inline vec vload_tail(const float* p, int n) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}
/* the four vectors' lane sums as one 4-float vector (each summed by the same tree) */
static inline __m128 vsum4(vec a, vec b, vec c, vec d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512 s = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VROUND(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VCVTI(x) _mm512_cvtps_epi32(x)
#define IADD(a, b) _mm512_add_epi32(a, b)
#define ICAST(i) _mm512_castsi512_ps(i)
static inline void vstore_n(float* p, vec v, int n) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), v); }
/* the sum of the lanes, by one fixed tree */
static inline float hsum(vec v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline float hmax(vec v) { return _mm512_reduce_max_ps(v); }
static inline vec vselect_lt(vec x, float lim, vec a, vec b) { /* x < lim ? a : b, lane by lane */
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, VSET1(lim), _CMP_LT_OQ), b, a);
}
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
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VROUND(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VCVTI(x) _mm256_cvtps_epi32(x)
#define IADD(a, b) _mm256_add_epi32(a, b)
#define ICAST(i) _mm256_castsi256_ps(i)
static inline void vstore_n(float* p, vec v, int n) {
    float buf[VW];
    _mm256_storeu_ps(buf, v);
    memcpy(p, buf, sizeof(float) * (size_t)n);
}
static inline float hsum(vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline float hmax(vec v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
static inline vec vselect_lt(vec x, float lim, vec a, vec b) {
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, VSET1(lim), _CMP_LT_OQ));
}
#endif


#endif /* NJ_SIMD_H */
