/*
 * dequant.cuh: device-side readers of the weight types (block layouts in
 * src/engine/quant.h), shared by the mat-vec kernels, the dequantize-to-
 * buffer kernel of the GEMM path and the embedding lookup.
 *
 * A row of a weight matrix is cut into "chunks": a few consecutive bytes of
 * one block that one thread turns into VALS floats. The floats come in
 * NG = VALS / 4 groups of 4 consecutive columns (col[g] is the first column
 * of group g, relative to the block's first column), so that activations
 * can be read as float4. Consecutive chunk indices map to consecutive bytes,
 * so the 32 lanes of a warp reading chunks c..c+31 read contiguous memory.
 *
 *   type  values/block  bytes  chunks/block  values/chunk  bytes read per chunk
 *   F32        4          16        1            4          16 (float4)
 *   F16        4           8        1            4           8
 *   BF16       4           8        1            4           8
 *   Q4_0      32          18        4            8           4 qs
 *   Q8_0      32          34        4            8           8 qs
 *   Q4_K     256         144       32            8           4 qs + scales
 *   Q5_K     256         176       32            8           4 qs + 4 qh + scales
 *   Q6_K     256         210       16           16           8 ql + 4 qh + scales
 *
 * (F32/F16/BF16 "blocks" of 4 elements: those weights need n_cols % 4 == 0,
 * checked at upload.) Alignment: device copies of the weights start at
 * 256-byte boundaries; Q4_K/Q5_K blocks are multiples of 16 bytes, so their
 * 32-bit loads are aligned; Q4_0/Q8_0/Q6_K blocks are only 2-byte aligned,
 * so their bytes are read as 16-bit halves (ld_u32_a2).
 *
 * The arithmetic is written with __fmul_rn/__fsub_rn so that nvcc does not
 * fuse it into FMAs: dequantized values are then bit-identical to
 * gpe_dequantize_row (quant.c, built with -ffp-contract=off), which the
 * self-test checks exactly.
 *
 * Internal to src/engine/cuda/.
 */
#ifndef GPE_CUDA_DEQUANT_CUH
#define GPE_CUDA_DEQUANT_CUH

#include "engine/cuda/common.cuh"

extern "C" {
#include "engine/quant.h"
}

/* 4 bytes at a 2-byte aligned address, little endian. */
static __device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t *p)
{
    const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

static __device__ __forceinline__ uint32_t ld_u32_a4(const uint8_t *p)
{
    return *reinterpret_cast<const uint32_t *>(p);
}

static __device__ __forceinline__ uint16_t ld_u16(const uint8_t *p)
{
    return *reinterpret_cast<const uint16_t *>(p);
}

/* byte i (0..3) of a 32-bit word */
static __device__ __forceinline__ uint32_t byte_of(uint32_t w, int i)
{
    return (w >> (8 * i)) & 0xffu;
}

/* ggml's 6-bit scale/min unpacking of the Q4_K/Q5_K scales[12] (sub-block j). */
static __device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, float &sc, float &m)
{
    if (j < 4) {
        sc = (float)(q[j] & 63);
        m = (float)(q[j + 4] & 63);
    } else {
        sc = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

struct tr_f32 {
    static constexpr gpe_type TYPE = GPE_TYPE_F32;
    static constexpr int BLK = 4, BYTES = 16, CPB = 1, VALS = 4;
    static __device__ __forceinline__ void load(const uint8_t *b, int c, float *v, int *col)
    {
        const float4 f = *reinterpret_cast<const float4 *>(b);
        v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
        col[0] = 0;
    }
};

struct tr_f16 {
    static constexpr gpe_type TYPE = GPE_TYPE_F16;
    static constexpr int BLK = 4, BYTES = 8, CPB = 1, VALS = 4;
    static __device__ __forceinline__ void load(const uint8_t *b, int c, float *v, int *col)
    {
        const uint2 u = *reinterpret_cast<const uint2 *>(b);
        v[0] = f16_bits_to_f32((uint16_t)(u.x & 0xffffu));
        v[1] = f16_bits_to_f32((uint16_t)(u.x >> 16));
        v[2] = f16_bits_to_f32((uint16_t)(u.y & 0xffffu));
        v[3] = f16_bits_to_f32((uint16_t)(u.y >> 16));
        col[0] = 0;
    }
};

struct tr_bf16 {
    static constexpr gpe_type TYPE = GPE_TYPE_BF16;
    static constexpr int BLK = 4, BYTES = 8, CPB = 1, VALS = 4;
    static __device__ __forceinline__ void load(const uint8_t *b, int c, float *v, int *col)
    {
        const uint2 u = *reinterpret_cast<const uint2 *>(b);
        v[0] = bf16_bits_to_f32((uint16_t)(u.x & 0xffffu));
        v[1] = bf16_bits_to_f32((uint16_t)(u.x >> 16));
        v[2] = bf16_bits_to_f32((uint16_t)(u.y & 0xffffu));
        v[3] = bf16_bits_to_f32((uint16_t)(u.y >> 16));
        col[0] = 0;
    }
};

/* Q4_0: f16 d; u8 qs[16]; x[j] = d*((qs[j]&15)-8), x[j+16] = d*((qs[j]>>4)-8).
 * Chunk c: qs[4c..4c+3] -> columns 4c.. (low nibbles) and 16+4c.. (high). */
struct tr_q4_0 {
    static constexpr gpe_type TYPE = GPE_TYPE_Q4_0;
    static constexpr int BLK = 32, BYTES = 18, CPB = 4, VALS = 8;
    static __device__ __forceinline__ void load(const uint8_t *b, int c, float *v, int *col)
    {
        const float d = f16_bits_to_f32(ld_u16(b));
        const uint32_t q = ld_u32_a2(b + 2 + 4 * c);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int x = (int)byte_of(q, i);
            v[i] = __fmul_rn((float)((x & 0xF) - 8), d);
            v[4 + i] = __fmul_rn((float)((x >> 4) - 8), d);
        }
        col[0] = 4 * c;
        col[1] = 16 + 4 * c;
    }
};

/* Q8_0: f16 d; i8 qs[32]; x[j] = d*qs[j]. Chunk c: qs[8c..8c+7]. */
struct tr_q8_0 {
    static constexpr gpe_type TYPE = GPE_TYPE_Q8_0;
    static constexpr int BLK = 32, BYTES = 34, CPB = 4, VALS = 8;
    static __device__ __forceinline__ void load(const uint8_t *b, int c, float *v, int *col)
    {
        const float d = f16_bits_to_f32(ld_u16(b));
        const uint32_t q0 = ld_u32_a2(b + 2 + 8 * c), q1 = ld_u32_a2(b + 2 + 8 * c + 4);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[i] = __fmul_rn((float)(int8_t)byte_of(q0, i), d);
            v[4 + i] = __fmul_rn((float)(int8_t)byte_of(q1, i), d);
        }
        col[0] = 8 * c;
        col[1] = 8 * c + 4;
    }
};

/* Q4_K: f16 d, dmin; u8 scales[12]; u8 qs[128]. Per 64 values p (0..3):
 * qs[32p..32p+31], low nibbles = sub-block 2p, high = sub-block 2p+1;
 * x = (d*sc)*q - dmin*m. Chunk c: p = c/8, bytes qs[32p + 4(c%8) ..+3]. */
struct tr_q4_k {
    static constexpr gpe_type TYPE = GPE_TYPE_Q4_K;
    static constexpr int BLK = 256, BYTES = 144, CPB = 32, VALS = 8;
    static __device__ __forceinline__ void load(const uint8_t *b, int c, float *v, int *col)
    {
        const int p = c / 8, w = c % 8;
        const float d = f16_bits_to_f32(ld_u16(b)), dmin = f16_bits_to_f32(ld_u16(b + 2));
        float sc, m;
        scale_min_k4(2 * p, b + 4, sc, m);
        const float d1 = __fmul_rn(d, sc), m1 = __fmul_rn(dmin, m);
        scale_min_k4(2 * p + 1, b + 4, sc, m);
        const float d2 = __fmul_rn(d, sc), m2 = __fmul_rn(dmin, m);
        const uint32_t q = ld_u32_a4(b + 16 + 32 * p + 4 * w);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t x = byte_of(q, i);
            v[i] = __fsub_rn(__fmul_rn(d1, (float)(x & 0xF)), m1);
            v[4 + i] = __fsub_rn(__fmul_rn(d2, (float)(x >> 4)), m2);
        }
        col[0] = 64 * p + 4 * w;
        col[1] = 64 * p + 32 + 4 * w;
    }
};

/* Q5_K: as Q4_K with qh[32] before qs: the fifth bit of value l of the low
 * (high) half of 64-chunk p is bit 2p (2p+1) of qh[l]. */
struct tr_q5_k {
    static constexpr gpe_type TYPE = GPE_TYPE_Q5_K;
    static constexpr int BLK = 256, BYTES = 176, CPB = 32, VALS = 8;
    static __device__ __forceinline__ void load(const uint8_t *b, int c, float *v, int *col)
    {
        const int p = c / 8, w = c % 8;
        const float d = f16_bits_to_f32(ld_u16(b)), dmin = f16_bits_to_f32(ld_u16(b + 2));
        float sc, m;
        scale_min_k4(2 * p, b + 4, sc, m);
        const float d1 = __fmul_rn(d, sc), m1 = __fmul_rn(dmin, m);
        scale_min_k4(2 * p + 1, b + 4, sc, m);
        const float d2 = __fmul_rn(d, sc), m2 = __fmul_rn(dmin, m);
        const uint32_t h = ld_u32_a4(b + 16 + 4 * w);
        const uint32_t q = ld_u32_a4(b + 48 + 32 * p + 4 * w);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t x = byte_of(q, i), hb = byte_of(h, i);
            const uint32_t lo = (x & 0xF) + (((hb >> (2 * p)) & 1u) << 4);
            const uint32_t hi = (x >> 4) + (((hb >> (2 * p + 1)) & 1u) << 4);
            v[i] = __fsub_rn(__fmul_rn(d1, (float)lo), m1);
            v[4 + i] = __fsub_rn(__fmul_rn(d2, (float)hi), m2);
        }
        col[0] = 64 * p + 4 * w;
        col[1] = 64 * p + 32 + 4 * w;
    }
};

/* Q6_K: u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d. Per 128 values n
 * (0..1) and l in 0..31, with a = ql[64n+l], b = ql[64n+32+l], h = qh[32n+l]:
 *   col 128n+l    : (a & 15 | (h    & 3) << 4) - 32, scale (128n+l)/16
 *   col 128n+32+l : (b & 15 | (h>>2 & 3) << 4) - 32
 *   col 128n+64+l : (a >> 4 | (h>>4 & 3) << 4) - 32
 *   col 128n+96+l : (b >> 4 | (h>>6 & 3) << 4) - 32
 * x = (d*scale)*q. Chunk c: n = c/8, l = 4(c%8)..+3 (one scale per column
 * group since 4 | 16). */
struct tr_q6_k {
    static constexpr gpe_type TYPE = GPE_TYPE_Q6_K;
    static constexpr int BLK = 256, BYTES = 210, CPB = 16, VALS = 16;
    static __device__ __forceinline__ void load(const uint8_t *b, int c, float *v, int *col)
    {
        const int n = c / 8, w = c % 8, l0 = 4 * w;
        const float d = f16_bits_to_f32(ld_u16(b + 208));
        const int8_t *scales = reinterpret_cast<const int8_t *>(b + 192);
        const uint32_t qa = ld_u32_a2(b + 64 * n + l0);
        const uint32_t qb = ld_u32_a2(b + 64 * n + 32 + l0);
        const uint32_t qh = ld_u32_a2(b + 128 + 32 * n + l0);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const int cb = 128 * n + 32 * g + l0;   /* first column of the group */
            const float ds = __fmul_rn(d, (float)scales[cb / 16]);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t a = byte_of(qa, i), bb = byte_of(qb, i), h = byte_of(qh, i);
                const uint32_t lowbits = (g & 1) ? bb : a;
                const uint32_t nib = (g < 2) ? (lowbits & 0xF) : (lowbits >> 4);
                const int q = (int)(nib | (((h >> (2 * g)) & 3u) << 4)) - 32;
                v[4 * g + i] = __fmul_rn(ds, (float)q);
            }
            col[g] = cb;
        }
    }
};

/* Calls f(trait{}) for a supported weight type; false otherwise. */
template <typename F> static bool gpe_cuda_dispatch_type(gpe_type t, F &&f)
{
    switch (t) {
    case GPE_TYPE_F32: f(tr_f32{}); return true;
    case GPE_TYPE_F16: f(tr_f16{}); return true;
    case GPE_TYPE_BF16: f(tr_bf16{}); return true;
    case GPE_TYPE_Q4_0: f(tr_q4_0{}); return true;
    case GPE_TYPE_Q8_0: f(tr_q8_0{}); return true;
    case GPE_TYPE_Q4_K: f(tr_q4_k{}); return true;
    case GPE_TYPE_Q5_K: f(tr_q5_k{}); return true;
    case GPE_TYPE_Q6_K: f(tr_q6_k{}); return true;
    default: return false;
    }
}

#endif
