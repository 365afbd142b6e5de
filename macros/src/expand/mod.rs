//! Code generation.

pub mod module;
pub mod sequential;
pub mod tensor_macro;

use proc_macro2::{Group, Span, TokenStream, TokenTree};

/// `tokens` with every span (groups included) set to `span`, so that an error
/// about generated code points at one user token.
pub fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|tt| match tt {
            TokenTree::Group(g) => {
                let mut group = Group::new(g.delimiter(), respan(g.stream(), span));
                group.set_span(span);
                TokenTree::Group(group)
            }
            mut other => {
                other.set_span(span);
                other
            }
        })
        .collect()
}
