//! Checks across attributes and fields: attributes that contradict each
//! other, and two fields stored under the same key.

use crate::ast::{Container, Field};
use crate::ctxt::Ctxt;
use quote::ToTokens;
use std::collections::HashMap;

pub fn check(cx: &Ctxt, cont: &Container) {
    for field in &cont.fields {
        check_conflicts(cx, field);
    }
    check_duplicate_keys(cx, cont);
}

/// `skip` with anything; `flatten` with `rename` or `buffer`.
fn check_conflicts(cx: &Ctxt, field: &Field) {
    let a = &field.attrs;
    let others: [(&str, Option<&dyn ToTokens>); 3] = [
        (
            "rename",
            a.rename.as_ref().map(|r| &r.word as &dyn ToTokens),
        ),
        ("buffer", a.buffer.as_ref().map(|(w, _)| w as &dyn ToTokens)),
        ("flatten", a.flatten.as_ref().map(|w| w as &dyn ToTokens)),
    ];
    if a.skip.is_some() {
        for (name, word) in others {
            if let Some(word) = word {
                cx.error_spanned_by(
                    word,
                    format!("#[module(skip)] cannot be combined with `{name}`"),
                );
            }
        }
        return;
    }
    if a.flatten.is_some() {
        for (name, word) in &others[..2] {
            if let Some(word) = word {
                cx.error_spanned_by(
                    word,
                    format!("#[module(flatten)] cannot be combined with `{name}`"),
                );
            }
        }
    }
}

/// Two visited fields under one key would overwrite each other's entries.
/// Flattened fields have no key of their own and are not compared.
fn check_duplicate_keys(cx: &Ctxt, cont: &Container) {
    let mut seen: HashMap<String, &str> = HashMap::new();
    for field in cont.fields.iter().filter(|f| f.visited()) {
        let key = field.key();
        if key.is_empty() {
            continue;
        }
        if let Some(first) = seen.get(&key) {
            let msg = format!("duplicate key `{key}` (also used by field `{first}`)");
            match (&field.attrs.rename, &field.original.ident) {
                (Some(r), _) => cx.error_spanned_by(&r.lit, msg),
                (None, Some(ident)) => cx.error_spanned_by(ident, msg),
                (None, None) => cx.error_spanned_by(field.ty, msg),
            }
        } else {
            seen.insert(key, &field.name);
        }
    }
}
