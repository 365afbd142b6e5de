// index_select, gather, scatter_add. Indices are checked by `check_idx`
// before any of these runs, so every read and write is in bounds.

// The first row-major position of the index view holding an index outside [0, size).
extern "C" __global__ void check_idx(const i64* idx, Lay li, i64 n, i64 size, u64* first_bad) {
    FORMA_LOOP(i, n) {
        i64 v = idx[loc(li, i)];
        if (v < 0 || v >= size) atomicMin(first_bad, (u64)i);
    }
}

// `lo` holds the output's sizes (the input's with `axis` resized to the index count).
extern "C" __global__ void index_select(const T* x, Lay lx, int axis, const i64* idx, Lay li, T* out,
                                        Lay lo, i64 n) {
    FORMA_LOOP(i, n) {
        i64 rem = i, off = lx.offset;
        for (int d = lo.rank - 1; d >= 0; --d) {
            i64 c = rem % lo.dims[d];
            rem /= lo.dims[d];
            if (d == axis) c = idx[loc(li, c)];
            off += c * lx.strides[d];
        }
        out[i] = x[off];
    }
}

// The output has the index's sizes.
extern "C" __global__ void gather(const T* x, Lay lx, int axis, const i64* idx, Lay li, T* out, i64 n) {
    FORMA_LOOP(i, n) {
        i64 rem = i, off = lx.offset;
        for (int d = li.rank - 1; d >= 0; --d) {
            i64 c = rem % li.dims[d];
            rem /= li.dims[d];
            if (d != axis) off += c * lx.strides[d];
        }
        off += idx[loc(li, i)] * lx.strides[axis];
        out[i] = x[off];
    }
}

__device__ __forceinline__ void atomic_add_t(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add_t(double* p, double v) { atomicAdd(p, v); }

// A 16-bit add by compare-and-swap on the aligned 32-bit word holding it
// (blocks are 512-byte aligned, so the word lies inside the block); the
// sum is rounded to the 16-bit type, as each `+=` on the CPU.
template <typename H>
__device__ __forceinline__ void atomic_add_h(H* p, float v) {
    unsigned int* base = (unsigned int*)((u64)p & ~(u64)3);
    bool hi = ((u64)p & 2) != 0;
    unsigned int old = *base, assumed;
    do {
        assumed = old;
        H h;
        h.b = (unsigned short)(hi ? (assumed >> 16) : (assumed & 0xffffu));
        H r = from_acc<H>(to_acc(h) + v);
        unsigned int nw = hi ? ((assumed & 0xffffu) | ((unsigned int)r.b << 16))
                             : ((assumed & 0xffff0000u) | (unsigned int)r.b);
        old = atomicCAS(base, assumed, nw);
    } while (assumed != old);
}
__device__ __forceinline__ void atomic_add_t(half_t* p, float v) { atomic_add_h<half_t>(p, v); }
__device__ __forceinline__ void atomic_add_t(bhalf_t* p, float v) { atomic_add_h<bhalf_t>(p, v); }

// `out` is a dense copy of the input (sizes `lo`); adds `src` at the indexed positions.
extern "C" __global__ void scatter_add(T* out, Lay lo, int axis, const i64* idx, Lay li, const T* src,
                                       Lay ls, i64 n) {
    FORMA_LOOP(i, n) {
        i64 rem = i, off = 0;
        for (int d = li.rank - 1; d >= 0; --d) {
            i64 c = rem % li.dims[d];
            rem /= li.dims[d];
            if (d != axis) off += c * lo.strides[d];
        }
        off += idx[loc(li, i)] * lo.strides[axis];
        atomic_add_t(out + off, to_acc(src[loc(ls, i)]));
    }
}
