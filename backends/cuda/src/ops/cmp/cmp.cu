// Comparisons (a bool per element, written as 0 or 1) and `where`.
// Values compare in the accumulation type, which is exact for f16/bf16.

extern "C" __global__ void cmp(int op, const T* a, Lay la, const T* b, Lay lb, unsigned char* out, i64 n) {
    FORMA_LOOP(i, n) {
        A x = to_acc(a[loc(la, i)]);
        A y = to_acc(b[loc(lb, i)]);
        bool r;
        switch (op) {
            case 0: r = x == y; break;
            case 1: r = x != y; break;
            case 2: r = x < y; break;
            case 3: r = x <= y; break;
            case 4: r = x > y; break;
            default: r = x >= y; break;
        }
        out[i] = r ? 1 : 0;
    }
}

extern "C" __global__ void where_cond(const unsigned char* c, Lay lc, const T* a, Lay la, const T* b,
                                      Lay lb, T* out, i64 n) {
    FORMA_LOOP(i, n) { out[i] = c[loc(lc, i)] ? a[loc(la, i)] : b[loc(lb, i)]; }
}
