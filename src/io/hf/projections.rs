//! A module's four projections read from the checkpoint into the crate's `[out, in]`
//! layout — split from the packed tensors some families store (GPT-2's Conv1D `c_attn`, phi3's
//! `qkv_proj` and MPT's `Wqkv`, gpt_neox's per-head `query_key_value`, Falcon's grouped one,
//! GPT-BigCode's Linear `c_attn`) — and
//! checked, every error naming a tensor as the checkpoint stores it.

use super::families::{projection_names, Family};
use super::HfCheckpoint;
use crate::error::{Error, Result};
use crate::model::config::AttentionConfig;
use crate::model::weights::{AttentionWeights, Linear};

/// Loads the projections of `family` at `prefix` with `heads` query heads (and `kv_heads`
/// key/value heads, which phi3's packed `qkv_proj` needs to be split). A bias that some
/// projections have and others lack (whisper's `k_proj`) is zero where missing: the same
/// answer, one bias switch. Fewer key than query outputs make grouped-query attention.
pub fn load(
    ckpt: &HfCheckpoint,
    family: Family,
    model_type: &str,
    prefix: &str,
    heads: usize,
    kv_heads: Option<usize>,
) -> Result<(AttentionConfig, AttentionWeights)> {
    if heads == 0 {
        return Err(Error::Config(format!(
            "`{prefix}`: 0 heads; an attention module has at least one"
        )));
    }
    match family {
        Family::Gpt2 if model_type == "gpt_bigcode" => {
            return gpt_bigcode(ckpt, prefix, heads, kv_heads == Some(1))
        }
        Family::Gpt2 => return gpt2(ckpt, prefix, heads),
        Family::Phi3 | Family::Mpt | Family::ModernBert => {
            return stacked(ckpt, family, prefix, heads, kv_heads.unwrap_or(heads))
        }
        Family::GptNeox if model_type == "falcon" => return falcon(ckpt, prefix, heads, kv_heads),
        Family::GptNeox => return gpt_neox(ckpt, prefix, heads),
        Family::CodeGen => return codegen(ckpt, prefix, heads),
        Family::Llama if model_type == "qwen3_next" => return gated(ckpt, prefix, heads),
        _ => {}
    }
    let names = projection_names(family);
    let [q, k, v, o] = names.map(|n| linear(ckpt, prefix, n, false));
    assembled(prefix, heads, names, [q?, k?, v?, o?])
}

/// GPT-2's Conv1D projections: `weight [in, out]`, the transpose of `nn.Linear`'s.
fn gpt2(
    ckpt: &HfCheckpoint,
    prefix: &str,
    heads: usize,
) -> Result<(AttentionConfig, AttentionWeights)> {
    let packed = linear(ckpt, prefix, "c_attn", true)?;
    let e = packed.in_features;
    if e.checked_mul(3) != Some(packed.out_features) {
        return Err(Error::weight(
            format!("{prefix}c_attn.weight"),
            format!(
                "is Conv1D [in, out] = [{e}, {}], expected [E, 3·E] = [{e}, {}] (GPT-2 stores \
                 its projections transposed)",
                packed.out_features,
                e.saturating_mul(3)
            ),
        ));
    }
    let part = |i: usize| Linear {
        out_features: e,
        in_features: e,
        weight: packed.weight[i * e * e..(i + 1) * e * e].to_vec(),
        bias: packed.bias.as_ref().map(|b| b[i * e..(i + 1) * e].to_vec()),
    };
    let o = linear(ckpt, prefix, "c_proj", true)?;
    assembled(
        prefix,
        heads,
        projection_names(Family::Gpt2),
        [part(0), part(1), part(2), o],
    )
}

/// GPT-BigCode's Linear `c_attn`: `[E + 2·d, E]` with one key/value head (`multi_query`: the
/// query rows, then the key's, then the value's), or `[3·E, E]` packed per head `[H, 3, d]`.
fn gpt_bigcode(
    ckpt: &HfCheckpoint,
    prefix: &str,
    heads: usize,
    multi_query: bool,
) -> Result<(AttentionConfig, AttentionWeights)> {
    let packed = linear(ckpt, prefix, "c_attn", false)?;
    let e = packed.in_features;
    let name = format!("{prefix}c_attn.weight");
    if heads > e || !e.is_multiple_of(heads) {
        return Err(Error::weight(
            name,
            format!("has input width E = {e}, which does not split into {heads} heads"),
        ));
    }
    let d = e / heads;
    let want = match multi_query {
        true => e + 2 * d,
        false => 3 * e,
    };
    if packed.out_features != want {
        return Err(Error::weight(
            name,
            format!(
                "has {} rows; with {heads} heads of {d} and multi_query = {multi_query} it holds \
                 {want} (E + 2·d with multi_query, 3·E without)",
                packed.out_features
            ),
        ));
    }
    let [q, k, v] = match multi_query {
        true => [(0, e), (e, d), (e + d, d)].map(|part| rows(&packed, &[part])),
        false => [0, 1, 2].map(|which| {
            let parts: Vec<(usize, usize)> = (0..heads).map(|h| ((3 * h + which) * d, d)).collect();
            rows(&packed, &parts)
        }),
    };
    let o = linear(ckpt, prefix, "c_proj", false)?;
    assembled(prefix, heads, projection_names(Family::Gpt2), [q, k, v, o])
}

/// Rows `[from, from + n)` of a projection (weight rows and bias entries) as its own layer.
fn rows(layer: &Linear, parts: &[(usize, usize)]) -> Linear {
    let w = layer.in_features;
    let mut weight = Vec::new();
    let mut bias = layer.bias.as_ref().map(|_| Vec::new());
    for &(from, n) in parts {
        weight.extend_from_slice(&layer.weight[from * w..(from + n) * w]);
        if let (Some(out), Some(b)) = (bias.as_mut(), layer.bias.as_ref()) {
            out.extend_from_slice(&b[from..from + n]);
        }
    }
    Linear {
        out_features: parts.iter().map(|p| p.1).sum(),
        in_features: w,
        weight,
        bias,
    }
}

/// Qwen3-Next's gated attention: `q_proj` holds, per head, its d query rows then its d gate
/// rows (`[H·2d, E]`); the gate rows become the output gate's `W_g`.
fn gated(
    ckpt: &HfCheckpoint,
    prefix: &str,
    heads: usize,
) -> Result<(AttentionConfig, AttentionWeights)> {
    let names = projection_names(Family::Llama);
    let [q, k, v, o] = names.map(|n| linear(ckpt, prefix, n, false));
    let q = q?;
    if !q.out_features.is_multiple_of(2 * heads) {
        return Err(Error::weight(
            format!("{prefix}q_proj.weight"),
            format!(
                "has {} rows, which are not {heads} heads of d query and d gate rows",
                q.out_features
            ),
        ));
    }
    let d = q.out_features / (2 * heads);
    let of = |first: usize| {
        (0..heads)
            .map(|h| (h * 2 * d + first, d))
            .collect::<Vec<_>>()
    };
    let (query, gate) = (rows(&q, &of(0)), rows(&q, &of(d)));
    let (config, mut weights) = assembled(prefix, heads, names, [query, k?, v?, o?])?;
    weights.gate = Some(gate);
    Ok((config.with_output_gate()?, weights))
}

/// phi3's `qkv_proj` and MPT's `Wqkv`: rows `[H·d queries | H_kv·d keys | H_kv·d values]`.
fn stacked(
    ckpt: &HfCheckpoint,
    family: Family,
    prefix: &str,
    heads: usize,
    kv_heads: usize,
) -> Result<(AttentionConfig, AttentionWeights)> {
    let [packed_name, _, _, out_name] = projection_names(family);
    let packed = linear(ckpt, prefix, packed_name, false)?;
    let parts = kv_heads
        .checked_mul(2)
        .and_then(|kv| kv.checked_add(heads))
        .filter(|&p| p <= packed.out_features);
    let Some(parts) = parts.filter(|&p| packed.out_features.is_multiple_of(p)) else {
        return Err(Error::weight(
            format!("{prefix}{packed_name}.weight"),
            format!(
                "has {} rows, which are not (heads + 2·kv_heads) = ({heads} + 2·{kv_heads}) heads \
                 of one size",
                packed.out_features
            ),
        ));
    };
    let d = packed.out_features / parts;
    let (q, kv) = (heads * d, kv_heads * d);
    let o = linear(ckpt, prefix, out_name, false)?;
    let layers = [
        rows(&packed, &[(0, q)]),
        rows(&packed, &[(q, kv)]),
        rows(&packed, &[(q + kv, kv)]),
        o,
    ];
    assembled(prefix, heads, projection_names(family), layers)
}

/// Falcon's `query_key_value`: per key/value group, the group's query heads then its key and
/// its value (`[kv, H/kv + 2, d]`, d = E/H). One group is multi-query's `[H queries | k | v]`,
/// one query head per group the old per-head `[q, k, v]` packing: the three layouts
/// transformers reads by `new_decoder_architecture` and `multi_query` are this one with the
/// key/value heads the config gives (`None`: from the rows).
fn falcon(
    ckpt: &HfCheckpoint,
    prefix: &str,
    heads: usize,
    kv_heads: Option<usize>,
) -> Result<(AttentionConfig, AttentionWeights)> {
    let packed = linear(ckpt, prefix, "query_key_value", false)?;
    let (e, n) = (packed.in_features, packed.out_features);
    let name = format!("{prefix}query_key_value.weight");
    if heads > e || !e.is_multiple_of(heads) {
        return Err(Error::weight(
            name,
            format!("has input width E = {e}, which does not split into {heads} heads"),
        ));
    }
    let d = e / heads;
    let kv = kv_heads.unwrap_or_else(|| (n / d).saturating_sub(heads) / 2);
    let want = kv
        .checked_mul(2)
        .and_then(|k| k.checked_add(heads))
        .map(|p| p * d);
    if kv == 0 || !heads.is_multiple_of(kv) || want != Some(n) {
        return Err(Error::weight(
            name,
            format!(
                "has {n} rows; {heads} query heads of {d} with {kv} key/value heads dividing \
                 them hold (heads + 2·kv_heads)·d = {}",
                want.map_or("too many".to_string(), |w| w.to_string())
            ),
        ));
    }
    let group = heads / kv + 2;
    let part = |g: usize, at: usize| ((g * group + at) * d, d);
    let q: Vec<(usize, usize)> = (0..kv)
        .flat_map(|g| (0..heads / kv).map(move |i| part(g, i)))
        .collect();
    let k: Vec<(usize, usize)> = (0..kv).map(|g| part(g, group - 2)).collect();
    let v: Vec<(usize, usize)> = (0..kv).map(|g| part(g, group - 1)).collect();
    let o = linear(ckpt, prefix, "dense", false)?;
    let layers = [rows(&packed, &q), rows(&packed, &k), rows(&packed, &v), o];
    assembled(prefix, heads, projection_names(Family::GptNeox), layers)
}

/// CodeGen's `qkv_proj` `[3·E, E]`: 4 blocks (its `mp_num`) of `3·E/4` rows, each the
/// [q, v, k] slices of one quarter of the hidden size, in that order (CodeGenAttention splits
/// `view(…, 4, 3·E/4)` into query, value, key).
fn codegen(
    ckpt: &HfCheckpoint,
    prefix: &str,
    heads: usize,
) -> Result<(AttentionConfig, AttentionWeights)> {
    const BLOCKS: usize = 4;
    let packed = linear(ckpt, prefix, "qkv_proj", false)?;
    let e = packed.in_features;
    if !e.is_multiple_of(BLOCKS) || packed.out_features != 3 * e {
        return Err(Error::weight(
            format!("{prefix}qkv_proj.weight"),
            format!(
                "has shape [{}, {e}], expected [3·E, E] with E a multiple of {BLOCKS} (CodeGen's \
                 {BLOCKS} packed blocks)",
                packed.out_features
            ),
        ));
    }
    let local = e / BLOCKS;
    let of = |slot: usize| -> Vec<(usize, usize)> {
        (0..BLOCKS)
            .map(|m| ((3 * m + slot) * local, local))
            .collect()
    };
    let o = linear(ckpt, prefix, "out_proj", false)?;
    let layers = [
        rows(&packed, &of(0)),
        rows(&packed, &of(2)),
        rows(&packed, &of(1)),
        o,
    ];
    assembled(prefix, heads, projection_names(Family::CodeGen), layers)
}

/// gpt_neox's `query_key_value`: packed per head, `[H, 3, d]` (q, k, v of head 0, then head 1…).
fn gpt_neox(
    ckpt: &HfCheckpoint,
    prefix: &str,
    heads: usize,
) -> Result<(AttentionConfig, AttentionWeights)> {
    let packed = linear(ckpt, prefix, "query_key_value", false)?;
    let parts = heads.checked_mul(3).filter(|&p| p <= packed.out_features);
    let Some(parts) = parts.filter(|&p| packed.out_features.is_multiple_of(p)) else {
        return Err(Error::weight(
            format!("{prefix}query_key_value.weight"),
            format!(
                "has {} rows, which are not [heads, 3, head_dim] with {heads} heads",
                packed.out_features
            ),
        ));
    };
    let d = packed.out_features / parts;
    let of = |which: usize| -> Vec<(usize, usize)> {
        (0..heads).map(|h| ((3 * h + which) * d, d)).collect()
    };
    let o = linear(ckpt, prefix, "dense", false)?;
    let layers = [
        rows(&packed, &of(0)),
        rows(&packed, &of(1)),
        rows(&packed, &of(2)),
        o,
    ];
    assembled(prefix, heads, projection_names(Family::GptNeox), layers)
}

/// `name.weight` (`[out, in]`, or Conv1D's `[in, out]` when `conv1d`) and `name.bias` if present.
pub(super) fn linear(
    ckpt: &HfCheckpoint,
    prefix: &str,
    name: &str,
    conv1d: bool,
) -> Result<Linear> {
    let weight_name = format!("{prefix}{name}.weight");
    let (shape, values) = ckpt.read(&weight_name)?;
    let [rows, cols] = shape[..] else {
        return Err(Error::weight(
            weight_name,
            format!("has shape {shape:?}, expected rank 2"),
        ));
    };
    let (out_features, in_features, weight) = match conv1d {
        false => (rows, cols, values),
        true => {
            let mut t = vec![0.0; values.len()];
            for r in 0..rows {
                for c in 0..cols {
                    t[c * rows + r] = values[r * cols + c];
                }
            }
            (cols, rows, t)
        }
    };
    let bias_name = format!("{prefix}{name}.bias");
    let bias = match ckpt.contains(&bias_name) {
        false => None,
        true => {
            let (bs, b) = ckpt.read(&bias_name)?;
            if b.len() != out_features {
                return Err(Error::weight(
                    bias_name,
                    format!("has shape {bs:?}, expected [{out_features}]"),
                ));
            }
            Some(b)
        }
    };
    Ok(Linear {
        out_features,
        in_features,
        weight,
        bias,
    })
}

/// The config the four projections imply with `heads` query heads, checked, and the weights
/// (missing biases zero-filled when any projection has one). `stored`: the checkpoint's names of
/// the q, k, v and output projections (a packed tensor names three), so that every error names
/// a tensor as the checkpoint stores it and the sizes it disagrees with.
fn assembled(
    prefix: &str,
    heads: usize,
    stored: [&str; 4],
    mut layers: [Linear; 4],
) -> Result<(AttentionConfig, AttentionWeights)> {
    let bias = layers.iter().any(|l| l.bias.is_some());
    for l in layers.iter_mut().filter(|l| bias && l.bias.is_none()) {
        l.bias = Some(vec![0.0; l.out_features]);
    }
    let [q, k, v, o] = layers;
    let weight = |i: usize| format!("{prefix}{}.weight", stored[i]);
    let shape = |l: &Linear| format!("[{}, {}]", l.out_features, l.in_features);
    // Every Hugging Face attention projects the hidden size (E, the query projection's input).
    let e = q.in_features;
    for (i, l) in [(1, &k), (2, &v)] {
        if l.in_features != e {
            return Err(Error::weight(
                weight(i),
                format!(
                    "has shape {} (as [out, in]): its input width {} differs from {}'s {e}, \
                     the hidden size",
                    shape(l),
                    l.in_features,
                    weight(0)
                ),
            ));
        }
    }
    if heads > q.out_features || !q.out_features.is_multiple_of(heads) {
        return Err(Error::weight(
            weight(0),
            format!(
                "has {} query outputs (shape {}), which do not split into {heads} heads",
                q.out_features,
                shape(&q)
            ),
        ));
    }
    let qk_head_dim = q.out_features / heads;
    // Fewer key than query outputs: grouped-query (or multi-query) attention, one key/value
    // head per group of query heads.
    let kv_heads = k.out_features / qk_head_dim;
    if !k.out_features.is_multiple_of(qk_head_dim)
        || kv_heads == 0
        || !heads.is_multiple_of(kv_heads)
    {
        return Err(Error::weight(
            weight(1),
            format!(
                "has {} key outputs (shape {}), which are not key/value heads of the query head \
                 size {qk_head_dim} ({} outputs / {heads} heads) dividing the {heads} heads",
                k.out_features,
                shape(&k),
                q.out_features
            ),
        ));
    }
    if !v.out_features.is_multiple_of(kv_heads) {
        return Err(Error::weight(
            weight(2),
            format!(
                "has {} value outputs (shape {}), which do not split into the {kv_heads} \
                 key/value heads {} gives",
                v.out_features,
                shape(&v),
                weight(1)
            ),
        ));
    }
    let weights = AttentionWeights::projections(q, k, v, Some(o));
    let config = weights.implied_config(heads, kv_heads)?;
    // The crate's names (W_q …) in a failed check become the checkpoint's.
    let ours = AttentionWeights::names(&config);
    weights.check(&config).map_err(|e| match e {
        Error::Weight { name, problem } => {
            let i = ours.iter().position(|n| name.starts_with(n)).unwrap_or(3);
            let part = name.rsplit('.').next().unwrap_or("weight");
            Error::Weight {
                name: format!("{prefix}{}.{part}", stored[i]),
                problem,
            }
        }
        other => other,
    })?;
    Ok((config, weights))
}
