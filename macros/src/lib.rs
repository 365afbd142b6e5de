//! Forma's procedural macros: `#[derive(Module)]`, and `Tensor![..]` /
//! `Shape![..]` for writing tensor types with literal sizes.
//!
//! This file holds only the entry points. The derive runs in steps, like
//! serde_derive: `ast` reads the struct (with `attr` reading its
//! `#[module(...)]` attributes), `check` rejects attributes that contradict
//! each other, and `expand` writes the code. Every error is collected in a
//! `ctxt::Ctxt` and reported at once, each spanned on the user's token.

mod ast;
mod attr;
mod check;
mod ctxt;
mod expand;

use proc_macro::TokenStream;

/// Implements `forma::nn::Module` for a struct: its tensor fields are its
/// parameters (or, with `#[module(buffer)]`, its buffers), and its other
/// fields are its children, visited in PyTorch's `state_dict` order.
///
/// Struct attributes: `#[module(crate = "path", name = "Repr", extra_repr = "Self::f")]`.
/// Field attributes: `#[module(rename = "a.b")]`, `#[module(skip)]`,
/// `#[module(buffer)]`, `#[module(buffer(persistent = false))]`,
/// `#[module(flatten)]`.
#[proc_macro_derive(Module, attributes(module))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    expand::module::derive(&input).into()
}

/// Implements `forma::nn::Forward` for a struct whose fields are layers
/// applied in order, from `#[sequential(input = [..])]` to
/// `#[sequential(output = [..])]` (dims as in `Tensor![..]`; a name such as
/// `B` that is not a parameter of the struct becomes a generic dim). Each step
/// is checked: a layer that cannot take its neighbour's output is a compile
/// error on that field, naming both and the sizes. Fields marked
/// `#[module(skip)]` or `#[sequential(skip)]` are left out of the chain.
#[proc_macro_derive(Sequential, attributes(sequential))]
pub fn derive_sequential(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    expand::sequential::derive(&input).into()
}

/// A tensor type from its dims: `Tensor![B, 3, 224, 224]` is
/// `forma::Tensor<(B, C<3>, C<224>, C<224>)>`. An integer is a static size,
/// `{expr}` a const expression, anything else a dim type (`Dyn`, a generic).
/// The element type and device may follow a semicolon: `Tensor![B, 784; f64]`,
/// `Tensor![B, 784; E, D]`.
#[allow(non_snake_case)]
#[proc_macro]
pub fn Tensor(input: TokenStream) -> TokenStream {
    expand::tensor_macro::tensor(input.into()).into()
}

/// A shape (the tuple of dims) in the notation of `Tensor![..]`:
/// `Shape![B, 3]` is `(B, C<3>)`.
#[allow(non_snake_case)]
#[proc_macro]
pub fn Shape(input: TokenStream) -> TokenStream {
    expand::tensor_macro::shape(input.into()).into()
}
