/*
 * synth_quant: the weight quantizers of llama.cpp's llama-quantize (ggml's
 * reference, "_ref", row quantizers, used when no importance matrix is
 * given), reimplemented so that quantized test models can be regenerated
 * byte for byte: Q4_0, Q8_0 (blocks of 32) and Q4_K, Q5_K, Q6_K (super-blocks
 * of 256). The algorithms and block layouts are ggml's (MIT, the ggml
 * authors), described in synth_quant.c; the float operations are evaluated
 * in the same order and without fused multiply-add (compile with
 * -ffp-contract=off), as llama-quantize's build evaluated them: every block
 * of the tiny-random files compares equal.
 */
#ifndef GPUPOOL_TESTS_SYNTH_SYNTH_QUANT_H
#define GPUPOOL_TESTS_SYNTH_SYNTH_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ggml type numbers. */
typedef enum synth_qtype {
    SYNTH_Q4_0 = 2,
    SYNTH_Q8_0 = 8,
    SYNTH_Q4_K = 12,
    SYNTH_Q5_K = 13,
    SYNTH_Q6_K = 14,
} synth_qtype;

/* "q4_0", "q8_0", "q4_k", "q5_k", "q6_k" -> type; false when unknown. */
bool synth_qtype_parse(const char *name, synth_qtype *out);
/* Elements per block and bytes per block. */
int synth_qtype_block(synth_qtype t);
size_t synth_qtype_block_bytes(synth_qtype t);
/* Quantize n values (n a multiple of the block) into out
 * (n / block * block_bytes bytes). */
void synth_quantize(synth_qtype t, const float *x, int64_t n, uint8_t *out);

#endif
