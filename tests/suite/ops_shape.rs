//! Views and shape ops against PyTorch (`tools/fixtures/shape.safetensors`):
//! transpose, t, permute, narrow, slice, split, chunk, expand, unsqueeze,
//! squeeze, reshape, flatten, contiguous, cat and stack (including size-0
//! pieces, non-contiguous inputs and f64). Also: which ops share storage
//! (`shares_storage`) and which copy, `into_dyn` / `try_into_shape`, and the
//! runtime errors of `Dyn` shapes. Views copy values, so comparisons are exact.
//!
//! Property tests (proptest, 64 cases each): `broadcast_dims` against a
//! reference; a `Dyn` add against an explicit expand-then-add and a plain
//! loop; random chains of transpose/permute/narrow/slice against the same
//! chain computed on plain `Vec` indices, with `contiguous()`, a unary and a
//! binary op on the resulting view.

use crate::common;

use common::*;
use forma::core::layout::broadcast_dims;
use forma::core::{Error, ShapeError, Tensor};
use forma::{cat, stack, try_cat, Ax, Cpu, Dyn, One, C};
use proptest::prelude::*;

type T3<D> = Tensor<(C<2>, C<3>, C<4>), f32, D>;

device_tests! {
    /// transpose, t, permute: views over the same storage, not contiguous.
    fn transpose_and_permute<D>(dev) {
        let fx = Fixture::load("shape");
        let x: T3<D> = fx.tensor("x.in0", dev);
        let t02: Tensor<(C<4>, C<3>, C<2>), f32, D> = x.transpose::<0, 2>();
        fx.check(&t02, "transpose02.out", EXACT);
        assert!(t02.shares_storage(&x) && !t02.is_contiguous());
        let row0: Tensor<(C<3>, C<4>), f32, D> = x.narrow_static::<0, 1>(0).squeeze::<0>();
        fx.check(&row0.t(), "t.out", EXACT);
        let p: Tensor<(C<4>, C<2>, C<3>), f32, D> = x.permute::<(Ax<2>, Ax<0>, Ax<1>)>();
        fx.check(&p, "permute201.out", EXACT);
        assert!(p.shares_storage(&x));
        let p: Tensor<(C<3>, C<4>, C<2>), f32, D> = x.permute::<(Ax<1>, Ax<2>, Ax<0>)>();
        fx.check(&p, "permute120.out", EXACT);
    }

    /// narrow (also to length 0) and stepped slices.
    fn narrow_and_slice<D>(dev) {
        let fx = Fixture::load("shape");
        let x: T3<D> = fx.tensor("x.in0", dev);
        let n = x.narrow::<1>(1, 2);
        assert_eq!(n.shape(), (C, Dyn(2), C));
        assert!(n.shares_storage(&x));
        fx.check(&n, "narrow1.out", EXACT);
        fx.check(&x.narrow::<2>(4, 0), "narrow_empty.out", EXACT);
        fx.check(&x.slice::<2>(1, 4, 2), "slice2.out", EXACT);
        fx.check(&x.slice::<0>(1, 2, 1), "slice0.out", EXACT);
        let s: Tensor<(C<2>, C<2>, C<4>), f32, D> = x.narrow_static::<1, 2>(1);
        fx.check(&s, "narrow1.out", EXACT);
    }

    /// split(3) along an axis of 4 gives pieces 3 and 1; chunk(2) of 3 gives
    /// 2 and 1; chunk(4) of 6 gives three pieces of 2, as in PyTorch.
    fn split_and_chunk<D>(dev) {
        let fx = Fixture::load("shape");
        let x: T3<D> = fx.tensor("x.in0", dev);
        let pieces = x.split::<2>(3);
        assert_eq!(pieces.len(), 2);
        for (i, p) in pieces.iter().enumerate() {
            assert!(p.shares_storage(&x));
            fx.check(p, &format!("split.ax2.out{i}"), EXACT);
        }
        let pieces = x.chunk::<1>(2);
        assert_eq!(pieces.len(), 2);
        for (i, p) in pieces.iter().enumerate() {
            fx.check(p, &format!("chunk.ax1.out{i}"), EXACT);
        }
        let y: Tensor<(C<6>, C<2>), f32, D> = fx.tensor("y.in0", dev);
        let pieces = y.chunk::<0>(4);
        assert_eq!(pieces.len(), 3);
        assert!(!fx.has("chunk4.out3"));
        for (i, p) in pieces.iter().enumerate() {
            fx.check(p, &format!("chunk4.out{i}"), EXACT);
        }
    }

    /// expand stretches `One` dims with stride 0; unsqueeze/squeeze add and remove `One`.
    fn expand_unsqueeze_squeeze<D>(dev) {
        let fx = Fixture::load("shape");
        let e: Tensor<(C<3>, One), f32, D> = fx.tensor("e.in0", dev);
        let big: T3<D> = e.expand((C, C, C));
        assert!(big.shares_storage(&e));
        assert_eq!(big.layout().strides[0], 0);
        fx.check(&big, "expand.out", EXACT);

        let x: T3<D> = fx.tensor("x.in0", dev);
        let u: Tensor<(C<2>, One, C<3>, C<4>), f32, D> = x.unsqueeze::<1>();
        fx.check(&u, "unsqueeze1.out", EXACT);
        let u3: Tensor<(C<2>, C<3>, C<4>, One), f32, D> = x.unsqueeze::<3>();
        fx.check(&u3, "unsqueeze3.out", EXACT);
        let same: T3<D> = e.expand_as(&x);
        assert!(same.shares_storage(&e));
        fx.check(&same, "expand.out", EXACT);
        let back: T3<D> = u.squeeze::<1>();
        assert!(back.shares_storage(&x));
        fx.check(&back, "x.in0", EXACT);
        // a Dyn axis of size 1 squeezes; one of size 3 is a shape error
        let d = x.narrow::<0>(1, 1);
        fx.check(&d.squeeze::<0>().unsqueeze::<0>(), "slice0.out", EXACT);
        match x.narrow::<1>(0, 3).try_squeeze::<1>() {
            Err(Error::Shape(e)) => assert_eq!(e.op, "squeeze"),
            other => panic!("expected a shape error, got {:?}", other.map(|t| t.dims())),
        }
        let dyn_e: Tensor<(Dyn, Dyn), f32, D> = e.into_dyn();
        match dyn_e.try_expand((Dyn(3), Dyn(4), Dyn(5))) {
            Err(Error::Shape(err)) => assert_eq!(err.op, "expand"),
            other => panic!("expected a shape error, got {:?}", other.map(|t| t.dims())),
        }
    }

    /// reshape/flatten share storage when the data is contiguous and copy otherwise.
    fn reshape_and_flatten<D>(dev) {
        let fx = Fixture::load("shape");
        let x: T3<D> = fx.tensor("x.in0", dev);
        let r: Tensor<(C<4>, C<6>), f32, D> = x.reshape();
        assert!(r.shares_storage(&x));
        fx.check(&r, "reshape.out", EXACT);
        let r: Tensor<(C<6>, C<4>), f32, D> = x.transpose::<0, 2>().reshape();
        assert!(!r.shares_storage(&x) && r.is_contiguous());
        fx.check(&r, "reshape_nc.out", EXACT);
        let r: Tensor<(Dyn, C<6>), f32, D> = x.reshape();
        assert_eq!(r.shape(), (Dyn(4), C));
        fx.check(&r, "reshape.out", EXACT);
        let f: Tensor<(C<2>, C<12>), f32, D> = x.flatten();
        assert!(f.shares_storage(&x));
        fx.check(&f, "flatten.out", EXACT);
        let f: Tensor<(C<2>, C<12>), f32, D> = x.transpose::<1, 2>().flatten();
        assert!(!f.shares_storage(&x));
        fx.check(&f, "flatten_nc.out", EXACT);
        assert_eq!(x.flatten_all().to_vec(), fx.array::<f32>("x.in0").data);
        // a narrow along the first axis is contiguous with an offset: still a view
        let tail = x.narrow::<0>(1, 1);
        let flat: Tensor<(C<12>,), f32, D> = tail.try_reshape().unwrap();
        assert!(flat.shares_storage(&x));
        assert_eq!(flat.to_vec(), fx.array::<f32>("x.in0").data[12..].to_vec());
    }

    /// contiguous() copies only when needed.
    fn contiguous_copies_only_when_needed<D>(dev) {
        let fx = Fixture::load("shape");
        let x: T3<D> = fx.tensor("x.in0", dev);
        let same = x.contiguous();
        assert!(same.shares_storage(&x));
        let p = x.permute::<(Ax<2>, Ax<0>, Ax<1>)>();
        let c = p.contiguous();
        assert!(!c.shares_storage(&x) && c.is_contiguous());
        assert_eq!(c.to_vec(), p.to_vec());
        fx.check(&c, "contiguous_nc.out", EXACT);
        // a dense view with an offset is contiguous already
        let tail = x.narrow::<0>(1, 1);
        assert!(tail.is_contiguous() && tail.contiguous().shares_storage(&x));
        // a view of a view of a view
        let chain = x.transpose::<0, 2>().slice::<0>(1, 4, 2).narrow::<2>(1, 1).permute::<(Ax<2>, Ax<0>, Ax<1>)>();
        fx.check(&chain, "chain.out", EXACT);
        fx.check(&chain.contiguous(), "chain.out", EXACT);
    }

    /// cat along each axis (with a size-0 piece, with transposed pieces), stack along each new axis.
    fn cat_and_stack<D>(dev) {
        let fx = Fixture::load("shape");
        let mut k = Checks::new(&fx);
        let x: T3<D> = fx.tensor("x.in0", dev);
        let z: T3<D> = fx.tensor("z.in0", dev);
        let xd: Tensor<(C<2>, Dyn, C<4>), f32, D> = fx.tensor("x.in0", dev);
        let c: Tensor<(C<2>, Dyn, C<4>), f32, D> = fx.tensor("c.in0", dev);
        let empty = xd.narrow::<1>(0, 0);
        k.close(&cat::<1, _, _>(&[xd.clone(), c, empty]), "cat.ax1.out", EXACT);
        let y: Tensor<(Dyn, C<3>, C<4>), f32, D> = cat::<0, _, _>(&[x.clone(), z.clone()]);
        k.close(&y, "cat.ax0.out", EXACT);
        k.close(&cat::<2, _, _>(&[x.clone(), z.clone(), x.clone()]), "cat.ax2.out", EXACT);
        let nc = cat::<1, _, _>(&[x.transpose::<0, 2>(), z.transpose::<0, 2>()]);
        k.close(&nc, "cat.nc.out", EXACT);

        let s: Vec<Tensor<(C<2>, C<3>), f32, D>> = (0..3).map(|i| fx.tensor(&format!("s{i}.in0"), dev)).collect();
        let st: Tensor<(Dyn, C<2>, C<3>), f32, D> = stack::<0, _, _>(&s);
        k.close(&st, "stack.ax0.out", EXACT);
        k.close(&stack::<1, _, _>(&s), "stack.ax1.out", EXACT);
        k.close(&stack::<2, _, _>(&s), "stack.ax2.out", EXACT);
        let st: Vec<Tensor<(C<3>, C<2>), f32, D>> = s.iter().map(|p| p.t()).collect();
        k.close(&stack::<0, _, _>(&st), "stack.nc.out", EXACT);
        k.finish();
    }

    fn f64_views<D>(dev) {
        let fx = Fixture::load("shape");
        let x: Tensor<(C<2>, C<3>, C<4>), f64, D> = fx.tensor("x64.in0", dev);
        let r: Tensor<(C<6>, C<4>), f64, D> = x.transpose::<0, 2>().reshape();
        fx.check(&r, "x64.reshape_nc.out", EXACT);
        let xd = x.narrow::<1>(0, 3);
        fx.check(&cat::<1, _, _>(&[xd.clone(), xd.narrow::<1>(0, 1)]), "x64.cat.out", EXACT);
    }

    /// cat of sizes that differ outside the axis, and of nothing, are errors.
    fn cat_errors<D>(dev) {
        let a: Tensor<(Dyn, Dyn), f32, D> = Tensor::zeros_on((Dyn(2), Dyn(3)), dev);
        let b: Tensor<(Dyn, Dyn), f32, D> = Tensor::zeros_on((Dyn(2), Dyn(4)), dev);
        match try_cat::<0, _, _>(&[a.clone(), b]) {
            Err(Error::Shape(e)) => assert_eq!((e.op, e.actual.as_str()), ("cat", "[2, 4]")),
            other => panic!("expected a shape error, got {:?}", other.map(|t| t.dims())),
        }
        let none: [Tensor<(Dyn, Dyn), f32, D>; 0] = [];
        assert!(matches!(try_cat::<0, _, _>(&none), Err(Error::InvalidArgument { .. })));
        let c: Tensor<(Dyn, Dyn), f32, D> = Tensor::zeros_on((Dyn(3), Dyn(3)), dev);
        assert!(matches!(forma::try_stack::<0, _, _>(&[a, c]), Err(Error::Shape(_))));
    }

    /// into_dyn always works; try_into_shape checks sizes and rank.
    fn into_dyn_and_try_into_shape<D>(dev) {
        let x: Tensor<(C<2>, C<3>), f32, D> = Tensor::from_vec_on((0..6).map(|v| v as f32).collect(), (C, C), dev).unwrap();
        let d: Tensor<(Dyn, Dyn), f32, D> = x.into_dyn();
        assert_eq!(d.shape(), (Dyn(2), Dyn(3)));
        assert!(d.shares_storage(&x));
        let back: Tensor<(C<2>, Dyn), f32, D> = d.try_into_shape().unwrap();
        assert_eq!(back.to_vec(), x.to_vec());
        let err = d.try_into_shape::<(C<3>, C<3>)>().unwrap_err();
        assert_eq!(
            err,
            Error::Shape(ShapeError { op: "try_into_shape", expected: "[3, 3]".into(), actual: "[2, 3]".into() })
        );
        assert_eq!(err.to_string(), "try_into_shape: expected shape [3, 3], got [2, 3]");
        assert_eq!(
            d.try_into_shape::<(Dyn,)>().unwrap_err().to_string(),
            "try_into_shape: expected shape [_], got [2, 3]"
        );
        assert!(d.try_into_shape::<(One, C<3>)>().is_err());
    }

    /// reshape of `Dyn` sizes: element counts are checked at run time.
    fn reshape_errors<D>(dev) {
        let x: Tensor<(Dyn, Dyn), f32, D> = Tensor::zeros_on((Dyn(3), Dyn(4)), dev);
        let err = x.try_reshape::<(C<5>, Dyn)>().unwrap_err();
        assert_eq!(
            err,
            Error::Shape(ShapeError { op: "reshape", expected: "[5, _]".into(), actual: "[3, 4]".into() })
        );
        assert_eq!(err.to_string(), "reshape: expected shape [5, _], got [3, 4]");
        assert_eq!(
            x.try_reshape_to((Dyn(5), Dyn(3))).unwrap_err().to_string(),
            "reshape: expected shape [5, 3], got [3, 4]"
        );
        // Several `Dyn`s keep the input's leading `Dyn` sizes, the last inferred.
        let same: Tensor<(Dyn, Dyn), f32, D> = x.try_reshape().unwrap();
        assert_eq!(same.dims()[..], [3, 4]);
        let y: Tensor<(Dyn, Dyn, C<2>, C<3>), f32, D> = Tensor::zeros_on((Dyn(2), Dyn(5), C, C), dev);
        let merged: Tensor<(Dyn, Dyn, C<6>), f32, D> = y.try_reshape().unwrap();
        assert_eq!(merged.dims()[..], [2, 5, 6]);
        let split: Tensor<(Dyn, Dyn, C<3>, C<2>), f32, D> = merged.try_reshape().unwrap();
        assert_eq!(split.dims()[..], [2, 5, 3, 2]);
        // Past the shared leading run, two `Dyn`s are still ambiguous.
        assert!(x.try_reshape::<(C<2>, Dyn, Dyn)>().is_err(), "two inferred dims are ambiguous");
        let z: Tensor<(Dyn, Dyn, Dyn), f32, D> = y.try_reshape().unwrap();
        assert_eq!(z.dims()[..], [2, 5, 6]);
        assert!(x.try_reshape::<(C<13>,)>().is_err());
        let ok: Tensor<(C<2>, Dyn), f32, D> = x.try_reshape().unwrap();
        assert_eq!(ok.shape(), (C, Dyn(6)));
        // slices and narrows out of range
        assert!(matches!(x.try_slice::<0>(1, 4, 1), Err(Error::InvalidArgument { .. })));
        assert!(matches!(x.try_slice::<1>(0, 4, 0), Err(Error::InvalidArgument { .. })));
        assert!(x.try_narrow::<1>(3, 2).is_err());
    }
}

// ------------------------------------------------------------------ properties

/// PyTorch's broadcasting rule, written plainly.
fn reference_broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let pad = |s: &[usize]| -> Vec<usize> {
        let mut v = vec![1; n - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (a, b) = (pad(a), pad(b));
    a.iter()
        .zip(&b)
        .map(|(&x, &y)| match (x, y) {
            _ if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// The row-major strides of `dims`.
fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Every multi-index of `dims` in row-major order.
fn indices(dims: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = dims.iter().product();
    (0..n)
        .map(|mut flat| {
            let mut idx = vec![0; dims.len()];
            for i in (0..dims.len()).rev() {
                idx[i] = flat % dims[i];
                flat /= dims[i];
            }
            idx
        })
        .collect()
}

/// A tensor as plain data: the reference the views are checked against.
#[derive(Clone, Debug)]
struct Plain {
    dims: Vec<usize>,
    data: Vec<f32>,
}

impl Plain {
    fn at(&self, idx: &[usize]) -> f32 {
        let s = strides(&self.dims);
        self.data[idx.iter().zip(&s).map(|(i, s)| i * s).sum::<usize>()]
    }

    /// A new tensor of `dims` whose element at `idx` is `self.at(src(idx))`.
    fn remap(&self, dims: Vec<usize>, src: impl Fn(&[usize]) -> Vec<usize>) -> Plain {
        let data = indices(&dims).iter().map(|i| self.at(&src(i))).collect();
        Plain { dims, data }
    }

    fn permute(&self, perm: &[usize]) -> Plain {
        let dims = perm.iter().map(|&p| self.dims[p]).collect();
        self.remap(dims, |i| {
            let mut src = vec![0; perm.len()];
            for (k, &p) in perm.iter().enumerate() {
                src[p] = i[k];
            }
            src
        })
    }

    fn slice(&self, axis: usize, start: usize, len: usize, step: usize) -> Plain {
        let mut dims = self.dims.clone();
        dims[axis] = len;
        self.remap(dims, |i| {
            let mut src = i.to_vec();
            src[axis] = start + i[axis] * step;
            src
        })
    }
}

/// One step of a random view chain; the raw numbers pick valid parameters
/// for whatever sizes the chain has reached.
#[derive(Clone, Debug)]
enum ViewOp {
    Transpose(usize),
    Permute(usize),
    Narrow(usize, u32, u32),
    Slice(usize, u32, u32, u32),
}

fn view_op() -> impl Strategy<Value = ViewOp> {
    prop_oneof![
        (0usize..3).prop_map(ViewOp::Transpose),
        (0usize..2).prop_map(ViewOp::Permute),
        (0usize..3, any::<u32>(), any::<u32>()).prop_map(|(a, s, l)| ViewOp::Narrow(a, s, l)),
        (0usize..3, any::<u32>(), any::<u32>(), any::<u32>())
            .prop_map(|(a, s, e, st)| ViewOp::Slice(a, s, e, st)),
    ]
}

type V3 = Tensor<(Dyn, Dyn, Dyn), f32, Cpu>;

/// Applies `op` to the tensor and to the reference.
fn apply(t: &V3, r: &Plain, op: &ViewOp) -> (V3, Plain) {
    match *op {
        ViewOp::Transpose(k) => match k {
            0 => (t.transpose::<0, 1>(), r.permute(&[1, 0, 2])),
            1 => (t.transpose::<0, 2>(), r.permute(&[2, 1, 0])),
            _ => (t.transpose::<1, 2>(), r.permute(&[0, 2, 1])),
        },
        ViewOp::Permute(k) => match k {
            0 => (t.permute::<(Ax<2>, Ax<0>, Ax<1>)>(), r.permute(&[2, 0, 1])),
            _ => (t.permute::<(Ax<1>, Ax<2>, Ax<0>)>(), r.permute(&[1, 2, 0])),
        },
        ViewOp::Narrow(axis, s, l) => {
            let size = r.dims[axis];
            let start = s as usize % (size + 1);
            let len = l as usize % (size - start + 1);
            let v = match axis {
                0 => t.narrow::<0>(start, len),
                1 => t.narrow::<1>(start, len),
                _ => t.narrow::<2>(start, len),
            };
            (v, r.slice(axis, start, len, 1))
        }
        ViewOp::Slice(axis, s, e, st) => {
            let size = r.dims[axis];
            let start = s as usize % (size + 1);
            let end = start + e as usize % (size - start + 1);
            let step = 1 + st as usize % 3;
            let v = match axis {
                0 => t.slice::<0>(start, end, step),
                1 => t.slice::<1>(start, end, step),
                _ => t.slice::<2>(start, end, step),
            };
            (v, r.slice(axis, start, (end - start).div_ceil(step), step))
        }
    }
}

/// Sizes a and b that broadcast to `out` (each dim either the full size or 1).
fn broadcast_pair(rank: usize) -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    proptest::collection::vec((0usize..4, any::<bool>(), any::<bool>()), rank).prop_map(|dims| {
        let a = dims
            .iter()
            .map(|&(d, sa, _)| if sa { 1 } else { d })
            .collect();
        let b = dims
            .iter()
            .map(|&(d, _, sb)| if sb { 1 } else { d })
            .collect();
        (a, b)
    })
}

fn iota(dims: &[usize], scale: f32) -> Vec<f32> {
    let n: usize = dims.iter().product();
    (0..n).map(|i| (i as f32 + 1.0) * scale).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// `broadcast_dims` follows PyTorch's rule on arbitrary (mostly incompatible) sizes.
    #[test]
    fn broadcast_dims_matches_reference(
        a in proptest::collection::vec(0usize..4, 0..5),
        b in proptest::collection::vec(0usize..4, 0..5),
    ) {
        let got = broadcast_dims(&a, &b).map(|d| d.to_vec());
        prop_assert_eq!(got, reference_broadcast(&a, &b));
    }

    /// ...and on compatible ones of different ranks, in both orders.
    #[test]
    fn broadcast_dims_of_compatible_shapes((a, b) in broadcast_pair(4), drop in 0usize..4) {
        let b = &b[drop..];
        let want = reference_broadcast(&a, b);
        prop_assert!(want.is_some());
        prop_assert_eq!(broadcast_dims(&a, b).map(|d| d.to_vec()), want.clone());
        prop_assert_eq!(broadcast_dims(b, &a).map(|d| d.to_vec()), want);
    }

    /// A `Dyn`-shaped add equals an explicit expand-then-add and a plain
    /// loop over the broadcast indices; a rank-2 operand broadcasts too.
    #[test]
    fn dyn_add_equals_expand_then_add((a_dims, b_dims) in broadcast_pair(3), low_rank in any::<bool>()) {
        let out = reference_broadcast(&a_dims, &b_dims).unwrap();
        let (av, bv) = (iota(&a_dims, 1.0), iota(&b_dims, 100.0));
        let a = V3::from_vec(av.clone(), (Dyn(a_dims[0]), Dyn(a_dims[1]), Dyn(a_dims[2]))).unwrap();
        let b = V3::from_vec(bv.clone(), (Dyn(b_dims[0]), Dyn(b_dims[1]), Dyn(b_dims[2]))).unwrap();
        let target = (Dyn(out[0]), Dyn(out[1]), Dyn(out[2]));
        let (pa, pb) = (Plain { dims: a_dims.clone(), data: av }, Plain { dims: b_dims.clone(), data: bv });
        let want: Vec<f32> = indices(&out)
            .iter()
            .map(|i| {
                let pick = |d: &[usize]| i.iter().zip(d).map(|(&k, &n)| if n == 1 { 0 } else { k }).collect::<Vec<_>>();
                pa.at(&pick(&a_dims)) + pb.at(&pick(&b_dims))
            })
            .collect();

        let y = a.try_add(&b).unwrap();
        prop_assert_eq!(y.dims().to_vec(), out.clone());
        let explicit = a.try_expand(target).unwrap().add(&b.try_expand(target).unwrap());
        prop_assert_eq!(y.to_vec(), explicit.to_vec());
        prop_assert_eq!(y.to_vec(), want.clone());

        if low_rank && b_dims[0] == 1 {
            // the same b without its leading 1: rank 3 + rank 2
            let b2: Tensor<(Dyn, Dyn), f32, Cpu> = b.squeeze::<0>();
            let y2 = a.try_add(&b2).unwrap();
            prop_assert_eq!(y2.to_vec(), want);
        }
    }

    /// Sizes that do not broadcast are a runtime `ShapeError`, never a panic.
    #[test]
    fn dyn_add_of_incompatible_shapes_is_an_error(
        a_dims in proptest::collection::vec(0usize..4, 2),
        b_dims in proptest::collection::vec(0usize..4, 2),
    ) {
        let a = Tensor::<(Dyn, Dyn), f32, Cpu>::zeros_with((Dyn(a_dims[0]), Dyn(a_dims[1])));
        let b = Tensor::<(Dyn, Dyn), f32, Cpu>::zeros_with((Dyn(b_dims[0]), Dyn(b_dims[1])));
        match reference_broadcast(&a_dims, &b_dims) {
            Some(out) => prop_assert_eq!(a.try_add(&b).unwrap().dims().to_vec(), out),
            None => {
                let is_shape_error = matches!(a.try_add(&b), Err(Error::Shape(_)));
                prop_assert!(is_shape_error);
            }
        }
    }

    /// Random chains of views give the same elements as the chain on plain
    /// indices; `contiguous()` of the view equals its `to_vec()`; unary and
    /// binary kernels read the strided view correctly.
    #[test]
    fn view_chains_match_reference(
        dims in proptest::collection::vec(1usize..5, 3),
        ops in proptest::collection::vec(view_op(), 0..6),
    ) {
        let data = iota(&dims, 1.0);
        let base = V3::from_vec(data.clone(), (Dyn(dims[0]), Dyn(dims[1]), Dyn(dims[2]))).unwrap();
        let (mut t, mut r) = (base.clone(), Plain { dims: dims.clone(), data });
        for op in &ops {
            let (t2, r2) = apply(&t, &r, op);
            t = t2;
            r = r2;
        }
        prop_assert!(t.shares_storage(&base));
        prop_assert_eq!(t.dims().to_vec(), r.dims.clone());
        prop_assert_eq!(t.to_vec(), r.data.clone());
        let c = t.contiguous();
        prop_assert!(c.is_contiguous());
        prop_assert_eq!(c.to_vec(), t.to_vec());
        prop_assert_eq!(c.shares_storage(&base), t.is_contiguous());
        let plus: Vec<f32> = r.data.iter().map(|v| v + 0.5).collect();
        prop_assert_eq!(t.add_scalar(0.5).to_vec(), plus);
        let twice: Vec<f32> = r.data.iter().map(|v| v * 2.0).collect();
        prop_assert_eq!((&t + &t).to_vec(), twice.clone());
        prop_assert_eq!((&t + &c).to_vec(), twice);
        let flat = t.flatten_all();
        prop_assert_eq!(flat.to_vec(), r.data);
    }
}

/// Like `torch.Tensor.view`: a strided view reshapes without a copy when each
/// new dim lies within a dense run of the old ones, and is copied otherwise;
/// the values are those of the row-major reshape either way.
#[test]
fn reshape_of_a_view_copies_only_when_its_strides_need_it() {
    let data: Vec<f32> = (0..60).map(|v| v as f32).collect();
    let x = Tensor::<(Dyn, Dyn, Dyn), f32, Cpu>::from_vec(data, (Dyn(2), Dyn(3), Dyn(10))).unwrap();
    // Columns 5..9 of every row: `[2, 3, 4]` with strides `[30, 10, 1]`.
    let s = x.narrow::<2>(5, 4);
    let want: Vec<f32> = (0..6)
        .flat_map(|row| (5..9).map(move |c| (row * 10 + c) as f32))
        .collect();
    let split = s.try_reshape_to((Dyn(2), Dyn(3), Dyn(2), Dyn(2))).unwrap();
    assert!(split.shares_storage(&x));
    assert_eq!(split.to_vec(), want);
    let merged = s.try_reshape_to((Dyn(6), Dyn(4))).unwrap();
    assert!(merged.shares_storage(&x));
    assert_eq!(merged.to_vec(), want);
    let flat = s.try_reshape_to((Dyn(24),)).unwrap();
    assert!(!flat.shares_storage(&x));
    assert_eq!(flat.to_vec(), want);
}

/// Negative axes count from the end, as PyTorch's `dim=-1`: every op that
/// takes an axis gives, for `-k`, the type and the values it gives for
/// `rank - k` (whose PyTorch parity the other tests check). Values are
/// distinct and unsorted, so an axis resolved wrongly changes the result.
#[test]
fn negative_axes_count_from_the_end() {
    use forma::Tensor as T;
    type S3 = (C<2>, C<3>, C<4>);
    let v: Vec<f32> = (0..24).map(|i| ((i * 7) % 24) as f32 - 11.5).collect();
    let x = T::<S3>::from_vec(v, (C, C, C)).unwrap();
    let same = |a: Vec<f32>, b: Vec<f32>, what: &str| assert_eq!(a, b, "{what}");

    // Reductions and softmax: the annotations check the shape rule.
    let s: T<(C<2>, C<3>)> = x.sum::<-1>();
    same(s.to_vec(), x.sum::<2>().to_vec(), "sum -1");
    let m: T<(C<2>, C<4>)> = x.max::<-2>();
    same(m.to_vec(), x.max::<1>().to_vec(), "max -2");
    let k: T<(One, C<3>, C<4>)> = x.mean_keepdim::<-3>();
    same(
        k.to_vec(),
        x.mean_keepdim::<0>().to_vec(),
        "mean_keepdim -3",
    );
    same(
        x.var::<-1>(true).to_vec(),
        x.var::<2>(true).to_vec(),
        "var -1",
    );
    same(
        x.softmax::<-1>().to_vec(),
        x.softmax::<2>().to_vec(),
        "softmax -1",
    );
    same(
        x.log_softmax::<-2>().to_vec(),
        x.log_softmax::<1>().to_vec(),
        "log_softmax -2",
    );
    let am: T<(C<2>, C<3>), i64> = x.argmax::<-1>();
    assert_eq!(am.to_vec(), x.argmax::<2>().to_vec(), "argmax -1");
    assert_eq!(
        x.argmin_keepdim::<-2>().to_vec(),
        x.argmin_keepdim::<1>().to_vec()
    );
    same(
        x.cumsum::<-1>().to_vec(),
        x.cumsum::<2>().to_vec(),
        "cumsum -1",
    );
    let xi = T::<S3, i64>::from_vec((0..24).map(|i| (i * 5) % 24).collect(), (C, C, C)).unwrap();
    assert_eq!(
        xi.sum::<-1>().to_vec(),
        xi.sum::<2>().to_vec(),
        "integer sum -1"
    );

    // Views.
    let t: T<(C<2>, C<4>, C<3>)> = x.transpose::<-2, -1>();
    same(
        t.contiguous().to_vec(),
        x.transpose::<1, 2>().contiguous().to_vec(),
        "transpose -2 -1",
    );
    same(
        x.transpose::<0, -1>().contiguous().to_vec(),
        x.transpose::<0, 2>().contiguous().to_vec(),
        "transpose 0 -1",
    );
    let u: T<(C<2>, C<3>, C<4>, One)> = x.unsqueeze::<-1>();
    assert_eq!(&*u.dims(), &[2, 3, 4, 1]);
    let u2: T<(C<2>, C<3>, One, C<4>)> = x.unsqueeze::<-2>();
    assert_eq!(&*u2.dims(), &[2, 3, 1, 4]);
    let back: T<S3> = u.squeeze::<-1>();
    same(back.to_vec(), x.to_vec(), "squeeze -1");
    same(
        x.narrow::<-1>(1, 2).contiguous().to_vec(),
        x.narrow::<2>(1, 2).contiguous().to_vec(),
        "narrow -1",
    );
    let parts = x.chunk::<-2>(2);
    let want = x.chunk::<1>(2);
    assert_eq!(parts.len(), want.len());
    for (p, w) in parts.iter().zip(&want) {
        same(p.contiguous().to_vec(), w.contiguous().to_vec(), "chunk -2");
    }

    // Joining, indexing, reordering, padding.
    let c: T<(C<2>, C<3>, Dyn)> = cat::<-1, _, _>(&[x.clone(), x.clone()]);
    same(
        c.to_vec(),
        cat::<2, _, _>(&[x.clone(), x.clone()]).to_vec(),
        "cat -1",
    );
    let st = stack::<-1, _, _>(&[x.clone(), x.clone()]);
    assert_eq!(&*st.dims(), &[2, 3, 4, 2]);
    same(
        st.to_vec(),
        stack::<3, _, _>(&[x.clone(), x.clone()]).to_vec(),
        "stack -1",
    );
    let idx = T::<(C<2>,), i64>::from_vec(vec![3, 0], (C,)).unwrap();
    same(
        x.index_select::<-1, _>(&idx).to_vec(),
        x.index_select::<2, _>(&idx).to_vec(),
        "index_select -1",
    );
    let gi = T::<S3, i64>::from_vec((0..24).map(|i| i % 3).collect(), (C, C, C)).unwrap();
    same(
        x.gather::<-2, _>(&gi).to_vec(),
        x.gather::<1, _>(&gi).to_vec(),
        "gather -2",
    );
    let (sv, si) = x.sort::<-1>(true);
    let (wv, wi) = x.sort::<2>(true);
    same(sv.to_vec(), wv.to_vec(), "sort -1");
    assert_eq!(si.to_vec(), wi.to_vec());
    same(
        x.topk::<-2>(2, true).0.contiguous().to_vec(),
        x.topk::<1>(2, true).0.contiguous().to_vec(),
        "topk -2",
    );
    same(x.roll::<-1>(1).to_vec(), x.roll::<2>(1).to_vec(), "roll -1");
    same(
        x.pad::<-1>(1, 2, forma::PadMode::Reflect).to_vec(),
        x.pad::<2>(1, 2, forma::PadMode::Reflect).to_vec(),
        "pad -1",
    );
    same(
        x.repeat_interleave::<-1>(2).to_vec(),
        x.repeat_interleave::<2>(2).to_vec(),
        "repeat_interleave -1",
    );
}
