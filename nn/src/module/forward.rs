//! [`Forward`]: a layer's computation, typed by its input and output.

/// A layer that maps an input `X` to an output `Y`, like `nn.Module.forward`.
///
/// The output is a trait parameter rather than an associated type so that a
/// layer whose output size needs arithmetic the type system cannot do on
/// stable Rust (a convolution's height and width) can let the caller state it;
/// the layer checks the stated sizes when the program is built. Layers whose
/// output follows from the input (Linear, activations, norms) have one impl
/// per input, so their output is inferred.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot take a `{X}` as input",
    label = "this layer does not accept what the layer before it produces",
    note = "compare this layer's input features or channels with what the previous layer produces (the output asked of it is `{Y}`, where `_` means inferred)"
)]
pub trait Forward<X, Y> {
    /// Runs the layer.
    fn forward(&self, x: X) -> Y;
}

impl<X, Y, M: Forward<X, Y> + ?Sized> Forward<X, Y> for Box<M> {
    fn forward(&self, x: X) -> Y {
        (**self).forward(x)
    }
}
