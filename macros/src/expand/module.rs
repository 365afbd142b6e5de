//! `#[derive(Module)]`: the `visit`, `visit_mut` and `describe` of a struct.

use super::respan;
use crate::ast::{Container, Field};
use crate::check;
use crate::ctxt::Ctxt;
use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{quote, ToTokens};
use syn::DeriveInput;

pub fn derive(input: &DeriveInput) -> TokenStream {
    let cx = Ctxt::new();
    let cont = Container::from_ast(&cx, input);
    check::check(&cx, &cont);
    match cx.check() {
        Ok(()) => expand(&cont),
        Err(errors) => {
            let fallback = minimal_impl(&cont);
            quote!(#fallback #errors)
        }
    }
}

/// What a user's mistake expands to beside its `compile_error!`: an impl that
/// visits nothing, so that uses of the type as a module raise no second error.
fn minimal_impl(cont: &Container) -> TokenStream {
    let root = &cont.attrs.root;
    let ident = cont.ident;
    let (impl_generics, ty_generics, where_clause) = cont.generics.split_for_impl();
    quote! {
        #[automatically_derived]
        impl #impl_generics #root::Module for #ident #ty_generics #where_clause {
            fn visit<__V: #root::Visitor>(&self, _: &mut #root::Cx, _: &mut __V) {}
            fn visit_mut<__V: #root::VisitorMut>(&mut self, _: &mut #root::Cx, _: &mut __V) {}
        }
    }
}

fn expand(cont: &Container) -> TokenStream {
    let root = &cont.attrs.root;
    let ident = cont.ident;
    let (impl_generics, ty_generics, where_clause) = cont.generics.split_for_impl();
    let visited: Vec<&Field> = cont.fields.iter().filter(|f| f.visited()).collect();

    let mut predicates: Vec<TokenStream> = where_clause
        .map(|w| w.predicates.iter().map(ToTokens::to_token_stream).collect())
        .unwrap_or_default();
    predicates.extend(visited.iter().flat_map(|f| bounds(cont, f)));
    let where_clause = (!predicates.is_empty()).then(|| quote!(where #(#predicates),*));

    let visit = visit_fn(root, &visited, false);
    let visit_mut = visit_fn(root, &visited, true);
    let describe = describe_fn(cont, &visited);
    let child_name = child_name_fn(&visited);
    let retype = retype_impls(cont);
    quote! {
        #[automatically_derived]
        impl #impl_generics #root::Module for #ident #ty_generics #where_clause {
            #visit
            #visit_mut
            #describe
            #child_name
        }
        #retype
    }
}

/// The type parameters a conversion replaces: `E` (element type) and `D`
/// (device).
const ELEM: &str = "E";
const DEV: &str = "D";
const ELEM2: &str = "__E2";
const DEV2: &str = "__D2";

/// `tokens` with the idents `E` and `D` replaced by the conversion's target
/// parameters.
fn substitute(tokens: TokenStream) -> TokenStream {
    rename(rename(tokens, ELEM, ELEM2), DEV, DEV2)
}

/// `tokens` with the type parameter `from` renamed `to`.
fn rename(tokens: TokenStream, from: &str, to: &str) -> TokenStream {
    tokens
        .into_iter()
        .map(|t| match t {
            TokenTree::Ident(i) if i == from => TokenTree::Ident(syn::Ident::new(to, i.span())),
            TokenTree::Group(g) => {
                let mut group =
                    proc_macro2::Group::new(g.delimiter(), rename(g.stream(), from, to));
                group.set_span(g.span());
                TokenTree::Group(group)
            }
            other => other,
        })
        .collect()
}

/// Whether `tokens` name `E` or `D`.
fn mentions_elem_or_dev(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|t| match t {
        TokenTree::Ident(i) => i == ELEM || i == DEV,
        TokenTree::Group(g) => mentions_elem_or_dev(g.stream()),
        _ => false,
    })
}

/// `Convert` (the struct as a field of another model) and `Retype` (the
/// user's `to_dtype`/`to_device`) for a struct with type parameters `E` and
/// `D`: a copy with both replaced, each field that names them converted,
/// the others cloned. Nothing for a struct without both.
fn retype_impls(cont: &Container) -> TokenStream {
    // `E: Float` and `D: Device<E>` (or bounds with those last segments):
    // parameters with these names but other roles (a `D: Dim`) are not
    // converted.
    let has = |name: &str, bound: &str| {
        cont.generics.type_params().any(|p| {
            p.ident == name
                && p.bounds.iter().any(|b| match b {
                    syn::TypeParamBound::Trait(t) => {
                        t.path.segments.last().is_some_and(|s| s.ident == bound)
                    }
                    _ => false,
                })
        })
    };
    if !(has(ELEM, "Float") && has(DEV, "Device")) {
        return TokenStream::new();
    }
    let root = &cont.attrs.root;
    let ident = cont.ident;
    let private = quote!(#root::module::convert::__private);
    let (impl_generics, ty_generics, where_clause) = cont.generics.split_for_impl();
    let target = substitute(quote!(#ident #ty_generics));
    let (e2, d2) = (
        syn::Ident::new(ELEM2, Span::call_site()),
        syn::Ident::new(DEV2, Span::call_site()),
    );
    let mut predicates: Vec<TokenStream> = where_clause
        .map(|w| w.predicates.iter().map(ToTokens::to_token_stream).collect())
        .unwrap_or_default();
    let mut inits = Vec::new();
    for f in &cont.fields {
        let (ty, member) = (f.ty, &f.member);
        if mentions_elem_or_dev(ty.to_token_stream()) {
            let to = substitute(ty.to_token_stream());
            predicates.push(quote!(#ty: #root::module::Convert<#to, #d2>));
            inits.push(quote! {
                #member: <#ty as #root::module::Convert<#to, #d2>>::try_convert(&self.#member, __device)?
            });
        } else {
            // `Keep<__E2>` is `Clone` under a bound that names the impl's
            // parameter: a field that is not `Clone` leaves the conversion
            // unimplemented (an error where it is called) instead of making
            // the derive fail.
            predicates.push(quote!(#ty: #private::Keep<#e2>));
            inits.push(quote!(#member: <#ty as #private::Keep<#e2>>::keep(&self.#member)));
        }
    }
    // The impl's own generics plus the target's two parameters.
    let mut generics = cont.generics.clone();
    generics
        .params
        .push(syn::parse_quote!(#e2: #private::Float));
    generics
        .params
        .push(syn::parse_quote!(#d2: #private::Device<#e2>));
    let (convert_generics, _, _) = generics.split_for_impl();
    let own_predicates = where_clause
        .map(|w| {
            w.predicates
                .iter()
                .map(ToTokens::to_token_stream)
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let own_where = (!own_predicates.is_empty()).then(|| quote!(where #(#own_predicates),*));
    let (elem, dev) = (
        syn::Ident::new(ELEM, Span::call_site()),
        syn::Ident::new(DEV, Span::call_site()),
    );
    // `to_dtype` keeps the device type, `to_device` the element type.
    let to_dtype = rename(quote!(#ident #ty_generics), ELEM, ELEM2);
    let to_device = rename(quote!(#ident #ty_generics), DEV, DEV2);
    let mut dtype_generics = cont.generics.clone();
    dtype_generics
        .params
        .push(syn::parse_quote!(#e2: #private::Float));
    let (dtype_generics, _, _) = dtype_generics.split_for_impl();
    let mut device_generics = cont.generics.clone();
    device_generics
        .params
        .push(syn::parse_quote!(#d2: #private::Device<#elem>));
    let (device_generics, _, _) = device_generics.split_for_impl();
    quote! {
        #[automatically_derived]
        impl #convert_generics #root::module::Convert<#target, #d2> for #ident #ty_generics
        where #(#predicates),*
        {
            fn try_convert(&self, __device: &#d2) -> #private::Result<#target> {
                ::core::result::Result::Ok(#ident { #(#inits),* })
            }
        }

        #[automatically_derived]
        impl #dtype_generics #root::module::ToDtype<#e2> for #ident #ty_generics
        where
            #(#own_predicates,)*
            #dev: #private::Device<#e2>,
            Self: #root::module::Convert<#to_dtype, #dev>,
        {
            type Out = #to_dtype;

            fn try_to_dtype_copy(&self) -> #private::Result<#to_dtype> {
                let __device = #private::device_of::<#dev>(self)?;
                <Self as #root::module::Convert<#to_dtype, #dev>>::try_convert(self, &__device)
            }
        }

        #[automatically_derived]
        impl #device_generics #root::module::ToDevice<#d2> for #ident #ty_generics
        where
            #(#own_predicates,)*
            Self: #root::module::Convert<#to_device, #d2>,
        {
            type Out = #to_device;

            fn try_to_device_copy(&self, __device: &#d2) -> #private::Result<#to_device> {
                <Self as #root::module::Convert<#to_device, #d2>>::try_convert(self, __device)
            }
        }

        #[automatically_derived]
        impl #impl_generics #root::module::Retype for #ident #ty_generics #own_where {
            type Elem = #elem;
            type Dev = #dev;
            type With<#e2: #private::Float, #d2: #private::Device<#e2>> = #target;

            fn try_retype<#e2: #private::Float, #d2: #private::Device<#e2>>(
                &self,
                __device: &#d2,
            ) -> #private::Result<Self::With<#e2, #d2>>
            where
                Self: #root::module::Convert<Self::With<#e2, #d2>, #d2>,
            {
                <Self as #root::module::Convert<#target, #d2>>::try_convert(self, __device)
            }
        }
    }
}

/// `Ty: Module` for a visited field, spanned on its type, so an unsupported
/// type is reported at the field; and `Ty: TensorField` for a buffer, spanned
/// on the `buffer` word. A field whose type names the struct itself (`Vec<Self>`,
/// `Option<Box<Tree>>`) gets no bound: proving it would need the impl being
/// written, and rustc reports an overflow instead.
fn bounds(cont: &Container, field: &Field) -> Vec<TokenStream> {
    let root = &cont.attrs.root;
    let ty = field.ty;
    let mut out = Vec::new();
    if !mentions_self(cont.ident, ty.to_token_stream()) {
        let module = spanned_over(quote!(: #root::Module), ty);
        out.push(quote!(#ty #module));
    }
    if let Some((_, buffer)) = &field.attrs.buffer {
        out.push(respan(quote!(#ty: #root::TensorField), buffer.span));
    }
    out
}

/// `tokens` spanned over all of `over`: the first token takes the span of
/// `over`'s first token and the last that of its last, so that rustc, which
/// spans a path from its first token to its last, underlines the whole of
/// `over` (a joined span is not available to proc macros on stable).
fn spanned_over(tokens: TokenStream, over: &impl ToTokens) -> TokenStream {
    let mut spans = over.to_token_stream().into_iter().map(|t| t.span());
    let first = spans.next().unwrap_or_else(Span::call_site);
    let last = spans.last().unwrap_or(first);
    let mut out: Vec<TokenTree> = respan(tokens, first).into_iter().collect();
    if let Some(t) = out.last_mut() {
        t.set_span(last);
    }
    out.into_iter().collect()
}

/// Whether a type names the struct (`Self` or its name) anywhere.
fn mentions_self(ident: &syn::Ident, tokens: TokenStream) -> bool {
    tokens.into_iter().any(|t| match t {
        TokenTree::Ident(i) => i == "Self" || i == *ident,
        TokenTree::Group(g) => mentions_self(ident, g.stream()),
        _ => false,
    })
}

/// The role of a field's tensors.
fn role(root: &syn::Path, field: &Field) -> TokenStream {
    match &field.attrs.buffer {
        None => quote!(#root::Role::Parameter),
        Some((_, b)) if b.persistent => quote!(#root::Role::Buffer),
        Some(_) => quote!(#root::Role::NonPersistentBuffer),
    }
}

/// `visit` (or `visit_mut`): one pass per phase over the fields, so the
/// struct's own parameters come first, then its buffers, then its children.
fn visit_fn(root: &syn::Path, fields: &[&Field], mutable: bool) -> TokenStream {
    let (name, visitor, receiver, borrow) = if mutable {
        (
            quote!(visit_mut),
            quote!(VisitorMut),
            quote!(&mut self),
            quote!(&mut),
        )
    } else {
        (quote!(visit), quote!(Visitor), quote!(&self), quote!(&))
    };
    if fields.is_empty() {
        return quote! {
            fn #name<__V: #root::#visitor>(#receiver, _: &mut #root::Cx, _: &mut __V) {}
        };
    }
    let steps = fields.iter().map(|f| {
        let ty = f.ty;
        let member = &f.member;
        let key = f.key();
        let role = role(root, f);
        quote! {
            if __cx.enter_field(__phase, <#ty as #root::Module>::IS_TENSOR, #key, #role) {
                #root::Module::#name(#borrow self.#member, __cx, __v);
                __cx.leave();
            }
        }
    });
    quote! {
        fn #name<__V: #root::#visitor>(#receiver, __cx: &mut #root::Cx, __v: &mut __V) {
            for __phase in #root::module::Phase::ALL {
                #(#steps)*
            }
        }
    }
}

/// `child_name`: a field's name in dotted paths (its rename, `""` when
/// flattened), for the module paths of errors and hooks. Only fields whose
/// key differs from their name need an arm.
fn child_name_fn(fields: &[&Field]) -> TokenStream {
    let arms: Vec<TokenStream> = fields
        .iter()
        .filter(|f| f.key() != f.name)
        .map(|f| {
            let (name, key) = (&f.name, f.key());
            quote!(#name => #key,)
        })
        .collect();
    if arms.is_empty() {
        return TokenStream::new();
    }
    quote! {
        fn child_name(field: &'static str) -> &'static str
        where
            Self: Sized,
        {
            match field {
                #(#arms)*
                other => other,
            }
        }
    }
}

/// `describe`: a node named after the struct, with its `extra_repr` text and
/// a child for every visited field that is a module.
fn describe_fn(cont: &Container, fields: &[&Field]) -> TokenStream {
    let root = &cont.attrs.root;
    let name = &cont.attrs.name;
    let extra = match &cont.attrs.extra_repr {
        Some(path) => quote!(#path(self)),
        None => quote!(""),
    };
    let node = quote!(#root::ReprNode::new(#name, #extra));
    if fields.is_empty() {
        return quote! {
            fn describe(&self) -> ::core::option::Option<#root::ReprNode> {
                ::core::option::Option::Some(#node)
            }
        };
    }
    let children = fields.iter().map(|f| {
        let member = &f.member;
        let key = f.key();
        quote! {
            if let ::core::option::Option::Some(__child) = #root::Module::describe(&self.#member) {
                __node.child(#key, __child);
            }
        }
    });
    quote! {
        fn describe(&self) -> ::core::option::Option<#root::ReprNode> {
            let mut __node = #node;
            #(#children)*
            ::core::option::Option::Some(__node)
        }
    }
}
