/* The vector type and helpers shared by the CPU kernels (skinny_linear.c, cpu_decode.c,
 * quant_linear.c, cpu_attention.c): AVX-512 where the compiler targets it, else AVX2 + FMA.
 * Every kernel that includes this is compiled with -march=native (nj_kernels/cpu_linear.py,
 * nj_kernels/cbuild.py). The integer helpers (I*, u8x, i8x) and the half / bfloat16 loads are
 * the GGUF block kernel's (gguf_blocks.h).
 *
 * Batch invariance rests on these helpers being deterministic: vsum4 reduces four vectors with
 * one fixed tree (the same for each of the four), so a sum does not depend on which other
 * vectors it was reduced beside, and a zero vector beside it changes nothing.
 */
#ifndef NJ_SIMD_H
#define NJ_SIMD_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#if !defined(__AVX2__) || !defined(__FMA__)
#error "the CPU kernels need AVX2 and FMA"
#endif

#if defined(__AVX512F__)
typedef __m512 vec;
typedef __m512i veci;
#define VW 16
#define VZERO() _mm512_setzero_ps()
#define VSET(a) _mm512_set1_ps(a)
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, a) _mm512_storeu_ps(p, a)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VDIV(a, b) _mm512_div_ps(a, b)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VMIN(a, b) _mm512_min_ps(a, b)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VFNMA(a, b, c) _mm512_fnmadd_ps(a, b, c) /* c - a * b */
#define VFLOOR(a) _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
#define VPOW2I(n) _mm512_castsi512_ps(_mm512_slli_epi32( \
    _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23))
static inline vec vload_tail(const float* p, int n) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}
static inline void vstore_tail(float* p, vec a, int n) {
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), a);
}
static inline float hmax(vec a) { return _mm512_reduce_max_ps(a); }
#define VCVT(i) _mm512_cvtepi32_ps(i) /* int32 lanes as floats */
#define ISET1(s) _mm512_set1_epi32(s)
#define IAND(a, b) _mm512_and_si512(a, b)
#define IOR(a, b) _mm512_or_si512(a, b)
#define ISUB(a, b) _mm512_sub_epi32(a, b)
#define ISRL(a, n) _mm512_srli_epi32(a, n)
#define ISLL(a, n) _mm512_slli_epi32(a, n)
/* VW bytes at p, zero- or sign-extended to int32 lanes; VW halves or bfloat16s as floats */
static inline veci u8x(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)); }
static inline veci i8x(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)); }
static inline vec f16x(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
static inline vec bf16x(const uint8_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
/* The horizontal sums of four vectors at once, as one 4-float vector. */
static inline __m128 vsum4(vec a, vec b, vec c, vec d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512 s = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
#else
typedef __m256 vec;
typedef __m256i veci;
#define VW 8
#define VZERO() _mm256_setzero_ps()
#define VSET(a) _mm256_set1_ps(a)
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, a) _mm256_storeu_ps(p, a)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VDIV(a, b) _mm256_div_ps(a, b)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VMIN(a, b) _mm256_min_ps(a, b)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VFNMA(a, b, c) _mm256_fnmadd_ps(a, b, c)
#define VFLOOR(a) _mm256_floor_ps(a)
#define VPOW2I(n) _mm256_castsi256_ps(_mm256_slli_epi32( \
    _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23))
static inline __m128 vsum4(vec a, vec b, vec c, vec d) {
    __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    __m256 s = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x44), _mm256_shuffle_ps(ab, cd, 0xEE));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}
static inline vec vload_tail(const float* p, int n) {
    float buf[VW] = {0};
    for (int i = 0; i < n; i++) buf[i] = p[i];
    return _mm256_loadu_ps(buf);
}
static inline void vstore_tail(float* p, vec a, int n) {
    float buf[VW];
    _mm256_storeu_ps(buf, a);
    for (int i = 0; i < n; i++) p[i] = buf[i];
}
static inline float hmax(vec a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
#define VCVT(i) _mm256_cvtepi32_ps(i)
#define ISET1(s) _mm256_set1_epi32(s)
#define IAND(a, b) _mm256_and_si256(a, b)
#define IOR(a, b) _mm256_or_si256(a, b)
#define ISUB(a, b) _mm256_sub_epi32(a, b)
#define ISRL(a, n) _mm256_srli_epi32(a, n)
#define ISLL(a, n) _mm256_slli_epi32(a, n)
static inline veci u8x(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
static inline veci i8x(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
static inline vec f16x(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
static inline vec bf16x(const uint8_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
#endif

/* The sum of one vector's lanes (the same tree as vsum4's first output). */
static inline float vsum(vec a) {
    vec z = VZERO();
    return _mm_cvtss_f32(vsum4(a, z, z, z));
}

/* exp(x) lane-wise: Cephes' expf (range reduction by ln 2 in two parts, a degree-6
 * polynomial; within 2 ulp of the true value). Inputs are clamped to [-87, 88]: exp(-87) is
 * 1.6e-38, not 0, which no sum of a softmax or a SiLU can tell apart. */
static inline vec vexp(vec x) {
    x = VMIN(VMAX(x, VSET(-87.0f)), VSET(88.0f));
    vec n = VFLOOR(VFMA(x, VSET(1.44269504088896341f), VSET(0.5f)));
    x = VFNMA(n, VSET(0.693359375f), x);
    x = VFNMA(n, VSET(-2.12194440e-4f), x);
    vec y = VSET(1.9875691500e-4f);
    y = VFMA(y, x, VSET(1.3981999507e-3f));
    y = VFMA(y, x, VSET(8.3334519073e-3f));
    y = VFMA(y, x, VSET(4.1665795894e-2f));
    y = VFMA(y, x, VSET(1.6666665459e-1f));
    y = VFMA(y, x, VSET(5.0000001201e-1f));
    y = VFMA(y, VMUL(x, x), VADD(x, VSET(1.0f)));
    return VMUL(y, VPOW2I(n));
}

#endif
