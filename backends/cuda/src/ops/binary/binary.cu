// Binary ops: one generic forward and backward kernel; the op rows are
// generated from the table in `mod.rs` and appended. Operands are strided
// views of the output's sizes (stride 0 on broadcast dims).

template <typename Op>
__device__ __forceinline__ void binary_fwd(const T* a, Lay la, const T* b, Lay lb, T* out, i64 n) {
    Op op;
    FORMA_LOOP(i, n) { out[i] = from_acc<T>(op.f(to_acc(a[loc(la, i)]), to_acc(b[loc(lb, i)]))); }
}

template <typename Op>
__device__ __forceinline__ void binary_bwd(const T* a, Lay la, const T* b, Lay lb, const T* g, Lay lg,
                                           T* ga, T* gb, i64 n) {
    Op op;
    FORMA_LOOP(i, n) {
        A x = to_acc(a[loc(la, i)]);
        A y = to_acc(b[loc(lb, i)]);
        A gv = to_acc(g[loc(lg, i)]);
        ga[i] = from_acc<T>(gv * op.da(x, y));
        gb[i] = from_acc<T>(gv * op.db(x, y));
    }
}
