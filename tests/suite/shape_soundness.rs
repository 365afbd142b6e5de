//! Soundness of static shapes under broadcasting: a tensor's static dims must
//! always equal its runtime sizes, whatever the broadcasting ops are given.
//!
//! A shape type mixes static sizes (`C<N>`), the stretching size 1 (`One`)
//! and runtime sizes (`Dyn`). The compiler checks the static pairs; a `Dyn`
//! is only known when the op runs, so it can meet a static size the result
//! type has already fixed. A `C<1>` meeting `Dyn(4)` would broadcast to 4 in
//! PyTorch, but the result type keeps `C<1>`: returning that tensor would let
//! the type lie about its size (and every later op trust the lie). The op must
//! refuse it with a `ShapeError` instead (`check_broadcast_type`).
//!
//! The property, for every broadcasting op family (the binary table,
//! comparisons, the logical ops, `where_cond`, `masked_fill` and fused
//! expressions, through their `try_` forms) over a table of shape-type pairs
//! that mix `C<1>`, `C<3>`, `One` and `Dyn` (rank 1 with rank 1, rank 2 with
//! rank 2, and rank 2 with rank 1 in both orders), with `Dyn` sizes drawn from
//! {1, 3, 4}:
//!
//! - `Ok` exactly when the runtime sizes broadcast (PyTorch's rule) and the
//!   result type can hold the broadcast sizes; a refusal is a `ShapeError`;
//! - on `Ok`, the result's runtime dims are PyTorch's broadcast and every
//!   static dim of its type equals the runtime size;
//! - on `Ok`, the values equal a reference computed on plain `Vec`s.
//!
//! `tests/proptest-regressions/shape_soundness.txt` keeps the case proptest
//! shrank to when `check_broadcast_type` was made to accept everything: a
//! `(C<3>, C<1>)` tensor with a `(Dyn, Dyn)` one holding (1, 3), whose add
//! returned [3, 3] typed (C<3>, C<1>). `static_one_does_not_stretch_against_dyn`
//! states the same pair of types by name, holding (1, 4), (3, 1) and (1, 1).

use forma::core::ops::fused::BinaryExprs;
use forma::core::shape::op::{self, Elementwise};
use forma::core::shape::{BroadcastShape, ExpandTo};
use forma::core::{Error, Result};
use forma::{try_composed, try_fused, try_where_cond, Dyn, One, Shape, Tensor, C};
use proptest::prelude::*;
use proptest::sample::select;
use std::fmt;

/// The result type of broadcasting `A` with `B`.
type Out<A, B> = <A as BroadcastShape<B>>::Output;

/// One pair of shape types, checked by its monomorphised [`check`].
#[derive(Clone, Copy)]
struct Combo {
    name: &'static str,
    check: fn(&[usize], &[usize]) -> std::result::Result<(), TestCaseError>,
}

impl fmt::Debug for Combo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

macro_rules! combos {
    ($($a:ty, $b:ty;)*) => {
        /// Every pair of shape types the property runs over.
        static COMBOS: &[Combo] = &[$(
            Combo {
                name: concat!(stringify!($a), " with ", stringify!($b)),
                check: check::<$a, $b>,
            },
        )*];
    };
}

// Per axis, the 14 ordered kind pairs that compile (`C<1>` with `C<3>` is a
// compile error either way round): C1-C1, C3-C3, C1-One, One-C1, C3-One,
// One-C3, C1-Dyn, Dyn-C1, C3-Dyn, Dyn-C3, One-One, One-Dyn, Dyn-One, Dyn-Dyn.
combos! {
    // Rank 1 with rank 1: every pair.
    (C<1>,), (C<1>,);
    (C<3>,), (C<3>,);
    (C<1>,), (One,);
    (One,), (C<1>,);
    (C<3>,), (One,);
    (One,), (C<3>,);
    (C<1>,), (Dyn,);
    (Dyn,), (C<1>,);
    (C<3>,), (Dyn,);
    (Dyn,), (C<3>,);
    (One,), (One,);
    (One,), (Dyn,);
    (Dyn,), (One,);
    (Dyn,), (Dyn,);
    // Rank 2 with rank 2: every pair on axis 0, and again on axis 1.
    (C<1>, One), (C<1>, C<3>);
    (C<3>, C<1>), (C<3>, Dyn);
    (C<1>, Dyn), (One, C<1>);
    (One, C<3>), (C<1>, Dyn);
    (C<3>, Dyn), (One, C<3>);
    (One, One), (C<3>, One);
    (C<1>, One), (Dyn, Dyn);
    (Dyn, Dyn), (C<1>, One);
    (C<3>, Dyn), (Dyn, Dyn);
    (Dyn, C<1>), (C<3>, C<1>);
    (One, C<3>), (One, C<3>);
    (One, C<1>), (Dyn, One);
    (Dyn, One), (One, C<1>);
    (Dyn, C<3>), (Dyn, One);
    // The type that lies: (1, 4) in the `Dyn` operand would give [3, 4]
    // typed (C<3>, C<1>).
    (C<3>, C<1>), (Dyn, Dyn);
    (Dyn, Dyn), (C<3>, C<1>);
    (Dyn, Dyn), (Dyn, Dyn);
    (One, C<3>), (C<3>, One);
    // Rank 2 with rank 1: every pair on the shared axis.
    (C<1>, C<1>), (C<1>,);
    (C<3>, C<3>), (C<3>,);
    (One, C<1>), (One,);
    (Dyn, One), (C<1>,);
    (C<1>, C<3>), (One,);
    (C<3>, One), (C<3>,);
    (One, C<1>), (Dyn,);
    (Dyn, Dyn), (C<1>,);
    (C<1>, C<3>), (Dyn,);
    (C<3>, Dyn), (C<3>,);
    (One, One), (One,);
    (Dyn, One), (Dyn,);
    (C<1>, Dyn), (One,);
    (C<3>, Dyn), (Dyn,);
    // Rank 1 with rank 2.
    (C<1>,), (Dyn, Dyn);
    (Dyn,), (C<3>, C<1>);
    (One,), (Dyn, C<3>);
    (C<3>,), (One, Dyn);
    (Dyn,), (Dyn, One);
    (C<1>,), (C<3>, One);
    (One,), (One, One);
}

/// PyTorch's broadcast of two sizes, aligned from the last dim; `None` when
/// they do not broadcast.
fn torch_broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let at = |s: &[usize], i: usize| (i + s.len()).checked_sub(n).map_or(1, |j| s[j]);
    (0..n)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// The flat index into an operand of sizes `dims` read at the flat output
/// position `flat` of a tensor of sizes `out` (size-1 and missing leading
/// dims stretch).
fn gather(dims: &[usize], out: &[usize], mut flat: usize) -> usize {
    let mut idx = vec![0; out.len()];
    for (i, &n) in out.iter().enumerate().rev() {
        idx[i] = flat % n;
        flat /= n;
    }
    let off = out.len() - dims.len();
    dims.iter().enumerate().fold(0, |acc, (j, &n)| {
        acc * n + if n == 1 { 0 } else { idx[j + off] }
    })
}

/// A shape's runtime sizes: a static dim's own size, a `Dyn` dim the drawn one.
fn runtime_dims<S: Shape>(drawn: &[usize]) -> Vec<usize> {
    S::static_dims()
        .iter()
        .zip(drawn)
        .map(|(s, &n)| s.unwrap_or(n))
        .collect()
}

fn tensor<S: Shape, E: forma::core::Dtype>(dims: &[usize], f: impl Fn(usize) -> E) -> Tensor<S, E> {
    let n = dims.iter().product();
    let shape = S::from_dims(dims).expect("runtime dims fit the operand's type");
    Tensor::from_vec((0..n).map(f).collect(), shape).unwrap()
}

/// What one case expects of every op.
struct Case {
    a: Vec<usize>,
    b: Vec<usize>,
    /// PyTorch's broadcast of the runtime sizes.
    torch: Option<Vec<usize>>,
    /// Whether the result type can hold `torch`.
    holds: bool,
    /// The result type's static sizes, `[_, 3]`.
    out_type: String,
}

impl Case {
    /// The verdict on one op's result: `Ok` exactly when the sizes broadcast
    /// and the type holds them, with PyTorch's dims and the type's static
    /// sizes; a refusal is a `ShapeError`. The tensor when `Ok`.
    fn verdict<O: Shape, E: forma::core::Dtype>(
        &self,
        op: &str,
        got: Result<Tensor<O, E>>,
    ) -> std::result::Result<Option<Tensor<O, E>>, TestCaseError> {
        let (a, b, ty) = (&self.a, &self.b, &self.out_type);
        match got {
            Ok(y) => {
                let dims = y.dims().to_vec();
                prop_assert!(
                    self.holds,
                    "{op}: {a:?} with {b:?} returned {dims:?} typed {ty}, but PyTorch gives {:?}",
                    self.torch
                );
                prop_assert_eq!(Some(&dims), self.torch.as_ref(), "{}: dims", op);
                for (axis, (s, &n)) in O::static_dims().iter().zip(&dims).enumerate() {
                    if let Some(s) = *s {
                        prop_assert_eq!(s, n, "{}: axis {} of {} holds {}", op, axis, ty, n);
                    }
                }
                prop_assert!(
                    O::from_dims(&dims).is_some(),
                    "{op}: {ty} cannot hold {dims:?}"
                );
                Ok(Some(y))
            }
            Err(e) => {
                prop_assert!(
                    !self.holds,
                    "{op}: refused {a:?} with {b:?} ({e}), though they broadcast to {:?} and {ty} holds it",
                    self.torch
                );
                prop_assert!(matches!(e, Error::Shape(_)), "{op}: not a ShapeError: {e}");
                Ok(None)
            }
        }
    }

    /// `f` of the operands' values at every output position (the case
    /// broadcasts).
    fn reference<X: Copy, Y: Copy, Z>(&self, x: &[X], y: &[Y], f: impl Fn(X, Y) -> Z) -> Vec<Z> {
        let out = self.torch.as_ref().expect("the sizes broadcast");
        let n: usize = out.iter().product();
        (0..n)
            .map(|i| f(x[gather(&self.a, out, i)], y[gather(&self.b, out, i)]))
            .collect()
    }
}

fn close(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| g == w || (g - w).abs() <= 1e-6 * w.abs().max(1.0))
}

/// The property for one pair of shape types, with the drawn `Dyn` sizes.
fn check<A, B>(a_drawn: &[usize], b_drawn: &[usize]) -> std::result::Result<(), TestCaseError>
where
    A: Elementwise<B>
        + ExpandTo<Out<A, B>, op::where_cond_mask>
        + ExpandTo<Out<A, B>, op::masked_fill>,
    B: Shape + ExpandTo<Out<A, B>, op::where_cond_mask> + ExpandTo<Out<A, B>, op::masked_fill>,
{
    let (a_dims, b_dims) = (runtime_dims::<A>(a_drawn), runtime_dims::<B>(b_drawn));
    let torch = torch_broadcast(&a_dims, &b_dims);
    let holds = torch
        .as_deref()
        .is_some_and(|d| Out::<A, B>::from_dims(d).is_some());
    let case = Case {
        a: a_dims.clone(),
        b: b_dims.clone(),
        torch,
        holds,
        out_type: Out::<A, B>::describe(),
    };

    // Small integers, so that sums, products and comparisons are exact and
    // some elements compare equal.
    let av: Vec<f32> = (0..a_dims.iter().product())
        .map(|i| (i % 4) as f32 + 1.0)
        .collect();
    let bv: Vec<f32> = (0..b_dims.iter().product())
        .map(|i| ((i * 3 + 1) % 5) as f32 + 1.0)
        .collect();
    let am: Vec<bool> = (0..av.len()).map(|i| i % 2 == 0).collect();
    let bm: Vec<bool> = (0..bv.len()).map(|i| i % 3 != 1).collect();
    let a = tensor::<A, f32>(&a_dims, |i| av[i]);
    let b = tensor::<B, f32>(&b_dims, |i| bv[i]);
    let ma = tensor::<A, bool>(&a_dims, |i| am[i]);
    let mb = tensor::<B, bool>(&b_dims, |i| bm[i]);

    type Arith<A, B> = fn(&Tensor<A>, &Tensor<B>) -> Result<Tensor<Out<A, B>>>;
    let arith: [(&str, Arith<A, B>, fn(f32, f32) -> f32); 9] = [
        ("add", Tensor::try_add, |x, y| x + y),
        ("sub", Tensor::try_sub, |x, y| x - y),
        ("mul", Tensor::try_mul, |x, y| x * y),
        ("div", Tensor::try_div, |x, y| x / y),
        ("pow", Tensor::try_pow, f32::powf),
        ("maximum", Tensor::try_maximum, f32::max),
        ("minimum", Tensor::try_minimum, f32::min),
        ("fmax", Tensor::try_fmax, f32::max),
        ("fmin", Tensor::try_fmin, f32::min),
    ];
    let mut sum = None;
    for (op, f, r) in arith {
        if let Some(y) = case.verdict(op, f(&a, &b))? {
            let (got, want) = (y.to_vec(), case.reference(&av, &bv, r));
            prop_assert!(close(&got, &want), "{}: {:?}, want {:?}", op, got, want);
            if op == "add" {
                sum = Some(y);
            }
        }
    }

    type Cmp<A, B> = fn(&Tensor<A>, &Tensor<B>) -> Result<Tensor<Out<A, B>, bool>>;
    let cmps: [(&str, Cmp<A, B>, fn(f32, f32) -> bool); 6] = [
        ("eq", Tensor::try_eq, |x, y| x == y),
        ("ne", Tensor::try_ne, |x, y| x != y),
        ("lt", Tensor::try_lt, |x, y| x < y),
        ("le", Tensor::try_le, |x, y| x <= y),
        ("gt", Tensor::try_gt, |x, y| x > y),
        ("ge", Tensor::try_ge, |x, y| x >= y),
    ];
    for (op, f, r) in cmps {
        if let Some(y) = case.verdict(op, f(&a, &b))? {
            prop_assert_eq!(y.to_vec(), case.reference(&av, &bv, r), "{}", op);
        }
    }

    type Logical<A, B> = fn(&Tensor<A, bool>, &Tensor<B, bool>) -> Result<Tensor<Out<A, B>, bool>>;
    let logical: [(&str, Logical<A, B>, fn(bool, bool) -> bool); 3] = [
        ("logical_and", Tensor::try_logical_and, |x, y| x && y),
        ("logical_or", Tensor::try_logical_or, |x, y| x || y),
        ("logical_xor", Tensor::try_logical_xor, |x, y| x != y),
    ];
    for (op, f, r) in logical {
        if let Some(y) = case.verdict(op, f(&ma, &mb))? {
            prop_assert_eq!(y.to_vec(), case.reference(&am, &bm, r), "{}", op);
        }
    }

    // `where`, with the condition shaped like either operand.
    if let Some(y) = case.verdict("where (cond like a)", try_where_cond(&ma, &a, &b))? {
        let cond = case.reference(&am, &bm, |c, _| c);
        let want: Vec<f32> = case
            .reference(&av, &bv, |x, y| (x, y))
            .into_iter()
            .zip(cond)
            .map(|((x, y), c)| if c { x } else { y })
            .collect();
        prop_assert_eq!(y.to_vec(), want, "where (cond like a)");
    }
    if let Some(y) = case.verdict("where (cond like b)", try_where_cond(&mb, &a, &b))? {
        let cond = case.reference(&am, &bm, |_, c| c);
        let want: Vec<f32> = case
            .reference(&av, &bv, |x, y| (x, y))
            .into_iter()
            .zip(cond)
            .map(|((x, y), c)| if c { x } else { y })
            .collect();
        prop_assert_eq!(y.to_vec(), want, "where (cond like b)");
    }

    // `masked_fill` of the sum, with a mask shaped like either operand: the
    // mask stretches to the result's sizes, which the result keeps.
    if let Some(sum) = &sum {
        let plus = case.reference(&av, &bv, |x, y| x + y);
        for (op, got, mask) in [
            (
                "masked_fill (mask like a)",
                sum.try_masked_fill(&ma, -1.0),
                case.reference(&am, &bm, |m, _| m),
            ),
            (
                "masked_fill (mask like b)",
                sum.try_masked_fill(&mb, -1.0),
                case.reference(&am, &bm, |_, m| m),
            ),
        ] {
            let y = case.verdict(op, got)?;
            prop_assert!(y.is_some(), "{}: refused", op);
            let want: Vec<f32> = plus
                .iter()
                .zip(mask)
                .map(|(&v, m)| if m { -1.0 } else { v })
                .collect();
            prop_assert_eq!(y.unwrap().to_vec(), want, "{}", op);
        }
    }

    // A fused expression of both inputs, fused and composed.
    let want = case
        .torch
        .is_some()
        .then(|| case.reference(&av, &bv, |x, y| x * y + x.max(y)));
    for (op, got) in [
        ("fused", try_fused((&a, &b), |(x, y)| x * y + x.maximum(y))),
        (
            "composed",
            try_composed((&a, &b), |(x, y)| x * y + x.maximum(y)),
        ),
    ] {
        if let Some(y) = case.verdict(op, got)? {
            prop_assert_eq!(Some(y.to_vec()), want.clone(), "{}", op);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every broadcasting op, over every pair of shape types in the table:
    /// `Ok` exactly when PyTorch broadcasts the runtime sizes and the result
    /// type holds them, with PyTorch's dims, static dims equal to the runtime
    /// sizes, and the reference values.
    #[test]
    fn broadcast_results_fit_their_static_dims(
        combo in select(COMBOS),
        a_sizes in proptest::collection::vec(select(vec![1usize, 3, 4]), 2),
        b_sizes in proptest::collection::vec(select(vec![1usize, 3, 4]), 2),
    ) {
        (combo.check)(&a_sizes, &b_sizes)?;
    }
}

/// The case by name: a `(C<3>, C<1>)` tensor with a `(Dyn, Dyn)`
/// tensor holding (1, 4) would broadcast to [3, 4] typed (C<3>, C<1>), so it
/// is refused in both orders; holding (3, 1) or (1, 1) it fits the type.
#[test]
fn static_one_does_not_stretch_against_dyn() {
    let s = Tensor::<(C<3>, C<1>)>::from_vec(vec![1.0, 2.0, 3.0], (C, C)).unwrap();

    let wide =
        Tensor::<(Dyn, Dyn)>::from_vec(vec![10.0, 20.0, 30.0, 40.0], (Dyn(1), Dyn(4))).unwrap();
    assert!(matches!(s.try_add(&wide), Err(Error::Shape(_))));
    assert!(matches!(wide.try_add(&s), Err(Error::Shape(_))));
    assert!(matches!(s.try_lt(&wide), Err(Error::Shape(_))));
    assert!(matches!(
        try_fused((&wide, &s), |(x, y)| x + y),
        Err(Error::Shape(_))
    ));

    let col = Tensor::<(Dyn, Dyn)>::from_vec(vec![10.0, 20.0, 30.0], (Dyn(3), Dyn(1))).unwrap();
    for y in [s.try_add(&col).unwrap(), col.try_add(&s).unwrap()] {
        assert_eq!(y.dims().to_vec(), [3, 1]);
        assert_eq!(y.to_vec(), [11.0, 22.0, 33.0]);
    }

    let one = Tensor::<(Dyn, Dyn)>::from_vec(vec![10.0], (Dyn(1), Dyn(1))).unwrap();
    for y in [s.try_add(&one).unwrap(), one.try_add(&s).unwrap()] {
        assert_eq!(y.dims().to_vec(), [3, 1]);
        assert_eq!(y.to_vec(), [11.0, 12.0, 13.0]);
    }

    // `One` is the size 1 that stretches: the same (1, 4) fits (C<3>, Dyn).
    let o = Tensor::<(C<3>, One)>::from_vec(vec![1.0, 2.0, 3.0], (C, One)).unwrap();
    let y: Tensor<(C<3>, Dyn)> = o.try_add(&wide).unwrap();
    assert_eq!(y.dims().to_vec(), [3, 4]);
    assert_eq!(
        y.to_vec(),
        [11.0, 21.0, 31.0, 41.0, 12.0, 22.0, 32.0, 42.0, 13.0, 23.0, 33.0, 43.0]
    );
}
