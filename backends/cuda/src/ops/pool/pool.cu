// 2-d max and average pooling of a dense [n, c, h, w] input, one thread per
// output (forward) or per input element (backward, which gathers from the
// windows that hold it: no atomics, deterministic). The window rules are
// the CPU backend's, which are PyTorch's.

struct PoolGeo {
    i64 h, w, oh, ow;
    int kh, kw, sh, sw, ph, pw, dh, dw, incl;
};

// Max of window (oy, ox) of one plane, and the offset of its first maximum
// (PyTorch: start at the first tap, move on `v > m || v is NaN`); -1 when
// the window holds no input element.
__device__ __forceinline__ A window_max(const T* xp, const PoolGeo& g, i64 oy, i64 ox, i64* at) {
    A m = -m_inf<A>();
    i64 best = -1;
    for (int a = 0; a < g.kh; ++a) {
        i64 y = oy * g.sh - g.ph + (i64)a * g.dh;
        if (y < 0 || y >= g.h) continue;
        for (int b = 0; b < g.kw; ++b) {
            i64 x = ox * g.sw - g.pw + (i64)b * g.dw;
            if (x < 0 || x >= g.w) continue;
            A v = to_acc(xp[y * g.w + x]);
            if (best < 0) best = y * g.w + x;
            if (v > m || m_isnan(v)) {
                m = v;
                best = y * g.w + x;
            }
        }
    }
    *at = best;
    return m;
}

extern "C" __global__ void max_pool(const T* x, T* out, PoolGeo g, i64 total) {
    FORMA_LOOP(i, total) {
        i64 ox = i % g.ow, oy = (i / g.ow) % g.oh, pl = i / (g.ow * g.oh);
        i64 at;
        out[i] = from_acc<T>(window_max(x + pl * g.h * g.w, g, oy, ox, &at));
    }
}

// The window of output (oy, ox) clipped to the padded input (`y0..y1`) and
// to the input (`ys..ye`); its divisor.
__device__ __forceinline__ i64 avg_count(const PoolGeo& g, i64 oy, i64 ox, i64* ys, i64* ye, i64* xs, i64* xe) {
    i64 y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
    i64 y1 = min(y0 + g.kh, g.h + g.ph), x1 = min(x0 + g.kw, g.w + g.pw);
    *ys = max(y0, (i64)0);
    *ye = min(y1, g.h);
    *xs = max(x0, (i64)0);
    *xe = min(x1, g.w);
    return g.incl ? (y1 - y0) * (x1 - x0) : (*ye - *ys) * (*xe - *xs);
}

extern "C" __global__ void avg_pool(const T* x, T* out, PoolGeo g, i64 total) {
    FORMA_LOOP(i, total) {
        i64 ox = i % g.ow, oy = (i / g.ow) % g.oh, pl = i / (g.ow * g.oh);
        const T* xp = x + pl * g.h * g.w;
        i64 ys, ye, xs, xe;
        i64 count = avg_count(g, oy, ox, &ys, &ye, &xs, &xe);
        if (ys >= ye || xs >= xe) {
            out[i] = from_acc<T>((A)0);
            continue;
        }
        A sum = (A)0;
        for (i64 y = ys; y < ye; ++y)
            for (i64 xx = xs; xx < xe; ++xx) sum += to_acc(xp[y * g.w + xx]);
        out[i] = from_acc<T>(sum / (A)count);
    }
}

// Each input element sums the gradients of the windows whose first maximum it is.
extern "C" __global__ void max_pool_bwd(const T* x, const T* gy, T* dx, PoolGeo g, i64 total) {
    FORMA_LOOP(i, total) {
        i64 xx = i % g.w, y = (i / g.w) % g.h, pl = i / (g.w * g.h);
        const T* xp = x + pl * g.h * g.w;
        const T* gp = gy + pl * g.oh * g.ow;
        A acc = (A)0;
        for (int a = 0; a < g.kh; ++a) {
            i64 t = y + g.ph - (i64)a * g.dh;
            if (t < 0 || t % g.sh != 0 || t / g.sh >= g.oh) continue;
            i64 oy = t / g.sh;
            for (int b = 0; b < g.kw; ++b) {
                i64 u = xx + g.pw - (i64)b * g.dw;
                if (u < 0 || u % g.sw != 0 || u / g.sw >= g.ow) continue;
                i64 ox = u / g.sw;
                i64 at;
                window_max(xp, g, oy, ox, &at);
                if (at == y * g.w + xx) acc += to_acc(gp[oy * g.ow + ox]);
            }
        }
        dx[i] = from_acc<T>(acc);
    }
}

// Each input element sums gradient / divisor over the windows that hold it.
extern "C" __global__ void avg_pool_bwd(const T* gy, T* dx, PoolGeo g, i64 total) {
    FORMA_LOOP(i, total) {
        i64 xx = i % g.w, y = (i / g.w) % g.h, pl = i / (g.w * g.h);
        const T* gp = gy + pl * g.oh * g.ow;
        i64 ylo = y + g.ph - g.kh + 1, xlo = xx + g.pw - g.kw + 1;
        i64 oy0 = ylo <= 0 ? 0 : (ylo + g.sh - 1) / g.sh;
        i64 ox0 = xlo <= 0 ? 0 : (xlo + g.sw - 1) / g.sw;
        i64 oy1 = min((y + g.ph) / g.sh, g.oh - 1), ox1 = min((xx + g.pw) / g.sw, g.ow - 1);
        A acc = (A)0;
        for (i64 oy = oy0; oy <= oy1; ++oy) {
            for (i64 ox = ox0; ox <= ox1; ++ox) {
                i64 ys, ye, xs, xe;
                i64 count = avg_count(g, oy, ox, &ys, &ye, &xs, &xe);
                if (y < ys || y >= ye || xx < xs || xx >= xe) continue;
                acc += to_acc(gp[oy * g.ow + ox]) / (A)count;
            }
        }
        dx[i] = from_acc<T>(acc);
    }
}
