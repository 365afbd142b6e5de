// Convolution as im2col + gemm (the gemm is cuBLAS, issued from mod.rs):
// `im2col` unfolds a dense [n, c, h, w] input into columns
// [n, c * kh * kw, oh * ow] (zero where a tap falls in the padding), and
// `col2im` folds column gradients (in the accumulation type) back into the
// input's gradient, each input element gathering its own taps (no atomics,
// deterministic).

struct ConvGeo {
    i64 n, c, h, w, kh, kw, oh, ow;
    int sh, sw, ph, pw, dh, dw;
};

extern "C" __global__ void im2col(const T* x, T* col, ConvGeo g, i64 total) {
    const i64 L = g.oh * g.ow, K = g.c * g.kh * g.kw;
    FORMA_LOOP(i, total) {
        i64 l = i % L, r = i / L;
        i64 kr = r % K, b = r / K;
        i64 kx = kr % g.kw, ky = (kr / g.kw) % g.kh, c = kr / (g.kw * g.kh);
        i64 ox = l % g.ow, oy = l / g.ow;
        i64 iy = oy * g.sh - g.ph + ky * g.dh, ix = ox * g.sw - g.pw + kx * g.dw;
        col[i] = (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w)
                     ? x[((b * g.c + c) * g.h + iy) * g.w + ix]
                     : from_acc<T>((A)0);
    }
}

extern "C" __global__ void col2im(const A* dcol, T* dx, ConvGeo g, i64 total) {
    const i64 L = g.oh * g.ow, K = g.c * g.kh * g.kw;
    FORMA_LOOP(i, total) {
        i64 x = i % g.w, y = (i / g.w) % g.h, c = (i / (g.w * g.h)) % g.c, b = i / (g.w * g.h * g.c);
        A acc = (A)0;
        for (i64 ky = 0; ky < g.kh; ++ky) {
            i64 t = y + g.ph - ky * g.dh;
            if (t < 0 || t % g.sh != 0) continue;
            i64 oy = t / g.sh;
            if (oy >= g.oh) continue;
            for (i64 kx = 0; kx < g.kw; ++kx) {
                i64 u = x + g.pw - kx * g.dw;
                if (u < 0 || u % g.sw != 0) continue;
                i64 ox = u / g.sw;
                if (ox >= g.ow) continue;
                acc += dcol[(b * K + (c * g.kh + ky) * g.kw + kx) * L + oy * g.ow + ox];
            }
        }
        dx[i] = from_acc<T>(acc);
    }
}
