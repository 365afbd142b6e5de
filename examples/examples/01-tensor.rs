//! 01: a first tour of tensors and shapes.
//!
//! Run with `cargo run --release -p forma-examples --example 01-tensor`.

use forma::prelude::*;

fn main() -> forma::Result<()> {
    println!("forma {} — a tour of tensors\n", env!("CARGO_PKG_VERSION"));

    // A shape is a tuple of dims: `C<N>` is known to the compiler, `Dyn` at run time.
    let x = Tensor::<(C<2>, C<3>)>::from_vec(vec![1., -2., 3., -4., 5., -6.], (C, C))?;
    println!("x =\n{x}\n");

    // Elementwise ops broadcast like PyTorch's. A bias of shape (3,) extends to (2, 3).
    let bias = Tensor::<(C<3>,)>::from_vec(vec![0.5, 0.5, 0.5], (C,))?;
    let y: Tensor<(C<2>, C<3>)> = (&x + &bias).relu();
    println!("relu(x + bias) =\n{y}\n");

    // Reductions name their axis in the type; `_keepdim` keeps it as `One`, a
    // size-1 dim that stretches back under broadcasting.
    let row_max: Tensor<(C<2>, One)> = x.max_keepdim::<1>();
    let centred: Tensor<(C<2>, C<3>)> = &x - &row_max;
    println!("x - max(x, 1, keepdim) =\n{centred}\n");
    println!("softmax(x, 1) =\n{}\n", x.softmax::<1>());

    // Matrix products check the inner dimension at compile time.
    let w = Tensor::<(C<3>, C<4>)>::ones();
    let z: Tensor<(C<2>, C<4>)> = x.matmul(&w);
    println!("x @ ones(3, 4) =\n{z}\n");
    // let bad = x.matmul(&Tensor::<(C<4>, C<4>)>::ones());
    // ^ does not compile: "matmul: the left operand has 3 columns but the right operand has 4 rows"

    // Views share storage: transpose, narrow, expand, unsqueeze cost no copy.
    let xt: Tensor<(C<3>, C<2>)> = x.t();
    println!(
        "x.t() shares x's storage: {}, contiguous: {}",
        xt.shares_storage(&x),
        xt.is_contiguous()
    );
    println!(
        "x.t().contiguous() copies: {}\n",
        !xt.contiguous().shares_storage(&x)
    );

    // Dynamic sizes: a batch known only at run time.
    let mut rng = Rng::seed_from(0);
    let batch = 4;
    let inputs = Tensor::<(Dyn, C<3>)>::randn((Dyn(batch), C), &mut rng);
    let logits: Tensor<(Dyn, C<4>)> = inputs.matmul(&w);
    println!("a Dyn batch of {batch}: logits {:?}", logits.dims());
    println!("argmax per row: {:?}\n", logits.argmax::<1>().to_vec());

    // Converting between static and dynamic shapes is explicit and checked.
    let d = x.into_dyn();
    let back: Tensor<(C<2>, C<3>)> = d.try_into_shape()?;
    println!("into_dyn then try_into_shape: {:?}", back.dims());
    match d.try_into_shape::<(C<3>, C<2>)>() {
        Ok(_) => unreachable!("a 2x3 tensor is not 3x2"),
        Err(e) => println!("a wrong claim is an error value: {e}\n"),
    }

    // Reshape checks element counts at compile time when the shapes are static.
    let r: Tensor<(C<3>, C<2>)> = x.reshape();
    println!("reshape to (3, 2) =\n{r}");
    // let bad: Tensor<(C<4>, C<2>)> = x.reshape();
    // ^ does not build: "reshape: cannot turn a tensor of 6 elements into a shape of 8 elements"

    // dtypes: f32 by default; f64, f16, bf16, i64, u32 and bool, with explicit casts.
    let h = x.to_dtype::<f16>();
    println!("\nas f16: {h}");
    Ok(())
}
