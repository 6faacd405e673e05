//! The catalog of every WGSL source the crate builds, for tests that check them all: naga's
//! validation natively, a browser's compiler in web/. Not an API (hidden from the docs).

use crate::kernels::decode::{self, DecodeShape};
use crate::kernels::flash_attention::{self, FlashShape};
use crate::kernels::linear::{self, LinearElems, LinearVariant};
use crate::kernels::paged_attention::{self, PagedShape};
use crate::kernels::{
    av_combine, clamp, kv_append, mla_rows, naive, output_gate, paged_append, paged_merge, qk_norm,
    read_probe, rope, scores, softmax,
};
use crate::{KernelClass, KvDtype};

/// Every element type of a page pool.
pub const POOL_DTYPES: [KvDtype; 4] = [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0];

/// Each head size of `head_dims` with each pool type that takes it.
pub fn pool_head_dims(head_dims: [usize; 4]) -> impl Iterator<Item = (usize, KvDtype)> {
    head_dims.into_iter().flat_map(|d| {
        POOL_DTYPES
            .into_iter()
            .filter(move |dtype| dtype.check_head_dim("d", d).is_ok())
            .map(move |dtype| (d, dtype))
    })
}

/// A flash shape of lavapipe's class (8 threads, 32 KiB of workgroup memory) for head sizes
/// `dk`, `dv`, `rows` query rows per thread; `Err` naming the head sizes if their keys do not fit.
pub fn flash_shape(dk: usize, dv: usize, rows: u32, f16: bool) -> Result<FlashShape, String> {
    let kv_tile = flash_attention::kv_tile(dk, dv, 32 * 1024)
        .ok_or_else(|| format!("flash heads {dk}/{dv}: no key tile fits 32 KiB"))?;
    Ok(FlashShape {
        qk_cap: crate::kernels::head_cap(dk),
        v_cap: crate::kernels::head_cap(dv),
        kv_tile,
        rows,
        threads: 8,
        f16,
        subgroup_kv: false,
        kv_bits: 0,
    })
}

/// Every source the crate can build, named: each kernel in every shape the crate can pick
/// (both adapter classes, every head size class, f16 and quantized element types). The native
/// tests validate each with naga (tests/shaders.rs); the browser tests compile each with the
/// browser's own WGSL compiler (web/tests/browser.rs). `Err` names a listed shape the
/// crate could not build (a catalog out of step with the kernels).
pub fn all_sources() -> Result<Vec<(String, String)>, String> {
    let mut all = vec![
        ("scores".to_string(), scores::source()),
        ("softmax".to_string(), softmax::source()),
        ("av_combine".to_string(), av_combine::source()),
        ("rope".to_string(), rope::source(false)),
        ("decode_reduce".to_string(), decode::reduce_source()),
        ("read_probe".to_string(), read_probe::WGSL.to_string()),
        ("read_probe_runs 8".to_string(), read_probe::runs_source(8)),
        (
            "read_probe_runs 64".to_string(),
            read_probe::runs_source(64),
        ),
        ("rope f16".to_string(), rope::source(true)),
        ("qk_norm".to_string(), qk_norm::source(false)),
        ("mla_rows".to_string(), mla_rows::source()),
        ("clamp".to_string(), clamp::source(false)),
        ("output gate".to_string(), output_gate::source()),
        ("clamp f16".to_string(), clamp::source(true)),
        ("qk_norm f16".to_string(), qk_norm::source(true)),
        ("kv_append".to_string(), kv_append::source(false, 0)),
        ("kv_append f16".to_string(), kv_append::source(true, 0)),
        ("kv_append q8_0".to_string(), kv_append::source(false, 8)),
        ("kv_append f16 q4_0".to_string(), kv_append::source(true, 4)),
        (
            "merge_state".to_string(),
            crate::kernels::merge_state::WGSL.to_string(),
        ),
        (
            "paged_append".to_string(),
            paged_append::source(KvDtype::F32),
        ),
        (
            "paged_append f16".to_string(),
            paged_append::source(KvDtype::F16),
        ),
        (
            "paged_append q8_0".to_string(),
            paged_append::source(KvDtype::Q8_0),
        ),
        (
            "paged_append q4_0".to_string(),
            paged_append::source(KvDtype::Q4_0),
        ),
        ("paged_merge d4 1".to_string(), paged_merge::source(1)),
        ("paged_merge d4 32".to_string(), paged_merge::source(32)),
        ("linear_naive".to_string(), naive::LINEAR_WGSL.to_string()),
        (
            "attention_naive".to_string(),
            naive::ATTENTION_WGSL.to_string(),
        ),
    ];
    let elems = [
        LinearElems::F32,
        LinearElems::F16Weights { f16_out: true },
        LinearElems::F16Weights { f16_out: false },
    ];
    for variant in [
        LinearVariant::Scalar,
        LinearVariant::Vec4,
        LinearVariant::Subgroup,
    ] {
        for e in elems {
            all.push((
                format!("linear {variant:?} {e:?}"),
                linear::source(variant, e),
            ));
        }
    }
    for (dk, dv) in [(1, 1), (3, 7), (16, 24), (64, 64), (256, 512)] {
        for rows in [1, 4, 16] {
            for f16 in [false, true] {
                // Subgroup K/V reads only where a workgroup is one subgroup of 8 lanes.
                for (threads, subgroup_kv) in [(8, false), (8, true), (64, false)] {
                    let s = FlashShape {
                        threads,
                        subgroup_kv,
                        ..flash_shape(dk, dv, rows, f16)?
                    };
                    all.push((format!("flash {s:?}"), flash_attention::source(s)));
                    // Quantized K/V: head sizes of whole blocks.
                    if dk % 32 == 0 && dv % 32 == 0 {
                        for kv_bits in [8, 4] {
                            let s = FlashShape { kv_bits, ..s };
                            all.push((format!("flash {s:?}"), flash_attention::source(s)));
                        }
                    }
                }
            }
        }
    }
    // Paged attention: both adapter classes' shapes, tiles shrunk for wide heads, f16 and
    // quantized pools (head sizes of whole blocks).
    for (threads, slots, key_tile) in [(8, 8, 16), (64, 16, 32), (64, 4, 4), (8, 1, 4)] {
        for d4 in [1, 3, 16, 32, 64] {
            for dtype in POOL_DTYPES {
                if dtype.check_head_dim("d", 4 * d4 as usize).is_err() {
                    continue;
                }
                let s = PagedShape {
                    threads,
                    slots,
                    key_tile,
                    d4,
                    f16: dtype == KvDtype::F16,
                    kv_bits: dtype.quant_bits(),
                };
                all.push((format!("paged {s:?}"), paged_attention::source(s)));
            }
        }
    }
    // The lane-keys decode body: every group size it takes, narrow and wide heads (head sizes
    // it does not take, 30, or 128 with 8 heads, go to the other bodies).
    for group in [1, 2, 3, 4, 8] {
        for (head_dim, dtype) in pool_head_dims([4, 30, 64, 128]) {
            let shape = crate::kernels::paged_decode::DecodeShape::within(
                32 * 1024,
                head_dim,
                dtype,
                group,
            );
            let takes = head_dim % 4 == 0 && group.next_power_of_two() * head_dim <= 512;
            assert_eq!(shape.is_some(), takes, "group {group}, d {head_dim}");
            if let Some(s) = shape {
                all.push((
                    format!("paged_decode {s:?}"),
                    crate::kernels::paged_decode::source(s),
                ));
            }
        }
    }
    // The register-tiled body: lavapipe's and GL's rows, narrow, odd and wide heads.
    for rows in [1, 2, 4, 8] {
        for (head_dim, dtype) in pool_head_dims([4, 30, 128, 256]) {
            let s = crate::kernels::paged_prefill::PrefillShape::within(
                32 * 1024,
                rows,
                head_dim,
                dtype,
            )
            .ok_or_else(|| {
                format!("paged_prefill rows {rows}, head {head_dim}: no tile fits 32 KiB")
            })?;
            all.push((
                format!("paged_prefill {s:?}"),
                crate::kernels::paged_prefill::source(s),
            ));
        }
    }
    for (dk, dv) in [(1, 1), (3, 7), (64, 64), (128, 128), (256, 256)] {
        for rows in [1, 2, 4, 8] {
            for f16 in [false, true] {
                for class in [KernelClass::Cpu, KernelClass::Gpu] {
                    for vec4_rows in [false, true] {
                        let mut s = DecodeShape::new(class, dk, dv, rows, f16);
                        s.vec4_rows = vec4_rows;
                        all.push((format!("decode {s:?}"), decode::source(s)));
                        if dk % 32 == 0 && dv % 32 == 0 && !vec4_rows {
                            for kv_bits in [8, 4] {
                                let s = DecodeShape { kv_bits, ..s };
                                all.push((format!("decode {s:?}"), decode::source(s)));
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(all)
}
