//! [`Forward`]: a layer's computation, typed by its input and output.

use forma_core::Result;

/// Unwraps the result of a `try_` method for its panicking form: the
/// error's message is the panic's, at the caller's location.
#[track_caller]
pub(crate) fn ok<T, E: std::fmt::Display>(r: std::result::Result<T, E>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// A layer that maps an input `X` to an output `Y`, like `nn.Module.forward`.
///
/// Implement [`Forward::try_forward`]; [`Forward::forward`] is the same call
/// for code that treats a failure as a bug (it panics with the error, at the
/// caller's line). A model's own forward calls its children fallibly, each
/// as a named child (`child!(self.fc1, x)?`, or
/// [`Forward::try_forward_as`]), so that an error says which module raised
/// it and module hooks can see the child's input and output.
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
    ///
    /// # Errors
    /// What its ops return: a run-time shape mismatch (a `Dyn` size that does
    /// not fit), an index out of range, a backend failure.
    fn try_forward(&self, x: X) -> Result<Y>;

    /// Runs the layer, panicking on an error (see [`Forward::try_forward`]).
    ///
    /// # Panics
    /// On any error `try_forward` returns, with its message.
    #[track_caller]
    fn forward(&self, x: X) -> Y {
        ok(self.try_forward(x))
    }

    /// Runs the layer as the child `name` of the module now running (its
    /// `state_dict` name: a field, or an index in a list): an error it raises
    /// carries the module's dotted path (`encoder.layer.3.attention.self:
    /// matmul: ...`), and the forward pre/post hooks registered for that path
    /// ([`crate::hooks`]) see and may replace its input and output.
    ///
    /// # Errors
    /// As [`Forward::try_forward`], with the path; or a hook registered for
    /// this path with another input or output type than this layer's.
    fn try_forward_as(&self, name: impl Into<crate::scope::Segment>, x: X) -> Result<Y>
    where
        X: 'static,
        Y: 'static,
        Self: Sized,
    {
        crate::scope::forward_child(self, name.into(), x)
    }
}

impl<X, Y, M: Forward<X, Y> + ?Sized> Forward<X, Y> for Box<M> {
    fn try_forward(&self, x: X) -> Result<Y> {
        (**self).try_forward(x)
    }
}
