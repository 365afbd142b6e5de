//! The derive's input as the code generator needs it: the struct's fields in
//! declaration order, each with its attributes and the key it is stored under.

use crate::attr;
use crate::ctxt::Ctxt;
use syn::ext::IdentExt;
use syn::{Data, DeriveInput, Fields, Member};

/// A struct deriving `Module`.
pub struct Container<'a> {
    pub ident: &'a syn::Ident,
    pub generics: &'a syn::Generics,
    pub attrs: attr::Container,
    /// Empty for a unit struct, and for an enum or union (already an error).
    pub fields: Vec<Field<'a>>,
}

/// One field of the struct.
pub struct Field<'a> {
    /// `self.<member>`: a name or a tuple index.
    pub member: Member,
    /// The field's name as the user knows it (`fc`, `0`).
    pub name: String,
    pub ty: &'a syn::Type,
    pub attrs: attr::Field,
    pub original: &'a syn::Field,
}

impl Field<'_> {
    /// Whether the derive visits (and describes) this field.
    pub fn visited(&self) -> bool {
        self.attrs.skip.is_none()
    }

    /// The key of the field in dotted names: its rename, its name, or `""`
    /// when flattened.
    pub fn key(&self) -> String {
        if self.attrs.flatten.is_some() {
            String::new()
        } else if let Some(r) = &self.attrs.rename {
            r.lit.value()
        } else {
            self.name.clone()
        }
    }
}

impl<'a> Container<'a> {
    pub fn from_ast(cx: &Ctxt, input: &'a DeriveInput) -> Self {
        let attrs = attr::Container::from_ast(cx, input);
        let fields = match &input.data {
            Data::Struct(data) => fields_from_ast(cx, &data.fields),
            Data::Enum(data) => {
                cx.error_spanned_by(
                    data.enum_token,
                    "#[derive(Module)] supports structs only, not enums",
                );
                Vec::new()
            }
            Data::Union(data) => {
                cx.error_spanned_by(
                    data.union_token,
                    "#[derive(Module)] supports structs only, not unions",
                );
                Vec::new()
            }
        };
        Container {
            ident: &input.ident,
            generics: &input.generics,
            attrs,
            fields,
        }
    }
}

fn fields_from_ast<'a>(cx: &Ctxt, fields: &'a Fields) -> Vec<Field<'a>> {
    fields
        .iter()
        .enumerate()
        .map(|(i, field)| {
            let (member, name) = match &field.ident {
                Some(ident) => (Member::Named(ident.clone()), ident.unraw().to_string()),
                None => (Member::Unnamed(i.into()), i.to_string()),
            };
            Field {
                member,
                name,
                ty: &field.ty,
                attrs: attr::Field::from_ast(cx, field),
                original: field,
            }
        })
        .collect()
}
