//! `#[derive(Sequential)]`: a `Forward` impl that chains the fields in order,
//! from the declared input shape to the declared output shape.
//!
//! The macro knows no layer by name. Each layer states what it does to a
//! shape beside its definition (`forma::nn::shape_step::ShapeStep`); the
//! derive emits one `const` link per field that applies the field's step to
//! the previous link's sizes (evaluated by the compiler, under `cargo check`
//! as well as `cargo build`), builds each layer's input and output types
//! from those sizes, and one `const` assertion per field that fails with
//! the first mismatch, spanned on that field: one error per mistake.
//!
//! A model whose layer types use the struct's const parameters (or type
//! parameters other than its element type and device) cannot be followed
//! in free `const` items on stable Rust; its steps are then chained by the
//! types alone, as a hand-written `forward` would be.

use crate::ctxt::Ctxt;
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, GenericParam, LitInt, Member, Token, Type};

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

    // Names the derive may not carry into a free `const` item: the
    // struct's const params and its type params other than dtype/device.
    let dtype_param = dtype.to_string();
    let device_param = device.to_string();
    let opaque: Vec<String> = struct_params
        .iter()
        .filter(|p| **p != dtype_param && **p != device_param)
        .cloned()
        .collect();
    let concrete = |ts: TokenStream| -> Option<TokenStream> {
        substitute(ts, &dtype_param, &device_param, &opaque)
    };
    let mut concrete_steps = Vec::new();
    for (_, field) in &layers {
        concrete_steps.push(concrete(field.ty.to_token_stream()));
    }
    // The input's sizes as `Size`s, written with the struct's params (for
    // the `ShapeStep` impl) and with f32 on the CPU (for the free consts).
    let in_step: Vec<TokenStream> = in_dims
        .iter()
        .enumerate()
        .map(|(j, d)| size_expr(d, j, &[]))
        .collect();
    let in_sizes: Vec<Option<TokenStream>> = in_step.iter().cloned().map(concrete).collect();

    let in_names: Vec<String> = in_dims.iter().map(SDim::show).collect();
    let in_idents: Vec<String> = in_dims
        .iter()
        .map(|d| match d {
            SDim::Tokens(t) => t.to_string(),
            SDim::Size(_) => String::new(),
        })
        .collect();
    let out_sizes: Vec<TokenStream> = out_dims
        .iter()
        .map(|d| size_expr(d, usize::MAX, &in_idents))
        .collect();
    let followed = concrete_steps.iter().all(Option::is_some)
        && in_sizes.iter().all(Option::is_some)
        && out_sizes.iter().all(|s| concrete(s.clone()).is_some());
    let in_tuple = {
        let dims = in_dims.iter().map(SDim::render);
        quote!((#(#dims,)*))
    };
    let step_path = quote!(::forma::nn::shape_step);
    let link = |i: usize| format_ident!("__FORMA_LINK_{}", i);
    let mut consts = Vec::new();
    let mut steps = Vec::new();
    if followed {
        let sizes = in_sizes.iter().flatten();
        let mut names: Vec<TokenStream> = in_names.iter().map(|n| quote!(#n)).collect();
        names.resize(6, quote!(""));
        let first = link(0);
        consts.push(quote! {
            const #first: #step_path::Link = #step_path::Link::start(
                #step_path::Sizes::new(&[#(#sizes),*]),
                [#(#names),*],
            );
        });
    }
    let shape_at = |l: &syn::Ident, side: TokenStream| {
        let slots = (0..6usize)
            .map(|k| quote!(#step_path::Slot<{ #l.#side.kind(#k) }, { #l.#side.value(#k) }>));
        quote!(<#step_path::Build<{ #l.#side.rank() }, #(#slots),*> as #step_path::BuildShape<#in_tuple>>::Shape)
    };
    let mut prev = "the model's input".to_string();
    for (i, ((member, field), ty)) in layers.iter().zip(&concrete_steps).enumerate() {
        let name = member.to_token_stream().to_string();
        let span = field.ty.span();
        let call = quote_spanned! {span=>
            ::forma::nn::Forward::try_forward_as(
                &self.#member,
                <Self as ::forma::nn::Module>::child_name(#name),
                __x,
            )?
        };
        let Some(ty) = ty.as_ref().filter(|_| followed) else {
            steps.push(quote_spanned! {span=> let __x = #call; });
            continue;
        };
        let (here, before) = (link(i + 1), link(i));
        let prev_lit = prev.clone();
        consts.push(quote_spanned! {span=>
            const #here: #step_path::Link = #before.then(
                <#ty as #step_path::ShapeStep>::STEP, #i, #name, #prev_lit,
            );
            const _: () = if let ::core::option::Option::Some(msg) = #here.error_at(#i) {
                ::core::panic!("{}", msg)
            };
        });
        let t_in = shape_at(&here, quote!(input));
        let t_out = shape_at(&here, quote!(output));
        steps.push(quote_spanned! {span=>
            let __x: ::forma::Tensor<#t_in, #dtype, #device> = #step_path::enter(#name, __x)?;
            let __x: ::forma::Tensor<#t_out, #dtype, #device> = #call;
        });
        prev = format!("`{name}`");
    }
    if followed {
        let (last, fin) = (link(layers.len()), format_ident!("__FORMA_LINK_OUTPUT"));
        consts.push(quote_spanned! {*out_span=>
            const #fin: #step_path::Link = #last.finish(#step_path::Sizes::new(&[#(#out_sizes),*]));
            const _: () = if let ::core::option::Option::Some(msg) = #fin.error_at(#step_path::OUTPUT) {
                ::core::panic!("{}", msg)
            };
        });
        steps.push(quote! {
            let __x: #out_ty = #step_path::enter("output", __x)?;
        });
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
    let name = ident.to_string();
    let struct_impl = input.generics.split_for_impl().0;
    quote! {
        const _: () = {
            #(#consts)*

            #[automatically_derived]
            impl #impl_generics ::forma::nn::Forward<#in_ty, #out_ty> for #ident #ty_generics #where_clause {
                fn try_forward(&self, __x: #in_ty) -> ::forma::Result<#out_ty> {
                    #(#steps)*
                    ::core::result::Result::Ok(__x)
                }
            }

            #[automatically_derived]
            impl #struct_impl #step_path::ShapeStep for #ident #ty_generics #where_clause {
                const STEP: #step_path::Step = #step_path::Step::fixed(
                    #name,
                    &[#(#in_step),*],
                    &[#(#out_sizes),*],
                );
            }
        };
    }
}

/// The `Size` of a declared dim: a literal or `{ expr }` is static; a name
/// is `Input(j)`, its position among the input's dims (`input_names`, or
/// `own` when it is itself an input dim), or `Dyn` when it is not one.
fn size_expr(d: &SDim, own: usize, input_names: &[String]) -> TokenStream {
    let path = quote!(::forma::nn::shape_step::Size);
    match d {
        SDim::Size(n) => quote!(#path::Static(#n)),
        SDim::Tokens(t) => {
            let text = t.to_string();
            if let Some(inner) = text
                .strip_prefix(":: forma :: C <")
                .and_then(|r| r.strip_suffix('>'))
            {
                let expr: TokenStream = inner.parse().unwrap_or_default();
                return quote!(#path::Static(#expr));
            }
            if own != usize::MAX {
                return quote!(#path::Input(#own));
            }
            match input_names
                .iter()
                .position(|n| *n == text && n != "Dyn" && n != "One")
            {
                Some(j) => quote!(#path::Input(#j)),
                None => quote!(#path::Dyn),
            }
        }
    }
}

/// `ts` with the struct's dtype and device params replaced by `f32` and the
/// CPU, so it can name a type in a free `const` item; `None` when it names
/// one of `opaque` (a const param, another type param).
fn substitute(
    ts: TokenStream,
    dtype: &str,
    device: &str,
    opaque: &[String],
) -> Option<TokenStream> {
    use proc_macro2::{Group, TokenTree};
    let mut out = TokenStream::new();
    for tt in ts {
        match tt {
            TokenTree::Ident(id) => {
                let s = id.to_string();
                if opaque.contains(&s) {
                    return None;
                }
                if s == dtype && s != "f32" {
                    out.extend(quote!(f32));
                } else if s == device && s != "Cpu" {
                    out.extend(quote!(::forma::Cpu));
                } else {
                    out.extend([TokenTree::Ident(id)]);
                }
            }
            TokenTree::Group(g) => {
                let inner = substitute(g.stream(), dtype, device, opaque)?;
                let mut ng = Group::new(g.delimiter(), inner);
                ng.set_span(g.span());
                out.extend([TokenTree::Group(ng)]);
            }
            other => out.extend([other]),
        }
    }
    Some(out)
}
