//! [`Family`]: the layouts of attention tensors the loader knows. The type alone, so that the
//! model-type tables (`model_types`) and the layouts' rules (`families`) both read it without
//! importing each other.

/// A layout of attention tensors, named after the family that made it known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// bert, roberta, …: `self.query/key/value`, `output.dense` (prefix `….attention.`).
    Bert,
    /// vit: `attention.query/key/value`, `output.dense`.
    Vit,
    /// distilbert: `q_lin`, `k_lin`, `v_lin`, `out_lin`.
    DistilBert,
    /// gpt2: packed Conv1D `c_attn [E, 3E]` (stored transposed), `c_proj`.
    Gpt2,
    /// bart, mbart, whisper, opt, …: `q_proj`, `k_proj`, `v_proj`, `out_proj`.
    Bart,
    /// t5: `q`, `k`, `v`, `o`, no biases, no 1/√d scale, relative position bias.
    T5,
    /// llama, mistral, qwen2, gemma, …: `q_proj`, `k_proj`, `v_proj`, `o_proj` with RoPE.
    Llama,
    /// phi3: packed `qkv_proj`, `o_proj`, RoPE.
    Phi3,
    /// gpt_neox: per-head packed `query_key_value`, `dense`, partial RoPE.
    GptNeox,
    /// phi: `q_proj`, `k_proj`, `v_proj`, `dense`, partial RoPE.
    Phi,
    /// albert: `query`, `key`, `value`, `dense` (and the LayerNorm after it) under
    /// `….attention.`, one layer shared by every position in the stack.
    Albert,
    /// mpt: packed `Wqkv` (q rows, then k, then v), `out_proj`, ALiBi.
    Mpt,
    /// codegen: `qkv_proj` packed in 4 blocks of [q, v, k] slices, `out_proj`, no biases.
    CodeGen,
    /// modernbert: packed `Wqkv` (q rows, then k, then v), `Wo`, RoPE, an encoder.
    ModernBert,
    /// deepseek_v2/v3 multi-head latent attention: `kv_a_proj_with_mqa`, `kv_a_layernorm`,
    /// `kv_b_proj`, `q_proj` or `q_a_proj` + `q_a_layernorm` + `q_b_proj`, `o_proj`.
    Mla,
}
