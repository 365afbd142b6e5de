// Shared by every Forma kernel source (prepended by `kernels.rs` before NVRTC
// compiles a module). No CUDA headers are included, so NVRTC compiles these
// sources with nothing but libnvrtc: the half types are 16-bit structs
// converted with PTX `cvt` (f16) and bit arithmetic (bf16).

typedef long long i64;
typedef unsigned long long u64;

struct half_t { unsigned short b; };
struct bhalf_t { unsigned short b; };

// The accumulation type: f32 for f32/f16/bf16, f64 for f64 (Float::Acc).
template <typename T> struct AccOf { typedef float type; };
template <> struct AccOf<double> { typedef double type; };

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(half_t x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.b));
    return f;
}
__device__ __forceinline__ float to_acc(bhalf_t x) {
    return __uint_as_float(((unsigned int)x.b) << 16);
}

template <typename T> __device__ __forceinline__ T from_acc(typename AccOf<T>::type v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_acc<double>(double v) { return v; }
template <> __device__ __forceinline__ half_t from_acc<half_t>(float v) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.b) : "f"(v));
    return h;
}
// Round to nearest even; NaN keeps its sign and becomes quiet (as `half::bf16::from_f32`).
template <> __device__ __forceinline__ bhalf_t from_acc<bhalf_t>(float v) {
    unsigned int u = __float_as_uint(v);
    bhalf_t r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.b = (unsigned short)((u >> 16) | 0x40u);
        return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    r.b = (unsigned short)(u >> 16);
    return r;
}

// Math in the accumulation type: explicit float/double overloads, so a
// float never silently computes in double.
#define FORMA_M1(name, ff, df)                                                 \
    __device__ __forceinline__ float name(float x) { return ff(x); }          \
    __device__ __forceinline__ double name(double x) { return df(x); }
FORMA_M1(m_exp, expf, exp)
FORMA_M1(m_log, logf, log)
FORMA_M1(m_log1p, log1pf, log1p)
FORMA_M1(m_sqrt, sqrtf, sqrt)
FORMA_M1(m_sin, sinf, sin)
FORMA_M1(m_cos, cosf, cos)
FORMA_M1(m_tanh, tanhf, tanh)
FORMA_M1(m_erf, erff, erf)
FORMA_M1(m_abs, fabsf, fabs)
__device__ __forceinline__ float m_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double m_pow(double a, double b) { return pow(a, b); }
__device__ __forceinline__ bool m_isnan(float x) { return x != x; }
__device__ __forceinline__ bool m_isnan(double x) { return x != x; }
template <typename A> __device__ __forceinline__ A m_nan();
template <> __device__ __forceinline__ float m_nan<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double m_nan<double>() { return __longlong_as_double(0x7ff8000000000000ll); }
template <typename A> __device__ __forceinline__ A m_inf();
template <> __device__ __forceinline__ float m_inf<float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double m_inf<double>() { return __longlong_as_double(0x7ff0000000000000ll); }

// A strided view, as `forma_core::Layout` (mirrored by `Lay` in kernels.rs).
#define FORMA_MAX_RANK 8
struct Lay {
    i64 offset;
    i64 dims[FORMA_MAX_RANK];
    i64 strides[FORMA_MAX_RANK];
    int rank;
    int contig;
};

// Storage offset of the element at row-major position `i` of the view.
__device__ __forceinline__ i64 loc(const Lay& l, i64 i) {
    if (l.contig) return l.offset + i;
    i64 o = l.offset;
    for (int d = l.rank - 1; d >= 0; --d) {
        i64 n = l.dims[d];
        o += (i % n) * l.strides[d];
        i /= n;
    }
    return o;
}

#define FORMA_LOOP(i, n)                                                       \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);          \
         i += (i64)blockDim.x * gridDim.x)
