//! `#[derive(Sequential)]`: a `Forward` impl that chains the fields in order,
//! from the declared input shape to the declared output shape.
//!
//! The macro follows the shape through the layers it knows (Linear, Conv2d,
//! the pools, Flatten, the norms and activations) using their literal size
//! arguments, so it can (a) state each sliding-window layer's output size,
//! which stable Rust cannot compute in a type, and (b) report a mismatch
//! between neighbours by naming both layers and the sizes. Past a layer it
//! does not know, the types alone carry the check: each step is spanned on
//! its field, so a `Forward` error points there.

use crate::ctxt::Ctxt;
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{
    Data, DeriveInput, Fields, GenericArgument, GenericParam, LitInt, Member, PathArguments, Token,
    Type,
};

/// One dim of a declared shape.
#[derive(Clone)]
enum SDim {
    Size(usize),
    Tokens(TokenStream),
}

impl SDim {
    fn render(&self) -> TokenStream {
        match self {
            SDim::Size(n) => quote!(::forma::C<#n>),
            SDim::Tokens(t) => t.clone(),
        }
    }

    fn show(&self) -> String {
        match self {
            SDim::Size(n) => n.to_string(),
            SDim::Tokens(t) => t.to_string().replace(' ', ""),
        }
    }
}

fn show(shape: &[SDim]) -> String {
    let parts: Vec<String> = shape.iter().map(SDim::show).collect();
    format!("[{}]", parts.join(", "))
}

struct ShapeList(Vec<(SDim, Span)>);

impl Parse for ShapeList {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let content;
        syn::bracketed!(content in input);
        let mut dims = Vec::new();
        for item in Punctuated::<TokenStream, Token![,]>::parse_terminated_with(&content, |p| {
            let mut ts = TokenStream::new();
            while !p.is_empty() && !p.peek(Token![,]) {
                let tt: proc_macro2::TokenTree = p.parse()?;
                ts.extend([tt]);
            }
            Ok(ts)
        })? {
            let span = item.span();
            let dim = match syn::parse2::<LitInt>(item.clone()) {
                Ok(lit) => SDim::Size(lit.base10_parse()?),
                Err(_) => match syn::parse2::<syn::Block>(item.clone()) {
                    Ok(_) => SDim::Tokens(quote!(::forma::C<#item>)),
                    Err(_) => SDim::Tokens(syn::parse2::<Type>(item)?.into_token_stream()),
                },
            };
            dims.push((dim, span));
        }
        Ok(ShapeList(dims))
    }
}

#[derive(Default)]
struct Attrs {
    had_error: bool,
    input: Option<ShapeList>,
    output: Option<(ShapeList, Span)>,
    dtype: Option<Type>,
    device: Option<Type>,
}

fn parse_attrs(cx: &Ctxt, input: &DeriveInput) -> Attrs {
    let mut a = Attrs::default();
    for attr in input
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("sequential"))
    {
        let r = attr.parse_nested_meta(|meta| {
            let key = meta
                .path
                .get_ident()
                .map(|i| i.to_string())
                .unwrap_or_default();
            match key.as_str() {
                "input" => a.input = Some(meta.value()?.parse()?),
                "output" => {
                    let span = meta.path.span();
                    a.output = Some((meta.value()?.parse()?, span));
                }
                "dtype" => a.dtype = Some(meta.value()?.parse()?),
                "device" => a.device = Some(meta.value()?.parse()?),
                _ => {
                    let path = meta.path.to_token_stream().to_string().replace(' ', "");
                    return Err(meta.error(format!(
                        "unknown attribute #[sequential({path})], expected `input`, `output`, `dtype` or `device`"
                    )));
                }
            }
            Ok(())
        });
        if let Err(e) = r {
            a.had_error = true;
            cx.syn_error(e);
        }
    }
    a
}

fn skipped(field: &syn::Field) -> bool {
    field.attrs.iter().any(|attr| {
        let mut skip = false;
        if attr.path().is_ident("module") || attr.path().is_ident("sequential") {
            let _ = attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("skip") {
                    skip = true;
                } else if meta.input.peek(Token![=]) {
                    let _: TokenStream = meta.value()?.parse()?;
                } else if meta.input.peek(syn::token::Paren) {
                    let _content;
                    syn::parenthesized!(_content in meta.input);
                    let _: TokenStream = _content.parse()?;
                }
                Ok(())
            });
        }
        skip
    })
}

/// The layer's type name and its leading literal size arguments.
fn layer_kind(ty: &Type) -> Option<(String, Vec<Option<usize>>)> {
    let Type::Path(p) = ty else { return None };
    let seg = p.path.segments.last()?;
    let mut args = Vec::new();
    if let PathArguments::AngleBracketed(ab) = &seg.arguments {
        for arg in &ab.args {
            match arg {
                GenericArgument::Const(syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(i),
                    ..
                })) => args.push(i.base10_parse().ok()),
                GenericArgument::Const(_) => args.push(None),
                // `Linear<4, 2>`: literals parse as const args; a bare ident
                // may be a const param (unknown size) or a type (the end of
                // the size arguments).
                GenericArgument::Type(Type::Path(tp)) if tp.path.get_ident().is_some() => {
                    args.push(None)
                }
                _ => break,
            }
        }
    }
    Some((seg.ident.to_string(), args))
}

fn window(input: usize, k: usize, s: usize, p: usize, d: usize) -> Option<usize> {
    let span = d.checked_mul(k.checked_sub(1)?)? + 1;
    let padded = input + 2 * p;
    (s > 0 && padded >= span).then(|| (padded - span) / s + 1)
}

/// What a layer does to a known shape: `Ok(Some(out))`, `Ok(None)` when it
/// cannot tell (unknown layer or non-literal sizes), `Err(msg)` for a mismatch.
fn step(
    name: &str,
    prev: &str,
    kind: &str,
    args: &[Option<usize>],
    shape: &[SDim],
) -> Result<Option<Vec<SDim>>, String> {
    let arg = |i: usize, default: Option<usize>| args.get(i).copied().unwrap_or(default);
    let size = |d: &SDim| match d {
        SDim::Size(n) => Some(*n),
        SDim::Tokens(_) => None,
    };
    match kind {
        "Relu" | "Gelu" | "Tanh" | "Sigmoid" | "Silu" | "Identity" | "Dropout" => {
            Ok(Some(shape.to_vec()))
        }
        "Linear" | "LayerNorm" => {
            let (Some(i), Some(last)) = (arg(0, None), shape.last()) else {
                return Ok(None);
            };
            if let Some(n) = size(last) {
                if n != i {
                    return Err(format!(
                        "layer `{name}` ({kind}) takes {i} input features, but receives {} ({n} features) from {prev}",
                        show(shape)
                    ));
                }
            }
            let mut out = shape.to_vec();
            if kind == "Linear" {
                match arg(1, None) {
                    Some(o) => *out.last_mut().expect("rank >= 1") = SDim::Size(o),
                    None => return Ok(None),
                }
            }
            Ok(Some(out))
        }
        "Conv2d" | "MaxPool2d" | "AvgPool2d" | "BatchNorm2d" => {
            if shape.len() != 4 {
                return Err(format!(
                    "layer `{name}` ({kind}) takes a [batch, channels, height, width] input, but receives {} from {prev}",
                    show(shape)
                ));
            }
            let (ch_in, ch_out, geometry) = match kind {
                "Conv2d" => (
                    arg(0, None),
                    arg(1, None),
                    Some((
                        arg(2, None),
                        arg(3, Some(1)),
                        arg(4, Some(0)),
                        arg(5, Some(1)),
                    )),
                ),
                "BatchNorm2d" => (arg(0, None), arg(0, None), None),
                // MaxPool2d<K, S, P, L, CEIL> and AvgPool2d<K, S, P, CEIL, ..>:
                // a ceil_mode argument (a bool, not read here) stops the
                // tracking rather than risk PyTorch's rounding up.
                "MaxPool2d" if args.len() > 4 => return Ok(None),
                "AvgPool2d" if args.len() > 3 => return Ok(None),
                "MaxPool2d" => {
                    let k = arg(0, None);
                    (
                        None,
                        None,
                        Some((k, arg(1, k), arg(2, Some(0)), arg(3, Some(1)))),
                    )
                }
                _ => {
                    let k = arg(0, None);
                    (None, None, Some((k, arg(1, k), arg(2, Some(0)), Some(1))))
                }
            };
            if let (Some(want), Some(got)) = (ch_in, size(&shape[1])) {
                if want != got {
                    return Err(format!(
                        "layer `{name}` ({kind}) takes {want} input channels, but receives {} ({got} channels) from {prev}",
                        show(shape)
                    ));
                }
            }
            let mut out = shape.to_vec();
            if kind != "BatchNorm2d" && kind != "MaxPool2d" && kind != "AvgPool2d" {
                match ch_out {
                    Some(o) => out[1] = SDim::Size(o),
                    None => return Ok(None),
                }
            }
            if let Some((Some(k), Some(s), Some(p), Some(d))) = geometry {
                for (axis, ax_name) in [(2, "height"), (3, "width")] {
                    match &shape[axis] {
                        SDim::Size(n) => match window(*n, k, s, p, d) {
                            Some(o) => out[axis] = SDim::Size(o),
                            None => {
                                return Err(format!(
                                    "layer `{name}` ({kind}): an input {ax_name} of {n} with kernel {k}, stride {s}, padding {p} leaves no output (the kernel is larger than the padded input)"
                                ))
                            }
                        },
                        SDim::Tokens(t) if t.to_string().ends_with("Dyn") => {}
                        SDim::Tokens(_) => return Ok(None),
                    }
                }
            } else if geometry.is_some() {
                return Ok(None);
            }
            Ok(Some(out))
        }
        "Flatten" => {
            if shape.len() < 2 {
                return Ok(Some(shape.to_vec()));
            }
            let rest: Option<usize> = shape[1..].iter().map(size).product();
            Ok(rest.map(|n| vec![shape[0].clone(), SDim::Size(n)]))
        }
        _ => Ok(None),
    }
}

fn bound_name(param: &syn::TypeParam) -> Vec<String> {
    param
        .bounds
        .iter()
        .filter_map(|b| match b {
            syn::TypeParamBound::Trait(t) => t.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        })
        .collect()
}

pub fn derive(input: &DeriveInput) -> TokenStream {
    let cx = Ctxt::new();
    let attrs = parse_attrs(&cx, input);
    let fields: Vec<(Member, &syn::Field)> = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(f) => f
                .named
                .iter()
                .map(|f| (Member::Named(f.ident.clone().expect("named")), f))
                .collect(),
            Fields::Unnamed(f) => f
                .unnamed
                .iter()
                .enumerate()
                .map(|(i, f)| (Member::Unnamed(i.into()), f))
                .collect(),
            Fields::Unit => Vec::new(),
        },
        _ => {
            cx.error_spanned_by(&input.ident, "#[derive(Sequential)] supports structs only");
            Vec::new()
        }
    };
    let layers: Vec<&(Member, &syn::Field)> = fields.iter().filter(|(_, f)| !skipped(f)).collect();
    if attrs.had_error {
        // The attribute's own error says what is wrong; a missing key would repeat it.
    } else if attrs.input.is_none() {
        cx.error_spanned_by(
            &input.ident,
            "#[derive(Sequential)] needs #[sequential(input = [..], output = [..])]",
        );
    } else if attrs.output.is_none() {
        cx.error_spanned_by(
            &input.ident,
            "#[derive(Sequential)] needs #[sequential(output = [..])] beside `input`",
        );
    }
    if layers.is_empty() && matches!(input.data, Data::Struct(_)) {
        cx.error_spanned_by(
            &input.ident,
            "#[derive(Sequential)] needs at least one layer field",
        );
    }
    let (Some(in_shape), Some((out_shape, out_span))) = (&attrs.input, &attrs.output) else {
        return cx.check().err().unwrap_or_default();
    };

    // Element type and device: declared, or the struct's `Float` / `Device`
    // type params, or f32 on the CPU.
    let mut dtype = attrs.dtype.as_ref().map(ToTokens::to_token_stream);
    let mut device = attrs.device.as_ref().map(ToTokens::to_token_stream);
    let mut struct_params = Vec::new();
    for p in &input.generics.params {
        match p {
            GenericParam::Type(t) => {
                struct_params.push(t.ident.to_string());
                let bounds = bound_name(t);
                let id = &t.ident;
                if dtype.is_none() && bounds.iter().any(|b| b == "Float") {
                    dtype = Some(quote!(#id));
                }
                if device.is_none() && bounds.iter().any(|b| b == "Device" || b == "Backend") {
                    device = Some(quote!(#id));
                }
            }
            GenericParam::Const(c) => struct_params.push(c.ident.to_string()),
            GenericParam::Lifetime(_) => {}
        }
    }
    let dtype = dtype.unwrap_or_else(|| quote!(f32));
    let device = device.unwrap_or_else(|| quote!(::forma::Cpu));

    // Dim names in the declared shapes that are not the struct's: new `Dim` params.
    let mut dim_params: Vec<syn::Ident> = Vec::new();
    for (d, _) in in_shape.0.iter().chain(out_shape.0.iter()) {
        if let SDim::Tokens(t) = d {
            if let Ok(id) = syn::parse2::<syn::Ident>(t.clone()) {
                let s = id.to_string();
                if !["Dyn", "One"].contains(&s.as_str())
                    && !struct_params.contains(&s)
                    && !dim_params.iter().any(|p| p == &id)
                {
                    dim_params.push(id);
                }
            }
        }
    }

    let tensor = |shape: &[SDim]| {
        let dims = shape.iter().map(SDim::render);
        quote!(::forma::Tensor<(#(#dims,)*), #dtype, #device>)
    };
    let in_dims: Vec<SDim> = in_shape.0.iter().map(|(d, _)| d.clone()).collect();
    let out_dims: Vec<SDim> = out_shape.0.iter().map(|(d, _)| d.clone()).collect();
    let in_ty = tensor(&in_dims);
    let out_ty = tensor(&out_dims);

    let mut shape = Some(in_dims);
    let mut steps = Vec::new();
    let mut prev = "the model's input".to_string();
    for (member, field) in &layers {
        let name = member.to_token_stream().to_string();
        let span = field.ty.span();
        let next = match (&shape, layer_kind(&field.ty)) {
            (Some(s), Some((kind, args))) => match step(&name, &prev, &kind, &args, s) {
                Ok(n) => n,
                Err(msg) => {
                    cx.error_spanned_by(&field.ty, msg);
                    None
                }
            },
            _ => None,
        };
        let annotation = next.as_ref().map(|s| {
            let t = tensor(s);
            quote!(: #t)
        });
        steps.push(quote_spanned! {span=>
            let __x #annotation = ::forma::nn::Forward::try_forward_as(
                &self.#member,
                <Self as ::forma::nn::Module>::child_name(#name),
                __x,
            )?;
        });
        shape = next;
        prev = format!("`{name}`");
    }
    if let Some(last) = &shape {
        if show(last) != show(&out_dims) {
            cx.syn_error(syn::Error::new(
                *out_span,
                format!(
                    "the model declares output {} but its last layer gives {}",
                    show(&out_dims),
                    show(last)
                ),
            ));
        }
    }
    if let Err(errors) = cx.check() {
        return errors;
    }

    let ident = &input.ident;
    let mut impl_generics = input.generics.clone();
    for (i, id) in dim_params.iter().enumerate() {
        impl_generics
            .params
            .insert(i, syn::parse_quote!(#id: ::forma::Dim));
    }
    let (impl_generics, _, _) = impl_generics.split_for_impl();
    let (_, ty_generics, where_clause) = input.generics.split_for_impl();
    let last = format_ident!("__x");
    quote! {
        #[automatically_derived]
        impl #impl_generics ::forma::nn::Forward<#in_ty, #out_ty> for #ident #ty_generics #where_clause {
            fn try_forward(&self, __x: #in_ty) -> ::forma::Result<#out_ty> {
                #(#steps)*
                ::core::result::Result::Ok(#last)
            }
        }
    }
}
