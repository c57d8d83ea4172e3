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
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {  /* round to nearest even, NaN stays NaN */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (bits >> 16) | 0x40u;
    return (uint16_t)(((bits & 0x7fffffffu) > 0x7f800000u) ? quiet_nan : rounded);
}

/* Elements [0, decay_end) get weight decay wd, the rest none (norms and biases). */
#define ADAMW_BODY(GRAD_EXPR)                                                                  \
    const float one_minus_b1 = 1.0f - beta1, one_minus_b2 = 1.0f - beta2;                    \
    const float step_size = lr / bias_correction1;                                             \
    const int threads = num_threads > 0 ? (int)num_threads : omp_get_max_threads();           \
    const int64_t size = chunk_size(n, chunk, threads);                                        \
    const int64_t chunks = (n + size - 1) / size;                                              \
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(threads)")                      \
    for (int64_t c = 0; c < chunks; ++c) {                                                     \
        const int64_t end = c * size + size < n ? c * size + size : n;                        \
        _Pragma("omp simd")                                                                    \
        for (int64_t i = c * size; i < end; ++i) {                                             \
            float g = (GRAD_EXPR) * grad_scale;                                                \
            float p = param[i];                                                                \
            p = p * (i < decay_end ? 1.0f - lr * wd : 1.0f);                                   \
            float m = exp_avg[i] + one_minus_b1 * (g - exp_avg[i]);                            \
            float v = beta2 * exp_avg_sq[i] + one_minus_b2 * g * g;                            \
            float denom = sqrtf(v) / bias_correction2_sqrt + eps;                              \
            p = p - step_size * m / denom;                                                     \
            param[i] = p;                                                                      \
            exp_avg[i] = m;                                                                    \
            exp_avg_sq[i] = v;                                                                 \
            if (weights_out) weights_out[i] = f32_to_bf16(p);                                  \
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
        const int64_t end = c * size + size < n ? c * size + size : n;
        _Pragma("omp simd")
        for (int64_t i = c * size; i < end; ++i) dst[i] = f32_to_bf16(src[i]);
    }
}
