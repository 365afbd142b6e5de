//! Reductions over a typed axis (`sum::<1>()`), keeping the axis as a
//! broadcasting [`One`] (`sum_keepdim::<1>()`) or dropping it, and over the whole
//! tensor (`sum_all()`). An axis the tensor lacks is a compile error
//! ([`HasAxis`]). Half types accumulate in f32.

use crate::device::Backend;
use crate::device::Device;
use crate::dtype::Float;
use crate::error::Result;
use crate::graph::Op;
use crate::layout::Layout;
use crate::shape::{op, AxisOf, Dyn, HasAxis, One, Shape};
use crate::tape::util::reshape;
use crate::tape::Raw;
use crate::tensor::{ok, Tensor};

/// A reduction along one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum (0 over an empty axis).
    Sum,
    /// Mean (NaN over an empty axis).
    Mean,
    /// Maximum (NaN if any element is NaN; an error over an empty axis).
    Max,
    /// Minimum (NaN if any element is NaN; an error over an empty axis).
    Min,
    /// Product (1 over an empty axis).
    Prod,
    /// `log(sum(exp(x)))`, computed stably.
    LogSumExp,
    /// Variance with `ddof` degrees of freedom removed (0 biased, 1 unbiased).
    Var {
        /// Delta degrees of freedom.
        ddof: usize,
    },
}

impl ReduceOp {
    /// The op's name, for the tape and error messages.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Prod => "prod",
            ReduceOp::LogSumExp => "logsumexp",
            ReduceOp::Var { .. } => "var",
        }
    }
}

/// The 3-d view `[outer, n, inner]` of `r` around `axis` (a copy if `r` is not
/// contiguous), where reduction `axis` becomes the middle one.
pub(crate) fn around_axis<E: Float, D: Device<E>>(
    r: &Raw<E, D>,
    axis: usize,
) -> Result<Tensor<(Dyn, Dyn, Dyn), E, D>> {
    let d = &r.layout.dims;
    let (o, n, i) = (
        d[..axis].iter().product(),
        d[axis],
        d[axis + 1..].iter().product(),
    );
    Tensor::from_raw(reshape(r, &[o, n, i])?)
}

/// Like [`around_axis`] for a reduced tensor (`n` = 1, as a broadcasting `One`),
/// given the unreduced `x`'s sizes.
pub(crate) fn reduced_around_axis<E: Float, D: Device<E>>(
    r: &Raw<E, D>,
    x: &Layout,
    axis: usize,
) -> Result<Tensor<(Dyn, One, Dyn), E, D>> {
    let d = &x.dims;
    let (o, i) = (d[..axis].iter().product(), d[axis + 1..].iter().product());
    Tensor::from_raw(reshape(r, &[o, 1, i])?)
}

/// The gradient of `x` for `y = op(x)` along `axis`, from `y`'s gradient `g`
/// (any dims holding `y`'s elements); returned as `[outer, n, inner]`.
fn reduce_backward<E: Float, D: Device<E>>(
    op: ReduceOp,
    x: &Raw<E, D>,
    y: &Raw<E, D>,
    axis: usize,
    g: &Raw<E, D>,
) -> Result<Raw<E, D>> {
    let x3 = around_axis(x, axis)?;
    let (y3, g3) = (
        reduced_around_axis(y, &x.layout, axis)?,
        reduced_around_axis(g, &x.layout, axis)?,
    );
    let n = x3.size(1);
    let full = x3.shape();
    let gx: Tensor<(Dyn, Dyn, Dyn), E, D> = match op {
        ReduceOp::Sum => g3.expand(full).contiguous(),
        ReduceOp::Mean => g3.div_scalar(n as f64).expand(full).contiguous(),
        ReduceOp::Max | ReduceOp::Min => {
            // Ties share the gradient evenly, as PyTorch's amax/amin do.
            let hits: Tensor<(Dyn, Dyn, Dyn), E, D> = x3.eq(&y3).to_dtype();
            let count = hits.sum_keepdim::<1>();
            &(&hits * &g3) / &count
        }
        ReduceOp::LogSumExp => &(&x3 - &y3).exp() * &g3,
        ReduceOp::Var { ddof } => {
            let centred = &x3 - &x3.mean_keepdim::<1>();
            (&centred * &g3).mul_scalar(2.0 / (n as f64 - ddof as f64))
        }
        ReduceOp::Prod => prod_backward(&x3, &g3)?,
    };
    Ok(gx.raw())
}

/// The gradient of a product: each element gets the product of the others in
/// its lane (prefix times suffix products, so zeros are handled exactly).
fn prod_backward<E: Float, D: Device<E>>(
    x3: &Tensor<(Dyn, Dyn, Dyn), E, D>,
    g3: &Tensor<(Dyn, One, Dyn), E, D>,
) -> Result<Tensor<(Dyn, Dyn, Dyn), E, D>> {
    let (o, n, i) = (x3.size(0), x3.size(1), x3.size(2));
    let (x, g) = (x3.try_to_vec()?, g3.try_to_vec()?);
    let mut out = vec![E::from_f64(0.0); x.len()];
    for a in 0..o {
        for c in 0..i {
            let at = |k: usize| x[(a * n + k) * i + c].to_acc();
            let one = <E::Acc as num_traits::One>::one();
            let mut suffix = vec![one; n + 1];
            for k in (0..n).rev() {
                suffix[k] = suffix[k + 1] * at(k);
            }
            let mut prefix = one;
            for k in 0..n {
                out[(a * n + k) * i + c] =
                    E::from_acc(g[a * i + c].to_acc() * prefix * suffix[k + 1]);
                prefix = prefix * at(k);
            }
        }
    }
    Tensor::from_vec_on(out, x3.shape(), x3.device())
}

/// An index-returning reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgReduceOp {
    /// Index of the first maximum (NaN counts as the maximum).
    ArgMax,
    /// Index of the first minimum (NaN counts as the minimum).
    ArgMin,
}

/// Backend support for reductions.
pub trait ReduceKernel<E: Float>: Backend {
    /// Reduces `axis` of the view. The result is row-major over the other axes
    /// in order (the same data serves the keepdim and dropped shapes).
    fn reduce(
        &self,
        op: ReduceOp,
        x: &Self::Storage<E>,
        layout: &Layout,
        axis: usize,
    ) -> Result<Self::Storage<E>>;
    /// Index of the extreme value along `axis`, as `i64`, laid out like [`ReduceKernel::reduce`].
    fn arg_reduce(
        &self,
        op: ArgReduceOp,
        x: &Self::Storage<E>,
        layout: &Layout,
        axis: usize,
    ) -> Result<Self::Storage<i64>>;
}

impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
    /// Reduces `axis` of `x` (or of the flattened tensor when `axis` is
    /// `None`) into a tensor of `out_dims`, recording the backward.
    fn reduce_recorded<S2: Shape>(
        &self,
        op: ReduceOp,
        axis: Option<usize>,
        out_dims: &[usize],
    ) -> Result<Tensor<S2, E, D>> {
        let (x, ax) = match axis {
            Some(a) => (self.raw(), a),
            None => (reshape(&self.raw(), &[self.numel()])?, 0),
        };
        let s = self.device.reduce(op, &x.storage(), &x.layout, ax)?;
        let y = Tensor::<S2, E, D>::from_storage(s, out_dims, self.device.clone());
        let (yr, in_dims) = (y.raw(), self.layout.dims);
        // Sum and mean need neither value; the others read the input, and
        // max, min, prod and logsumexp the output too.
        let saved = match op {
            ReduceOp::Sum | ReduceOp::Mean => vec![],
            ReduceOp::Var { .. } => vec![x.saved()],
            _ => vec![x.saved(), yr.saved()],
        };
        Ok(y.record(
            op.name(),
            std::slice::from_ref(&self.var),
            saved,
            move |g| {
                let gx = reduce_backward(op, &x, &yr, ax, g)?;
                Ok(vec![Some(reshape(&gx, &in_dims)?)])
            },
        )
        .noted(|| {
            let keepdim = axis.is_some() && out_dims.len() == S::RANK;
            (Op::Reduce { op, axis, keepdim }, vec![self.val()])
        }))
    }

    /// Reduces axis `AX` (dropping it) with `op`: the entry point of the named reductions.
    ///
    /// # Errors
    /// Max/min over an empty axis.
    pub fn try_reduce<const AX: isize>(
        &self,
        op: ReduceOp,
    ) -> Result<Tensor<<S as AxisOf<AX, op::try_reduce>>::Removed, E, D>>
    where
        S: AxisOf<AX, op::try_reduce>,
    {
        Ok(self.reduce_at::<AX>(op)?.retype())
    }

    pub(crate) fn reduce_at<const AX: isize>(
        &self,
        op: ReduceOp,
    ) -> Result<Tensor<<S as HasAxis<AX>>::Removed, E, D>>
    where
        S: HasAxis<AX>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        self.reduce_recorded(op, Some(ax), &self.layout.remove_axis(ax).dims)
    }

    /// Reduces axis `AX` with `op`, keeping it as a size-1 [`One`].
    ///
    /// # Errors
    /// Max/min over an empty axis.
    pub fn try_reduce_keepdim<const AX: isize>(
        &self,
        op: ReduceOp,
    ) -> Result<Tensor<<S as AxisOf<AX, op::try_reduce>>::Replaced<One>, E, D>>
    where
        S: AxisOf<AX, op::try_reduce>,
    {
        Ok(self.reduce_keepdim_at::<AX>(op)?.retype())
    }

    pub(crate) fn reduce_keepdim_at<const AX: isize>(
        &self,
        op: ReduceOp,
    ) -> Result<Tensor<<S as HasAxis<AX>>::Replaced<One>, E, D>>
    where
        S: HasAxis<AX>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        let mut dims = self.layout.dims;
        dims[ax] = 1;
        self.reduce_recorded(op, Some(ax), &dims)
    }

    /// Reduces every element with `op` to a scalar.
    ///
    /// # Errors
    /// Max/min of an empty tensor.
    pub fn try_reduce_all(&self, op: ReduceOp) -> Result<Tensor<(), E, D>> {
        self.reduce_recorded(op, None, &[])
    }

    /// Index of the extreme along `AX`, as a tensor of `dims` (the input's
    /// with `AX` dropped, or kept as size 1 when `keepdim`).
    fn try_arg<const AX: isize, S2: Shape>(
        &self,
        op: ArgReduceOp,
        keepdim: bool,
    ) -> Result<Tensor<S2, i64, D>>
    where
        S: HasAxis<AX>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        let s = self
            .device
            .arg_reduce(op, &self.storage(), &self.layout, ax)?;
        let dims = if keepdim {
            let mut dims = self.layout.dims;
            dims[ax] = 1;
            dims
        } else {
            self.layout.remove_axis(ax).dims
        };
        Ok(
            Tensor::from_storage(s, &dims, self.device.clone()).noted(|| {
                let op = Op::ArgReduce {
                    op,
                    axis: ax,
                    keepdim,
                };
                (op, vec![self.val()])
            }),
        )
    }

    /// Index of the first maximum along `AX`, like `x.argmax(ax)`; NaN
    /// counts as the maximum.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<2>, C<3>)>::from_vec(vec![1., 5., 5., 7., 0., 2.], (C, C)).unwrap();
    /// assert_eq!(x.argmax::<1>().to_vec(), [1, 0]);
    /// assert_eq!(x.argmax_keepdim::<0>().dims()[..], [1, 3]);
    /// assert_eq!(x.argmax_all().to_vec(), [3]);
    /// ```
    ///
    /// # Panics
    /// If the axis is empty; see [`Tensor::try_argmax`].
    #[track_caller]
    pub fn argmax<const AX: isize>(&self) -> Tensor<<S as AxisOf<AX, op::argmax>>::Removed, i64, D>
    where
        S: AxisOf<AX, op::argmax>,
    {
        ok(self.try_argmax::<AX>())
    }

    /// [`Tensor::argmax`], returning an error where PyTorch raises.
    ///
    /// # Errors
    /// An empty axis (PyTorch: "cannot perform reduction function argmax
    /// on a tensor with no elements").
    pub fn try_argmax<const AX: isize>(
        &self,
    ) -> Result<Tensor<<S as AxisOf<AX, op::argmax>>::Removed, i64, D>>
    where
        S: AxisOf<AX, op::argmax>,
    {
        self.try_arg::<AX, _>(ArgReduceOp::ArgMax, false)
    }

    /// [`Tensor::argmax`] keeping the axis as size 1, like `x.argmax(ax, keepdim=True)`.
    ///
    /// # Panics
    /// If the axis is empty.
    #[track_caller]
    pub fn argmax_keepdim<const AX: isize>(
        &self,
    ) -> Tensor<<S as AxisOf<AX, op::argmax>>::Replaced<One>, i64, D>
    where
        S: AxisOf<AX, op::argmax>,
    {
        ok(self.try_arg::<AX, _>(ArgReduceOp::ArgMax, true))
    }

    /// Index of the first minimum along `AX`, like `x.argmin(ax)`; NaN
    /// counts as the minimum.
    ///
    /// # Panics
    /// If the axis is empty; see [`Tensor::try_argmin`].
    #[track_caller]
    pub fn argmin<const AX: isize>(&self) -> Tensor<<S as AxisOf<AX, op::argmin>>::Removed, i64, D>
    where
        S: AxisOf<AX, op::argmin>,
    {
        ok(self.try_argmin::<AX>())
    }

    /// [`Tensor::argmin`], returning an error where PyTorch raises.
    ///
    /// # Errors
    /// An empty axis.
    pub fn try_argmin<const AX: isize>(
        &self,
    ) -> Result<Tensor<<S as AxisOf<AX, op::argmin>>::Removed, i64, D>>
    where
        S: AxisOf<AX, op::argmin>,
    {
        self.try_arg::<AX, _>(ArgReduceOp::ArgMin, false)
    }

    /// [`Tensor::argmin`] keeping the axis as size 1, like `x.argmin(ax, keepdim=True)`.
    ///
    /// # Panics
    /// If the axis is empty.
    #[track_caller]
    pub fn argmin_keepdim<const AX: isize>(
        &self,
    ) -> Tensor<<S as AxisOf<AX, op::argmin>>::Replaced<One>, i64, D>
    where
        S: AxisOf<AX, op::argmin>,
    {
        ok(self.try_arg::<AX, _>(ArgReduceOp::ArgMin, true))
    }

    /// Index of the first maximum of the flattened tensor, like `x.argmax()`.
    ///
    /// # Panics
    /// If the tensor is empty; see [`Tensor::try_argmax_all`].
    #[track_caller]
    pub fn argmax_all(&self) -> Tensor<(), i64, D> {
        ok(self.try_argmax_all())
    }

    /// [`Tensor::argmax_all`], returning an error where PyTorch raises.
    ///
    /// # Errors
    /// An empty tensor.
    pub fn try_argmax_all(&self) -> Result<Tensor<(), i64, D>> {
        self.try_reshape_to((Dyn(self.numel()),))?
            .try_arg::<0, _>(ArgReduceOp::ArgMax, false)
    }

    /// Index of the first minimum of the flattened tensor, like `x.argmin()`.
    ///
    /// # Panics
    /// If the tensor is empty; see [`Tensor::try_argmin_all`].
    #[track_caller]
    pub fn argmin_all(&self) -> Tensor<(), i64, D> {
        ok(self.try_argmin_all())
    }

    /// [`Tensor::argmin_all`], returning an error where PyTorch raises.
    ///
    /// # Errors
    /// An empty tensor.
    pub fn try_argmin_all(&self) -> Result<Tensor<(), i64, D>> {
        self.try_reshape_to((Dyn(self.numel()),))?
            .try_arg::<0, _>(ArgReduceOp::ArgMin, false)
    }

    /// Variance along `AX`, unbiased (`ddof = 1`) or not, like `x.var(ax, unbiased=...)`.
    #[track_caller]
    pub fn var<const AX: isize>(
        &self,
        unbiased: bool,
    ) -> Tensor<<S as AxisOf<AX, op::var>>::Removed, E, D>
    where
        S: AxisOf<AX, op::var>,
    {
        ok(self.reduce_at::<AX>(ReduceOp::Var {
            ddof: unbiased as usize,
        }))
        .retype()
    }

    /// Variance along `AX`, keeping the axis.
    #[track_caller]
    pub fn var_keepdim<const AX: isize>(
        &self,
        unbiased: bool,
    ) -> Tensor<<S as AxisOf<AX, op::var>>::Replaced<One>, E, D>
    where
        S: AxisOf<AX, op::var>,
    {
        ok(self.reduce_keepdim_at::<AX>(ReduceOp::Var {
            ddof: unbiased as usize,
        }))
        .retype()
    }

    /// Variance of all elements.
    #[track_caller]
    pub fn var_all(&self, unbiased: bool) -> Tensor<(), E, D> {
        ok(self.try_reduce_all(ReduceOp::Var {
            ddof: unbiased as usize,
        }))
    }
}

impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
    /// Standard deviation along `AX`, like `x.std(ax, unbiased=...)`.
    pub fn std<const AX: isize>(
        &self,
        unbiased: bool,
    ) -> Tensor<<S as AxisOf<AX, op::std_dev>>::Removed, E, D>
    where
        S: AxisOf<AX, op::std_dev>,
    {
        ok(self.reduce_at::<AX>(ReduceOp::Var {
            ddof: unbiased as usize,
        }))
        .sqrt()
        .retype()
    }

    /// Standard deviation along `AX`, keeping the axis.
    pub fn std_keepdim<const AX: isize>(
        &self,
        unbiased: bool,
    ) -> Tensor<<S as AxisOf<AX, op::std_dev>>::Replaced<One>, E, D>
    where
        S: AxisOf<AX, op::std_dev>,
    {
        ok(self.reduce_keepdim_at::<AX>(ReduceOp::Var {
            ddof: unbiased as usize,
        }))
        .sqrt()
        .retype()
    }

    /// Standard deviation of all elements.
    pub fn std_all(&self, unbiased: bool) -> Tensor<(), E, D> {
        self.var_all(unbiased).sqrt()
    }
}

macro_rules! reductions {
    ($($(#[$doc:meta])* $m:ident, $keep:ident, $all:ident, $try_m:ident, $try_keep:ident, $try_all:ident => $op:ident;)*) => {
        impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {$(
            $(#[$doc])*
            /// Drops the axis; the fallible form.
            ///
            /// # Errors
            /// Max/min over an empty axis (PyTorch raises), or a backend failure.
            pub fn $try_m<const AX: isize>(&self) -> Result<Tensor<<S as AxisOf<AX, op::$m>>::Removed, E, D>>
            where
                S: AxisOf<AX, op::$m>,
            {
                self.reduce_at::<AX>(ReduceOp::$op).map(Tensor::retype)
            }

            $(#[$doc])*
            /// Keeps the axis as a size-1 [`One`]; the fallible form.
            ///
            /// # Errors
            /// Max/min over an empty axis, or a backend failure.
            pub fn $try_keep<const AX: isize>(&self) -> Result<Tensor<<S as AxisOf<AX, op::$m>>::Replaced<One>, E, D>>
            where
                S: AxisOf<AX, op::$m>,
            {
                self.reduce_keepdim_at::<AX>(ReduceOp::$op).map(Tensor::retype)
            }

            $(#[$doc])*
            /// Over every element, to a scalar; the fallible form.
            ///
            /// # Errors
            /// Max/min of an empty tensor, or a backend failure.
            pub fn $try_all(&self) -> Result<Tensor<(), E, D>> {
                self.try_reduce_all(ReduceOp::$op)
            }

            $(#[$doc])*
            /// Drops the axis.
            ///
            /// # Panics
            /// Max/min over an empty axis.
            #[track_caller]
            pub fn $m<const AX: isize>(&self) -> Tensor<<S as AxisOf<AX, op::$m>>::Removed, E, D>
            where
                S: AxisOf<AX, op::$m>,
            {
                ok(self.reduce_at::<AX>(ReduceOp::$op)).retype()
            }

            $(#[$doc])*
            /// Keeps the axis as a broadcasting size-1 [`One`].
            ///
            /// # Panics
            /// Max/min over an empty axis.
            #[track_caller]
            pub fn $keep<const AX: isize>(&self) -> Tensor<<S as AxisOf<AX, op::$m>>::Replaced<One>, E, D>
            where
                S: AxisOf<AX, op::$m>,
            {
                ok(self.reduce_keepdim_at::<AX>(ReduceOp::$op)).retype()
            }

            $(#[$doc])*
            /// Over every element, to a scalar.
            ///
            /// # Panics
            /// Max/min of an empty tensor.
            #[track_caller]
            pub fn $all(&self) -> Tensor<(), E, D> {
                ok(self.try_reduce_all(ReduceOp::$op))
            }
        )*}
    };
}

reductions! {
    /// Sum, like `x.sum(ax)`.
    sum, sum_keepdim, sum_all, try_sum, try_sum_keepdim, try_sum_all => Sum;
    /// Mean, like `x.mean(ax)`.
    mean, mean_keepdim, mean_all, try_mean, try_mean_keepdim, try_mean_all => Mean;
    /// Maximum values, like `x.amax(ax)`.
    max, max_keepdim, max_all, try_max, try_max_keepdim, try_max_all => Max;
    /// Minimum values, like `x.amin(ax)`.
    min, min_keepdim, min_all, try_min, try_min_keepdim, try_min_all => Min;
    /// Product, like `x.prod(ax)`.
    prod, prod_keepdim, prod_all, try_prod, try_prod_keepdim, try_prod_all => Prod;
    /// `log(sum(exp(x)))` computed stably, like `torch.logsumexp`.
    logsumexp, logsumexp_keepdim, logsumexp_all, try_logsumexp, try_logsumexp_keepdim, try_logsumexp_all => LogSumExp;
}
