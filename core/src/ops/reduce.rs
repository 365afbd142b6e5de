//! Reductions over a typed axis (`sum::<1>()`), keeping the axis as a
//! broadcasting [`One`] (`sum_keepdim::<1>()`) or dropping it, and over the whole
//! tensor (`sum_all()`). An axis the tensor lacks is a compile error
//! ([`HasAxis`]). Half types accumulate in f32.

use crate::device::Backend;
use crate::dtype::Float;
use crate::error::Result;
use crate::layout::Layout;
use crate::shape::{HasAxis, One, Shape};
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

impl<S: Shape, E: Float, D: ReduceKernel<E>> Tensor<S, E, D> {
    /// Reduces axis `AX` (dropping it) with `op`: the entry point of the named reductions.
    ///
    /// # Errors
    /// Max/min over an empty axis.
    pub fn try_reduce<const AX: usize>(
        &self,
        op: ReduceOp,
    ) -> Result<Tensor<<S as HasAxis<AX>>::Removed, E, D>>
    where
        S: HasAxis<AX>,
    {
        let s = self.device.reduce(op, &self.storage(), &self.layout, AX)?;
        Ok(Tensor::from_storage(
            s,
            &self.layout.remove_axis(AX).dims,
            self.device.clone(),
        ))
    }

    /// Reduces axis `AX` with `op`, keeping it as a size-1 [`One`].
    ///
    /// # Errors
    /// Max/min over an empty axis.
    pub fn try_reduce_keepdim<const AX: usize>(
        &self,
        op: ReduceOp,
    ) -> Result<Tensor<<S as HasAxis<AX>>::Replaced<One>, E, D>>
    where
        S: HasAxis<AX>,
    {
        let s = self.device.reduce(op, &self.storage(), &self.layout, AX)?;
        let mut dims = self.layout.dims;
        dims[AX] = 1;
        Ok(Tensor::from_storage(s, &dims, self.device.clone()))
    }

    /// Reduces every element with `op` to a scalar.
    ///
    /// # Errors
    /// Max/min of an empty tensor.
    pub fn try_reduce_all(&self, op: ReduceOp) -> Result<Tensor<(), E, D>> {
        let flat = Layout::contiguous(&[self.numel()]);
        let c = self.contiguous();
        let s = self.device.reduce(
            op,
            &c.storage(),
            &Layout {
                offset: c.layout.offset,
                ..flat
            },
            0,
        )?;
        Ok(Tensor::from_storage(s, &[], self.device.clone()))
    }

    /// Index of the extreme along `AX` (dropping it).
    fn try_arg<const AX: usize>(
        &self,
        op: ArgReduceOp,
    ) -> Result<Tensor<<S as HasAxis<AX>>::Removed, i64, D>>
    where
        S: HasAxis<AX>,
    {
        let s = self
            .device
            .arg_reduce(op, &self.storage(), &self.layout, AX)?;
        Ok(Tensor::from_storage(
            s,
            &self.layout.remove_axis(AX).dims,
            self.device.clone(),
        ))
    }

    /// Index of the first maximum along `AX`, like `x.argmax(ax)`.
    ///
    /// # Panics
    /// If the axis is empty.
    pub fn argmax<const AX: usize>(&self) -> Tensor<<S as HasAxis<AX>>::Removed, i64, D>
    where
        S: HasAxis<AX>,
    {
        ok(self.try_arg::<AX>(ArgReduceOp::ArgMax))
    }

    /// Index of the first minimum along `AX`, like `x.argmin(ax)`.
    ///
    /// # Panics
    /// If the axis is empty.
    pub fn argmin<const AX: usize>(&self) -> Tensor<<S as HasAxis<AX>>::Removed, i64, D>
    where
        S: HasAxis<AX>,
    {
        ok(self.try_arg::<AX>(ArgReduceOp::ArgMin))
    }

    /// Variance along `AX`, unbiased (`ddof = 1`) or not, like `x.var(ax, unbiased=...)`.
    pub fn var<const AX: usize>(&self, unbiased: bool) -> Tensor<<S as HasAxis<AX>>::Removed, E, D>
    where
        S: HasAxis<AX>,
    {
        ok(self.try_reduce::<AX>(ReduceOp::Var {
            ddof: unbiased as usize,
        }))
    }

    /// Variance along `AX`, keeping the axis.
    pub fn var_keepdim<const AX: usize>(
        &self,
        unbiased: bool,
    ) -> Tensor<<S as HasAxis<AX>>::Replaced<One>, E, D>
    where
        S: HasAxis<AX>,
    {
        ok(self.try_reduce_keepdim::<AX>(ReduceOp::Var {
            ddof: unbiased as usize,
        }))
    }

    /// Variance of all elements.
    pub fn var_all(&self, unbiased: bool) -> Tensor<(), E, D> {
        ok(self.try_reduce_all(ReduceOp::Var {
            ddof: unbiased as usize,
        }))
    }
}

impl<S: Shape, E: Float, D: ReduceKernel<E> + crate::ops::unary::UnaryKernel<E>> Tensor<S, E, D> {
    /// Standard deviation along `AX`, like `x.std(ax, unbiased=...)`.
    pub fn std<const AX: usize>(&self, unbiased: bool) -> Tensor<<S as HasAxis<AX>>::Removed, E, D>
    where
        S: HasAxis<AX>,
    {
        self.var::<AX>(unbiased).sqrt()
    }

    /// Standard deviation along `AX`, keeping the axis.
    pub fn std_keepdim<const AX: usize>(
        &self,
        unbiased: bool,
    ) -> Tensor<<S as HasAxis<AX>>::Replaced<One>, E, D>
    where
        S: HasAxis<AX>,
    {
        self.var_keepdim::<AX>(unbiased).sqrt()
    }

    /// Standard deviation of all elements.
    pub fn std_all(&self, unbiased: bool) -> Tensor<(), E, D> {
        self.var_all(unbiased).sqrt()
    }
}

macro_rules! reductions {
    ($($(#[$doc:meta])* $m:ident, $keep:ident, $all:ident => $op:ident;)*) => {
        impl<S: Shape, E: Float, D: ReduceKernel<E>> Tensor<S, E, D> {$(
            $(#[$doc])*
            /// Drops the axis.
            ///
            /// # Panics
            /// Max/min over an empty axis.
            pub fn $m<const AX: usize>(&self) -> Tensor<<S as HasAxis<AX>>::Removed, E, D>
            where
                S: HasAxis<AX>,
            {
                ok(self.try_reduce::<AX>(ReduceOp::$op))
            }

            $(#[$doc])*
            /// Keeps the axis as a broadcasting size-1 [`One`].
            ///
            /// # Panics
            /// Max/min over an empty axis.
            pub fn $keep<const AX: usize>(&self) -> Tensor<<S as HasAxis<AX>>::Replaced<One>, E, D>
            where
                S: HasAxis<AX>,
            {
                ok(self.try_reduce_keepdim::<AX>(ReduceOp::$op))
            }

            $(#[$doc])*
            /// Over every element, to a scalar.
            ///
            /// # Panics
            /// Max/min of an empty tensor.
            pub fn $all(&self) -> Tensor<(), E, D> {
                ok(self.try_reduce_all(ReduceOp::$op))
            }
        )*}
    };
}

reductions! {
    /// Sum, like `x.sum(ax)`.
    sum, sum_keepdim, sum_all => Sum;
    /// Mean, like `x.mean(ax)`.
    mean, mean_keepdim, mean_all => Mean;
    /// Maximum values, like `x.amax(ax)`.
    max, max_keepdim, max_all => Max;
    /// Minimum values, like `x.amin(ax)`.
    min, min_keepdim, min_all => Min;
    /// Product, like `x.prod(ax)`.
    prod, prod_keepdim, prod_all => Prod;
    /// `log(sum(exp(x)))` computed stably, like `torch.logsumexp`.
    logsumexp, logsumexp_keepdim, logsumexp_all => LogSumExp;
}
