// Unary ops: one generic forward and backward kernel; the op rows (a struct
// per op with its function and derivative, and the `extern "C"` entry points)
// are generated from the table in `mod.rs` and appended to this source.
// `T` is the storage type, `A` the accumulation type (see common.cuh).

__device__ __forceinline__ A sigm(A x) { return (A)1 / ((A)1 + m_exp(-x)); }

__device__ __forceinline__ A gelu_tanh_f(A x) {
    const A k = (A)0.7978845608028654;
    return (A)0.5 * x * ((A)1 + m_tanh(k * (x + (A)0.044715 * x * x * x)));
}

__device__ __forceinline__ A gelu_tanh_df(A x) {
    const A k = (A)0.7978845608028654;
    const A c = (A)0.044715;
    A t = m_tanh(k * (x + c * x * x * x));
    return (A)0.5 * ((A)1 + t) + (A)0.5 * x * ((A)1 - t * t) * k * ((A)1 + (A)3 * c * x * x);
}

__device__ __forceinline__ A silu_df(A x) {
    A sg = sigm(x);
    return sg * ((A)1 + x * ((A)1 - sg));
}

template <typename Op>
__device__ __forceinline__ void unary_fwd(const T* x, Lay lx, T* out, i64 n, A p0, A p1) {
    Op op;
    FORMA_LOOP(i, n) { out[i] = from_acc<T>(op.f(to_acc(x[loc(lx, i)]), p0, p1)); }
}

template <typename Op>
__device__ __forceinline__ void unary_bwd(const T* x, Lay lx, const T* y, Lay ly, const T* g,
                                          Lay lg, T* out, i64 n, A p0, A p1) {
    Op op;
    FORMA_LOOP(i, n) {
        A d = op.df(to_acc(x[loc(lx, i)]), to_acc(y[loc(ly, i)]), p0, p1);
        out[i] = from_acc<T>(to_acc(g[loc(lg, i)]) * d);
    }
}
