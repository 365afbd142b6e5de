// Dtype-agnostic copies and fills: the element is moved as an unsigned
// integer of its size, so one kernel serves every dtype of that width.

template <typename U>
__device__ __forceinline__ void copy_k(const U* src, Lay ls, U* dst, Lay ld, i64 n) {
    FORMA_LOOP(i, n) { dst[loc(ld, i)] = src[loc(ls, i)]; }
}

template <typename U>
__device__ __forceinline__ void fill_k(U* dst, i64 n, u64 bits) {
    FORMA_LOOP(i, n) { dst[i] = (U)bits; }
}

#define FORMA_COPY(W, U)                                                          \
    extern "C" __global__ void copy_##W(const U* s, Lay ls, U* d, Lay ld, i64 n) { \
        copy_k<U>(s, ls, d, ld, n);                                               \
    }                                                                             \
    extern "C" __global__ void fill_##W(U* d, i64 n, u64 bits) { fill_k<U>(d, n, bits); }

FORMA_COPY(1, unsigned char)
FORMA_COPY(2, unsigned short)
FORMA_COPY(4, unsigned int)
FORMA_COPY(8, u64)
