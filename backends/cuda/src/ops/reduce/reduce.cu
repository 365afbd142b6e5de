// Reductions along one axis of a dense [outer, n, inner] view: one block per
// output, each thread folding a strided share of the lane, then a tree in
// shared memory. The fold order depends only on the sizes, so results are
// deterministic. Arithmetic is in the accumulation type.

#define NT 256

__device__ __forceinline__ A comb(int k, A a, A b) {
    switch (k) {
        case 0: return a + b;
        case 1: return (a > b || m_isnan(a)) ? a : b;  // NaN-propagating max
        case 2: return (a < b || m_isnan(a)) ? a : b;  // NaN-propagating min
        default: return a * b;
    }
}

__device__ __forceinline__ A block_reduce(int k, A v, A* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = NT / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] = comb(k, sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    A r = sh[0];
    __syncthreads();
    return r;
}

// k: 0 sum, 1 max, 2 min, 3 prod; `shift` is subtracted before `exp` when `ex`.
__device__ __forceinline__ A lane_fold(int k, const T* lane, i64 n, i64 inner, bool ex, A shift,
                                       bool sq, A mean, A id, A* sh) {
    A acc = id;
    for (i64 j = threadIdx.x; j < n; j += NT) {
        A v = to_acc(lane[j * inner]);
        if (ex) v = m_exp(v - shift);
        if (sq) { v = v - mean; v = v * v; }
        acc = comb(k, acc, v);
    }
    return block_reduce(k, acc, sh);
}

// op: 0 sum, 1 mean, 2 max, 3 min, 4 prod, 5 logsumexp, 6 var (divided by `div`).
extern "C" __global__ void reduce(int op, const T* x, T* out, i64 outer, i64 n, i64 inner, double div) {
    __shared__ A sh[NT];
    const A inf = m_inf<A>();
    for (i64 o = blockIdx.x; o < outer * inner; o += gridDim.x) {
        const T* lane = x + (o / inner) * n * inner + (o % inner);
        A r;
        switch (op) {
            case 0: r = lane_fold(0, lane, n, inner, false, 0, false, 0, (A)0, sh); break;
            case 1: r = lane_fold(0, lane, n, inner, false, 0, false, 0, (A)0, sh) / (A)n; break;
            case 2: r = lane_fold(1, lane, n, inner, false, 0, false, 0, -inf, sh); break;
            case 3: r = lane_fold(2, lane, n, inner, false, 0, false, 0, inf, sh); break;
            case 4: r = lane_fold(3, lane, n, inner, false, 0, false, 0, (A)1, sh); break;
            case 5: {
                // PyTorch: shift by the max unless it is infinite.
                A m = lane_fold(1, lane, n, inner, false, 0, false, 0, -inf, sh);
                A shift = (m == inf || m == -inf) ? (A)0 : m;
                A s = lane_fold(0, lane, n, inner, true, shift, false, 0, (A)0, sh);
                r = m_log(s) + shift;
                break;
            }
            default: {
                A mean = lane_fold(0, lane, n, inner, false, 0, false, 0, (A)0, sh) / (A)n;
                A m2 = lane_fold(0, lane, n, inner, false, 0, true, mean, (A)0, sh);
                r = m2 / (A)div;
                break;
            }
        }
        if (threadIdx.x == 0) out[o] = from_acc<T>(r);
    }
}

struct ArgBest {
    A v;
    i64 i;  // -1: nothing seen
    bool nan;
};

__device__ __forceinline__ bool better(bool is_min, A v, A b) { return is_min ? v < b : v > b; }

// The first NaN wins; otherwise the extreme value, the smaller index on ties.
__device__ __forceinline__ ArgBest arg_comb(bool is_min, ArgBest a, ArgBest b) {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    if (a.nan || b.nan) {
        if (a.nan && b.nan) return a.i < b.i ? a : b;
        return a.nan ? a : b;
    }
    if (better(is_min, b.v, a.v)) return b;
    if (better(is_min, a.v, b.v)) return a;
    return a.i < b.i ? a : b;
}

extern "C" __global__ void arg_reduce(int is_min, const T* x, i64* out, i64 outer, i64 n, i64 inner) {
    __shared__ A sv[NT];
    __shared__ i64 si[NT];
    __shared__ bool sn[NT];
    for (i64 o = blockIdx.x; o < outer * inner; o += gridDim.x) {
        const T* lane = x + (o / inner) * n * inner + (o % inner);
        ArgBest best;
        best.v = (A)0;
        best.i = -1;
        best.nan = false;
        for (i64 j = threadIdx.x; j < n; j += NT) {
            ArgBest c;
            c.v = to_acc(lane[j * inner]);
            c.i = j;
            c.nan = m_isnan(c.v);
            best = arg_comb(is_min != 0, best, c);
        }
        sv[threadIdx.x] = best.v;
        si[threadIdx.x] = best.i;
        sn[threadIdx.x] = best.nan;
        __syncthreads();
        for (int s = NT / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) {
                ArgBest a, b;
                a.v = sv[threadIdx.x]; a.i = si[threadIdx.x]; a.nan = sn[threadIdx.x];
                b.v = sv[threadIdx.x + s]; b.i = si[threadIdx.x + s]; b.nan = sn[threadIdx.x + s];
                ArgBest r = arg_comb(is_min != 0, a, b);
                sv[threadIdx.x] = r.v; si[threadIdx.x] = r.i; sn[threadIdx.x] = r.nan;
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) out[o] = si[0];
        __syncthreads();
    }
}
