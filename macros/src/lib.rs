//! Forma's procedural macros. The `Module` derive and the sequential forward
//! DSL arrive with the model-DSL issue; this crate holds only entry points.
