//! Matrix products with PyTorch's `matmul` rules: a vector operand is promoted
//! to a matrix and the added dim removed afterwards; batch dims broadcast. The
//! inner dimensions are checked at compile time when static ([`MatmulShape`]).

use crate::device::Backend;
use crate::dtype::{DType, Float};
use crate::error::{fmt_dims, Error, Result};
use crate::layout::{broadcast_dims, Layout};
use crate::shape::op::{self, SameDtype};
use crate::shape::{MatmulShape, Shape};
use crate::tape::util::{reshape, sum_to};
use crate::tape::Raw;
use crate::tensor::{ok, Tensor};

/// Backend support for (batched) matrix products.
pub trait MatmulKernel<E: Float>: Backend {
    /// `a` is `[batch.., m, k]` and `b` is `[batch.., k, n]` with the same batch
    /// sizes (broadcast batch dims have stride 0); any strides are allowed. The
    /// result is row-major `[batch.., m, n]`.
    fn matmul(
        &self,
        a: &Self::Storage<E>,
        la: &Layout,
        b: &Self::Storage<E>,
        lb: &Layout,
    ) -> Result<Self::Storage<E>>;

    /// `b`, a `[k, n]` matrix (any strides), packed once for many products
    /// `a @ b` by [`MatmulKernel::matmul_packed`]: a recurrent layer's
    /// weight, read at every time step, is then packed once per sequence.
    /// `Ok(None)` (the default): the backend has no packed form, and the
    /// caller runs [`MatmulKernel::matmul`].
    fn pack_rhs(&self, b: &Self::Storage<E>, lb: &Layout) -> Result<Option<PackedRhs>> {
        let _ = (b, lb);
        Ok(None)
    }

    /// `a @ b` for an `[m, k]` `a` (any strides) and a `b` packed by this
    /// backend's [`MatmulKernel::pack_rhs`]; row-major `[m, n]`, the same
    /// values as [`MatmulKernel::matmul`] on the unpacked `b`. `Ok(None)`
    /// (the default) when the backend cannot run it.
    fn matmul_packed(
        &self,
        a: &Self::Storage<E>,
        la: &Layout,
        b: &PackedRhs,
    ) -> Result<Option<Self::Storage<E>>> {
        let _ = (a, la, b);
        Ok(None)
    }

    /// `x @ w^T + bias` for an `[m, k]` `x` and `w^T` packed by this
    /// backend's [`MatmulKernel::pack_rhs`] (a compiled model's weight,
    /// packed once for every call): the same values as
    /// [`crate::ops::linear::LinearKernel::linear`] gives for these
    /// operands. `Ok(None)` (the default) when the backend cannot, or when
    /// its unpacked product would not pack the weight either (a single
    /// row, a product read in place): the caller then runs the plain op.
    fn linear_packed(
        &self,
        x: (&Self::Storage<E>, &Layout),
        w: &PackedRhs,
        bias: Option<(&Self::Storage<E>, &Layout)>,
    ) -> Result<Option<Self::Storage<E>>> {
        let _ = (x, w, bias);
        Ok(None)
    }

    /// Whether [`MatmulKernel::matmul_low`] runs for this dtype and `low`
    /// (bf16 or f16): then autocast's products call it, one kernel each,
    /// instead of rounding their operands and result as ops of their own.
    /// `false` (the default): autocast rounds around [`MatmulKernel::matmul`].
    fn has_matmul_low(&self, low: DType) -> bool {
        let _ = low;
        false
    }

    /// `a @ b (+ bias)` as autocast computes it in `low`: each operand's
    /// values rounded to `low`, the products summed in f32, then the bias
    /// (rounded to `low`, `[n]`, only with rank-2 operands) added to each
    /// finished sum, and the results rounded to `low` when `round` (left as
    /// they are when the caller sums them further), all stored in `E`.
    /// Operands as for [`MatmulKernel::matmul`]. Called only where
    /// [`MatmulKernel::has_matmul_low`] says yes; the default is an error.
    #[allow(clippy::too_many_arguments)]
    fn matmul_low(
        &self,
        a: (&Self::Storage<E>, &Layout),
        b: (&Self::Storage<E>, &Layout),
        bias: Option<(&Self::Storage<E>, &Layout)>,
        low: DType,
        round: bool,
    ) -> Result<Self::Storage<E>> {
        let _ = (a, b, bias, round);
        Err(Error::invalid(
            "matmul",
            format!("{} has no {low} product for {}", self.name(), E::DTYPE),
        ))
    }

    /// `b` (`[k, n]`, any strides) packed once as
    /// [`MatmulKernel::matmul_low`] packs its right operand in `low`, for
    /// [`MatmulKernel::linear_low_packed`]: the weight of a linear layer
    /// under autocast in inference. `Ok(None)` (the default): no such form.
    fn pack_rhs_low(
        &self,
        b: (&Self::Storage<E>, &Layout),
        low: DType,
    ) -> Result<Option<PackedRhs>> {
        let _ = (b, low);
        Ok(None)
    }

    /// [`MatmulKernel::matmul_low`] of an `[m, k]` `x` (any strides) and a
    /// right operand packed by [`MatmulKernel::pack_rhs_low`] in the same
    /// `low`: the same values, bit for bit. `Ok(None)` (the default) when
    /// the backend cannot run it; the caller then runs `matmul_low`.
    fn linear_low_packed(
        &self,
        x: (&Self::Storage<E>, &Layout),
        w: &PackedRhs,
        bias: Option<(&Self::Storage<E>, &Layout)>,
        low: DType,
        round: bool,
    ) -> Result<Option<Self::Storage<E>>> {
        let _ = (x, w, bias, low, round);
        Ok(None)
    }
}

/// A right operand a backend packed for repeated products
/// ([`MatmulKernel::pack_rhs`]).
#[derive(Clone)]
pub struct PackedRhs {
    /// Rows: the products' depth.
    pub k: usize,
    /// Columns.
    pub n: usize,
    /// The backend's packed copy.
    pub data: std::sync::Arc<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for PackedRhs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedRhs({} x {})", self.k, self.n)
    }
}

impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
    /// Matrix product, like `a @ b`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let a = Tensor::<(C<2>, C<3>)>::ones();
    /// let b = Tensor::<(C<3>, C<4>)>::ones();
    /// let c: Tensor<(C<2>, C<4>)> = a.matmul(&b);
    /// assert_eq!(c.to_vec(), vec![3.0; 8]);
    /// ```
    ///
    /// # Panics
    /// If `Dyn` sizes disagree at run time (see [`Tensor::try_matmul`]).
    #[track_caller]
    pub fn matmul<S2: Shape, E2: SameDtype<E, op::matmul>>(
        &self,
        rhs: &Tensor<S2, E2, D>,
    ) -> Tensor<<S as MatmulShape<S2>>::Output, E, D>
    where
        S: MatmulShape<S2>,
    {
        ok(self.try_matmul(E2::same(rhs)))
    }

    fn try_matmul_unnoted<S2: Shape>(
        &self,
        rhs: &Tensor<S2, E, D>,
    ) -> Result<Tensor<<S as MatmulShape<S2>>::Output, E, D>>
    where
        S: MatmulShape<S2>,
    {
        self.same_device("matmul", rhs)?;
        let low = crate::autocast::target::<E, D>(&self.device);
        if let Some(low) = low.filter(|&l| !self.device.has_matmul_low(l)) {
            // No low-precision kernel: round the operands and the result as
            // ops of their own around the plain product.
            let _inner = crate::autocast::suspend();
            let (a, b) = (self.try_round_to(low)?, rhs.try_round_to(low)?);
            return a.try_matmul_unnoted(&b)?.try_round_to(low);
        }
        // Promote vectors: [k] -> [1, k] on the left, [k] -> [k, 1] on the right.
        let la = if S::RANK == 1 {
            self.layout.insert_axis(0)
        } else {
            self.layout
        };
        let lb = if S2::RANK == 1 {
            rhs.layout.insert_axis(1)
        } else {
            rhs.layout
        };
        let (ra, rb) = (la.rank(), lb.rank());
        let (m, k) = (la.dims[ra - 2], la.dims[ra - 1]);
        let (k2, n) = (lb.dims[rb - 2], lb.dims[rb - 1]);
        if k != k2 {
            return Err(Error::shape(
                "matmul",
                format!(
                    "[.., {k}, _] (the left operand is {})",
                    fmt_dims(&self.layout.dims)
                ),
                &rhs.layout.dims,
            ));
        }
        let batch = broadcast_dims(&la.dims[..ra - 2], &lb.dims[..rb - 2]).ok_or_else(|| {
            Error::shape(
                "matmul",
                format!(
                    "batch dims that broadcast with {}",
                    fmt_dims(&la.dims[..ra - 2])
                ),
                &lb.dims[..rb - 2],
            )
        })?;
        let full =
            |extra: [usize; 2]| -> Vec<usize> { batch.iter().copied().chain(extra).collect() };
        let (pa, pb) = (la.dims, lb.dims);
        let la = la.broadcast_to(&full([m, k]));
        let lb = lb.broadcast_to(&full([k, n]));
        let mut out = full([m, n]);
        // Drop the promoted dims again.
        if S2::RANK == 1 {
            out.pop();
        }
        if S::RANK == 1 {
            out.remove(out.len() - if S2::RANK == 1 { 1 } else { 2 });
        }
        crate::ops::binary::check_broadcast_type::<<S as MatmulShape<S2>>::Output>("matmul", &out)?;
        let s = product(
            &self.device,
            (&self.storage(), &la),
            (&rhs.storage(), &lb),
            low,
            true,
        )?;
        let (ar, br) = (
            Raw {
                layout: la,
                ..self.raw()
            },
            Raw {
                layout: lb,
                ..rhs.raw()
            },
        );
        let (da, db, gfull) = (self.layout.dims, rhs.layout.dims, full([m, n]));
        // Whether an operand's gradient is summed over broadcast batch dims
        // (then autocast rounds the sum, not each product).
        let (sum_a, sum_b) = (la.dims != pa, lb.dims != pb);
        let (need_a, need_b) = (self.var.is_some(), rhs.var.is_some());
        Ok(Tensor::from_storage(s, &out, self.device.clone()).record(
            "matmul",
            &[self.var.clone(), rhs.var.clone()],
            [need_a.then(|| br.saved()), need_b.then(|| ar.saved())]
                .into_iter()
                .flatten()
                .collect(),
            move |g| {
                let g = reshape(g, &gfull)?;
                let r = g.layout.rank();
                let dev = &g.device;
                // dA = dC @ B^T and dB = A^T @ dC, then summed over broadcast batch
                // dims; only operands on the tape get one (an input batch needs none).
                let ga = match need_a {
                    true => {
                        let ga = product(
                            dev,
                            (&g.storage(), &g.layout),
                            (&br.storage(), &br.layout.swap(r - 2, r - 1)),
                            low,
                            !sum_a,
                        )?;
                        let ga = sum_to(&Raw::new(ga, &ar.layout.dims, dev.clone()), &pa)?;
                        Some(reshape(&rounded(ga, low, sum_a)?, &da)?)
                    }
                    false => None,
                };
                let gb = match need_b {
                    // A transposed right operand (the `x @ w.t()` of a linear
                    // layer): its gradient is computed as `(dC^T @ A)^T`, row-major
                    // in `w`'s own orientation, so the transpose's backward hands
                    // `w` a dense gradient instead of a strided one to copy.
                    true if transposed(&br.layout) => {
                        let gbt = product(
                            dev,
                            (&g.storage(), &g.layout.swap(r - 2, r - 1)),
                            (&ar.storage(), &ar.layout),
                            low,
                            !sum_b,
                        )?;
                        let mut tdims = br.layout.dims;
                        tdims.swap(r - 2, r - 1);
                        let gbt = Raw::new(gbt, &tdims, dev.clone());
                        let gb = Raw {
                            layout: gbt.layout.swap(r - 2, r - 1),
                            ..gbt
                        };
                        Some(reshape(&rounded(sum_to(&gb, &pb)?, low, sum_b)?, &db)?)
                    }
                    true => {
                        let gb = product(
                            dev,
                            (&ar.storage(), &ar.layout.swap(r - 2, r - 1)),
                            (&g.storage(), &g.layout),
                            low,
                            !sum_b,
                        )?;
                        let gb = sum_to(&Raw::new(gb, &br.layout.dims, dev.clone()), &pb)?;
                        Some(reshape(&rounded(gb, low, sum_b)?, &db)?)
                    }
                    false => None,
                };
                Ok(vec![ga, gb])
            },
        ))
    }

    /// Fallible [`Tensor::matmul`].
    ///
    /// # Errors
    /// A [`crate::ShapeError`] when the inner sizes or the batch sizes disagree.
    pub fn try_matmul<S2: Shape, E2: SameDtype<E, op::matmul>>(
        &self,
        rhs: &Tensor<S2, E2, D>,
    ) -> Result<Tensor<<S as MatmulShape<S2>>::Output, E, D>>
    where
        S: MatmulShape<S2>,
    {
        let rhs = E2::same(rhs);
        let y = self.try_matmul_unnoted(rhs)?;
        Ok(y.noted(|| (crate::graph::Op::Matmul, vec![self.val(), rhs.val()])))
    }
}

/// `a @ b` by the backend: its plain product, or under autocast (`low`)
/// its low-precision one, rounding the result when `round`.
pub(crate) fn product<E: Float, D: MatmulKernel<E>>(
    dev: &D,
    a: (&D::Storage<E>, &Layout),
    b: (&D::Storage<E>, &Layout),
    low: Option<DType>,
    round: bool,
) -> Result<D::Storage<E>> {
    match low {
        Some(low) => dev.matmul_low(a, b, None, low, round),
        None => dev.matmul(a.0, a.1, b.0, b.1),
    }
}

/// `r` rounded to `low` when autocast is on (`low`) and the product that
/// made it did not round it already (`pending`).
pub(crate) fn rounded<E: Float, D: crate::device::Device<E>>(
    r: Raw<E, D>,
    low: Option<DType>,
    pending: bool,
) -> Result<Raw<E, D>> {
    match low {
        Some(low) if pending => crate::autocast::round_raw(&r, low),
        _ => Ok(r),
    }
}

/// Whether the matrices of `l` (its last two dims) are stored transposed:
/// unit stride down the rows, not along them.
fn transposed(l: &Layout) -> bool {
    let r = l.rank();
    l.strides[r - 2] == 1 && l.strides[r - 1] > 1 && l.dims[r - 2] > 1
}
