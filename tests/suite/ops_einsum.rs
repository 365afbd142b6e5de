//! `einsum` against PyTorch (`tools/fixtures/einsum.safetensors`): one and
//! two operands (matmul, batched matmul, attention scores, row-wise dot,
//! outer product, a letter summed before the product, the implicit output,
//! a reordered output, transpose, reductions, permutation), and the
//! gradients of `sum(out * w)` for every operand.

use crate::common;

use common::*;
use forma::core::Tensor;
use forma::{einsum, try_einsum, Dyn, C};

type T2 = (Dyn, Dyn);
type T3 = (Dyn, Dyn, Dyn);
type T4 = (Dyn, Dyn, Dyn, Dyn);

/// Runs case `name` on two operands of shapes `A`, `B` into `O` and checks
/// the output and both gradients.
fn two<A: forma::Shape, B: forma::Shape, O: forma::Shape, D: TestDevice>(
    c: &mut Checks,
    fx: &Fixture,
    dev: &D,
    name: &str,
    eq: &str,
) {
    let a: Tensor<A, f32, D> = fx
        .tensor::<A, f32, D>(&format!("{name}.in0"), dev)
        .requires_grad();
    let b: Tensor<B, f32, D> = fx
        .tensor::<B, f32, D>(&format!("{name}.in1"), dev)
        .requires_grad();
    let out: Tensor<O, f32, D> = einsum(eq, (&a, &b));
    c.close(&out, &format!("{name}.out"), F32_SUM_TOL);
    let w: Tensor<O, f32, D> = fx.tensor(&format!("{name}.w"), dev);
    (&out.flatten_all() * &w.flatten_all()).sum_all().backward();
    c.close(
        &a.grad().expect("a gradient"),
        &format!("{name}.grad0"),
        F32_SUM_TOL,
    );
    c.close(
        &b.grad().expect("a gradient"),
        &format!("{name}.grad1"),
        F32_SUM_TOL,
    );
}

fn one<A: forma::Shape, O: forma::Shape, D: TestDevice>(
    c: &mut Checks,
    fx: &Fixture,
    dev: &D,
    name: &str,
    eq: &str,
) {
    let a: Tensor<A, f32, D> = fx
        .tensor::<A, f32, D>(&format!("{name}.in0"), dev)
        .requires_grad();
    let out: Tensor<O, f32, D> = einsum(eq, (&a,));
    c.close(&out, &format!("{name}.out"), F32_SUM_TOL);
    let w: Tensor<O, f32, D> = fx.tensor(&format!("{name}.w"), dev);
    (&out.flatten_all() * &w.flatten_all()).sum_all().backward();
    c.close(
        &a.grad().expect("a gradient"),
        &format!("{name}.grad0"),
        F32_SUM_TOL,
    );
}

device_tests! {
    fn einsum_of_two_operands<D>(dev) {
        let fx = Fixture::load("einsum");
        let mut c = Checks::new(&fx);
        two::<(C<3>, C<4>), (C<4>, C<5>), (C<3>, C<5>), D>(&mut c, &fx, dev, "matmul", "ij,jk->ik");
        two::<T3, T3, T3, D>(&mut c, &fx, dev, "bmm", "bij,bjk->bik");
        two::<T4, T4, T4, D>(&mut c, &fx, dev, "scores", "bhqd,bhkd->bhqk");
        two::<T2, T2, (Dyn,), D>(&mut c, &fx, dev, "rowdot", "ij,ij->i");
        two::<(Dyn,), (Dyn,), T2, D>(&mut c, &fx, dev, "outer", "i,j->ij");
        two::<T3, T2, T2, D>(&mut c, &fx, dev, "summed_first", "bij,jk->bk");
        two::<T2, T2, T2, D>(&mut c, &fx, dev, "implicit", "ij,jk");
        two::<T3, T2, T3, D>(&mut c, &fx, dev, "reorder", " ijk , kj -> kij ");
        c.finish();
    }

    fn einsum_of_one_operand<D>(dev) {
        let fx = Fixture::load("einsum");
        let mut c = Checks::new(&fx);
        one::<T2, T2, D>(&mut c, &fx, dev, "transpose", "ij->ji");
        one::<T3, (C<3>,), D>(&mut c, &fx, dev, "reduce", "ijk->j");
        one::<T2, (), D>(&mut c, &fx, dev, "total", "ij->");
        one::<T3, T3, D>(&mut c, &fx, dev, "permute", "abc->cab");
        c.finish();
    }

    fn einsum_refuses_what_it_cannot_do<D>(dev) {
        let a = Tensor::<(C<2>, C<3>), f32, D>::zeros_on((C, C), dev);
        let b = Tensor::<(C<4>, C<5>), f32, D>::zeros_on((C, C), dev);
        let err = |r: forma::Result<Tensor<T2, f32, D>>| r.unwrap_err().to_string();
        // j is 3 in the first operand and 4 in the second.
        let msg = err(try_einsum("ij,jk->ik", (&a, &b)));
        assert!(msg.contains("size 3 for 'j'"), "{msg}");
        let msg = err(try_einsum("ijk->ij", (&a,)));
        assert!(msg.contains("operand 0 has 2 axes, the equation names 3"), "{msg}");
        let msg = err(try_einsum("ii->ij", (&a,)));
        assert!(msg.contains("'i' appears twice in operand 0"), "{msg}");
        let msg = err(try_einsum("...j->j", (&a,)));
        assert!(msg.contains("ellipsis"), "{msg}");
        let msg = err(try_einsum("ij->iz", (&a,)));
        assert!(msg.contains("'z' names no operand's axis"), "{msg}");
        let msg = err(try_einsum("ij,jk->ik", (&a,)));
        assert!(msg.contains("2 operand(s) named, 1 given"), "{msg}");
        // The output must fit the result type: [2, 3] is not [3, 2] statically.
        let r: forma::Result<Tensor<(C<3>, C<2>), f32, D>> = try_einsum("ij->ij", (&a,));
        assert!(r.is_err());
    }
}
