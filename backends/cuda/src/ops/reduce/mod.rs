//! [`ReduceKernel`] for [`Cuda`]: reductions along one axis, one block per
//! output over a dense `[outer, n, inner]` view of the input (a copy first
//! when the view is not dense). The result is row-major over the other axes,
//! as the CPU's.

use crate::device::cfg_lanes;
use crate::kernels::{float_module, tag};
use crate::{Cuda, CudaStorage};
use forma_core::ops::reduce::{ArgReduceOp, ReduceKernel, ReduceOp};
use forma_core::{Backend, DType, Error, Float, Layout, Result};

/// The reduction module source for dtype `d`.
pub(crate) fn source(d: DType) -> String {
    float_module(d, include_str!("reduce.cu"))
}

/// A dense `[outer, n, inner]` view around `axis`: the device address of its
/// first element, the sizes, and the copy that holds it (if one was needed).
pub(crate) struct Lanes<E> {
    pub(crate) ptr: u64,
    pub(crate) outer: usize,
    pub(crate) n: usize,
    pub(crate) inner: usize,
    _copy: Option<CudaStorage<E>>,
}

impl Cuda {
    /// The dense lanes of `axis` of a view.
    pub(crate) fn lanes<E: Float>(
        &self,
        x: &CudaStorage<E>,
        layout: &Layout,
        axis: usize,
    ) -> Result<Lanes<E>> {
        let d = &layout.dims;
        let outer = d[..axis].iter().product();
        let inner = d[axis + 1..].iter().product();
        let (ptr, copy) = match layout.contiguous_range() {
            Some(r) => (x.ptr_at(r.start), None),
            None => {
                let c = self.contiguous(x, layout)?;
                (c.ptr(), Some(c))
            }
        };
        Ok(Lanes {
            ptr,
            outer,
            n: d[axis],
            inner,
            _copy: copy,
        })
    }
}

fn empty_axis(op: &'static str) -> Error {
    Error::invalid(op, "cannot reduce an empty axis")
}

impl<E: Float> ReduceKernel<E> for Cuda {
    fn reduce(
        &self,
        op: ReduceOp,
        x: &CudaStorage<E>,
        layout: &Layout,
        axis: usize,
    ) -> Result<CudaStorage<E>> {
        let n = layout.dims[axis];
        let (code, div): (i32, f64) = match op {
            ReduceOp::Sum => (0, 0.0),
            ReduceOp::Mean => (1, 0.0),
            ReduceOp::Max if n == 0 => return Err(empty_axis("max")),
            ReduceOp::Min if n == 0 => return Err(empty_axis("min")),
            ReduceOp::Max => (2, 0.0),
            ReduceOp::Min => (3, 0.0),
            ReduceOp::Prod => (4, 0.0),
            ReduceOp::LogSumExp => (5, 0.0),
            // PyTorch divides by max(n - ddof, 0).
            ReduceOp::Var { ddof } => (6, n.saturating_sub(ddof) as f64),
        };
        let l = self.lanes(x, layout, axis)?;
        let m = l.outer * l.inner;
        let out = self.alloc::<E>(m)?;
        if m == 0 {
            return Ok(out);
        }
        let key = format!("reduce/{}", tag(E::DTYPE));
        let f = self.inner().function(&key, || source(E::DTYPE), "reduce")?;
        let (op_, o, nn, i) = (out.ptr(), l.outer as i64, l.n as i64, l.inner as i64);
        launch!(self, f, cfg_lanes(m, 0), code, l.ptr, op_, o, nn, i, div)?;
        Ok(out)
    }

    fn arg_reduce(
        &self,
        op: ArgReduceOp,
        x: &CudaStorage<E>,
        layout: &Layout,
        axis: usize,
    ) -> Result<CudaStorage<i64>> {
        let (name, is_min) = match op {
            ArgReduceOp::ArgMax => ("argmax", 0i32),
            ArgReduceOp::ArgMin => ("argmin", 1i32),
        };
        if layout.dims[axis] == 0 {
            return Err(empty_axis(name));
        }
        let l = self.lanes(x, layout, axis)?;
        let m = l.outer * l.inner;
        let out = self.alloc::<i64>(m)?;
        if m == 0 {
            return Ok(out);
        }
        let key = format!("reduce/{}", tag(E::DTYPE));
        let f = self
            .inner()
            .function(&key, || source(E::DTYPE), "arg_reduce")?;
        let (op_, o, nn, i) = (out.ptr(), l.outer as i64, l.n as i64, l.inner as i64);
        launch!(self, f, cfg_lanes(m, 0), is_min, l.ptr, op_, o, nn, i)?;
        Ok(out)
    }
}
