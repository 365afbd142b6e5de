//! [`ConvKernel`] for [`Cuda`]: im2col + cuBLAS gemm, one strided batched
//! gemm per group over the batch. The backward reuses the columns: the
//! weight gradient is a gemm per (group, batch item) accumulated in the
//! accumulation type (f32 for half types, then rounded once), and the input
//! gradient is a batched gemm into f32/f64 columns folded back by `col2im`.

use crate::device::cfg_1d;
use crate::kernels::{float_module, tag};
use crate::ops::matmul::Mat;
use crate::{Cuda, CudaStorage};
use cudarc::driver::DeviceRepr;
use forma_core::ops::conv::{Conv2dGeometry, Conv2dParams, ConvKernel};
use forma_core::{Backend, DType, Dtype, Float, Layout, Result};

/// The convolution module source for dtype `d`.
pub(crate) fn source(d: DType) -> String {
    float_module(d, include_str!("conv.cu"))
}

/// `struct ConvGeo` of `conv.cu`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ConvGeo {
    n: i64,
    c: i64,
    h: i64,
    w: i64,
    kh: i64,
    kw: i64,
    oh: i64,
    ow: i64,
    sh: i32,
    sw: i32,
    ph: i32,
    pw: i32,
    dh: i32,
    dw: i32,
}

// SAFETY: plain `repr(C)` data matching the CUDA struct.
unsafe impl DeviceRepr for ConvGeo {}

/// Sizes of a convolution (validated by core's checks) and the kernels'
/// view of them.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    n: usize,
    c_in: usize,
    c_out: usize,
    cg: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    groups: usize,
    kernel: ConvGeo,
}

/// Checks the operands with core's checks (core ran them before it
/// dispatched; a direct call gets them too) and derives the sizes.
fn geometry(lx: &Layout, lw: &Layout, p: &Conv2dParams) -> Result<Geometry> {
    let g = Conv2dGeometry::new(&lx.dims, &lw.dims, p)?;
    let kernel = ConvGeo {
        n: g.n as i64,
        c: g.c_in as i64,
        h: g.h as i64,
        w: g.w as i64,
        kh: g.kh as i64,
        kw: g.kw as i64,
        oh: g.oh as i64,
        ow: g.ow as i64,
        sh: p.stride[0] as i32,
        sw: p.stride[1] as i32,
        ph: p.padding[0] as i32,
        pw: p.padding[1] as i32,
        dh: p.dilation[0] as i32,
        dw: p.dilation[1] as i32,
    };
    Ok(Geometry {
        n: g.n,
        c_in: g.c_in,
        c_out: g.c_out,
        cg: g.cg,
        kh: g.kh,
        kw: g.kw,
        oh: g.oh,
        ow: g.ow,
        groups: p.groups,
        kernel,
    })
}

/// A row-major matrix at `ptr` plus `elems` elements of `size` bytes.
fn mat(ptr: u64, elems: usize, size: usize, ld: usize, trans: bool, batch: usize) -> Mat {
    Mat {
        ptr: ptr + (elems * size) as u64,
        ld,
        trans,
        batch,
    }
}

impl Cuda {
    /// A dense copy of a view, or the view itself when already dense; the
    /// address of its first element and the copy that owns it.
    fn dense<E: Float>(
        &self,
        x: &CudaStorage<E>,
        l: &Layout,
    ) -> Result<(u64, Option<CudaStorage<E>>)> {
        Ok(match l.contiguous_range() {
            Some(r) => (x.ptr_at(r.start), None),
            None => {
                let c = self.contiguous(x, l)?;
                (c.ptr(), Some(c))
            }
        })
    }

    /// The columns `[n, c_in * kh * kw, oh * ow]` of a dense input.
    fn im2col<E: Float>(&self, x: u64, g: &Geometry) -> Result<CudaStorage<E>> {
        let total = g.n * g.c_in * g.kh * g.kw * g.oh * g.ow;
        let col = self.alloc::<E>(total)?;
        if total > 0 {
            let key = format!("conv/{}", tag(E::DTYPE));
            let f = self.inner().function(&key, || source(E::DTYPE), "im2col")?;
            let (cp, geo, t) = (col.ptr(), g.kernel, total as i64);
            launch!(self, f, cfg_1d(total), x, cp, geo, t)?;
        }
        Ok(col)
    }
}

impl<E: Float> ConvKernel<E> for Cuda {
    fn conv2d(
        &self,
        x: &CudaStorage<E>,
        lx: &Layout,
        w: &CudaStorage<E>,
        lw: &Layout,
        p: &Conv2dParams,
    ) -> Result<CudaStorage<E>> {
        let g = geometry(lx, lw, p)?;
        let (l, kg, cog) = (g.oh * g.ow, g.cg * g.kh * g.kw, g.c_out / g.groups);
        let k_all = g.c_in * g.kh * g.kw;
        let out = self.alloc::<E>(g.n * g.c_out * l)?;
        if out.is_empty() {
            return Ok(out);
        }
        if kg == 0 {
            self.inner()
                .zero(out.ptr(), out.len() * std::mem::size_of::<E>())?;
            return Ok(out);
        }
        let (xp, _xc) = self.dense(x, lx)?;
        let (wp, _wc) = self.dense(w, lw)?;
        let col = self.im2col::<E>(xp, &g)?;
        let sz = std::mem::size_of::<E>();
        for grp in 0..g.groups {
            // out[b, grp] (cog x L) = W[grp] (cog x Kg) @ col[b, grp] (Kg x L)
            let a = mat(wp, grp * cog * kg, sz, kg, false, 0);
            let b = mat(col.ptr(), grp * kg * l, sz, l, false, k_all * l);
            let c = out.ptr() + (grp * cog * l * sz) as u64;
            self.gemm(
                E::DTYPE,
                E::DTYPE,
                (cog, l, kg),
                a,
                b,
                c,
                g.c_out * l,
                g.n,
                0.0,
            )?;
        }
        Ok(out)
    }

    fn conv2d_backward(
        &self,
        x: &CudaStorage<E>,
        lx: &Layout,
        w: &CudaStorage<E>,
        lw: &Layout,
        gy: &CudaStorage<E>,
        lg: &Layout,
        p: &Conv2dParams,
        need: [bool; 2],
    ) -> Result<(Option<CudaStorage<E>>, Option<CudaStorage<E>>)> {
        // Both are computed; the one not asked for is dropped.
        let (dx, dw) = self.conv2d_backward_both(x, lx, w, lw, gy, lg, p)?;
        Ok((need[0].then_some(dx), need[1].then_some(dw)))
    }
}

impl Cuda {
    /// Both gradients of the convolution (see `conv2d_backward`).
    #[allow(clippy::too_many_arguments)] // three operands with their layouts
    fn conv2d_backward_both<E: Float>(
        &self,
        x: &CudaStorage<E>,
        lx: &Layout,
        w: &CudaStorage<E>,
        lw: &Layout,
        gy: &CudaStorage<E>,
        lg: &Layout,
        p: &Conv2dParams,
    ) -> Result<(CudaStorage<E>, CudaStorage<E>)> {
        let g = geometry(lx, lw, p)?;
        let (l, kg, cog) = (g.oh * g.ow, g.cg * g.kh * g.kw, g.c_out / g.groups);
        let k_all = g.c_in * g.kh * g.kw;
        let nx = lx.numel();
        let nw = lw.numel();
        if g.n * g.c_out * l == 0 || kg == 0 {
            // No output element, or no tap: both gradients are zero.
            let dx = self.full(nx, E::zero())?;
            let dw = self.full(nw, E::zero())?;
            return Ok((dx, dw));
        }
        let (xp, _xc) = self.dense(x, lx)?;
        let (wp, _wc) = self.dense(w, lw)?;
        let (gp, _gc) = self.dense(gy, lg)?;
        let col = self.im2col::<E>(xp, &g)?;
        let (ptrs, geo) = ((xp, wp, gp, col.ptr()), (g, l, kg, cog, k_all));
        if E::DTYPE == DType::F64 {
            self.conv_backward_in::<E, f64>(ptrs, geo, nx, nw)
        } else {
            self.conv_backward_in::<E, f32>(ptrs, geo, nx, nw)
        }
    }
}

impl Cuda {
    /// The backward gemms and `col2im` with accumulation type `Acc` (f32, or
    /// f64 for f64): `(x, w, gy, col)` are dense device addresses.
    fn conv_backward_in<E: Float, Acc: Dtype>(
        &self,
        (_xp, wp, gp, colp): (u64, u64, u64, u64),
        (g, l, kg, cog, k_all): (Geometry, usize, usize, usize, usize),
        nx: usize,
        nw: usize,
    ) -> Result<(CudaStorage<E>, CudaStorage<E>)> {
        let sz = std::mem::size_of::<E>();
        let asz = std::mem::size_of::<Acc>();
        // dW[grp] (cog x Kg) = sum_b G[b, grp] (cog x L) @ col[b, grp]^T (L x Kg),
        // accumulated over b in the accumulation type.
        let dw_acc = self.alloc::<Acc>(nw)?;
        for grp in 0..g.groups {
            for bi in 0..g.n {
                let a = mat(gp, (bi * g.c_out + grp * cog) * l, sz, l, false, 0);
                let b = mat(colp, (bi * k_all + grp * kg) * l, sz, l, true, 0);
                let c = dw_acc.ptr() + (grp * cog * kg * asz) as u64;
                let beta = if bi == 0 { 0.0 } else { 1.0 };
                self.gemm(E::DTYPE, Acc::DTYPE, (cog, kg, l), a, b, c, 0, 1, beta)?;
            }
        }
        let dw = self.cast_view::<Acc, E>(&dw_acc, &Layout::contiguous(&[nw]))?;

        // dcol[b, grp] (Kg x L) = W[grp]^T (Kg x cog) @ G[b, grp] (cog x L), then col2im.
        let dcol = self.alloc::<Acc>(g.n * k_all * l)?;
        for grp in 0..g.groups {
            let a = mat(wp, grp * cog * kg, sz, kg, true, 0);
            let b = mat(gp, grp * cog * l, sz, l, false, g.c_out * l);
            let c = dcol.ptr() + (grp * kg * l * asz) as u64;
            self.gemm(
                E::DTYPE,
                Acc::DTYPE,
                (kg, l, cog),
                a,
                b,
                c,
                k_all * l,
                g.n,
                0.0,
            )?;
        }
        let dx = self.alloc::<E>(nx)?;
        if nx > 0 {
            let key = format!("conv/{}", tag(E::DTYPE));
            let f = self.inner().function(&key, || source(E::DTYPE), "col2im")?;
            let (dp, xo, geo, t) = (dcol.ptr(), dx.ptr(), g.kernel, nx as i64);
            launch!(self, f, cfg_1d(nx), dp, xo, geo, t)?;
        }
        Ok((dx, dw))
    }
}
