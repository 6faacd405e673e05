//! What a problem is, with no device: the module's sizes, masks, weights and host tensors.

pub mod config;
pub mod mask;
pub mod mla;
pub mod qk_norm;
pub mod relative_bias;
pub mod rope;
pub mod tensor;
pub mod weights;
