//! Every shader the engine builds parses and validates with naga (no GPU needed), built
//! through the crate's own source functions; host mirrors of shader structs and constants
//! match what naga reads back.

use std::collections::BTreeSet;
use std::path::Path;

use naga::valid::{Capabilities, ValidationFlags};
use wgpu_mha::kernels::catalog::{all_sources, flash_shape};
use wgpu_mha::kernels::clamp::{self, ClampParams};
use wgpu_mha::kernels::decode::{self, DecodeParams, DecodeShape, ReduceParams};
use wgpu_mha::kernels::flash_attention::{self, FlashShape};
use wgpu_mha::kernels::kv_append::{self, AppendParams};
use wgpu_mha::kernels::linear::{self, LinearElems, LinearVariant};
use wgpu_mha::kernels::mask::{MaskKind, MaskParams};
use wgpu_mha::kernels::merge_state::MergeStateParams;
use wgpu_mha::kernels::mla_rows::{self, RowParams};
use wgpu_mha::kernels::paged_append::{self, PagedAppendParams};
use wgpu_mha::kernels::paged_attention::{self, PagedParams, PagedShape};
use wgpu_mha::kernels::paged_merge::{self, MergeParams};
use wgpu_mha::kernels::qk_norm::{self, NormParams};
use wgpu_mha::kernels::read_probe::{self, ProbeParams};
use wgpu_mha::kernels::{av_combine, naive, rope, scores, softmax, GEMM_TILE};
use wgpu_mha::serve::PoolFormat;
use wgpu_mha::{KernelClass, KvDtype};

fn parse(name: &str, source: &str) -> Result<naga::Module, String> {
    naga::front::wgsl::parse_str(source)
        .map_err(|e| format!("{name}: parse: {}", e.emit_to_string(source)))
}

fn validate(name: &str, source: &str) -> Result<naga::Module, String> {
    let module = parse(name, source)?;
    naga::valid::Validator::new(ValidationFlags::all(), Capabilities::all())
        .validate(&module)
        .map_err(|e| format!("{name}: validation: {}", e.emit_to_string(source)))?;
    Ok(module)
}

#[test]
fn every_built_shader_validates() {
    let failures: Vec<String> = all_sources()
        .expect("every catalogued shape builds")
        .iter()
        .filter_map(|(name, src)| validate(name, src).err())
        .collect();
    assert!(
        failures.is_empty(),
        "invalid shaders:\n{}",
        failures.join("\n\n")
    );
}

/// No `.wgsl` file escapes validation: each is part of some source the crate builds.
#[test]
fn every_shader_file_is_part_of_a_built_source() {
    let sources = all_sources().expect("every catalogued shape builds");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut files = Vec::new();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("readable shaders/") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "wgsl") {
                files.push(path);
            }
        }
    }
    assert!(files.len() >= 12, "{files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).expect("readable");
        assert!(
            sources.iter().any(|(_, s)| s.contains(&text)),
            "{} is in no built source",
            f.display()
        );
    }
}

/// The f16 sources really read (and, for Q/K/V, write) f16: the prelude's aliases are used.
#[test]
fn f16_sources_alias_their_element_types() {
    let q = linear::source(
        LinearVariant::Scalar,
        LinearElems::F16Weights { f16_out: true },
    );
    assert!(q.starts_with("enable f16;") && q.contains("alias WElem = f16;"));
    assert!(q.contains("alias YElem = f16;") && q.contains("array<WElem>"));
    let o = linear::source(
        LinearVariant::Scalar,
        LinearElems::F16Weights { f16_out: false },
    );
    assert!(o.contains("alias WElem = f16;") && o.contains("alias YElem = f32;"));
    let f = flash_attention::source(flash_shape(64, 64, 4, true).expect("fits 32 KiB"));
    assert!(f.starts_with("enable f16;") && f.contains("alias QkvElem = f16;"));
    assert!(!linear::source(LinearVariant::Scalar, LinearElems::F32).contains("enable f16"));
}

/// Shader bodies never define what the host's prelude defines: without the prelude they do
/// not even parse, so a missing or misnamed constant is an error, never a silent default.
#[test]
fn bodies_without_their_prelude_do_not_parse() {
    let bodies = [
        (
            "flash",
            format!(
                "{}\n{}",
                wgpu_mha::kernels::mask::WGSL,
                flash_attention::WGSL
            ),
        ),
        (
            "linear",
            format!(
                "{}\n{}\n{}",
                linear::PARAMS_WGSL,
                wgpu_mha::kernels::GEMM_TILE_WGSL,
                linear::WGSL
            ),
        ),
        (
            "linear_vec4",
            format!(
                "{}\n{}\n{}",
                linear::PARAMS_WGSL,
                linear::VEC4_BLOCK_WGSL,
                linear::WGSL_VEC4
            ),
        ),
        (
            "scores",
            format!(
                "{}\n{}\n{}",
                wgpu_mha::kernels::GEMM_TILE_WGSL,
                wgpu_mha::kernels::mask::WGSL,
                scores::WGSL
            ),
        ),
    ];
    for (name, body) in bodies {
        assert!(
            parse(name, &body).is_err(),
            "{name} parses without its prelude"
        );
    }
}

/// `(name, byte offset)` of each field of a host struct, and its size.
macro_rules! host_layout {
    ($t:ty, [$($f:ident),* $(,)?]) => {
        (
            stringify!($t),
            std::mem::size_of::<$t>(),
            vec![$((stringify!($f), std::mem::offset_of!($t, $f))),*],
        )
    };
}

/// The WGSL struct `name` in `module`: its members' names and offsets, and its size.
fn wgsl_layout(module: &naga::Module, name: &str) -> Option<(usize, Vec<(String, usize)>)> {
    module
        .types
        .iter()
        .find_map(|(_, ty)| match (&ty.name, &ty.inner) {
            (Some(n), naga::TypeInner::Struct { members, span }) if n == name => Some((
                *span as usize,
                members
                    .iter()
                    .map(|m| (m.name.clone().unwrap_or_default(), m.offset as usize))
                    .collect(),
            )),
            _ => None,
        })
}

#[test]
fn uniform_structs_match_their_wgsl_layout() {
    use flash_attention::FlashParams;
    use linear::LinearParams;
    use wgpu_mha::kernels::av_combine::AvParams;
    use wgpu_mha::kernels::naive::{NaiveAttnParams, NaiveLinearParams};
    use wgpu_mha::kernels::rope::RopeParams;
    use wgpu_mha::kernels::scores::ScoresParams;
    use wgpu_mha::kernels::softmax::SoftmaxParams;
    use wgpu_mha::kernels::RowStrides;
    let flash = flash_attention::source(flash_shape(64, 64, 4, false).expect("fits 32 KiB"));
    let lin = linear::source(LinearVariant::Scalar, LinearElems::F32);
    // The paged attention shader over an f32 pool (`kv_bits` 0) or a quantized one.
    let paged = |kv_bits| {
        paged_attention::source(PagedShape {
            threads: 8,
            slots: 8,
            key_tile: 16,
            d4: 16,
            f16: false,
            kv_bits,
        })
    };
    let structs = [
        (
            flash.clone(),
            host_layout!(
                FlashParams,
                [
                    q,
                    k,
                    v,
                    o,
                    lq,
                    lk,
                    heads,
                    scale,
                    z_offset,
                    tile_begin,
                    tile_end,
                    carry_flags,
                    kv_group,
                    key_base,
                    head_dim_qk,
                    head_dim_v,
                    sinks,
                    sink_base,
                    k_scales,
                    v_scales
                ]
            ),
        ),
        (
            flash,
            host_layout!(
                MaskParams,
                [
                    kind,
                    causal_offset,
                    base,
                    batch_base,
                    strides,
                    window,
                    softcap,
                    alibi_max_bias,
                    alibi_heads,
                    chunk,
                    temp_floor_scale,
                    temp_attn_scale,
                    _pad
                ]
            ),
        ),
        (
            lin,
            host_layout!(
                LinearParams,
                [
                    m,
                    n,
                    k,
                    seq_len,
                    x_offset,
                    w_offset,
                    bias_offset,
                    has_bias,
                    dst_seq_len,
                    dst_pos,
                    k_begin,
                    k_end,
                    seg_start,
                    seg_head_dim,
                    seg_heads,
                    seg_dst
                ]
            ),
        ),
        (
            scores::source(),
            host_layout!(
                ScoresParams,
                [
                    q, k, lq, lk, head_dim, heads, scale, z_offset, k_begin, k_end, kv_group,
                    _pad0, _pad1, _pad2
                ]
            ),
        ),
        (
            av_combine::source(),
            host_layout!(
                AvParams,
                [
                    v, o, lq, lk, head_dim, heads, z_offset, k_begin, k_end, kv_group, _pad0,
                    _pad1, _pad2, _pad3
                ]
            ),
        ),
        (
            softmax::source(),
            host_layout!(
                SoftmaxParams,
                [rows, cols, groups_x, sinks, lq, heads, _pad0, _pad1]
            ),
        ),
        (
            decode::source(DecodeShape::new(KernelClass::Gpu, 64, 64, 4, false)),
            host_layout!(
                DecodeParams,
                [
                    q,
                    k,
                    v,
                    lq,
                    lk,
                    heads,
                    kv_heads,
                    kv_group,
                    scale,
                    keys_per_split,
                    splits,
                    split_base,
                    key_base,
                    head_dim_qk,
                    head_dim_v,
                    k_scales,
                    v_scales
                ]
            ),
        ),
        (
            decode::reduce_source(),
            host_layout!(
                ReduceParams,
                [o, rows, lq, heads, splits, groups_x, head_dim_v, sinks, _pad2]
            ),
        ),
        (
            decode::reduce_source(),
            host_layout!(RowStrides, [offset, batch, head, row]),
        ),
        (
            rope::source(false),
            host_layout!(
                RopeParams,
                [
                    rows,
                    heads,
                    n,
                    stride,
                    first,
                    head_dim,
                    half,
                    interleaved,
                    offset,
                    groups_x,
                    _pad0,
                    _pad1
                ]
            ),
        ),
        (
            mla_rows::source(),
            host_layout!(
                RowParams,
                [
                    rows, n, in_stride, in_offset, out_stride, out_offset, normalise, groups_x,
                    eps, _pad0, _pad1, _pad2
                ]
            ),
        ),
        (
            clamp::source(false),
            host_layout!(
                ClampParams,
                [elements, n, stride, first, head_dim, offset, groups_x, limit]
            ),
        ),
        (
            qk_norm::source(false),
            host_layout!(
                NormParams,
                [
                    groups,
                    heads,
                    heads_per_group,
                    n,
                    stride,
                    first,
                    head_dim,
                    offset,
                    per_head_weight,
                    layer_norm,
                    eps,
                    weight_offset,
                    groups_x,
                    has_bias,
                    _pad1,
                    _pad2
                ]
            ),
        ),
        (
            paged(0),
            host_layout!(
                PagedParams,
                [
                    heads,
                    kv_heads,
                    head_dim,
                    page_size,
                    hnd,
                    causal,
                    window_left,
                    flags,
                    scale,
                    softcap,
                    groups_x,
                    items,
                    seqs_at,
                    indices_at,
                    heads_at,
                    partial_rows,
                    q_offset,
                    q_row,
                    q_head,
                    page_shift,
                    item_base,
                    _pad0,
                    _pad1,
                    _pad2
                ]
            ),
        ),
        (
            paged_merge::source(16),
            host_layout!(
                MergeParams,
                [
                    total_q,
                    heads,
                    head_dim,
                    rows_at,
                    partial_rows,
                    write_lse,
                    groups_x,
                    _pad
                ]
            ),
        ),
        (
            wgpu_mha::kernels::merge_state::WGSL.to_string(),
            host_layout!(MergeStateParams, [rows, head_dim, groups_x, _pad]),
        ),
        (
            paged(4),
            host_layout!(PoolFormat, [scales, _pad0, _pad1, _pad2]),
        ),
        (
            naive::LINEAR_WGSL.to_string(),
            host_layout!(NaiveLinearParams, [m, n, k, has_bias]),
        ),
        (
            naive::ATTENTION_WGSL.to_string(),
            host_layout!(
                NaiveAttnParams,
                [lq, lk, dk, dv, heads, rows, q_offset, k_offset, v_offset, scale, _pad0, _pad1]
            ),
        ),
    ];
    // A params struct that a plain and a quantized (or a run-length) shader both read: each
    // must match it.
    let shared = [
        (
            [
                paged_append::source(KvDtype::F32),
                paged_append::source(KvDtype::Q8_0),
            ],
            host_layout!(
                PagedAppendParams,
                [
                    tokens,
                    kv_heads,
                    head_dim,
                    page_size,
                    hnd,
                    groups_x,
                    k_offset,
                    v_offset,
                    row_stride,
                    head_stride,
                    scales,
                    _pad1
                ]
            ),
        ),
        (
            [kv_append::source(false, 0), kv_append::source(false, 8)],
            host_layout!(
                AppendParams,
                [
                    blocks, count, width, src_offset, src_stride, src_first, dst_stride, dst_first,
                    groups_x, dst_scales, _pad1, _pad2
                ]
            ),
        ),
        (
            [read_probe::WGSL.to_string(), read_probe::runs_source(8)],
            host_layout!(ProbeParams, [vec4s, per_group, groups_x, _pad0]),
        ),
    ];
    let shared = shared
        .into_iter()
        .flat_map(|(sources, layout)| sources.map(|source| (source, layout.clone())));
    for (source, (name, size, fields)) in structs.into_iter().chain(shared) {
        let module = validate(name, &source).unwrap_or_else(|e| panic!("{e}"));
        let (span, members) =
            wgsl_layout(&module, name).unwrap_or_else(|| panic!("no struct {name}"));
        let host: Vec<(String, usize)> = fields
            .into_iter()
            .map(|(f, o)| (f.to_string(), o))
            .collect();
        assert_eq!(members, host, "{name}: WGSL members vs host fields");
        assert_eq!(span, size, "{name}: WGSL size vs host size");
    }
}

/// Every constant of a module whose value is a plain literal, by name.
fn constants(module: &naga::Module) -> Vec<(String, f64)> {
    module
        .constants
        .iter()
        .filter_map(|(_, c)| {
            let value = match module.global_expressions[c.init] {
                naga::Expression::Literal(naga::Literal::U32(v)) => v as f64,
                naga::Expression::Literal(naga::Literal::I32(v)) => v as f64,
                naga::Expression::Literal(naga::Literal::F32(v)) => v as f64,
                _ => return None,
            };
            Some((c.name.clone()?, value))
        })
        .collect()
}

fn constant(module: &naga::Module, name: &str) -> f64 {
    constants(module)
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no constant {name}"))
        .1
}

/// Host constants the geometry and buffers depend on equal the shader's.
#[test]
fn host_constants_match_the_shaders() {
    for (dk, dv, rows, threads) in [
        (64, 64, 16, 8),
        (3, 7, 4, 8),
        (256, 512, 16, 8),
        (128, 128, 1, 64),
    ] {
        let s = FlashShape {
            threads,
            ..flash_shape(dk, dv, rows, false).expect("fits 32 KiB")
        };
        let m = validate("flash", &flash_attention::source(s)).unwrap_or_else(|e| panic!("{e}"));
        let threads = threads as f64;
        assert_eq!(constant(&m, "THREADS"), threads);
        assert_eq!(
            constant(&m, "BLOCK_Q"),
            rows as f64 * threads,
            "workgroup rows"
        );
        assert_eq!(constant(&m, "KV_TILE"), s.kv_tile as f64);
        assert_eq!(
            constant(&m, "KEY_GROUP"),
            flash_attention::key_group(s.kv_tile) as f64
        );
        assert_eq!(constant(&m, "CARRY_IN"), flash_attention::CARRY_IN as f64);
        assert_eq!(constant(&m, "CARRY_OUT"), flash_attention::CARRY_OUT as f64);
        // Registers and tiles are laid out for the head-size buckets the host sized
        // workgroup memory and loop caps for (the carry's stride follows the real head size
        // at run time, as `carry_stride` does on the host).
        for (name, d) in [("DK4", dk), ("DV4", dv)] {
            let vec4s = wgpu_mha::kernels::head_cap(d).div_ceil(4) as f64;
            assert_eq!(constant(&m, name), vec4s, "{name} of d{d}");
        }
        assert_eq!(
            constant(&m, "MASKED_SCORE"),
            wgpu_mha::model::mask::MASKED_SCORE as f64
        );
        for (kind, name) in MaskKind::ALL {
            assert_eq!(constant(&m, name), kind as u32 as f64, "{name}");
        }
    }
    let s = validate("scores", &scores::source()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(constant(&s, "TILE_M"), GEMM_TILE as f64);
    assert_eq!(constant(&s, "TILE_N"), GEMM_TILE as f64);
    let v = linear::source(LinearVariant::Vec4, LinearElems::F32);
    let v = validate("vec4", &v).unwrap_or_else(|e| panic!("{e}"));
    let (tm, tn) = linear::tile(LinearVariant::Vec4);
    assert_eq!(
        (8.0 * constant(&v, "RB"), 8.0 * constant(&v, "CB")),
        (tm as f64, tn as f64)
    );
    // Every mask kind has its own value.
    let kinds: BTreeSet<u32> = MaskKind::ALL.iter().map(|(k, _)| *k as u32).collect();
    assert_eq!(kinds.len(), MaskKind::ALL.len());
}

/// The subgroup GEMM validates with just the subgroup operations wgpu's SUBGROUP feature gives
/// (vote, ballot, shuffle) in compute, and is rejected without the capability: it does use it.
#[test]
fn linear_subgroup_validates_with_subgroup_capability_only() {
    use naga::valid::SubgroupOperationSet as Ops;
    let source = linear::source(LinearVariant::Subgroup, LinearElems::F32);
    assert_needs_subgroups_with_only("subgroup", &source, Ops::VOTE | Ops::BALLOT | Ops::SHUFFLE);
}

/// `source` validates with the SUBGROUP capability and only `ops` in compute, and not
/// without the capability (it does use it).
fn assert_needs_subgroups_with_only(
    name: &str,
    source: &str,
    ops: naga::valid::SubgroupOperationSet,
) {
    let module = parse(name, source).unwrap_or_else(|e| panic!("{e}"));
    naga::valid::Validator::new(ValidationFlags::all(), Capabilities::SUBGROUP)
        .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
        .subgroup_operations(ops)
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}: validation: {}", e.emit_to_string(source)));
    let without = naga::valid::Validator::new(ValidationFlags::all(), Capabilities::empty())
        .validate(&module);
    assert!(
        without.is_err(),
        "{name}: validated without the SUBGROUP capability"
    );
}

/// The fused pass's subgroup K/V reads use only what wgpu's SUBGROUP feature gives (an
/// exclusive add, broadcasts) and need the capability; its shared reads need none, so GL
/// (no subgroups) still builds the pass.
#[test]
fn flash_subgroup_kv_needs_the_subgroup_capability_and_only_it() {
    use naga::valid::SubgroupOperationSet as Ops;
    let shape = |subgroup_kv| FlashShape {
        subgroup_kv,
        ..flash_shape(64, 64, 16, false).expect("fits 32 KiB")
    };
    let source = flash_attention::source(shape(true));
    assert_needs_subgroups_with_only("flash subgroup", &source, Ops::ARITHMETIC | Ops::BALLOT);
    let shared = flash_attention::source(shape(false));
    let module = parse("flash shared", &shared).unwrap_or_else(|e| panic!("{e}"));
    naga::valid::Validator::new(ValidationFlags::all(), Capabilities::empty())
        .validate(&module)
        .unwrap_or_else(|e| panic!("validation: {}", e.emit_to_string(&shared)));
}

#[test]
fn a_broken_shader_is_rejected() {
    // The validator is not a no-op: an undefined identifier must fail.
    assert!(validate(
        "broken",
        "@compute @workgroup_size(1) fn main() { let x = undefined_thing; }"
    )
    .is_err());
}

/// The paged pass's work-list strides and sentinels are the host's, and the workgroup memory
/// the host budgets is what the shader declares.
#[test]
fn paged_attention_constants_match_the_host() {
    use wgpu_mha::kernels::paged_attention::{DIRECT, ITEM_WORDS, NO_WINDOW, SEQ_WORDS};
    let shape = PagedShape {
        threads: 64,
        slots: 16,
        key_tile: 32,
        d4: 32,
        f16: false,
        kv_bits: 0,
    };
    let m = validate("paged", &paged_attention::source(shape)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(constant(&m, "ITEM_WORDS"), ITEM_WORDS as f64);
    assert_eq!(constant(&m, "SEQ_WORDS"), SEQ_WORDS as f64);
    assert_eq!(constant(&m, "NO_WINDOW"), NO_WINDOW as f64);
    assert_eq!(constant(&m, "DIRECT"), DIRECT as f64);
    let declared: usize = m
        .global_variables
        .iter()
        .filter(|(_, v)| v.space == naga::AddressSpace::WorkGroup)
        .map(|(_, v)| m.types[v.ty].inner.size(m.to_ctx()) as usize)
        .sum();
    assert_eq!(declared, shape.workgroup_bytes() as usize);
}
