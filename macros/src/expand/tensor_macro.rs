//! `Tensor![..]` and `Shape![..]`: tensor types written as lists of dims.

use proc_macro2::{TokenStream, TokenTree};
use quote::{quote, ToTokens};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{LitInt, Token, Type};

/// The most dims a shape has (`forma::Shape` is implemented up to rank 6).
const MAX_RANK: usize = 6;

/// One dim as written.
enum Dim {
    /// `3`: a static size, `C<3>`.
    Size(LitInt),
    /// `{N * 2}`: a const expression, `C<{N * 2}>`.
    Const(TokenTree),
    /// `B`, `Dyn`, `C<3>`: a dim type, used as is.
    Ty(Box<Type>),
}

impl Parse for Dim {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.peek(Token![-]) && input.peek2(syn::Lit) {
            let minus: Token![-] = input.parse()?;
            let lit: syn::Lit = input.parse()?;
            return Err(syn::Error::new_spanned(
                quote!(#minus #lit),
                "a dim must be a non-negative integer",
            ));
        }
        if input.peek(LitInt) {
            let lit: LitInt = input.parse()?;
            if !matches!(lit.suffix(), "" | "usize") {
                return Err(syn::Error::new_spanned(
                    &lit,
                    format!("a dim is a `usize`, remove the `{}` suffix", lit.suffix()),
                ));
            }
            return Ok(Dim::Size(lit));
        }
        if input.peek(syn::Lit) {
            let lit: syn::Lit = input.parse()?;
            return Err(syn::Error::new_spanned(
                lit,
                "a dim must be a non-negative integer, a `{const}` expression or a dim type",
            ));
        }
        if input.peek(syn::token::Brace) {
            return Ok(Dim::Const(input.parse()?));
        }
        Ok(Dim::Ty(input.parse()?))
    }
}

impl Dim {
    /// The dim as the user wrote it, for errors about it.
    fn written(&self) -> TokenStream {
        match self {
            Dim::Size(lit) => lit.to_token_stream(),
            Dim::Const(block) => block.to_token_stream(),
            Dim::Ty(ty) => ty.to_token_stream(),
        }
    }
}

impl ToTokens for Dim {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        match self {
            Dim::Size(lit) => tokens.extend(quote!(::forma::C<#lit>)),
            Dim::Const(block) => tokens.extend(quote!(::forma::C<#block>)),
            Dim::Ty(ty) => ty.to_tokens(tokens),
        }
    }
}

/// `dims` and, after a semicolon, the types that follow the shape.
struct Input {
    dims: Vec<Dim>,
    tail: Option<(Token![;], Punctuated<Type, Token![,]>)>,
}

impl Parse for Input {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut dims = Vec::new();
        while !input.is_empty() && !input.peek(Token![;]) {
            dims.push(input.parse()?);
            if input.is_empty() || input.peek(Token![;]) {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        let tail = if input.peek(Token![;]) {
            let semi: Token![;] = input.parse()?;
            Some((semi, Punctuated::parse_terminated(input)?))
        } else {
            None
        };
        Ok(Input { dims, tail })
    }
}

/// The shape tuple, or an error if there are too many dims.
fn shape_tuple(macro_name: &str, input: &Input) -> syn::Result<TokenStream> {
    if input.dims.len() > MAX_RANK {
        let extra = input.dims[MAX_RANK..].iter().map(Dim::written);
        return Err(syn::Error::new_spanned(
            quote!(#(#extra)*),
            format!(
                "{macro_name}![..] takes at most {MAX_RANK} dims, got {}",
                input.dims.len()
            ),
        ));
    }
    let dims = &input.dims;
    Ok(quote!((#(#dims,)*)))
}

pub fn tensor(tokens: TokenStream) -> TokenStream {
    let result = syn::parse2::<Input>(tokens).and_then(|input| {
        let shape = shape_tuple("Tensor", &input)?;
        let rest: Vec<&Type> = match &input.tail {
            None => Vec::new(),
            Some((semi, types)) if types.is_empty() => {
                return Err(syn::Error::new_spanned(
                    semi,
                    "expected the element type after `;`, like Tensor![B, 3; f64]",
                ))
            }
            Some((_, types)) if types.len() > 2 => {
                let extra = types.iter().skip(2);
                return Err(syn::Error::new_spanned(
                    quote!(#(#extra)*),
                    "after `;` come at most the element type and the device, like Tensor![B, 3; f32, Cpu]",
                ));
            }
            Some((_, types)) => types.iter().collect(),
        };
        Ok(quote!(::forma::Tensor<#shape #(, #rest)*>))
    });
    result.unwrap_or_else(|e| e.to_compile_error())
}

pub fn shape(tokens: TokenStream) -> TokenStream {
    let result = syn::parse2::<Input>(tokens).and_then(|input| {
        if let Some((semi, types)) = &input.tail {
            return Err(syn::Error::new_spanned(
                quote!(#semi #types),
                "Shape![..] takes dims only; the element type and device go in Tensor![..]",
            ));
        }
        shape_tuple("Shape", &input)
    });
    result.unwrap_or_else(|e| e.to_compile_error())
}
