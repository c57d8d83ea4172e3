/* One pass of AdamW over a block's flat fp32 state that reads the grads as they land (bf16, or
 * fp32 sums when accumulating) and can write the updated weights as bf16 for the next upload.
 *
 * torch's fused CPU AdamW needs fp32 grads and leaves the cast to a second pass: with the
 * upcast before and the cast after, a step moves 40 bytes per parameter through host memory.
 * This pass moves 28 (read g 2, p m v 12; write p m v 12, bf16 w 2), and host memory
 * bandwidth is what bounds an offloaded step at small batches. The arithmetic is torch's
 * (ATen FusedAdamKernel, ADAMW mode), so results agree to float rounding.
 *
 * Work is split into chunks of `chunk` elements that threads take as they come free
 * (chunk <= 0: one even slice per thread, OpenMP's static split). With a static split one thread
 * that the OS pre-empts (the executor's lane threads share the cores) holds up the whole call;
 * with chunks the others take over its share. num_threads <= 0: OpenMP's default.
 */
#define _GNU_SOURCE /* syscall(SYS_gettid) */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Niceness of the kernels' OpenMP workers (the calling thread keeps its own). A call keeps every
 * core busy for tens of ms, while the executor's lane threads wake for microseconds at a time (to
 * launch kernels, to hand the GIL on) and would otherwise queue behind a worker for a core. Each
 * worker takes the setting at its next chunk. Linux only (elsewhere nothing changes); raising it
 * needs no privilege, lowering it again does (RLIMIT_NICE). */
static volatile int worker_nice = 0;
static __thread int nice_taken = 0;

static inline void take_worker_nice(void) {
#ifdef __linux__
    if (nice_taken != worker_nice && omp_get_thread_num() != 0) {
        nice_taken = worker_nice;
        setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice_taken);
    }
#endif
}

void set_worker_nice(int64_t nice) { worker_nice = (int)nice; }
int64_t worker_nice_now(void) { return worker_nice; }

static inline uint16_t f32_to_bf16(float f) {  /* round to nearest even, NaN stays NaN */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (bits >> 16) | 0x40u;
    return (uint16_t)(((bits & 0x7fffffffu) > 0x7f800000u) ? quiet_nan : rounded);
}

/* Elements [0, decay_end) get weight decay wd, the rest none (norms and biases). The weights
 * test is outside the SIMD loop: inside it, a NULL weights_out costs masked stores. */
#define ADAMW_LOOP(GRAD_EXPR, STORE_WEIGHTS)                                                   \
    _Pragma("omp simd")                                                                        \
    for (int64_t i = c * size; i < end; ++i) {                                                 \
        float g = (GRAD_EXPR) * grad_scale;                                                    \
        float p = param[i];                                                                    \
        p = p * (i < decay_end ? 1.0f - lr * wd : 1.0f);                                       \
        float m = exp_avg[i] + one_minus_b1 * (g - exp_avg[i]);                                \
        float v = beta2 * exp_avg_sq[i] + one_minus_b2 * g * g;                                \
        float denom = sqrtf(v) / bias_correction2_sqrt + eps;                                  \
        p = p - step_size * m / denom;                                                         \
        param[i] = p;                                                                          \
        exp_avg[i] = m;                                                                        \
        exp_avg_sq[i] = v;                                                                     \
        STORE_WEIGHTS;                                                                         \
    }

#define ADAMW_BODY(GRAD_EXPR)                                                                  \
    const float one_minus_b1 = 1.0f - beta1, one_minus_b2 = 1.0f - beta2;                    \
    const float step_size = lr / bias_correction1;                                             \
    const int threads = num_threads > 0 ? (int)num_threads : omp_get_max_threads();           \
    const int64_t size = chunk_size(n, chunk, threads);                                        \
    const int64_t chunks = (n + size - 1) / size;                                              \
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(threads)")                      \
    for (int64_t c = 0; c < chunks; ++c) {                                                     \
        take_worker_nice();                                                                    \
        const int64_t end = c * size + size < n ? c * size + size : n;                        \
        if (weights_out) {                                                                     \
            ADAMW_LOOP(GRAD_EXPR, weights_out[i] = f32_to_bf16(p))                             \
        } else {                                                                               \
            ADAMW_LOOP(GRAD_EXPR, (void)0)                                                     \
        }                                                                                      \
    }

/* Elements per chunk: `chunk`, but no more than an even slice per thread (a small block still
 * reaches every thread), or the even slice; never 0. */
static inline int64_t chunk_size(int64_t n, int64_t chunk, int threads) {
    int64_t even = (n + threads - 1) / threads;
    int64_t size = chunk > 0 && chunk < even ? chunk : even;
    return size > 0 ? size : 1;
}

void adamw_step_bf16_grads(float *param, float *exp_avg, float *exp_avg_sq,
                           const uint16_t *grad, uint16_t *weights_out, int64_t n,
                           int64_t decay_end, float lr, float beta1, float beta2, float eps,
                           float wd, float grad_scale, float bias_correction1,
                           float bias_correction2_sqrt, int64_t num_threads, int64_t chunk) {
    ADAMW_BODY(bf16_to_f32(grad[i]))
}

void adamw_step_f32_grads(float *param, float *exp_avg, float *exp_avg_sq, const float *grad,
                          uint16_t *weights_out, int64_t n, int64_t decay_end, float lr,
                          float beta1, float beta2, float eps, float wd, float grad_scale,
                          float bias_correction1, float bias_correction2_sqrt,
                          int64_t num_threads, int64_t chunk) {
    ADAMW_BODY(grad[i])
}

/* How a call over n elements is cut: elements per chunk (for callers and tests). */
int64_t split_chunk_elements(int64_t n, int64_t chunk, int64_t num_threads) {
    return chunk_size(n, chunk, num_threads > 0 ? (int)num_threads : omp_get_max_threads());
}

/* fp32 -> bf16 copy with the same rounding as torch's (round to nearest even). */
void cast_f32_to_bf16(const float *src, uint16_t *dst, int64_t n, int64_t num_threads,
                      int64_t chunk) {
    const int threads = num_threads > 0 ? (int)num_threads : omp_get_max_threads();
    const int64_t size = chunk_size(n, chunk, threads);
    const int64_t chunks = (n + size - 1) / size;
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(threads)")
    for (int64_t c = 0; c < chunks; ++c) {
        take_worker_nice();
        const int64_t end = c * size + size < n ? c * size + size : n;
        _Pragma("omp simd")
        for (int64_t i = c * size; i < end; ++i) dst[i] = f32_to_bf16(src[i]);
    }
}

/* A micro-batch's bf16 grads into the fp32 sum: sum = grads (first) or sum += grads, exactly as
 * torch's copy_ / add_ (a bf16 widens to fp32 without rounding; one fp32 add). torch's
 * mixed-dtype add_ ran ~5x below this on the H200 host (validation_2026-12-03a). */
void accumulate_bf16_grads(float *sum, const uint16_t *grads, int64_t n, int64_t first,
                           int64_t num_threads, int64_t chunk) {
    const int threads = num_threads > 0 ? (int)num_threads : omp_get_max_threads();
    const int64_t size = chunk_size(n, chunk, threads);
    const int64_t chunks = (n + size - 1) / size;
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(threads)")
    for (int64_t c = 0; c < chunks; ++c) {
        take_worker_nice();
        const int64_t end = c * size + size < n ? c * size + size : n;
        if (first) {
            _Pragma("omp simd")
            for (int64_t i = c * size; i < end; ++i) sum[i] = bf16_to_f32(grads[i]);
        } else {
            _Pragma("omp simd")
            for (int64_t i = c * size; i < end; ++i) sum[i] += bf16_to_f32(grads[i]);
        }
    }
}

/* ---- Compact moments: the same AdamW with m and v kept in bf16 or 8-bit codes ------------------
 *
 * Host traffic per parameter falls from 28 B to 20 B (bf16: m and v read and written as 2 B each)
 * and to about 16 B (8-bit: 1 B each, plus a fp32 scale per MOMENT_BLOCK elements).
 *
 * bf16 moments are rounded stochastically, with the noise a hash of (seed, element index): with
 * round-to-nearest a v whose step changes it by less than half a bf16 ulp (0.2%) never moves,
 * so with beta2 = 0.999 it could never decrease. The hash makes the rounding deterministic:
 * the same call gives the same bits whatever the threads or the order.
 *
 * 8-bit moments are stored blockwise as 8-bit Adam does: per MOMENT_BLOCK elements a scale (the
 * block's largest |m|, largest v) and a code per element into a dynamic map (signed for m,
 * unsigned for v: decades with more linear steps in the upper ones). Codes are the nearest map
 * entry, found through a bucket table indexed by the top bits of the value (each bucket holds at
 * most one midpoint between entries), and a positive v never rounds to 0 (its update would be
 * m / eps). A block holding a non-finite moment gets a NaN scale, so NaN spreads as in fp32.
 */
#define MOMENT_BLOCK 2048
/* The bucket tables cover [2^-27, 1.0] (below: the first bucket, which both maps code as 0),
 * 2^7 buckets an octave: 14 KB each, so their gathers hit L1. */
#define BUCKET_SHIFT 16
#define BUCKET_FLOOR_BITS 0x32000000 /* 2^-27 */
#define BUCKETS ((0x3f800000u >> BUCKET_SHIFT) - (BUCKET_FLOOR_BITS >> BUCKET_SHIFT) + 1u)

typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_scale, bias_correction1,
        bias_correction2_sqrt;
    int64_t decay_end, num_threads, chunk;
} adamw_args;

typedef struct {             /* the maps of 8-bit moments and their lookup tables */
    const float *m_values;   /* 256: signed code -> value in [-1, 1] */
    const float *v_values;   /* 256: unsigned code -> value in [0, 1] */
    const float *m_mids;     /* 128: midpoints between magnitude codes k and k + 1 (last inf) */
    const float *v_mids;     /* 256: likewise for v */
    const int32_t *m_bucket; /* BUCKETS: magnitude code at the bucket's start (32-bit: SIMD gathers) */
    const int32_t *v_bucket;
} moment_maps;

static inline uint32_t hash32(uint32_t x) { /* a 32-bit integer mixer (lowbias32) */
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static inline uint16_t f32_to_bf16_stochastic(float f, uint32_t noise) { /* noise: 16 bits */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint32_t rounded = (bits + (noise & 0xffffu)) >> 16;
    uint32_t quiet_nan = (bits >> 16) | 0x40u;
    return (uint16_t)(((bits & 0x7fffffffu) > 0x7f800000u) ? quiet_nan : rounded);
}

static inline int64_t block_chunk(int64_t n, int64_t chunk, int threads) {
    int64_t size = chunk_size(n, chunk, threads);
    return (size + MOMENT_BLOCK - 1) / MOMENT_BLOCK * MOMENT_BLOCK;
}

#define ADAMW_PREAMBLE                                                                         \
    const float b1 = a->beta1, b2 = a->beta2, one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2; \
    const float step_size = a->lr / a->bias_correction1, bc2 = a->bias_correction2_sqrt;       \
    const float eps = a->eps, gs = a->grad_scale, decay = 1.0f - a->lr * a->weight_decay;      \
    const int64_t decay_end = a->decay_end;                                                    \
    const int threads = a->num_threads > 0 ? (int)a->num_threads : omp_get_max_threads();

/* bf16 m and v; index_base: the index of element 0 in its block (the noise's counter). The loop
 * runs on 32-bit offsets from the chunk's start: 64-bit ones double the SIMD work of the index
 * arithmetic (the compare with decay_end, the noise's counter). */
#define BF16_MOMENTS_LOOP(GRAD_EXPR, STORE_WEIGHTS)                                            \
    _Pragma("omp simd")                                                                        \
    for (int32_t j = 0; j < len; ++j) {                                                        \
        const int64_t i = lo + j;                                                              \
        float g = (GRAD_EXPR) * gs;                                                            \
        float p = param[i] * (j < decayed ? decay : 1.0f);                                     \
        float m0 = bf16_to_f32(exp_avg[i]);                                                    \
        float m = m0 + one_minus_b1 * (g - m0);                                                \
        float v = b2 * bf16_to_f32(exp_avg_sq[i]) + one_minus_b2 * g * g;                      \
        p = p - step_size * m / (sqrtf(v) / bc2 + eps);                                        \
        uint32_t noise = hash32(seed ^ (counter + (uint32_t)j));                               \
        param[i] = p;                                                                          \
        exp_avg[i] = f32_to_bf16_stochastic(m, noise);                                         \
        exp_avg_sq[i] = f32_to_bf16_stochastic(v, noise >> 16);                                \
        STORE_WEIGHTS;                                                                         \
    }

#define ADAMW_BF16_MOMENTS(GRAD_EXPR)                                                          \
    ADAMW_PREAMBLE                                                                             \
    const int64_t size = chunk_size(n, a->chunk, threads) < (1 << 30)                         \
                             ? chunk_size(n, a->chunk, threads) : (1 << 30);                   \
    const int64_t chunks = (n + size - 1) / size;                                              \
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(threads)")                      \
    for (int64_t c = 0; c < chunks; ++c) {                                                     \
        take_worker_nice();                                                                    \
        const int64_t lo = c * size, end = lo + size < n ? lo + size : n;                     \
        const int32_t len = (int32_t)(end - lo);                                               \
        const int32_t decayed = (int32_t)(decay_end <= lo ? 0 : decay_end - lo < len          \
                                                                 ? decay_end - lo : len);     \
        const uint32_t counter = (uint32_t)(index_base + lo);                                  \
        if (weights_out) {                                                                     \
            BF16_MOMENTS_LOOP(GRAD_EXPR, weights_out[i] = f32_to_bf16(p))                      \
        } else {                                                                               \
            BF16_MOMENTS_LOOP(GRAD_EXPR, (void)0)                                              \
        }                                                                                      \
    }

void adamw_step_bf16_moments_bf16_grads(float *param, uint16_t *exp_avg, uint16_t *exp_avg_sq,
                                        const uint16_t *grad, uint16_t *weights_out, int64_t n,
                                        const adamw_args *a, uint32_t seed, int64_t index_base) {
    ADAMW_BF16_MOMENTS(bf16_to_f32(grad[i]))
}

void adamw_step_bf16_moments_f32_grads(float *param, uint16_t *exp_avg, uint16_t *exp_avg_sq,
                                       const float *grad, uint16_t *weights_out, int64_t n,
                                       const adamw_args *a, uint32_t seed, int64_t index_base) {
    ADAMW_BF16_MOMENTS(grad[i])
}

/* A block's fp32 values, readable as their bits. */
typedef union {
    float value[MOMENT_BLOCK];
    uint32_t bits[MOMENT_BLOCK];
} moment_block;

/* The bits of the largest |x| of a block: for non-negative floats the order of their bits is
 * theirs, and an inf or NaN is above every finite value (integer max reductions vectorise). */
static inline uint32_t largest_magnitude_bits(const moment_block *x, int32_t len) {
    uint32_t top = 0;
#pragma omp simd reduction(max : top)
    for (int32_t j = 0; j < len; ++j) {
        const uint32_t magnitude = x->bits[j] & 0x7fffffffu;
        top = magnitude > top ? magnitude : top;
    }
    return top;
}

static inline float bits_to_f32(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Codes of one block's new m and v (len elements) against its new largest |m| and v: the
 * values scaled into [0, 1] (a NaN to 1: its scale is NaN), then read back as bits to index
 * the bucket tables (gcc vectorises the gathers only so). */
static inline void int8_requantise(uint8_t *restrict exp_avg, uint8_t *restrict exp_avg_sq,
                                   const float *restrict m_new, const float *restrict v_new,
                                   float m_max, float v_max, int32_t len,
                                   const moment_maps *maps) {
    const float m_inv = m_max > 0.0f ? 1.0f / m_max : 0.0f;
    const float v_inv = v_max > 0.0f ? 1.0f / v_max : 0.0f;
    union { float value[MOMENT_BLOCK]; int32_t bits[MOMENT_BLOCK]; } m_unit, v_unit;
#pragma omp simd
    for (int32_t j = 0; j < len; ++j) {
        const float m = fabsf(m_new[j]) * m_inv, v = fabsf(v_new[j]) * v_inv;
        m_unit.value[j] = m < 1.0f ? m : 1.0f;
        v_unit.value[j] = v < 1.0f ? v : 1.0f;
    }
    const int32_t *restrict m_bucket = maps->m_bucket, *restrict v_bucket = maps->v_bucket;
    const float *restrict m_mids = maps->m_mids, *restrict v_mids = maps->v_mids;
#pragma omp simd
    for (int32_t j = 0; j < len; ++j) { /* -0.0 codes as +0, the same value */
        const int32_t mb = m_unit.bits[j] > BUCKET_FLOOR_BITS ? m_unit.bits[j] : BUCKET_FLOOR_BITS;
        const int32_t vb = v_unit.bits[j] > BUCKET_FLOOR_BITS ? v_unit.bits[j] : BUCKET_FLOOR_BITS;
        const int32_t mc = m_bucket[(mb - BUCKET_FLOOR_BITS) >> BUCKET_SHIFT];
        const int32_t vc = v_bucket[(vb - BUCKET_FLOOR_BITS) >> BUCKET_SHIFT];
        const int32_t m_code = mc + (m_unit.value[j] > m_mids[mc]);
        const int32_t v_code = vc + (v_unit.value[j] > v_mids[vc]);
        exp_avg[j] = (uint8_t)(m_code | (m_new[j] < 0.0f ? 0x80 : 0));
        exp_avg_sq[j] = (uint8_t)(v_code + ((v_code == 0) & (v_new[j] > 0.0f)));
    }
}

/* One block's dequantise-and-step pass (len elements from `start`), keeping the new m and v in
 * fp32 for the requantisation. No reductions here: gcc leaves a loop with float max reductions
 * scalar (3x slower); largest_magnitude_bits finds the scales after it. */
#define INT8_STEP_LOOP(GRAD_EXPR, STORE_WEIGHTS)                                               \
    _Pragma("omp simd")                                                                        \
    for (int32_t j = 0; j < len; ++j) { /* 32-bit: cheaper SIMD compares */                 \
        const int64_t i = start + j;                                                           \
        float g = (GRAD_EXPR) * gs;                                                            \
        float p = param[i] * (j < decayed ? decay : 1.0f);                                     \
        float m0 = m_values[exp_avg[i]] * ms;                                                  \
        float m = m0 + one_minus_b1 * (g - m0);                                                \
        float v = b2 * (v_values[exp_avg_sq[i]] * vs) + one_minus_b2 * g * g;                  \
        p = p - step_size * m / (sqrtf(v) / bc2 + eps);                                        \
        param[i] = p;                                                                          \
        STORE_WEIGHTS;                                                                         \
        m_new.value[j] = m;                                                                    \
        v_new.value[j] = v;                                                                    \
    }

/* 8-bit m and v over n elements from a MOMENT_BLOCK boundary: scales hold one per block.
 * GRAD_EXPR is fixed per function: a pointer chosen at run time inside the SIMD loop costs
 * masked loads, and those through NULL take a slow path on AMD cores. */
#define ADAMW_INT8_MOMENTS(GRAD_EXPR)                                                          \
    ADAMW_PREAMBLE                                                                             \
    const float *restrict m_values = maps->m_values, *restrict v_values = maps->v_values;      \
    const int64_t size = block_chunk(n, a->chunk, threads);                                    \
    const int64_t chunks = (n + size - 1) / size;                                              \
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(threads)")                      \
    for (int64_t c = 0; c < chunks; ++c) {                                                     \
        take_worker_nice();                                                                    \
        const int64_t chunk_end = c * size + size < n ? c * size + size : n;                  \
        moment_block m_new, v_new;                                                             \
        for (int64_t start = c * size; start < chunk_end; start += MOMENT_BLOCK) {             \
            const int32_t len = (int32_t)(chunk_end - start < MOMENT_BLOCK ? chunk_end - start \
                                                                           : MOMENT_BLOCK);   \
            const int64_t q = start / MOMENT_BLOCK;                                            \
            const float ms = m_scales[q], vs = v_scales[q];                                    \
            const int32_t decayed = (int32_t)(decay_end <= start ? 0                           \
                                              : decay_end - start < len ? decay_end - start   \
                                                                        : len);               \
            if (weights_out) {                                                                 \
                INT8_STEP_LOOP(GRAD_EXPR, weights_out[i] = f32_to_bf16(p))                     \
            } else {                                                                           \
                INT8_STEP_LOOP(GRAD_EXPR, (void)0)                                             \
            }                                                                                  \
            const uint32_t m_bits = largest_magnitude_bits(&m_new, len);                       \
            const uint32_t v_bits = largest_magnitude_bits(&v_new, len);                       \
            const int finite = m_bits < 0x7f800000u && v_bits < 0x7f800000u;                  \
            const float m_max = bits_to_f32(m_bits), v_max = bits_to_f32(v_bits);              \
            m_scales[q] = finite ? m_max : NAN;                                                \
            v_scales[q] = finite ? v_max : NAN;                                                \
            int8_requantise(exp_avg + start, exp_avg_sq + start, m_new.value, v_new.value,     \
                            m_max, v_max, len, maps);                                          \
        }                                                                                      \
    }

void adamw_step_int8_moments_bf16_grads(float *param, uint8_t *exp_avg, uint8_t *exp_avg_sq,
                                        float *m_scales, float *v_scales, const uint16_t *grad,
                                        uint16_t *weights_out, int64_t n, const adamw_args *a,
                                        const moment_maps *maps) {
    ADAMW_INT8_MOMENTS(bf16_to_f32(grad[i]))
}

void adamw_step_int8_moments_f32_grads(float *param, uint8_t *exp_avg, uint8_t *exp_avg_sq,
                                       float *m_scales, float *v_scales, const float *grad,
                                       uint16_t *weights_out, int64_t n, const adamw_args *a,
                                       const moment_maps *maps) {
    ADAMW_INT8_MOMENTS(grad[i])
}

int64_t moment_block_elements(void) { return MOMENT_BLOCK; }
int64_t moment_bucket_count(void) { return BUCKETS; }
int64_t moment_bucket_shift(void) { return BUCKET_SHIFT; }
int64_t moment_bucket_floor_bits(void) { return BUCKET_FLOOR_BITS; }
