//! Reductions of `i64` tensors, like PyTorch's on `torch.int64`: `sum` and
//! `prod` (wrapping on overflow, as PyTorch's do), `max` and `min`, each
//! along an axis (`sum::<AX>()`), keeping it (`sum_keepdim::<AX>()`) or over
//! every element (`sum_all()`), with `try_` forms.
//!
//! The shape rule is the float reductions' ([`AxisOf`], naming the op).
//! The values are exact at any magnitude: the reduction runs on the host,
//! so a CUDA tensor makes a round trip. Integer tensors carry no gradient.

use crate::device::Backend;
use crate::error::{Error, Result};
use crate::shape::{op, AxisOf, HasAxis, One, Shape};
use crate::tensor::{ok, Tensor};

#[derive(Clone, Copy)]
enum IntOp {
    Sum,
    Prod,
    Max,
    Min,
}

impl IntOp {
    fn name(self) -> &'static str {
        match self {
            IntOp::Sum => "sum",
            IntOp::Prod => "prod",
            IntOp::Max => "max",
            IntOp::Min => "min",
        }
    }

    /// The reduction of `values`; `None` for max/min of nothing.
    fn fold(self, values: impl Iterator<Item = i64>) -> Option<i64> {
        match self {
            IntOp::Sum => Some(values.fold(0, i64::wrapping_add)),
            IntOp::Prod => Some(values.fold(1, i64::wrapping_mul)),
            IntOp::Max => values.max(),
            IntOp::Min => values.min(),
        }
    }
}

impl<S: Shape, D: Backend> Tensor<S, i64, D> {
    /// The values reduced along `axis`, row-major over the other axes.
    fn int_reduce(&self, op: IntOp, axis: usize) -> Result<Vec<i64>> {
        let dims = self.dims();
        let (outer, n, inner): (usize, usize, usize) = (
            dims[..axis].iter().product(),
            dims[axis],
            dims[axis + 1..].iter().product(),
        );
        if n == 0 && matches!(op, IntOp::Max | IntOp::Min) && outer * inner > 0 {
            return Err(Error::invalid(
                op.name(),
                format!(
                    "axis {axis} is empty (sizes {:?}): it has no {}",
                    &dims[..],
                    op.name()
                ),
            ));
        }
        let x = self.to_vec();
        let mut out = Vec::with_capacity(outer * inner);
        for o in 0..outer {
            for i in 0..inner {
                let along = (0..n).map(|k| x[(o * n + k) * inner + i]);
                out.push(op.fold(along).unwrap_or_default());
            }
        }
        Ok(out)
    }

    fn try_int_reduce<S2: Shape>(
        &self,
        op: IntOp,
        axis: usize,
        dims: &[usize],
    ) -> Result<Tensor<S2, i64, D>> {
        let values = self.int_reduce(op, axis)?;
        let shape =
            S2::from_dims(dims).ok_or_else(|| Error::shape(op.name(), S2::describe(), dims))?;
        Tensor::from_vec_on(values, shape, &self.device)
    }

    fn try_int_reduce_axis<const AX: isize>(
        &self,
        op: IntOp,
    ) -> Result<Tensor<<S as HasAxis<AX>>::Removed, i64, D>>
    where
        S: HasAxis<AX>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        let mut dims = self.dims().to_vec();
        dims.remove(ax);
        self.try_int_reduce(op, ax, &dims)
    }

    fn try_int_reduce_keepdim<const AX: isize>(
        &self,
        op: IntOp,
    ) -> Result<Tensor<<S as HasAxis<AX>>::Replaced<One>, i64, D>>
    where
        S: HasAxis<AX>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        let mut dims = self.dims().to_vec();
        dims[ax] = 1;
        self.try_int_reduce(op, ax, &dims)
    }

    fn try_int_reduce_all(&self, op: IntOp) -> Result<Tensor<(), i64, D>> {
        let all: Tensor<(crate::shape::Dyn,), i64, D> = self.flatten_all_int();
        if all.dims()[0] == 0 && matches!(op, IntOp::Max | IntOp::Min) {
            return Err(Error::invalid(
                op.name(),
                "the tensor is empty: it has no extreme value".to_string(),
            ));
        }
        all.try_int_reduce(op, 0, &[])
    }

    /// The elements as one axis (a view when contiguous).
    fn flatten_all_int(&self) -> Tensor<(crate::shape::Dyn,), i64, D> {
        let n = self.layout.numel();
        Tensor::from_vec_on(self.to_vec(), (crate::shape::Dyn(n),), &self.device)
            .expect("as many values as the shape holds")
    }
}

macro_rules! int_reductions {
    ($($(#[$doc:meta])* $m:ident, $keep:ident, $all:ident, $try_m:ident, $try_keep:ident, $try_all:ident => $op:ident;)*) => {
        impl<S: Shape, D: Backend> Tensor<S, i64, D> {$(
            $(#[$doc])*
            /// Drops the axis; the fallible form.
            ///
            /// # Errors
            /// Max/min over an empty axis (PyTorch raises), or a backend failure.
            pub fn $try_m<const AX: isize>(&self) -> Result<Tensor<<S as AxisOf<AX, op::$m>>::Removed, i64, D>>
            where
                S: AxisOf<AX, op::$m>,
            {
                self.try_int_reduce_axis::<AX>(IntOp::$op).map(Tensor::retype)
            }

            $(#[$doc])*
            /// Keeps the axis as a size-1 [`One`]; the fallible form.
            ///
            /// # Errors
            /// Max/min over an empty axis, or a backend failure.
            pub fn $try_keep<const AX: isize>(&self) -> Result<Tensor<<S as AxisOf<AX, op::$m>>::Replaced<One>, i64, D>>
            where
                S: AxisOf<AX, op::$m>,
            {
                self.try_int_reduce_keepdim::<AX>(IntOp::$op).map(Tensor::retype)
            }

            $(#[$doc])*
            /// Over every element, to a scalar; the fallible form.
            ///
            /// # Errors
            /// Max/min of an empty tensor, or a backend failure.
            pub fn $try_all(&self) -> Result<Tensor<(), i64, D>> {
                self.try_int_reduce_all(IntOp::$op)
            }

            $(#[$doc])*
            /// Drops the axis.
            ///
            /// # Panics
            /// Max/min over an empty axis.
            #[track_caller]
            pub fn $m<const AX: isize>(&self) -> Tensor<<S as AxisOf<AX, op::$m>>::Removed, i64, D>
            where
                S: AxisOf<AX, op::$m>,
            {
                ok(self.$try_m::<AX>())
            }

            $(#[$doc])*
            /// Keeps the axis as a broadcasting size-1 [`One`].
            ///
            /// # Panics
            /// Max/min over an empty axis.
            #[track_caller]
            pub fn $keep<const AX: isize>(&self) -> Tensor<<S as AxisOf<AX, op::$m>>::Replaced<One>, i64, D>
            where
                S: AxisOf<AX, op::$m>,
            {
                ok(self.$try_keep::<AX>())
            }

            $(#[$doc])*
            /// Over every element, to a scalar.
            ///
            /// # Panics
            /// Max/min of an empty tensor.
            #[track_caller]
            pub fn $all(&self) -> Tensor<(), i64, D> {
                ok(self.$try_all())
            }
        )*}
    };
}

int_reductions! {
    /// Integer sum, like `x.sum(ax)` on `int64` (wrapping on overflow).
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<2>, C<3>), i64>::from_vec(vec![1, 2, 3, 4, 5, 6], (C, C)).unwrap();
    /// assert_eq!(x.sum::<1>().to_vec(), [6, 15]);
    /// assert_eq!(x.sum_keepdim::<0>().to_vec(), [5, 7, 9]);
    /// assert_eq!(x.sum_all().item(), 21);
    /// ```
    sum, sum_keepdim, sum_all, try_sum, try_sum_keepdim, try_sum_all => Sum;
    /// Integer product, like `x.prod(ax)` on `int64` (wrapping on overflow).
    prod, prod_keepdim, prod_all, try_prod, try_prod_keepdim, try_prod_all => Prod;
    /// Integer maximum, like `x.amax(ax)` on `int64`.
    max, max_keepdim, max_all, try_max, try_max_keepdim, try_max_all => Max;
    /// Integer minimum, like `x.amin(ax)` on `int64`.
    min, min_keepdim, min_all, try_min, try_min_keepdim, try_min_all => Min;
}
