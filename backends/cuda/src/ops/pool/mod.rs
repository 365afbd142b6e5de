//! [`PoolKernel`] for [`Cuda`]: 2-d max and average pooling and their
//! gradients, one thread per output or input element.

use crate::device::cfg_1d;
use crate::kernels::{float_module, tag};
use crate::{Cuda, CudaStorage};
use cudarc::driver::DeviceRepr;
use forma_core::ops::pool::{check_pool, Pool2dParams, PoolKernel};
use forma_core::{Backend, DType, Float, Layout, Result};

/// The pooling module source for dtype `d`.
pub(crate) fn source(d: DType) -> String {
    float_module(d, include_str!("pool.cu"))
}

/// `struct PoolGeo` of `pool.cu`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PoolGeo {
    h: i64,
    w: i64,
    oh: i64,
    ow: i64,
    kh: i32,
    kw: i32,
    sh: i32,
    sw: i32,
    ph: i32,
    pw: i32,
    dh: i32,
    dw: i32,
    incl: i32,
}

// SAFETY: plain `repr(C)` data matching the CUDA struct.
unsafe impl DeviceRepr for PoolGeo {}

/// Validates a pooling call with core's checks; `[n, c, h, w]`.
fn check(op: &'static str, lx: &Layout, p: &Pool2dParams) -> Result<[usize; 4]> {
    check_pool(op, &lx.dims, p)?;
    let d = &lx.dims;
    Ok([d[0], d[1], d[2], d[3]])
}

fn geo(d: [usize; 4], out: [usize; 2], p: &Pool2dParams) -> PoolGeo {
    PoolGeo {
        h: d[2] as i64,
        w: d[3] as i64,
        oh: out[0] as i64,
        ow: out[1] as i64,
        kh: p.kernel[0] as i32,
        kw: p.kernel[1] as i32,
        sh: p.stride[0] as i32,
        sw: p.stride[1] as i32,
        ph: p.padding[0] as i32,
        pw: p.padding[1] as i32,
        dh: p.dilation[0] as i32,
        dw: p.dilation[1] as i32,
        incl: i32::from(p.count_include_pad),
    }
}

impl Cuda {
    fn dense_of<E: Float>(
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

    fn pool_fwd<E: Float>(
        &self,
        name: &'static str,
        kernel: &str,
        x: &CudaStorage<E>,
        lx: &Layout,
        p: &Pool2dParams,
        out: [usize; 2],
    ) -> Result<CudaStorage<E>> {
        let d = check(name, lx, p)?;
        let total = d[0] * d[1] * out[0] * out[1];
        let y = self.alloc::<E>(total)?;
        if total == 0 {
            return Ok(y);
        }
        if d[2] * d[3] == 0 {
            // An empty plane: every window is empty (max gives -inf, avg 0).
            let v = if kernel == "max_pool" {
                E::neg_infinity()
            } else {
                E::zero()
            };
            self.fill(y.ptr(), total, v)?;
            return Ok(y);
        }
        let (xp, _xc) = self.dense_of(x, lx)?;
        let key = format!("pool/{}", tag(E::DTYPE));
        let f = self.inner().function(&key, || source(E::DTYPE), kernel)?;
        let (yp, g, t) = (y.ptr(), geo(d, out, p), total as i64);
        launch!(self, f, cfg_1d(total), xp, yp, g, t)?;
        Ok(y)
    }
}

impl<E: Float> PoolKernel<E> for Cuda {
    fn max_pool2d(
        &self,
        x: &CudaStorage<E>,
        lx: &Layout,
        p: &Pool2dParams,
        out: [usize; 2],
    ) -> Result<CudaStorage<E>> {
        self.pool_fwd("max_pool2d", "max_pool", x, lx, p, out)
    }

    fn avg_pool2d(
        &self,
        x: &CudaStorage<E>,
        lx: &Layout,
        p: &Pool2dParams,
        out: [usize; 2],
    ) -> Result<CudaStorage<E>> {
        self.pool_fwd("avg_pool2d", "avg_pool", x, lx, p, out)
    }

    fn max_pool2d_backward(
        &self,
        x: &CudaStorage<E>,
        lx: &Layout,
        g: &CudaStorage<E>,
        lg: &Layout,
        p: &Pool2dParams,
    ) -> Result<CudaStorage<E>> {
        let d = check("max_pool2d_backward", lx, p)?;
        let out = [lg.dims[2], lg.dims[3]];
        let total = lx.numel();
        let dx = self.alloc::<E>(total)?;
        if total == 0 {
            return Ok(dx);
        }
        if out[0] * out[1] == 0 {
            self.fill(dx.ptr(), total, E::zero())?;
            return Ok(dx);
        }
        let (xp, _xc) = self.dense_of(x, lx)?;
        let (gp, _gc) = self.dense_of(g, lg)?;
        let key = format!("pool/{}", tag(E::DTYPE));
        let f = self
            .inner()
            .function(&key, || source(E::DTYPE), "max_pool_bwd")?;
        let (dp, ge, t) = (dx.ptr(), geo(d, out, p), total as i64);
        launch!(self, f, cfg_1d(total), xp, gp, dp, ge, t)?;
        Ok(dx)
    }

    fn avg_pool2d_backward(
        &self,
        lx: &Layout,
        g: &CudaStorage<E>,
        lg: &Layout,
        p: &Pool2dParams,
    ) -> Result<CudaStorage<E>> {
        let d = check("avg_pool2d_backward", lx, p)?;
        let out = [lg.dims[2], lg.dims[3]];
        let total = lx.numel();
        let dx = self.alloc::<E>(total)?;
        if total == 0 {
            return Ok(dx);
        }
        if out[0] * out[1] == 0 {
            self.fill(dx.ptr(), total, E::zero())?;
            return Ok(dx);
        }
        let (gp, _gc) = self.dense_of(g, lg)?;
        let key = format!("pool/{}", tag(E::DTYPE));
        let f = self
            .inner()
            .function(&key, || source(E::DTYPE), "avg_pool_bwd")?;
        let (dp, ge, t) = (dx.ptr(), geo(d, out, p), total as i64);
        launch!(self, f, cfg_1d(total), gp, dp, ge, t)?;
        Ok(dx)
    }
}
