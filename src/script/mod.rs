//! Rhai glue shared by the script APIs: conversions at the edge (`convert`) and the
//! session-bound core functions (`core`). Each type's API lives beside the type
//! (`table::script`, `plot::script`, ...); the flat registration list is `engine::registry`.
//! This module depends on nothing but `output`, so every type's API may use it.

pub mod convert;
pub mod core;
