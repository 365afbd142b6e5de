// Softmax and log-softmax along one axis of a dense [outer, n, inner] view,
// one block per lane, PyTorch's formula: subtract the lane max (so an all
// -inf lane, or one with +inf or NaN, gives NaN), exponentials in the
// accumulation type, one rounding at the end.

#define NT 256

__device__ __forceinline__ A sm_comb(bool mx, A a, A b) {
    return mx ? ((a > b || m_isnan(a)) ? a : b) : a + b;
}

__device__ __forceinline__ A sm_block(bool mx, A v, A* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = NT / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] = sm_comb(mx, sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    A r = sh[0];
    __syncthreads();
    return r;
}

extern "C" __global__ void softmax(int logm, const T* x, T* out, i64 outer, i64 n, i64 inner) {
    __shared__ A sh[NT];
    for (i64 o = blockIdx.x; o < outer * inner; o += gridDim.x) {
        i64 base = (o / inner) * n * inner + (o % inner);
        A m = -m_inf<A>();
        for (i64 j = threadIdx.x; j < n; j += NT) m = sm_comb(true, m, to_acc(x[base + j * inner]));
        m = sm_block(true, m, sh);
        A s = (A)0;
        for (i64 j = threadIdx.x; j < n; j += NT) s += m_exp(to_acc(x[base + j * inner]) - m);
        s = sm_block(false, s, sh);
        A ls = m_log(s);
        for (i64 j = threadIdx.x; j < n; j += NT) {
            A v = to_acc(x[base + j * inner]);
            out[base + j * inner] = from_acc<T>(logm ? v - m - ls : m_exp(v - m) / s);
        }
    }
}
