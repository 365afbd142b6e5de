//! Sorting along an axis, like `torch.sort`, `torch.argsort` and
//! `torch.topk`. NaN sorts above every number (last ascending, first
//! descending), as in PyTorch; the sort is stable, so equal values keep
//! their order (PyTorch's `stable=True`).
//!
//! The shape rule: the axis must exist ([`AxisOf`], whose message names
//! the op); `sort` keeps the shape, `topk` makes the axis [`Dyn`].
//! Composite: the permutation is computed on the host (on every backend: a
//! CUDA tensor makes a round trip),
//! and the values are a `gather` of the input by it, so their gradient is
//! the gather's (the output gradient scattered back to where each value
//! came from).

use crate::device::Device;
use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::shape::{op, AxisOf, Dyn, HasAxis, Shape};
use crate::tensor::{ok, Tensor};
use std::cmp::Ordering;

/// Values sorted along an axis with the index each came from
/// (`torch.return_types.sort`'s pair).
pub type Sorted<S, E, D> = (Tensor<S, E, D>, Tensor<S, i64, D>);

impl<S: Shape, E: Float, D: Device<E>> Tensor<S, E, D> {
    /// Sorts along `AX`, ascending or descending, like
    /// `x.sort(dim=ax, descending=.., stable=True)`: the values and their
    /// indices in the input.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<2>, C<3>)>::from_vec(vec![3., 1., 2., 0., 5., 4.], (C, C)).unwrap();
    /// let (values, indices) = x.sort::<1>(false);
    /// assert_eq!(values.to_vec(), [1., 2., 3., 0., 4., 5.]);
    /// assert_eq!(indices.to_vec(), [1, 2, 0, 0, 2, 1]);
    /// ```
    #[track_caller]
    pub fn sort<const AX: isize>(&self, descending: bool) -> Sorted<S, E, D>
    where
        S: AxisOf<AX, op::sort>,
    {
        ok(self.try_sort::<AX>(descending))
    }

    /// [`Tensor::sort`], returning a backend failure as an error.
    ///
    /// # Errors
    /// A backend failure.
    pub fn try_sort<const AX: isize>(&self, descending: bool) -> Result<Sorted<S, E, D>>
    where
        S: AxisOf<AX, op::sort>,
    {
        self.sort_at::<AX>(descending)
    }

    fn sort_at<const AX: isize>(&self, descending: bool) -> Result<Sorted<S, E, D>>
    where
        S: HasAxis<AX>,
    {
        let idx = self.argsort_at::<AX>(descending)?;
        Ok((self.gather_at::<AX, S>(&idx)?, idx))
    }

    /// The indices that sort axis `AX`, like `x.argsort(dim=ax, descending=.., stable=True)`.
    ///
    /// # Errors
    /// A backend failure.
    pub fn try_argsort<const AX: isize>(&self, descending: bool) -> Result<Tensor<S, i64, D>>
    where
        S: AxisOf<AX, op::argsort>,
    {
        self.argsort_at::<AX>(descending)
    }

    fn argsort_at<const AX: isize>(&self, descending: bool) -> Result<Tensor<S, i64, D>>
    where
        S: HasAxis<AX>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        let dims = self.layout.dims;
        let data = self.try_to_vec()?;
        let n = dims[ax];
        let inner: usize = dims[ax + 1..S::RANK].iter().product();
        let outer: usize = dims[..ax].iter().product();
        let mut out = vec![0i64; data.len()];
        let mut lane: Vec<usize> = Vec::with_capacity(n);
        let order = |a: E, b: E| -> Ordering {
            // NaN above every number; `total_cmp`-free so -0 == 0 stay in order.
            match (a.is_nan(), b.is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                _ => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
            }
        };
        for o in 0..outer {
            for i in 0..inner {
                let at = |k: usize| (o * n + k) * inner + i;
                lane.clear();
                lane.extend(0..n);
                if descending {
                    lane.sort_by(|&a, &b| order(data[at(b)], data[at(a)]));
                } else {
                    lane.sort_by(|&a, &b| order(data[at(a)], data[at(b)]));
                }
                for (k, &src) in lane.iter().enumerate() {
                    out[at(k)] = src as i64;
                }
            }
        }
        Tensor::from_vec_on(
            out,
            S::from_dims(&dims).expect("the input's own dims"),
            &self.device,
        )
    }

    /// [`Tensor::try_argsort`] that panics on a backend failure.
    #[track_caller]
    pub fn argsort<const AX: isize>(&self, descending: bool) -> Tensor<S, i64, D>
    where
        S: AxisOf<AX, op::argsort>,
    {
        ok(self.try_argsort::<AX>(descending))
    }

    /// The `k` largest (or smallest) values along `AX`, sorted, with their
    /// indices, like `x.topk(k, dim=ax, largest=..)`. Ties keep their order.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<5>,)>::from_vec(vec![1., 9., 3., 7., 5.], (C,)).unwrap();
    /// let (values, indices) = x.topk::<0>(2, true);
    /// assert_eq!(values.to_vec(), [9., 7.]);
    /// assert_eq!(indices.to_vec(), [1, 3]);
    /// ```
    ///
    /// # Panics
    /// When `k` exceeds the axis; see [`Tensor::try_topk`].
    #[track_caller]
    #[allow(clippy::type_complexity)]
    pub fn topk<const AX: isize>(
        &self,
        k: usize,
        largest: bool,
    ) -> Sorted<<S as AxisOf<AX, op::topk>>::Replaced<Dyn>, E, D>
    where
        S: AxisOf<AX, op::topk>,
    {
        ok(self.try_topk::<AX>(k, largest))
    }

    /// [`Tensor::topk`], returning PyTorch's refusal as an error.
    ///
    /// # Errors
    /// `k` larger than the axis ("selected index k out of range").
    #[allow(clippy::type_complexity)]
    pub fn try_topk<const AX: isize>(
        &self,
        k: usize,
        largest: bool,
    ) -> Result<Sorted<<S as AxisOf<AX, op::topk>>::Replaced<Dyn>, E, D>>
    where
        S: AxisOf<AX, op::topk>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        let n = self.layout.dims[ax];
        if k > n {
            return Err(Error::invalid(
                "topk",
                format!("k = {k} is larger than axis {ax} of size {n}"),
            ));
        }
        let (values, idx) = self.sort_at::<AX>(largest)?;
        Ok((
            values.slice_at::<AX>(0, k, 1)?.retype(),
            idx.slice_at::<AX>(0, k, 1)?.retype(),
        ))
    }
}
