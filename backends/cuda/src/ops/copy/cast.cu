// `tensor.to(dtype)` for one (SRC, DST) pair, with `forma_core::Dtype::cast`'s
// rules: integers (and bool) go through i64, floats through f64, each with a
// single rounding; float to integer truncates toward zero and saturates, NaN
// becomes 0 (Rust's `as`); non-zero (NaN included) is `true`.

// f64 to f32 rounding to odd: a later round to f16/bf16 is then correctly
// rounded from the f64 value (f32 keeps more than two extra bits).
__device__ __forceinline__ float d2f_odd(double d) {
    float f = __double2float_rz(d);
    if ((double)f != d && d == d) f = __uint_as_float(__float_as_uint(f) | 1u);
    return f;
}

template <typename D> __device__ __forceinline__ D from_int(i64 v);
template <> __device__ __forceinline__ float from_int<float>(i64 v) { return (float)v; }
template <> __device__ __forceinline__ double from_int<double>(i64 v) { return (double)v; }
template <> __device__ __forceinline__ half_t from_int<half_t>(i64 v) { return from_acc<half_t>(d2f_odd((double)v)); }
template <> __device__ __forceinline__ bhalf_t from_int<bhalf_t>(i64 v) { return from_acc<bhalf_t>(d2f_odd((double)v)); }
template <> __device__ __forceinline__ i64 from_int<i64>(i64 v) { return v; }
template <> __device__ __forceinline__ unsigned int from_int<unsigned int>(i64 v) { return (unsigned int)v; }
template <> __device__ __forceinline__ unsigned char from_int<unsigned char>(i64 v) { return v != 0; }

template <typename D> __device__ __forceinline__ D from_dbl(double v);
template <> __device__ __forceinline__ float from_dbl<float>(double v) { return (float)v; }
template <> __device__ __forceinline__ double from_dbl<double>(double v) { return v; }
template <> __device__ __forceinline__ half_t from_dbl<half_t>(double v) { return from_acc<half_t>(d2f_odd(v)); }
template <> __device__ __forceinline__ bhalf_t from_dbl<bhalf_t>(double v) { return from_acc<bhalf_t>(d2f_odd(v)); }
template <> __device__ __forceinline__ i64 from_dbl<i64>(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return 9223372036854775807ll;
    if (v <= -9223372036854775808.0) return (-9223372036854775807ll - 1);
    return (i64)v;
}
template <> __device__ __forceinline__ unsigned int from_dbl<unsigned int>(double v) {
    if (v != v || v <= 0.0) return 0u;
    if (v >= 4294967295.0) return 4294967295u;
    return (unsigned int)v;
}
template <> __device__ __forceinline__ unsigned char from_dbl<unsigned char>(double v) { return v != 0.0; }

__device__ __forceinline__ double src_val(float v) { return (double)v; }
__device__ __forceinline__ double src_val(double v) { return v; }
__device__ __forceinline__ double src_val(half_t v) { return (double)to_acc(v); }
__device__ __forceinline__ double src_val(bhalf_t v) { return (double)to_acc(v); }
__device__ __forceinline__ i64 src_val(i64 v) { return v; }
__device__ __forceinline__ i64 src_val(unsigned int v) { return (i64)v; }
__device__ __forceinline__ i64 src_val(unsigned char v) { return v != 0; }

template <typename D> __device__ __forceinline__ D conv(double v) { return from_dbl<D>(v); }
template <typename D> __device__ __forceinline__ D conv(i64 v) { return from_int<D>(v); }

extern "C" __global__ void cast(const SRC* s, Lay ls, DST* d, i64 n) {
    FORMA_LOOP(i, n) { d[i] = conv<DST>(src_val(s[loc(ls, i)])); }
}
