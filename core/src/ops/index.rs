//! Indexing with `i64` index tensors: `index_select`, `gather`, `scatter_add`,
//! `embedding` (a lookup of rows) and `one_hot`. Indices are checked against
//! the indexed size; an out-of-range index is an error, never a wild read.

use crate::device::Backend;
use crate::dtype::{Dtype, Float};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::shape::op::{OneHotOf, SameDtype};
use crate::shape::{op, AppendDimOf, AxisOf, Dim, Dyn, HasAxis, Shape};
use crate::tape::Raw;
use crate::tensor::{ok, Tensor};

/// The sizes `gather` and `scatter_add` need, checked here once for every
/// backend (core runs it before it dispatches; kernels run it again when
/// called directly): the index has `x`'s rank, `axis` exists, the index is
/// no larger than `x` outside `axis`, and a scattered `src` has the
/// index's sizes. Index values are the kernels' to check (they live on the
/// device).
///
/// # Errors
/// An invalid-argument error naming `op` and the sizes.
pub fn check_index_layouts(
    op: &'static str,
    lx: &Layout,
    li: &Layout,
    axis: usize,
    src: Option<&Layout>,
) -> Result<()> {
    if li.rank() != lx.rank()
        || axis >= lx.rank()
        || (0..lx.rank()).any(|d| d != axis && li.dims[d] > lx.dims[d])
    {
        return Err(Error::invalid(
            op,
            format!(
                "an index of sizes {:?} does not fit sizes {:?} outside axis {axis}",
                &*li.dims, &*lx.dims
            ),
        ));
    }
    match src {
        Some(ls) if ls.dims != li.dims => Err(Error::invalid(
            op,
            format!(
                "the index has sizes {:?} but the source {:?}",
                &*li.dims, &*ls.dims
            ),
        )),
        _ => Ok(()),
    }
}

/// Backend support for index ops.
pub trait IndexKernel<E: Float>: Backend {
    /// Picks entries of `axis` by a rank-1 index; the result is row-major with
    /// that axis resized to the number of indices.
    fn index_select(
        &self,
        x: &Self::Storage<E>,
        lx: &Layout,
        axis: usize,
        idx: &Self::Storage<i64>,
        li: &Layout,
    ) -> Result<Self::Storage<E>>;
    /// `out[i][j][k] = x[idx[i][j][k]][j][k]` (for axis 0); the result has the
    /// index's sizes, which must not exceed `x`'s on the other axes.
    fn gather(
        &self,
        x: &Self::Storage<E>,
        lx: &Layout,
        axis: usize,
        idx: &Self::Storage<i64>,
        li: &Layout,
    ) -> Result<Self::Storage<E>>;
    /// A copy of `x` with `out[idx[i][j]][j] += src[i][j]` (for axis 0); `idx`
    /// and `src` have the same sizes.
    fn scatter_add(
        &self,
        x: &Self::Storage<E>,
        lx: &Layout,
        axis: usize,
        idx: &Self::Storage<i64>,
        li: &Layout,
        src: &Self::Storage<E>,
        ls: &Layout,
    ) -> Result<Self::Storage<E>>;
}

impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
    fn try_index_select_unnoted<const AX: isize, L: Dim>(
        &self,
        idx: &Tensor<(L,), i64, D>,
    ) -> Result<Tensor<<S as HasAxis<AX>>::Replaced<L>, E, D>>
    where
        S: HasAxis<AX>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        self.same_device("index_select", idx)?;
        let s = self.device.index_select(
            &self.storage(),
            &self.layout,
            ax,
            &idx.storage(),
            &idx.layout,
        )?;
        let mut dims = self.layout.dims;
        dims[ax] = idx.numel();
        let (ir, xdims) = (idx.raw(), self.layout.dims);
        Ok(Tensor::from_storage(s, &dims, self.device.clone()).record(
            "index_select",
            std::slice::from_ref(&self.var),
            vec![ir.saved()],
            move |g| {
                // index_add: every row of g goes back to the row it was taken from.
                let mut strides = crate::shape::Dims::from_slice(&vec![0; g.layout.rank()]);
                strides[ax] = ir.layout.strides[0];
                let li = Layout {
                    dims: g.layout.dims,
                    strides,
                    offset: ir.layout.offset,
                };
                Ok(vec![Some(scatter_into_zeros(g, &xdims, ax, &ir, &li)?)])
            },
        ))
    }

    /// Selects entries along `AX` by index, like `x.index_select(ax, idx)`.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] for an index outside the axis.
    pub fn try_index_select<const AX: isize, L: Dim>(
        &self,
        idx: &Tensor<(L,), i64, D>,
    ) -> Result<Tensor<<S as AxisOf<AX, op::index_select>>::Replaced<L>, E, D>>
    where
        S: AxisOf<AX, op::index_select>,
    {
        self.index_select_at::<AX, L>(idx).map(Tensor::retype)
    }

    /// [`Tensor::try_index_select`] under its types' rule only, for ops built on it.
    pub(crate) fn index_select_at<const AX: isize, L: Dim>(
        &self,
        idx: &Tensor<(L,), i64, D>,
    ) -> Result<Tensor<<S as HasAxis<AX>>::Replaced<L>, E, D>>
    where
        S: HasAxis<AX>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        let y = self.try_index_select_unnoted::<AX, L>(idx)?;
        Ok(y.noted(|| {
            (
                crate::graph::Op::IndexSelect { axis: ax },
                vec![self.val(), idx.val()],
            )
        }))
    }

    /// [`Tensor::try_index_select`] that panics on a bad index.
    #[track_caller]
    pub fn index_select<const AX: isize, L: Dim>(
        &self,
        idx: &Tensor<(L,), i64, D>,
    ) -> Tensor<<S as AxisOf<AX, op::index_select>>::Replaced<L>, E, D>
    where
        S: AxisOf<AX, op::index_select>,
    {
        ok(self.try_index_select::<AX, L>(idx))
    }

    fn try_gather_unnoted<const AX: isize, Si: Shape>(
        &self,
        idx: &Tensor<Si, i64, D>,
    ) -> Result<Tensor<Si, E, D>>
    where
        S: HasAxis<AX>,
        Si: HasAxis<AX>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        self.same_device("gather", idx)?;
        if Si::RANK != S::RANK
            || (0..S::RANK).any(|i| i != ax && idx.layout.dims[i] > self.layout.dims[i])
        {
            return Err(Error::shape(
                "gather",
                format!(
                    "an index no larger than {} outside axis {ax}",
                    crate::error::fmt_dims(&self.layout.dims)
                ),
                &idx.layout.dims,
            ));
        }
        let s = self.device.gather(
            &self.storage(),
            &self.layout,
            ax,
            &idx.storage(),
            &idx.layout,
        )?;
        let (ir, xdims) = (idx.raw(), self.layout.dims);
        Ok(
            Tensor::from_storage(s, &idx.layout.dims, self.device.clone()).record(
                "gather",
                std::slice::from_ref(&self.var),
                vec![ir.saved()],
                move |g| {
                    Ok(vec![Some(scatter_into_zeros(
                        g, &xdims, ax, &ir, &ir.layout,
                    )?)])
                },
            ),
        )
    }

    /// Gathers along `AX`, like `torch.gather(x, ax, idx)`; the result has the
    /// index's shape.
    ///
    /// # Errors
    /// An out-of-range index, or an index larger than `x` on another axis.
    pub fn try_gather<const AX: isize, Si: Shape>(
        &self,
        idx: &Tensor<Si, i64, D>,
    ) -> Result<Tensor<Si, E, D>>
    where
        S: AxisOf<AX, op::gather>,
        Si: AxisOf<AX, op::gather>,
    {
        self.gather_at::<AX, Si>(idx)
    }

    /// [`Tensor::try_gather`] under its types' rule only, for ops built on it.
    pub(crate) fn gather_at<const AX: isize, Si: Shape>(
        &self,
        idx: &Tensor<Si, i64, D>,
    ) -> Result<Tensor<Si, E, D>>
    where
        S: HasAxis<AX>,
        Si: HasAxis<AX>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        let y = self.try_gather_unnoted::<AX, Si>(idx)?;
        Ok(y.noted(|| {
            (
                crate::graph::Op::Gather { axis: ax },
                vec![self.val(), idx.val()],
            )
        }))
    }

    /// [`Tensor::try_gather`] that panics on a bad index.
    #[track_caller]
    pub fn gather<const AX: isize, Si: Shape>(&self, idx: &Tensor<Si, i64, D>) -> Tensor<Si, E, D>
    where
        S: AxisOf<AX, op::gather>,
        Si: AxisOf<AX, op::gather>,
    {
        ok(self.try_gather::<AX, Si>(idx))
    }

    /// Adds `src` into a copy of `self` at the positions `idx` names along `AX`,
    /// like `x.scatter_add(ax, idx, src)`.
    ///
    /// # Errors
    /// An out-of-range index, or `idx` and `src` of different sizes.
    pub fn try_scatter_add<const AX: isize, Si: Shape>(
        &self,
        idx: &Tensor<Si, i64, D>,
        src: &Tensor<Si, E, D>,
    ) -> Result<Self>
    where
        S: AxisOf<AX, op::scatter_add>,
        Si: AxisOf<AX, op::scatter_add>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        self.same_device("scatter_add", idx)?;
        crate::graph::refuse("scatter_add", "has no graph form yet");
        if idx.layout.dims != src.layout.dims {
            return Err(Error::shape(
                "scatter_add",
                crate::error::fmt_dims(&idx.layout.dims),
                &src.layout.dims,
            ));
        }
        if (0..S::RANK).any(|i| i != ax && idx.layout.dims[i] > self.layout.dims[i]) {
            return Err(Error::shape(
                "scatter_add",
                format!(
                    "an index no larger than {} outside axis {ax}",
                    crate::error::fmt_dims(&self.layout.dims)
                ),
                &idx.layout.dims,
            ));
        }
        let s = self.device.scatter_add(
            &self.storage(),
            &self.layout,
            ax,
            &idx.storage(),
            &idx.layout,
            &src.storage(),
            &src.layout,
        )?;
        let ir = idx.raw();
        Ok(
            Self::from_storage(s, &self.layout.dims, self.device.clone()).record(
                "scatter_add",
                &[self.var.clone(), src.var.clone()],
                vec![ir.saved()],
                move |g| {
                    let gs =
                        g.device
                            .gather(&g.storage(), &g.layout, ax, &ir.storage(), &ir.layout)?;
                    Ok(vec![
                        Some(g.clone()),
                        Some(Raw::new(gs, &ir.layout.dims, g.device.clone())),
                    ])
                },
            ),
        )
    }

    /// [`Tensor::try_scatter_add`] that panics on a bad index.
    #[track_caller]
    pub fn scatter_add<const AX: isize, Si: Shape>(
        &self,
        idx: &Tensor<Si, i64, D>,
        src: &Tensor<Si, E, D>,
    ) -> Self
    where
        S: AxisOf<AX, op::scatter_add>,
        Si: AxisOf<AX, op::scatter_add>,
    {
        ok(self.try_scatter_add::<AX, Si>(idx, src))
    }
}

/// Zeros of `dims` with `g` added at the positions `idx` names along `axis`
/// (the backward of gathering ops).
fn scatter_into_zeros<E: Float, D: crate::device::Device<E>>(
    g: &Raw<E, D>,
    dims: &[usize],
    axis: usize,
    idx: &Raw<i64, D>,
    li: &Layout,
) -> Result<Raw<E, D>> {
    let zeros = g.device.full(dims.iter().product(), E::from_f64(0.0))?;
    let s = g.device.scatter_add(
        &zeros,
        &Layout::contiguous(dims),
        axis,
        &idx.storage(),
        li,
        &g.storage(),
        &g.layout,
    )?;
    Ok(Raw::new(s, dims, g.device.clone()))
}

impl<V: Dim, Dm: Dim, E: Float, D: crate::device::Device<E>> Tensor<(V, Dm), E, D> {
    /// Looks up rows of this `[vocab, dim]` table for every index, like
    /// `F.embedding(idx, weight)`: the result has the index's shape plus `dim`.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] for an index outside the vocabulary.
    pub fn try_embedding<
        Si: AppendDimOf<op::embedding_indices>,
        I: SameDtype<i64, op::embedding_indices>,
    >(
        &self,
        idx: &Tensor<Si, I, D>,
    ) -> Result<Tensor<<Si as AppendDimOf<op::embedding_indices>>::Appended<Dm>, E, D>> {
        let idx = I::same(idx);
        let flat = idx.flatten_all();
        let rows = self.try_index_select::<0, Dyn>(&flat)?;
        let mut dims = idx.layout.dims.to_vec();
        dims.push(self.layout.dims[1]);
        let shape = <Si as AppendDimOf<op::embedding_indices>>::Appended::<Dm>::from_dims(&dims)
            .expect("the dims were built from the index and the table");
        rows.try_reshape_to(shape)
    }

    /// [`Tensor::try_embedding`] that panics on a bad index.
    #[track_caller]
    pub fn embedding<
        Si: AppendDimOf<op::embedding_indices>,
        I: SameDtype<i64, op::embedding_indices>,
    >(
        &self,
        idx: &Tensor<Si, I, D>,
    ) -> Tensor<<Si as AppendDimOf<op::embedding_indices>>::Appended<Dm>, E, D> {
        ok(self.try_embedding(I::same(idx)))
    }

    /// [`Tensor::try_embedding`] with a padding row, like
    /// `F.embedding(idx, weight, padding_idx=p)`: the rows looked up at
    /// index `p` pass no gradient back to the table (with `None`, this is
    /// [`Tensor::try_embedding`]).
    ///
    /// ```
    /// use forma::prelude::*;
    /// let table = Tensor::<(C<3>, C<2>)>::ones().requires_grad();
    /// let idx = Tensor::<(C<3>,), i64>::from_vec(vec![0, 2, 0], (C,)).unwrap();
    /// table.embedding_padded(&idx, Some(0)).sum_all().backward();
    /// assert_eq!(table.grad().unwrap().to_vec(), [0., 0., 0., 0., 1., 1.]);
    /// ```
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] for an index outside the vocabulary, or a
    /// `padding_idx` outside the table.
    pub fn try_embedding_padded<Si: AppendDimOf<op::embedding_indices>>(
        &self,
        idx: &Tensor<Si, i64, D>,
        padding_idx: Option<usize>,
    ) -> Result<Tensor<<Si as AppendDimOf<op::embedding_indices>>::Appended<Dm>, E, D>> {
        let vocab = self.layout.dims[0];
        let p = match padding_idx {
            Some(p) if p >= vocab => {
                return Err(Error::invalid(
                    "embedding",
                    format!("padding_idx {p} is outside the table of {vocab} rows"),
                ))
            }
            Some(p) if self.needs_grad() => p,
            _ => return self.try_embedding(idx),
        };
        let flat = idx.flatten_all();
        let rows = self.try_embedding(&flat)?.into_dyn();
        // Which positions hold the padding index, found with a lookup in a
        // one-column table that is 1 at the padding row (no host read of
        // the indices, and no float cast of them that could round).
        let mut marks = vec![E::from_f64(0.0); vocab];
        marks[p] = E::from_f64(1.0);
        let marks = Tensor::from_vec_on(marks, (Dyn(vocab), Dyn(1)), &self.device)?;
        let hit = marks.try_embedding(&flat)?;
        let is_padding = hit.try_gt(&hit.zeros_like())?;
        let rows = crate::ops::cmp::try_where_cond(&is_padding, &rows.detach(), &rows)?;
        let mut dims = idx.layout.dims.to_vec();
        dims.push(self.layout.dims[1]);
        let shape = <Si as AppendDimOf<op::embedding_indices>>::Appended::<Dm>::from_dims(&dims)
            .expect("the dims were built from the index and the table");
        rows.try_reshape_to(shape)
    }

    /// [`Tensor::try_embedding_padded`] that panics on a bad index.
    #[track_caller]
    pub fn embedding_padded<Si: AppendDimOf<op::embedding_indices>>(
        &self,
        idx: &Tensor<Si, i64, D>,
        padding_idx: Option<usize>,
    ) -> Tensor<<Si as AppendDimOf<op::embedding_indices>>::Appended<Dm>, E, D> {
        ok(self.try_embedding_padded(idx, padding_idx))
    }
}

impl<S: Shape, D: Backend> Tensor<S, i64, D> {
    /// One-hot encodes class indices into `N` classes, like
    /// `F.one_hot(idx, N)`, as a float tensor with a new last axis.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] for an index outside `0..N`.
    pub fn try_one_hot<const N: usize, F: Dtype>(
        &self,
    ) -> Result<Tensor<<F as OneHotOf<S, N>>::Out, F, D>>
    where
        F: OneHotOf<S, N>,
    {
        let idx = self.try_to_vec()?;
        let mut data = vec![F::from_f64(0.0); idx.len() * N];
        for (row, &i) in idx.iter().enumerate() {
            if i < 0 || i as usize >= N {
                return Err(Error::IndexOutOfRange {
                    op: "one_hot",
                    index: i,
                    size: N,
                });
            }
            data[row * N + i as usize] = F::from_f64(1.0);
        }
        let mut dims = self.layout.dims.to_vec();
        dims.push(N);
        let s = self.device.upload(data)?;
        Ok(Tensor::from_storage(s, &dims, self.device.clone()))
    }

    /// [`Tensor::try_one_hot`] that panics on a bad index.
    #[track_caller]
    pub fn one_hot<const N: usize, F: Dtype>(&self) -> Tensor<<F as OneHotOf<S, N>>::Out, F, D>
    where
        F: OneHotOf<S, N>,
    {
        ok(self.try_one_hot::<N, F>())
    }
}
