//! Recurrent cells, fused: one LSTM or GRU time step's gate activations and
//! state update in one pass over the batch, and its backward in one, rows
//! in parallel, each row a loop [`crate::simd::run`] vectorises. The
//! arithmetic is the composed ops' in `E::Acc` (products and sums in the
//! same order), except that `exp` and `tanh` are [`Real::exp_fast`] and
//! [`Real::tanh_fast`] (std's in f64; in f32 within 2e-7 relative of the
//! unary table's libm calls, which do not vectorise and were a fifth of an
//! LSTM step).

use crate::{gather_vec, par, Cpu};
use forma_core::dtype::Real;
use forma_core::ops::rnn::{Operand, RnnKernel};
use forma_core::{Float, Result};
use std::borrow::Cow;
use std::mem::MaybeUninit;

/// A 2-D operand's rows: row `i` is `data[off + i * stride..][..n]`
/// (copied first when a row is not contiguous).
struct Rows<'a, E: Clone> {
    data: Cow<'a, [E]>,
    off: usize,
    stride: usize,
    n: usize,
}

impl<'a, E: Float> Rows<'a, E> {
    fn new((s, l): Operand<'a, Vec<E>>) -> Self {
        let n = l.dims[1];
        if l.strides[1] == 1 || n <= 1 {
            Rows {
                data: Cow::Borrowed(&s[..]),
                off: l.offset,
                stride: l.strides[0],
                n,
            }
        } else {
            Rows {
                data: Cow::Owned(gather_vec(s, l)),
                off: 0,
                stride: n,
                n,
            }
        }
    }

    #[inline(always)]
    fn row(&self, i: usize) -> &[E] {
        let start = self.off + i * self.stride;
        &self.data[start..start + self.n]
    }
}

/// Outputs written row by row from parallel tasks.
struct Out<E>(*mut MaybeUninit<E>);

// SAFETY: each task of `rows_par` writes only its own rows of each output.
unsafe impl<E: Send> Sync for Out<E> {}

impl<E> Out<E> {
    /// Row `i` of `n` elements.
    ///
    /// # Safety
    /// Only one task may hold a given row, within the buffer's length.
    #[allow(clippy::mut_from_ref)] // disjoint rows, see above
    unsafe fn row(&self, i: usize, n: usize) -> &mut [MaybeUninit<E>] {
        // SAFETY: the caller holds row `i` alone, inside the allocation.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(i * n), n) }
    }
}

/// Calls `f(i)` for every row `i < b`, in parallel when the rows hold
/// enough work (`width` elements each).
fn rows_par(b: usize, width: usize, f: impl Fn(usize) + Sync) {
    let threads = par::threads();
    if threads < 2 || b < 2 || b * width < 4096 {
        (0..b).for_each(f);
        return;
    }
    let per = b.div_ceil(threads);
    par::run(b.div_ceil(per), &|c| {
        (c * per..((c + 1) * per).min(b)).for_each(&f);
    });
}

/// An output of `len` elements, each written once by the rows.
fn uninit<E>(len: usize) -> Vec<MaybeUninit<E>> {
    let mut v = Vec::with_capacity(len);
    // SAFETY: `MaybeUninit` elements need no initialisation.
    unsafe { v.set_len(len) };
    v
}

/// An output once every element is written.
///
/// # Safety
/// Every element of `v` must have been written.
unsafe fn written<E>(v: Vec<MaybeUninit<E>>) -> Vec<E> {
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: `MaybeUninit<E>` has `E`'s layout, and the caller wrote every element.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<E>(), v.len(), v.capacity()) }
}

#[inline(always)]
fn sigmoid<R: Real>(x: R) -> R {
    R::one() / (R::one() + (-x).exp_fast())
}

/// The `k` blocks of `n` of a row.
#[inline(always)]
fn blocks<E, const K: usize>(row: &[E], n: usize) -> [&[E]; K] {
    std::array::from_fn(|k| &row[k * n..(k + 1) * n])
}

/// The `k` blocks of `n` of a row, to write.
#[inline(always)]
fn blocks_mut<E, const K: usize>(row: &mut [E], n: usize) -> [&mut [E]; K] {
    let mut it = row.chunks_exact_mut(n);
    std::array::from_fn(|_| it.next().expect("K blocks of n"))
}

/// The sum of row `i` of every part, as one row (the part itself when
/// there is one).
fn summed<'a, E: Float>(parts: &'a [Rows<'_, E>], i: usize, buf: &'a mut Vec<E>) -> &'a [E] {
    if let [only] = parts {
        return only.row(i);
    }
    buf.clear();
    buf.extend_from_slice(parts[0].row(i));
    for p in &parts[1..] {
        for (b, v) in buf.iter_mut().zip(p.row(i)) {
            *b = E::from_acc(b.to_acc() + v.to_acc());
        }
    }
    buf
}

/// One row of [`RnnKernel::lstm_cell`].
struct LstmRow<'a, E> {
    x: &'a [E],
    g: &'a [E],
    c0: &'a [E],
    h: &'a mut [MaybeUninit<E>],
    c: &'a mut [MaybeUninit<E>],
    act: &'a mut [MaybeUninit<E>],
}

impl<E: Float> crate::simd::Vectorized for LstmRow<'_, E> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let n = self.h.len();
        let x: [&[E]; 4] = blocks(self.x, n);
        let g: [&[E]; 4] = blocks(self.g, n);
        let [ai, af, ag, ao] = blocks_mut(self.act, n);
        let (c0, hr, cr) = (&self.c0[..n], &mut self.h[..n], &mut self.c[..n]);
        for j in 0..n {
            let pi = E::from_acc(x[0][j].to_acc() + g[0][j].to_acc()).to_acc();
            let pf = E::from_acc(x[1][j].to_acc() + g[1][j].to_acc()).to_acc();
            let pg = E::from_acc(x[2][j].to_acc() + g[2][j].to_acc()).to_acc();
            let po = E::from_acc(x[3][j].to_acc() + g[3][j].to_acc()).to_acc();
            let (i, f) = (E::from_acc(sigmoid(pi)), E::from_acc(sigmoid(pf)));
            let (gg, o) = (E::from_acc(pg.tanh_fast()), E::from_acc(sigmoid(po)));
            let fc = E::from_acc(f.to_acc() * c0[j].to_acc());
            let ig = E::from_acc(i.to_acc() * gg.to_acc());
            let c = E::from_acc(fc.to_acc() + ig.to_acc());
            let tc = E::from_acc(c.to_acc().tanh_fast());
            hr[j].write(E::from_acc(o.to_acc() * tc.to_acc()));
            cr[j].write(c);
            ai[j].write(i);
            af[j].write(f);
            ag[j].write(gg);
            ao[j].write(o);
        }
    }
}

/// One row of [`RnnKernel::lstm_cell_backward`].
struct LstmBackRow<'a, E> {
    act: &'a [E],
    c0: &'a [E],
    c: &'a [E],
    dh: &'a [E],
    dc: &'a [E],
    dg: &'a mut [MaybeUninit<E>],
    dc0: &'a mut [MaybeUninit<E>],
}

impl<E: Float> crate::simd::Vectorized for LstmBackRow<'_, E> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let n = self.dc0.len();
        let a: [&[E]; 4] = blocks(self.act, n);
        let [di, df, dgg, d_o] = blocks_mut(self.dg, n);
        let (c0, c, dhs, dcs) = (&self.c0[..n], &self.c[..n], &self.dh[..n], &self.dc[..n]);
        let out = &mut self.dc0[..n];
        let one = E::Acc::c(1.0);
        for j in 0..n {
            let (i, f, g, o) = (
                a[0][j].to_acc(),
                a[1][j].to_acc(),
                a[2][j].to_acc(),
                a[3][j].to_acc(),
            );
            let tc = E::from_acc(c[j].to_acc().tanh_fast()).to_acc();
            let dh = dhs[j].to_acc();
            let dc = dcs[j].to_acc() + dh * o * (one - tc * tc);
            di[j].write(E::from_acc(dc * g * i * (one - i)));
            df[j].write(E::from_acc(dc * c0[j].to_acc() * f * (one - f)));
            dgg[j].write(E::from_acc(dc * i * (one - g * g)));
            d_o[j].write(E::from_acc(dh * tc * o * (one - o)));
            out[j].write(E::from_acc(dc * f));
        }
    }
}

/// One row of [`RnnKernel::gru_cell`].
struct GruRow<'a, E> {
    x: &'a [E],
    g: &'a [E],
    h0: &'a [E],
    h: &'a mut [MaybeUninit<E>],
    act: &'a mut [MaybeUninit<E>],
}

impl<E: Float> crate::simd::Vectorized for GruRow<'_, E> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let n = self.h.len();
        let x: [&[E]; 3] = blocks(self.x, n);
        let g: [&[E]; 3] = blocks(self.g, n);
        let [ar, az, an, ahn] = blocks_mut(self.act, n);
        let (h0, hr) = (&self.h0[..n], &mut self.h[..n]);
        for j in 0..n {
            let pr = E::from_acc(x[0][j].to_acc() + g[0][j].to_acc()).to_acc();
            let pz = E::from_acc(x[1][j].to_acc() + g[1][j].to_acc()).to_acc();
            let (r, z) = (E::from_acc(sigmoid(pr)), E::from_acc(sigmoid(pz)));
            let hn = g[2][j];
            let rh = E::from_acc(r.to_acc() * hn.to_acc());
            let pre = E::from_acc(x[2][j].to_acc() + rh.to_acc());
            let nn = E::from_acc(pre.to_acc().tanh_fast());
            // PyTorch's form of (1 - z) * n + z * h, as the composed ops.
            let d = E::from_acc(h0[j].to_acc() - nn.to_acc());
            let dz = E::from_acc(d.to_acc() * z.to_acc());
            hr[j].write(E::from_acc(dz.to_acc() + nn.to_acc()));
            ar[j].write(r);
            az[j].write(z);
            an[j].write(nn);
            ahn[j].write(hn);
        }
    }
}

/// One row of [`RnnKernel::gru_cell_backward`].
struct GruBackRow<'a, E> {
    act: &'a [E],
    h0: &'a [E],
    dh: &'a [E],
    dx: &'a mut [MaybeUninit<E>],
    dg: &'a mut [MaybeUninit<E>],
    dh0: &'a mut [MaybeUninit<E>],
}

impl<E: Float> crate::simd::Vectorized for GruBackRow<'_, E> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let n = self.dh0.len();
        let a: [&[E]; 4] = blocks(self.act, n);
        let [xr, xz, xn] = blocks_mut(self.dx, n);
        let [gr, gz, gn] = blocks_mut(self.dg, n);
        let (h0, dhs, out) = (&self.h0[..n], &self.dh[..n], &mut self.dh0[..n]);
        let one = E::Acc::c(1.0);
        for j in 0..n {
            let (r, z, nn, hn) = (
                a[0][j].to_acc(),
                a[1][j].to_acc(),
                a[2][j].to_acc(),
                a[3][j].to_acc(),
            );
            let dh = dhs[j].to_acc();
            let dn = E::from_acc(dh * (one - z) * (one - nn * nn));
            let dz = E::from_acc(dh * (h0[j].to_acc() - nn) * z * (one - z));
            let dr = E::from_acc(dn.to_acc() * hn * r * (one - r));
            xr[j].write(dr);
            xz[j].write(dz);
            xn[j].write(dn);
            gr[j].write(dr);
            gz[j].write(dz);
            gn[j].write(E::from_acc(dn.to_acc() * r));
            out[j].write(E::from_acc(dh * z));
        }
    }
}

impl<E: Float> RnnKernel<E> for Cpu {
    fn lstm_cell(
        &self,
        xp: Operand<'_, Vec<E>>,
        hg: Operand<'_, Vec<E>>,
        c_prev: Operand<'_, Vec<E>>,
    ) -> Result<Option<[Vec<E>; 3]>> {
        let (xp, hg, cp) = (Rows::new(xp), Rows::new(hg), Rows::new(c_prev));
        let (b, h) = (c_prev.1.dims[0], c_prev.1.dims[1]);
        let (mut hs, mut cs, mut act) = (uninit::<E>(b * h), uninit::<E>(b * h), uninit(b * 4 * h));
        let (ho, co, ao) = (
            Out(hs.as_mut_ptr()),
            Out(cs.as_mut_ptr()),
            Out(act.as_mut_ptr()),
        );
        rows_par(b, 4 * h, |i| {
            // SAFETY: row `i` belongs to this call alone.
            let (h_, c, act) = unsafe { (ho.row(i, h), co.row(i, h), ao.row(i, 4 * h)) };
            crate::simd::run(LstmRow {
                x: xp.row(i),
                g: hg.row(i),
                c0: cp.row(i),
                h: h_,
                c,
                act,
            });
        });
        // SAFETY: every row of every output was written.
        Ok(Some(unsafe { [written(hs), written(cs), written(act)] }))
    }

    fn lstm_cell_backward(
        &self,
        act: Operand<'_, Vec<E>>,
        c_prev: Operand<'_, Vec<E>>,
        c: Operand<'_, Vec<E>>,
        dh: &[Operand<'_, Vec<E>>],
        dc: &[Operand<'_, Vec<E>>],
    ) -> Result<Option<[Vec<E>; 2]>> {
        let (b, h) = (c.1.dims[0], c.1.dims[1]);
        let (act, cp, cn) = (Rows::new(act), Rows::new(c_prev), Rows::new(c));
        let dh: Vec<_> = dh.iter().map(|&o| Rows::new(o)).collect();
        let dc: Vec<_> = dc.iter().map(|&o| Rows::new(o)).collect();
        let (mut dg, mut dcp) = (uninit::<E>(b * 4 * h), uninit::<E>(b * h));
        let (go, co) = (Out(dg.as_mut_ptr()), Out(dcp.as_mut_ptr()));
        rows_par(b, 4 * h, |r| {
            let (mut bh, mut bc) = (Vec::new(), Vec::new());
            // SAFETY: row `r` belongs to this call alone.
            let (dg, dc0) = unsafe { (go.row(r, 4 * h), co.row(r, h)) };
            crate::simd::run(LstmBackRow {
                act: act.row(r),
                c0: cp.row(r),
                c: cn.row(r),
                dh: summed(&dh, r, &mut bh),
                dc: summed(&dc, r, &mut bc),
                dg,
                dc0,
            });
        });
        // SAFETY: every row of every output was written.
        Ok(Some(unsafe { [written(dg), written(dcp)] }))
    }

    fn gru_cell(
        &self,
        xp: Operand<'_, Vec<E>>,
        hg: Operand<'_, Vec<E>>,
        h_prev: Operand<'_, Vec<E>>,
    ) -> Result<Option<[Vec<E>; 2]>> {
        let (xp, hg, hp) = (Rows::new(xp), Rows::new(hg), Rows::new(h_prev));
        let (b, h) = (h_prev.1.dims[0], h_prev.1.dims[1]);
        let (mut hs, mut act) = (uninit::<E>(b * h), uninit::<E>(b * 4 * h));
        let (ho, ao) = (Out(hs.as_mut_ptr()), Out(act.as_mut_ptr()));
        rows_par(b, 3 * h, |i| {
            // SAFETY: row `i` belongs to this call alone.
            let (h_, act) = unsafe { (ho.row(i, h), ao.row(i, 4 * h)) };
            crate::simd::run(GruRow {
                x: xp.row(i),
                g: hg.row(i),
                h0: hp.row(i),
                h: h_,
                act,
            });
        });
        // SAFETY: every row of every output was written.
        Ok(Some(unsafe { [written(hs), written(act)] }))
    }

    fn gru_cell_backward(
        &self,
        act: Operand<'_, Vec<E>>,
        h_prev: Operand<'_, Vec<E>>,
        dh: &[Operand<'_, Vec<E>>],
    ) -> Result<Option<[Vec<E>; 3]>> {
        let (b, h) = (h_prev.1.dims[0], h_prev.1.dims[1]);
        let (act, hp) = (Rows::new(act), Rows::new(h_prev));
        let dh: Vec<_> = dh.iter().map(|&o| Rows::new(o)).collect();
        let (mut dx, mut dg, mut dhp) = (
            uninit::<E>(b * 3 * h),
            uninit::<E>(b * 3 * h),
            uninit(b * h),
        );
        let (xo, go, ho) = (
            Out(dx.as_mut_ptr()),
            Out(dg.as_mut_ptr()),
            Out(dhp.as_mut_ptr()),
        );
        rows_par(b, 3 * h, |r| {
            let mut buf = Vec::new();
            // SAFETY: row `r` belongs to this call alone.
            let (dx, dg, dh0) = unsafe { (xo.row(r, 3 * h), go.row(r, 3 * h), ho.row(r, h)) };
            crate::simd::run(GruBackRow {
                act: act.row(r),
                h0: hp.row(r),
                dh: summed(&dh, r, &mut buf),
                dx,
                dg,
                dh0,
            });
        });
        // SAFETY: every row of every output was written.
        Ok(Some(unsafe { [written(dx), written(dg), written(dhp)] }))
    }
}
