//! Every `.wgsl` file under `shaders/` parses and validates with naga (no GPU needed).
//! Pass files are validated as the engine builds them: with the shared snippets they call
//! (`gemm_tile.wgsl`, `mask.wgsl`) prepended, and `enable` directives hoisted to the top.

use std::path::{Path, PathBuf};

fn wgsl_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("shaders/ is readable") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            wgsl_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "wgsl") {
            out.push(path);
        }
    }
}

/// Prepends the snippets a pass uses but does not define, keeping `enable` lines first.
fn with_snippets(source: &str, shaders: &Path) -> String {
    let mut prefix = String::new();
    if source.contains("gemm_tile(") && !source.contains("fn gemm_tile(") {
        prefix += &std::fs::read_to_string(shaders.join("gemm_tile.wgsl")).expect("gemm_tile.wgsl");
    }
    if source.contains("vec4_block(") && !source.contains("fn vec4_block(") {
        prefix += &std::fs::read_to_string(shaders.join("linear_vec4_block.wgsl"))
            .expect("linear_vec4_block.wgsl");
    }
    let uses_params = source.contains("dst_index(") || prefix.contains("dst_index(");
    if uses_params && !source.contains("fn dst_index(") {
        prefix += &std::fs::read_to_string(shaders.join("linear_params.wgsl"))
            .expect("linear_params.wgsl");
    }
    if source.contains("apply_mask(") && !source.contains("fn apply_mask(") {
        prefix += &std::fs::read_to_string(shaders.join("mask.wgsl")).expect("mask.wgsl");
    }
    let full = format!("{prefix}\n{source}");
    let (enables, rest): (Vec<&str>, Vec<&str>) = full
        .lines()
        .partition(|l| l.trim_start().starts_with("enable "));
    format!("{}\n{}", enables.join("\n"), rest.join("\n"))
}

fn validate(name: &str, source: &str) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| format!("{name}: parse: {}", e.emit_to_string(source)))?;
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{name}: validation: {}", e.emit_to_string(source)))?;
    Ok(())
}

#[test]
fn every_shader_file_validates() {
    let shaders = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut files = Vec::new();
    wgsl_files(&shaders, &mut files);
    assert!(
        files.len() >= 7,
        "expected the pass shaders, found {files:?}"
    );
    let mut failures = Vec::new();
    let mut validated = 0;
    for path in &files {
        let name = path
            .strip_prefix(&shaders)
            .unwrap_or(path)
            .display()
            .to_string();
        let source = std::fs::read_to_string(path).expect("readable shader");
        // Snippets (no entry point, e.g. gemm_tile.wgsl calling the pass's load_a/load_b) are
        // validated inside the passes that prepend them.
        if !source.contains("@compute") {
            continue;
        }
        match validate(&name, &with_snippets(&source, &shaders)) {
            Ok(()) => validated += 1,
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "invalid shaders:\n{}",
        failures.join("\n\n")
    );
    assert!(validated >= 5, "validated only {validated} pass files");
}

/// Workgroup memory of lavapipe, GL llvmpipe and most desktop GPUs.
const WORKGROUP_BYTES: u32 = 32 * 1024;

/// K/V tiles hold whole key groups and fit the workgroup memory they are sized for.
#[test]
fn flash_tiles_are_whole_key_groups_within_workgroup_memory() {
    use wgpu_mha::kernels::flash_attention::{kv_tile, KEY_GROUP};
    for bytes in [16 * 1024u32, 32 * 1024, 48 * 1024] {
        for (dk, dv) in [
            (1usize, 1usize),
            (3, 7),
            (64, 64),
            (128, 96),
            (256, 512),
            (500, 500),
        ] {
            let staged = |keys: usize| keys * (dk.div_ceil(4) + dv.div_ceil(4)) * 16;
            match kv_tile(dk, dv, bytes) {
                Some(tile) => {
                    let tile = tile as usize;
                    assert!(tile.is_multiple_of(KEY_GROUP), "{dk} {dv} {bytes}: {tile}");
                    assert!(staged(tile) <= bytes as usize, "{dk} {dv} {bytes}: {tile}");
                }
                None => assert!(staged(KEY_GROUP) > bytes as usize, "{dk} {dv} {bytes}"),
            }
        }
    }
    // One group of 8 keys of 1024 + 1024 floats needs 64 KiB.
    assert_eq!(kv_tile(1024, 1024, 32 * 1024), None);
}

/// The host's dispatch geometry is the shader's: THREADS as written, ROWS as rewritten.
#[test]
fn flash_geometry_matches_the_shader() {
    use wgpu_mha::kernels::flash_attention::{source, THREADS, WGSL};
    assert!(WGSL.contains(&format!("const THREADS: u32 = {THREADS}u;")));
    assert!(WGSL.contains("const BLOCK_Q: u32 = ROWS * THREADS;"));
    for rows in [4, 16] {
        assert!(source(64, 64, 32, rows).contains(&format!("const ROWS: u32 = {rows}u;")));
    }
}

#[test]
fn flash_attention_validates_for_odd_head_sizes() {
    use wgpu_mha::kernels::flash_attention;
    for (dk, dv) in [(1, 1), (24, 24), (16, 24), (64, 64), (256, 512), (3, 7)] {
        let tile = flash_attention::kv_tile(dk, dv, WORKGROUP_BYTES).expect("fits");
        for rows in [4, 16] {
            let source = flash_attention::source(dk, dv, tile, rows);
            let label = format!("flash dk={dk} dv={dv} rows={rows}");
            validate(&label, &source).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// The f16 variants the host generates by text substitution: every rewrite took effect and
/// the result validates (naga with every capability, f16 included).
#[test]
fn f16_variants_validate() {
    use wgpu_mha::kernels::{flash_attention, linear};
    for (output, out_ty) in [
        (linear::F16Output::Half, "array<f16>"),
        (linear::F16Output::Full, "array<f32>"),
    ] {
        let source = linear::source_f16(output);
        assert!(source.starts_with("enable f16;"), "{output:?}");
        assert!(source.contains("w: array<f16>"), "{output:?}");
        assert!(source.contains("f32(w["), "{output:?}");
        assert!(source.contains(&format!("y: {out_ty}")), "{output:?}");
        validate(&format!("linear f16 {output:?}"), &source).unwrap_or_else(|e| panic!("{e}"));
    }
    for (dk, dv) in [(1, 1), (7, 7), (24, 24), (6, 24), (64, 64), (256, 512)] {
        let tile = flash_attention::kv_tile(dk, dv, WORKGROUP_BYTES).expect("fits");
        let source = flash_attention::source_f16(dk, dv, tile, 4);
        assert!(source.starts_with("enable f16;"));
        assert!(source.contains("qkv: array<f16>"));
        assert!(source.contains("return f32(qkv[base + d]);"));
        validate(&format!("flash f16 dk={dk} dv={dv}"), &source).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The subgroup GEMM validates with just the subgroup operations wgpu's SUBGROUP feature gives
/// (vote, ballot, shuffle) in compute, and is rejected without the capability: it does use it.
#[test]
fn linear_subgroup_validates_with_subgroup_capability_only() {
    use naga::valid::{Capabilities, ShaderStages, SubgroupOperationSet as Ops, ValidationFlags};
    use wgpu_mha::kernels::linear::{self, LinearVariant};
    let source = linear::source(LinearVariant::Subgroup);
    let module = naga::front::wgsl::parse_str(&source)
        .unwrap_or_else(|e| panic!("parse: {}", e.emit_to_string(&source)));
    naga::valid::Validator::new(ValidationFlags::all(), Capabilities::SUBGROUP)
        .subgroup_stages(ShaderStages::COMPUTE)
        .subgroup_operations(Ops::VOTE | Ops::BALLOT | Ops::SHUFFLE)
        .validate(&module)
        .unwrap_or_else(|e| panic!("validation: {}", e.emit_to_string(&source)));
    let without = naga::valid::Validator::new(ValidationFlags::all(), Capabilities::empty())
        .validate(&module);
    assert!(
        without.is_err(),
        "validated without the SUBGROUP capability"
    );
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
