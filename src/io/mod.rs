//! Files: safetensors in and out, the weight layouts it recognises, and case files.

pub mod case;
mod case_file;
pub mod files;
pub mod hf;
pub mod layouts;
pub mod masks;
pub mod safetensors;
