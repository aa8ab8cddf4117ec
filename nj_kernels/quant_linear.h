/* The GGUF block product of quant_linear.c as other kernels call it: the fused decode path
 * (cpu_decode.c) multiplies a layer's GGUF matrices through this very function, by its address
 * in the block kernel's library (quant_linear.py), so the fused and the op-by-op paths run the
 * same machine code for every product (quant_linear.c is compiled with -ffp-contract=off, the
 * fused library is not: sharing the compiled function, not the source, keeps its contract).
 *
 * Contract (quant_linear.c): y[M,N] = x[M,K] @ dequant(w)^T (+ bias[N]); w is N rows of
 * row_bytes bytes of GGML type `type`; a row's result depends only on that row (never on M,
 * its place in x, or `threads`). Returns 0, -1 for a type it does not read, -2 out of memory. */
#ifndef NJ_QUANT_LINEAR_H
#define NJ_QUANT_LINEAR_H

#include <stddef.h>
#include <stdint.h>

typedef int nj_quant_linear_t(int type, const uint8_t* w, size_t row_bytes, const float* x, const float* bias,
                              float* y, int M, int N, int K, int threads);

nj_quant_linear_t quant_linear;

#endif /* NJ_QUANT_LINEAR_H */
