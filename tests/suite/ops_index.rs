//! Index ops against PyTorch (`tools/fixtures/index.safetensors`):
//! `index_select` (repeated and empty indices, a permuted view, NaN/Inf
//! values), `gather` (each axis, an index smaller than the input, a
//! transposed input, rank 3), `scatter_add` (duplicate indices accumulate),
//! `embedding` (`F.embedding`), `one_hot` (`F.one_hot(..).float()`), in f32 and
//! f64; and `IndexOutOfRange` / `ShapeError` for bad indices.
//! Selected values are copies and compare exactly; scatter_add sums compare
//! with f32 rtol 1e-5 / atol 1e-6, f64 1e-12.

use crate::common;

use common::*;
use forma::core::{Error, Tensor};
use forma::{Ax, Dyn, C};

/// The index and size of an `IndexOutOfRange` error, or a panic naming what came instead.
fn out_of_range<T>(r: forma::core::Result<T>) -> (i64, usize) {
    match r {
        Err(Error::IndexOutOfRange { index, size, .. }) => (index, size),
        Err(e) => panic!("expected IndexOutOfRange, got {e:?}"),
        Ok(_) => panic!("expected IndexOutOfRange, got a result"),
    }
}

device_tests! {
    fn index_select_matches_torch<D>(dev) {
        let fx = Fixture::load("index");
        let mut c = Checks::new(&fx);
        let x: Tensor<(C<4>, C<5>), f32, D> = fx.tensor("is.x.in0", dev);
        let i0: Tensor<(C<3>,), i64, D> = fx.tensor("is.ax0.in1", dev);
        let y: Tensor<(C<3>, C<5>), f32, D> = x.index_select::<0, _>(&i0);
        c.close(&y, "is.ax0.out", EXACT);
        let i1: Tensor<(C<4>,), i64, D> = fx.tensor("is.ax1.in1", dev);
        c.close_ok(x.try_index_select::<1, _>(&i1), "is.ax1.out", EXACT);
        // no indices: [4, 0]
        let ie: Tensor<(Dyn,), i64, D> = fx.tensor("is.empty.in1", dev);
        c.close_ok(x.try_index_select::<1, _>(&ie), "is.empty.out", EXACT);
        // stored [4,3,2], selected along 1 of base.permute(2,1,0)
        let base: Tensor<(C<4>, C<3>, C<2>), f32, D> = fx.tensor("is.nc.in0", dev);
        let ni: Tensor<(C<2>,), i64, D> = fx.tensor("is.nc.in1", dev);
        let v = base.permute::<(Ax<2>, Ax<1>, Ax<0>)>();
        c.close_ok(v.try_index_select::<1, _>(&ni), "is.nc.out", EXACT);
        // NaN and Inf are copied through
        let xn: Tensor<(C<3>, C<2>), f32, D> = fx.tensor("is.nan.in0", dev);
        let inan: Tensor<(C<3>,), i64, D> = fx.tensor("is.nan.in1", dev);
        c.close_ok(xn.try_index_select::<0, _>(&inan), "is.nan.out", EXACT);
        let x64: Tensor<(C<4>, C<5>), f64, D> = fx.tensor("is.x64.in0", dev);
        c.close_ok(x64.try_index_select::<0, _>(&i0), "is.x64.out", EXACT);
        c.finish();
    }

    fn gather_matches_torch<D>(dev) {
        let fx = Fixture::load("index");
        let mut c = Checks::new(&fx);
        let x: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("gather.x.in0", dev);
        let i1: Tensor<(C<3>, C<2>), i64, D> = fx.tensor("gather.ax1.in1", dev);
        c.close_ok(x.try_gather::<1, _>(&i1), "gather.ax1.out", EXACT);
        let i0: Tensor<(C<2>, C<4>), i64, D> = fx.tensor("gather.ax0.in1", dev);
        c.close_ok(x.try_gather::<0, _>(&i0), "gather.ax0.out", EXACT);
        // an index smaller than x on the other axis
        let is: Tensor<(C<2>, C<2>), i64, D> = fx.tensor("gather.small.in1", dev);
        c.close_ok(x.try_gather::<1, _>(&is), "gather.small.out", EXACT);
        // stored [4,3], gathered from `.t()`
        let base: Tensor<(C<4>, C<3>), f32, D> = fx.tensor("gather.nc.in0", dev);
        let inc: Tensor<(C<3>, C<4>), i64, D> = fx.tensor("gather.nc.in1", dev);
        c.close_ok(base.t().try_gather::<1, _>(&inc), "gather.nc.out", EXACT);
        let x3: Tensor<(C<2>, C<3>, C<4>), f32, D> = fx.tensor("gather.x3.in0", dev);
        let i3: Tensor<(C<2>, C<3>, C<2>), i64, D> = fx.tensor("gather.x3.in1", dev);
        c.close_ok(x3.try_gather::<2, _>(&i3), "gather.x3.out", EXACT);
        let x64: Tensor<(C<3>, C<4>), f64, D> = fx.tensor("gather.x64.in0", dev);
        c.close_ok(x64.try_gather::<1, _>(&i1), "gather.x64.out", EXACT);
        c.finish();
    }

    /// Duplicate indices accumulate; the input is not modified.
    fn scatter_add_matches_torch<D>(dev) {
        let fx = Fixture::load("index");
        let mut c = Checks::new(&fx);
        let x: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("sa.x.in0", dev);
        let before = x.to_vec();
        let i0: Tensor<(C<2>, C<4>), i64, D> = fx.tensor("sa.ax0.in1", dev);
        let s0: Tensor<(C<2>, C<4>), f32, D> = fx.tensor("sa.ax0.in2", dev);
        c.close_ok(x.try_scatter_add::<0, _>(&i0, &s0), "sa.ax0.out", F32_TOL);
        let i1: Tensor<(C<3>, C<3>), i64, D> = fx.tensor("sa.ax1.in1", dev);
        let s1: Tensor<(C<3>, C<3>), f32, D> = fx.tensor("sa.ax1.in2", dev);
        c.close_ok(x.try_scatter_add::<1, _>(&i1, &s1), "sa.ax1.out", F32_TOL);
        // into a transposed view (stored [4,3])
        let base: Tensor<(C<4>, C<3>), f32, D> = fx.tensor("sa.nc.in0", dev);
        c.close_ok(base.t().try_scatter_add::<0, _>(&i0, &s0), "sa.nc.out", F32_TOL);
        let x64: Tensor<(C<3>, C<4>), f64, D> = fx.tensor("sa.x64.in0", dev);
        let s64: Tensor<(C<2>, C<4>), f64, D> = fx.tensor("sa.x64.in2", dev);
        c.close_ok(x64.try_scatter_add::<0, _>(&i0, &s64), "sa.x64.out", F64_TOL);
        c.finish();
        assert_eq!(x.to_vec(), before, "scatter_add must not modify its input");
    }

    /// `F.embedding`: a [2,4] and a [5] index into a [6,3] table.
    fn embedding_matches_torch<D>(dev) {
        let fx = Fixture::load("index");
        let mut c = Checks::new(&fx);
        let w: Tensor<(C<6>, C<3>), f32, D> = fx.tensor("emb.w.in0", dev);
        let i2: Tensor<(C<2>, C<4>), i64, D> = fx.tensor("emb.idx2.in1", dev);
        c.close_ok::<(C<2>, C<4>, C<3>), _, _>(w.try_embedding(&i2), "emb.idx2.out", EXACT);
        let i1: Tensor<(C<5>,), i64, D> = fx.tensor("emb.idx1.in1", dev);
        c.close_ok::<(C<5>, C<3>), _, _>(w.try_embedding(&i1), "emb.idx1.out", EXACT);
        c.finish();
    }

    /// `F.one_hot(idx, 4).float()`.
    fn one_hot_matches_torch<D>(dev) {
        let fx = Fixture::load("index");
        let mut c = Checks::new(&fx);
        let i1: Tensor<(C<5>,), i64, D> = fx.tensor("oh.idx1.in0", dev);
        let y: Tensor<(C<5>, C<4>), f32, D> = i1.one_hot::<4, f32>();
        c.close(&y, "oh.idx1.out", EXACT);
        let i2: Tensor<(C<2>, C<3>), i64, D> = fx.tensor("oh.idx2.in0", dev);
        c.close(&i2.one_hot::<4, f32>(), "oh.idx2.out", EXACT);
        c.finish();
    }

    /// Indices outside `0..size` (too large or negative) are errors naming the index and the size.
    fn out_of_range_indices_are_errors<D>(dev) {
        let x: Tensor<(C<4>, C<5>), f32, D> = Tensor::zeros_on((C, C), dev);
        let idx = |v: Vec<i64>| -> Tensor<(Dyn,), i64, D> {
            let n = v.len();
            Tensor::from_vec_on(v, (Dyn(n),), dev).unwrap()
        };
        assert_eq!(out_of_range(x.try_index_select::<0, _>(&idx(vec![0, 4]))), (4, 4));
        assert_eq!(out_of_range(x.try_index_select::<1, _>(&idx(vec![-1]))), (-1, 5));

        let gi: Tensor<(C<2>, C<2>), i64, D> = Tensor::from_vec_on(vec![0, 1, 5, 0], (C, C), dev).unwrap();
        assert_eq!(out_of_range(x.try_gather::<1, _>(&gi)), (5, 5));
        let gi: Tensor<(C<1>, C<2>), i64, D> = Tensor::from_vec_on(vec![0, -2], (C, C), dev).unwrap();
        assert_eq!(out_of_range(x.try_gather::<0, _>(&gi)), (-2, 4));

        let si: Tensor<(C<1>, C<2>), i64, D> = Tensor::from_vec_on(vec![4, 0], (C, C), dev).unwrap();
        let src: Tensor<(C<1>, C<2>), f32, D> = Tensor::ones_on((C, C), dev);
        assert_eq!(out_of_range(x.try_scatter_add::<0, _>(&si, &src)), (4, 4));

        let w: Tensor<(C<6>, C<3>), f32, D> = Tensor::zeros_on((C, C), dev);
        let ei: Tensor<(C<3>,), i64, D> = Tensor::from_vec_on(vec![0, 6, 1], (C,), dev).unwrap();
        assert_eq!(out_of_range(w.try_embedding(&ei)), (6, 6));

        let oi: Tensor<(C<3>,), i64, D> = Tensor::from_vec_on(vec![0, 4, 1], (C,), dev).unwrap();
        assert_eq!(
            oi.try_one_hot::<4, f32>().unwrap_err(),
            Error::IndexOutOfRange { op: "one_hot", index: 4, size: 4 }
        );
        let oi: Tensor<(C<1>,), i64, D> = Tensor::from_vec_on(vec![-1], (C,), dev).unwrap();
        assert_eq!(
            oi.try_one_hot::<4, f32>().unwrap_err().to_string(),
            "one_hot: index -1 is out of range for a dimension of size 4"
        );
    }

    /// gather's index may not exceed the input outside the gathered axis.
    fn gather_index_larger_than_input_is_a_shape_error<D>(dev) {
        let x: Tensor<(C<3>, C<4>), f32, D> = Tensor::zeros_on((C, C), dev);
        let gi: Tensor<(C<4>, C<2>), i64, D> = Tensor::zeros_on((C, C), dev);
        match x.try_gather::<1, _>(&gi) {
            Err(Error::Shape(e)) => assert_eq!((e.op, e.actual.as_str()), ("gather", "[4, 2]")),
            other => panic!("expected a shape error, got {:?}", other.map(|t| t.dims())),
        }
    }
}
