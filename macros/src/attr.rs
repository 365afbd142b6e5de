//! The `#[module(...)]` attributes of a struct and of its fields.
//!
//! Struct: `crate = "path"`, `name = "Repr"`, `extra_repr = "path"`.
//! Field: `rename = "a.b"`, `skip`, `buffer`, `buffer(persistent = false)`,
//! `flatten`.
//!
//! Each bad attribute is recorded in the [`Ctxt`] and reading goes on, so
//! every mistake is reported at once.

use crate::ctxt::Ctxt;
use proc_macro2::Span;
use quote::quote;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, Lit, LitStr, Meta, Path, Token};

const FIELD_ATTRS: &str = "`rename`, `skip`, `buffer` or `flatten`";
const STRUCT_ATTRS: &str = "`crate`, `name` or `extra_repr`";

/// The attribute's name as written (`rename`, `a::b`).
fn path_str(path: &Path) -> String {
    quote!(#path).to_string().replace(' ', "")
}

/// The items of every `#[module(...)]` among `attrs`, in order.
fn module_items(cx: &Ctxt, attrs: &[syn::Attribute]) -> Vec<Meta> {
    let mut items = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("module")) {
        match &attr.meta {
            Meta::List(list) => {
                match list.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated) {
                    Ok(list) => items.extend(list),
                    Err(e) => cx.syn_error(e),
                }
            }
            other => {
                cx.error_spanned_by(other, "expected attributes in parentheses: #[module(...)]")
            }
        }
    }
    items
}

/// One attribute that may be given once: the word that set it and its value.
struct Attr<T> {
    name: &'static str,
    value: Option<(Path, T)>,
}

impl<T> Attr<T> {
    fn none(name: &'static str) -> Self {
        Attr { name, value: None }
    }

    fn set(&mut self, cx: &Ctxt, word: &Path, value: T) {
        if self.value.is_some() {
            cx.error_spanned_by(word, format!("duplicate attribute `{}`", self.name));
        } else {
            self.value = Some((word.clone(), value));
        }
    }
}

/// The string literal of `name = "..."`, or an error showing the syntax.
fn string_value(cx: &Ctxt, meta: &Meta, example: &str) -> Option<LitStr> {
    let name = path_str(meta.path());
    let Meta::NameValue(nv) = meta else {
        let msg = format!("#[module({name})] needs a value: {name} = \"{example}\"");
        cx.error_spanned_by(meta, msg);
        return None;
    };
    if let Expr::Lit(ExprLit {
        lit: Lit::Str(s), ..
    }) = ungroup(&nv.value)
    {
        return Some(s.clone());
    }
    let msg = format!("#[module({name} = ...)] takes a string literal: {name} = \"{example}\"");
    cx.error_spanned_by(&nv.value, msg);
    None
}

/// `expr` without the invisible group a `macro_rules!` fragment (`$name:expr`)
/// puts around it.
fn ungroup(mut expr: &Expr) -> &Expr {
    while let Expr::Group(g) = expr {
        expr = &g.expr;
    }
    expr
}

/// Whether `meta` is a bare word (`skip`), recording an error if it has a value.
fn bare_word(cx: &Ctxt, meta: &Meta) -> bool {
    if let Meta::Path(_) = meta {
        return true;
    }
    let name = path_str(meta.path());
    cx.error_spanned_by(
        meta,
        format!("#[module({name})] takes no value, write #[module({name})]"),
    );
    false
}

/// The struct's attributes.
pub struct Container {
    /// Path of forma-nn in the generated code.
    pub root: Path,
    /// The name printed in the repr.
    pub name: String,
    /// `fn(&Self) -> String` giving the repr's extra text.
    pub extra_repr: Option<syn::ExprPath>,
}

impl Container {
    pub fn from_ast(cx: &Ctxt, input: &syn::DeriveInput) -> Self {
        let mut root = Attr::<Path>::none("crate");
        let mut name = Attr::<String>::none("name");
        let mut extra_repr = Attr::<syn::ExprPath>::none("extra_repr");
        for meta in module_items(cx, &input.attrs) {
            let word = meta.path();
            if word.is_ident("crate") {
                if let Some(lit) = string_value(cx, &meta, "::forma::nn") {
                    match lit.parse::<Path>() {
                        Ok(p) => root.set(cx, word, p),
                        Err(_) => cx.error_spanned_by(
                            &lit,
                            format!("`{}` is not a path, like \"::forma::nn\"", lit.value()),
                        ),
                    }
                }
            } else if word.is_ident("name") {
                if let Some(lit) = string_value(cx, &meta, "Linear") {
                    if lit.value().is_empty() {
                        cx.error_spanned_by(&lit, "the repr name cannot be empty");
                    } else {
                        name.set(cx, word, lit.value());
                    }
                }
            } else if word.is_ident("extra_repr") {
                if let Some(lit) = string_value(cx, &meta, "Self::extra_repr") {
                    match lit.parse::<syn::ExprPath>() {
                        Ok(p) => extra_repr.set(cx, word, p),
                        Err(_) => cx.error_spanned_by(
                            &lit,
                            format!(
                                "`{}` is not a path to a function, like \"Self::extra_repr\"",
                                lit.value()
                            ),
                        ),
                    }
                }
            } else {
                cx.error_spanned_by(
                    word,
                    format!(
                        "unknown attribute #[module({})], expected {STRUCT_ATTRS}",
                        path_str(word)
                    ),
                );
            }
        }
        Container {
            root: root
                .value
                .map_or_else(|| syn::parse_quote!(::forma::nn), |(_, p)| p),
            name: name
                .value
                .map_or_else(|| input.ident.to_string(), |(_, n)| n),
            extra_repr: extra_repr.value.map(|(_, p)| p),
        }
    }
}

/// `#[module(rename = "...")]`.
pub struct Rename {
    /// The `rename` word.
    pub word: Path,
    /// The literal, where a duplicate key is reported.
    pub lit: LitStr,
}

/// `#[module(buffer)]` or `#[module(buffer(persistent = false))]`.
pub struct Buffer {
    /// The `buffer` word, where a field that is not a tensor is reported.
    pub span: Span,
    pub persistent: bool,
}

/// A field's attributes, each with the word that set it (for spans).
pub struct Field {
    pub rename: Option<Rename>,
    pub skip: Option<Path>,
    pub buffer: Option<(Path, Buffer)>,
    pub flatten: Option<Path>,
}

impl Field {
    pub fn from_ast(cx: &Ctxt, field: &syn::Field) -> Self {
        let mut rename = Attr::<LitStr>::none("rename");
        let mut skip = Attr::<()>::none("skip");
        let mut buffer = Attr::<Buffer>::none("buffer");
        let mut flatten = Attr::<()>::none("flatten");
        for meta in module_items(cx, &field.attrs) {
            let word = meta.path();
            if word.is_ident("rename") {
                if let Some(lit) = string_value(cx, &meta, "encoder.fc") {
                    if check_key(cx, &lit) {
                        rename.set(cx, word, lit);
                    }
                }
            } else if word.is_ident("skip") {
                if bare_word(cx, &meta) {
                    skip.set(cx, word, ());
                }
            } else if word.is_ident("buffer") {
                if let Some(persistent) = buffer_options(cx, &meta) {
                    let span = syn::spanned::Spanned::span(word);
                    buffer.set(cx, word, Buffer { span, persistent });
                }
            } else if word.is_ident("flatten") {
                if bare_word(cx, &meta) {
                    flatten.set(cx, word, ());
                }
            } else {
                cx.error_spanned_by(
                    word,
                    format!(
                        "unknown attribute #[module({})], expected {FIELD_ATTRS}",
                        path_str(word)
                    ),
                );
            }
        }
        Field {
            rename: rename.value.map(|(word, lit)| Rename { word, lit }),
            skip: skip.value.map(|(w, ())| w),
            buffer: buffer.value,
            flatten: flatten.value.map(|(w, ())| w),
        }
    }
}

/// Whether a renamed key is usable: non-empty, with no empty dotted segment.
fn check_key(cx: &Ctxt, lit: &LitStr) -> bool {
    let key = lit.value();
    if key.is_empty() {
        cx.error_spanned_by(lit, "#[module(rename = \"\")] gives an empty key");
        return false;
    }
    if key.split('.').any(str::is_empty) {
        cx.error_spanned_by(
            lit,
            format!("key \"{key}\" has an empty segment; dots separate names, like \"encoder.fc\""),
        );
        return false;
    }
    true
}

/// `persistent` of `buffer` or `buffer(persistent = ..)`; `None` after an error.
fn buffer_options(cx: &Ctxt, meta: &Meta) -> Option<bool> {
    let list = match meta {
        Meta::Path(_) => return Some(true),
        Meta::List(list) => list,
        Meta::NameValue(_) => {
            cx.error_spanned_by(
                meta,
                "#[module(buffer)] takes no value, write #[module(buffer)] or #[module(buffer(persistent = false))]",
            );
            return None;
        }
    };
    let items = match list.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated) {
        Ok(items) => items,
        Err(e) => {
            cx.syn_error(e);
            return None;
        }
    };
    let mut persistent = Attr::<bool>::none("persistent");
    let mut ok = true;
    for item in items {
        let word = item.path();
        if !word.is_ident("persistent") {
            cx.error_spanned_by(
                word,
                format!(
                    "unknown attribute #[module(buffer({}))], expected `persistent`",
                    path_str(word)
                ),
            );
            ok = false;
            continue;
        }
        match &item {
            Meta::NameValue(nv) => match ungroup(&nv.value) {
                Expr::Lit(ExprLit {
                    lit: Lit::Bool(b), ..
                }) => persistent.set(cx, word, b.value),
                other => {
                    cx.error_spanned_by(
                        other,
                        "`persistent` takes `true` or `false`: #[module(buffer(persistent = false))]",
                    );
                    ok = false;
                }
            },
            _ => {
                cx.error_spanned_by(
                    &item,
                    "`persistent` needs a value: #[module(buffer(persistent = false))]",
                );
                ok = false;
            }
        }
    }
    ok.then(|| persistent.value.is_none_or(|(_, p)| p))
}
