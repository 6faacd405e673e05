//! Interop: case files, safetensors weight layouts, their rejections, and the `check`/`run` CLI.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use wgpu_mha::{
    reference, AttentionPath, AttentionWeights, Case, CaseVariant, Error, ForwardOptions, Mask,
    MultiHeadAttention, SafetensorsFile, WeightLayout,
};

use common::{gpu, max_err, tolerance};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn case_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("tests/fixtures")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    files
}

// ---------------------------------------------------------------------------------------------
// Case files: every fixture passes the check rule, on both attention paths.

#[test]
fn every_case_fixture_passes_the_check() {
    let files = case_files();
    assert_eq!(files.len(), 28, "expected the 28 committed case files");
    let (mut classic, mut per_head) = (0, 0);
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let case = Case::from_file(path).unwrap_or_else(|e| panic!("{name}: cannot read: {e}"));
        match case.variant {
            CaseVariant::Classic => classic += 1,
            CaseVariant::PerHead => per_head += 1,
        }
        assert!(
            case.err_f32_vs_f64.is_some(),
            "{name}: err_f32_vs_f64 metadata"
        );
        for path_choice in [AttentionPath::Auto, AttentionPath::MultiPass] {
            let options = ForwardOptions {
                return_probs: false,
                path: path_choice,
            };
            let result = case
                .run(gpu(), &options)
                .unwrap_or_else(|e| panic!("{name}: forward failed: {e}"));
            assert!(
                result.passed(),
                "{name} ({:?} path): max|engine − out_f64| = {:.3e} > bound {:.3e}",
                result.forward.path,
                result.max_abs_err,
                result.bound
            );
        }
    }
    assert_eq!((classic, per_head), (16, 12));
}

/// The f64 CPU reference on the loaded case reproduces `out_f64` (so the loader hands the engine
/// exactly what PyTorch ran: weights, inputs, mask polarity, key = value for per-head).
#[test]
fn case_files_load_what_pytorch_ran() {
    for path in case_files() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let case = Case::from_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let value = case.value.as_ref().unwrap_or(&case.key);
        let r = reference::forward(
            &case.config,
            &case.weights,
            &case.query,
            &case.key,
            value,
            &case.mask,
        )
        .unwrap_or_else(|e| panic!("{name}: reference: {e}"));
        assert_eq!(r.shape, case.out_shape, "{name}");
        let err = r
            .output
            .iter()
            .zip(&case.out_f64)
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        // The reference takes the scale as f32 (`config.scale()`), which costs ~1e-8 against a
        // pure f64 run; anything lost in loading (a bias, a mask polarity) is far larger.
        assert!(err <= 1e-6, "{name}: reference vs out_f64 {err:.3e}");
        if let Some(attn) = &case.attn_f64 {
            let perr = r
                .probs
                .iter()
                .zip(attn)
                .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                perr <= 1e-6,
                "{name}: reference probs vs attn_f64 {perr:.3e}"
            );
        }
        let out = case.out_f32.as_ref().expect("out");
        assert!(
            case.max_abs_err(out.data()) <= case.bound(),
            "{name}: PyTorch's own f32 result passes"
        );
    }
}

/// The multi-pass path's probabilities match `attn_f64`.
#[test]
fn case_probabilities_match_attn_f64() {
    let options = ForwardOptions {
        return_probs: true,
        path: AttentionPath::MultiPass,
    };
    for path in case_files() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let case = Case::from_file(&path).unwrap();
        let Some(attn) = &case.attn_f64 else { continue };
        let mha = MultiHeadAttention::new(gpu(), case.config, &case.weights).unwrap();
        let out = case.forward(&mha, &options).unwrap();
        let probs = out.probs.expect("probs");
        let err = max_err(probs.data(), attn);
        // Inputs ×30 make the scores large; their f32 rounding shows in the probabilities.
        let bound = if name.contains("scaled30") {
            1e-3
        } else {
            1e-5
        };
        assert!(
            err <= bound,
            "{name}: probs vs attn_f64 {err:.3e} > {bound:.0e}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Weight layouts.

fn weight_file(name: &str) -> PathBuf {
    fixtures()
        .join("weights")
        .join(format!("{name}.safetensors"))
}

/// Loads a weight fixture, runs it on the GPU and checks it against `out_f64` and the CPU
/// reference.
fn check_weight_fixture(name: &str, layout: WeightLayout, key_dim: usize, value_dim: usize) {
    let path = weight_file(name);
    let file = SafetensorsFile::open(&path).unwrap();
    let prefix = file.metadata("prefix").unwrap_or("").to_string();
    let loaded = AttentionWeights::from_safetensors(&path, &prefix, None)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(loaded.layout, layout, "{name}");
    let c = loaded.config;
    assert_eq!(
        (
            c.model_dim,
            c.key_dim,
            c.value_dim,
            c.heads,
            c.qk_head_dim,
            c.v_head_dim
        ),
        (32, key_dim, value_dim, 4, 8, 8),
        "{name}"
    );
    assert!(
        c.output_projection && c.bias,
        "{name}: output projection and biases"
    );
    assert_eq!(
        c.scale(),
        (1.0 / 8f64.sqrt()) as f32,
        "{name}: scale 1/sqrt(E/heads)"
    );

    let query = file.tensor_f32("query").unwrap();
    let key = file.tensor_f32("key").unwrap();
    let value = file.tensor_f32("value").unwrap();
    let (shape, out_f64) = file.tensor_f64("out_f64").unwrap();

    let want = reference::forward(&c, &loaded.weights, &query, &key, &value, &Mask::None).unwrap();
    assert_eq!(want.shape, shape, "{name}");
    let ref_err = want
        .output
        .iter()
        .zip(&out_f64)
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        ref_err <= 1e-6,
        "{name}: CPU reference vs out_f64 {ref_err:.3e}"
    );

    let mha = MultiHeadAttention::new(gpu(), c, &loaded.weights).unwrap();
    let got = mha.forward(&query, &key, &value, &Mask::None).unwrap();
    assert_eq!(got.shape(), shape.as_slice(), "{name}");
    let tol = tolerance(&out_f64);
    let err = max_err(got.data(), &out_f64);
    assert!(err <= tol, "{name}: GPU vs out_f64 {err:.3e} > {tol:.3e}");
    let err_ref = max_err(got.data(), &want.output);
    assert!(
        err_ref <= tol,
        "{name}: GPU vs CPU reference {err_ref:.3e} > {tol:.3e}"
    );
}

#[test]
fn weights_torch_packed() {
    check_weight_fixture("mha_packed_e32_h4", WeightLayout::TorchPacked, 32, 32);
}

#[test]
fn weights_torch_packed_under_prefix_skipping_other_tensors() {
    check_weight_fixture(
        "mha_packed_prefixed_e32_h4",
        WeightLayout::TorchPacked,
        32,
        32,
    );
}

#[test]
fn weights_torch_separate_kdim_vdim() {
    check_weight_fixture(
        "mha_separate_e32_h4_k20_v12",
        WeightLayout::TorchSeparate,
        20,
        12,
    );
}

#[test]
fn weights_classic_f16() {
    check_weight_fixture("classic_d32_h4_f16", WeightLayout::Classic, 32, 32);
}

#[test]
fn weights_classic_bf16() {
    check_weight_fixture("classic_d32_h4_bf16", WeightLayout::Classic, 32, 32);
}

#[test]
fn weights_from_bytes_with_explicit_heads() {
    let bytes = std::fs::read(weight_file("mha_packed_e32_h4")).unwrap();
    let loaded = AttentionWeights::from_safetensors_bytes(&bytes, "", Some(2)).unwrap();
    assert_eq!(
        loaded.config.heads, 2,
        "the caller's heads win over metadata"
    );
    assert_eq!(loaded.config.qk_head_dim, 16);
}

/// The per-head layout is recognised from a case file's tensors; heads split q_k_size/v_size.
#[test]
fn weights_per_head_layout() {
    let path = fixtures().join("perhead_b2_l6_e32_qk8_v16_h2_random_fullrow.safetensors");
    let loaded = AttentionWeights::from_safetensors(&path, "", Some(2)).unwrap();
    assert_eq!(loaded.layout, WeightLayout::PerHead);
    let c = loaded.config;
    assert_eq!(
        (c.model_dim, c.heads, c.qk_head_dim, c.v_head_dim),
        (32, 2, 8, 16)
    );
    assert!(!c.output_projection && loaded.weights.o.is_none());
}

// ---------------------------------------------------------------------------------------------
// Rejections. Small files are built here with the safetensors serializer.

/// An editable copy of a safetensors file.
struct StFile {
    tensors: BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>,
    metadata: HashMap<String, String>,
}

impl StFile {
    fn empty() -> Self {
        StFile {
            tensors: BTreeMap::new(),
            metadata: HashMap::new(),
        }
    }
    fn read(path: &Path) -> Self {
        let bytes = std::fs::read(path).unwrap();
        let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let tensors = st
            .tensors()
            .into_iter()
            .map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
            .collect();
        StFile {
            tensors,
            metadata: meta.metadata().clone().unwrap_or_default(),
        }
    }
    fn f32(mut self, name: &str, shape: &[usize]) -> Self {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .flat_map(|i| (i as f32 * 0.01).to_le_bytes())
            .collect();
        self.tensors
            .insert(name.into(), (Dtype::F32, shape.to_vec(), data));
        self
    }
    fn typed(mut self, name: &str, dtype: Dtype, shape: &[usize]) -> Self {
        let n: usize = shape.iter().product();
        self.tensors.insert(
            name.into(),
            (dtype, shape.to_vec(), vec![0u8; n * dtype.bitsize() / 8]),
        );
        self
    }
    fn without(mut self, name: &str) -> Self {
        assert!(self.tensors.remove(name).is_some(), "{name} was not there");
        self
    }
    fn meta(mut self, key: &str, value: &str) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }
    fn without_meta(mut self, key: &str) -> Self {
        assert!(
            self.metadata.remove(key).is_some(),
            "metadata {key} was not there"
        );
        self
    }
    fn bytes(&self) -> Vec<u8> {
        let views: Vec<(&str, TensorView)> = self
            .tensors
            .iter()
            .map(|(n, (d, s, b))| (n.as_str(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let meta = (!self.metadata.is_empty()).then(|| self.metadata.clone());
        safetensors::serialize(views, meta).unwrap()
    }
}

/// Classic weights, d_model 16, 2 heads.
fn classic16() -> StFile {
    let mut f = StFile::empty().meta("num_heads", "2");
    for p in ["W_q", "W_k", "W_v", "W_o"] {
        f = f
            .f32(&format!("{p}.weight"), &[16, 16])
            .f32(&format!("{p}.bias"), &[16]);
    }
    f
}

/// nn.MultiheadAttention(16, 2) packed.
fn packed16() -> StFile {
    StFile::empty()
        .meta("num_heads", "2")
        .f32("in_proj_weight", &[48, 16])
        .f32("in_proj_bias", &[48])
        .f32("out_proj.weight", &[16, 16])
        .f32("out_proj.bias", &[16])
}

fn load(f: &StFile, prefix: &str, heads: Option<usize>) -> Result<wgpu_mha::LoadedWeights, Error> {
    AttentionWeights::from_safetensors_bytes(&f.bytes(), prefix, heads)
}

/// Asserts an `Error::Weight` naming `tensor` whose problem contains `phrase`.
fn assert_weight_error(result: Result<wgpu_mha::LoadedWeights, Error>, tensor: &str, phrase: &str) {
    match result {
        Err(Error::Weight { name, problem }) => {
            assert_eq!(name, tensor, "problem: {problem}");
            assert!(
                problem.contains(phrase),
                "`{problem}` should mention `{phrase}`"
            );
        }
        other => panic!("expected Error::Weight for `{tensor}`, got {other:?}"),
    }
}

#[test]
fn the_builders_make_loadable_files() {
    let c = load(&classic16(), "", None).unwrap();
    assert_eq!(
        (c.layout, c.config.heads, c.config.qk_head_dim),
        (WeightLayout::Classic, 2, 8)
    );
    let p = load(&packed16(), "", None).unwrap();
    assert_eq!(p.layout, WeightLayout::TorchPacked);
    let no_bias = packed16().without("in_proj_bias").without("out_proj.bias");
    assert!(
        !load(&no_bias, "", None).unwrap().config.bias,
        "bias off when absent"
    );
}

#[test]
fn rejects_missing_weight_tensor() {
    assert_weight_error(
        load(&classic16().without("W_k.weight"), "", None),
        "W_k.weight",
        "missing",
    );
    assert_weight_error(
        load(&packed16().without("out_proj.weight"), "", None),
        "out_proj.weight",
        "missing",
    );
}

#[test]
fn rejects_missing_bias_when_others_have_one() {
    assert_weight_error(
        load(&classic16().without("W_v.bias"), "", None),
        "W_v.bias",
        "missing",
    );
    assert_weight_error(
        load(&packed16().without("out_proj.bias"), "", None),
        "out_proj.bias",
        "missing",
    );
}

#[test]
fn rejects_wrong_shapes() {
    assert_weight_error(
        load(&classic16().f32("W_k.weight", &[15, 16]), "", None),
        "W_k.weight",
        "[15, 16]",
    );
    assert_weight_error(
        load(&classic16().f32("W_o.weight", &[16, 12]), "", None),
        "W_o.weight",
        "shape",
    );
    assert_weight_error(
        load(&classic16().f32("W_q.bias", &[8]), "", None),
        "W_q.bias",
        "[8]",
    );
    assert_weight_error(
        load(&classic16().f32("W_q.weight", &[16, 16, 1]), "", None),
        "W_q.weight",
        "rank 2",
    );
    assert_weight_error(
        load(&packed16().f32("in_proj_weight", &[47, 16]), "", None),
        "in_proj_weight",
        "[3·E, E]",
    );
    assert_weight_error(
        load(&packed16().f32("in_proj_bias", &[32]), "", None),
        "in_proj_bias",
        "[48]",
    );
    // 16 rows do not split into 3 heads.
    assert_weight_error(load(&classic16(), "", Some(3)), "W_q.weight", "3 heads");
}

#[test]
fn rejects_unknown_layout() {
    let f = StFile::empty()
        .meta("num_heads", "2")
        .f32("linear.weight", &[4, 4]);
    match load(&f, "", None) {
        Err(Error::File { problem, .. }) => {
            assert!(problem.contains("no attention weights"), "{problem}");
            assert!(
                problem.contains("linear.weight"),
                "lists what the file holds: {problem}"
            );
        }
        other => panic!("expected Error::File, got {other:?}"),
    }
    // The right names under another prefix: the message suggests it.
    let prefixed = weight_file("mha_packed_prefixed_e32_h4");
    match AttentionWeights::from_safetensors(&prefixed, "", None) {
        Err(Error::File { problem, .. }) => {
            assert!(problem.contains("encoder.layers.0.self_attn."), "{problem}")
        }
        other => panic!("expected Error::File, got {other:?}"),
    }
}

#[test]
fn rejects_unreadable_dtypes() {
    for dtype in [Dtype::I32, Dtype::F64, Dtype::U8] {
        let f = classic16().typed("W_q.weight", dtype, &[16, 16]);
        assert_weight_error(load(&f, "", None), "W_q.weight", &format!("{dtype:?}"));
    }
    // f16 / bf16 are fine.
    for dtype in [Dtype::F16, Dtype::BF16] {
        assert!(load(&classic16().typed("W_q.weight", dtype, &[16, 16]), "", None).is_ok());
    }
}

#[test]
fn rejects_unknown_heads_and_unsupported_extras() {
    let f = classic16().without_meta("num_heads");
    assert!(
        matches!(load(&f, "", None), Err(Error::Config(_))),
        "no heads anywhere"
    );
    assert!(load(&f, "", Some(4)).is_ok(), "heads from the caller");
    assert!(
        load(&f.meta("heads", "4"), "", None).is_ok(),
        "metadata `heads`"
    );
    assert!(matches!(
        load(&packed16().meta("num_heads", "two"), "", None),
        Err(Error::File { .. })
    ));
    assert_weight_error(
        load(&packed16().f32("bias_k", &[1, 1, 16]), "", None),
        "bias_k",
        "add_bias_kv",
    );
    assert!(
        matches!(load(&classic16(), "", Some(0)), Err(Error::Config(_))),
        "zero heads"
    );
}

#[test]
fn weight_errors_name_the_prefixed_tensor() {
    let mut f = StFile::empty().meta("num_heads", "2");
    for (n, t) in packed16().without("out_proj.bias").tensors {
        f.tensors.insert(format!("enc.0.attn.{n}"), t);
    }
    assert_weight_error(
        load(&f, "enc.0.attn.", None),
        "enc.0.attn.out_proj.bias",
        "missing",
    );
}

fn case_bytes(name: &str) -> Vec<u8> {
    std::fs::read(fixtures().join(name)).unwrap()
}

const CLASSIC: &str = "classic_b2_l6_d32_h4_causal.safetensors";
const PER_HEAD: &str = "perhead_b2_l6_e32_qk8_v12_h4_causal.safetensors";

fn edited_case(name: &str, edit: impl FnOnce(StFile) -> StFile) -> Result<Case, Error> {
    let f = edit(StFile::read(&fixtures().join(name)));
    Case::from_bytes(name, f.bytes())
}

#[test]
fn rejects_truncated_files() {
    let bytes = case_bytes(CLASSIC);
    for cut in [1, 100, bytes.len() / 2, bytes.len() - 9, bytes.len() - 1] {
        let result = Case::from_bytes("truncated", bytes[..bytes.len() - cut].to_vec());
        assert!(
            matches!(result, Err(Error::File { .. })),
            "cut {cut}: {result:?}"
        );
    }
    let weights = std::fs::read(weight_file("mha_packed_e32_h4")).unwrap();
    let result = AttentionWeights::from_safetensors_bytes(&weights[..weights.len() - 4], "", None);
    assert!(matches!(result, Err(Error::File { .. })), "{result:?}");
}

#[test]
fn rejects_garbage_bytes() {
    let mut huge_header = u64::MAX.to_le_bytes().to_vec();
    huge_header.extend_from_slice(b"{}");
    let mut not_json = 8u64.to_le_bytes().to_vec();
    not_json.extend_from_slice(b"not json");
    for (label, bytes) in [
        ("empty", Vec::new()),
        ("short", vec![1, 2, 3]),
        ("text", b"this is not a safetensors file at all".to_vec()),
        ("huge header length", huge_header),
        ("header not json", not_json),
    ] {
        let result = Case::from_bytes(label, bytes);
        assert!(
            matches!(result, Err(Error::File { .. })),
            "{label}: {result:?}"
        );
    }
    let dir = std::env::temp_dir().join(format!("wgpu-mha-interop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("garbage.safetensors");
    std::fs::write(&path, b"\x07\x00\x00\x00\x00\x00\x00\x00{\"a\":1}").unwrap();
    assert!(matches!(Case::from_file(&path), Err(Error::File { .. })));
    assert!(matches!(
        Case::from_file(dir.join("missing.safetensors")),
        Err(Error::Io { .. })
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

fn assert_file_error(result: Result<Case, Error>, phrase: &str) {
    match result {
        Err(Error::File { problem, .. }) => {
            assert!(
                problem.contains(phrase),
                "`{problem}` should mention `{phrase}`"
            )
        }
        other => panic!("expected Error::File mentioning `{phrase}`, got {other:?}"),
    }
}

#[test]
fn rejects_missing_metadata() {
    assert_file_error(
        edited_case(CLASSIC, |f| f.without_meta("variant")),
        "`variant` is missing",
    );
    assert_file_error(
        edited_case(CLASSIC, |f| f.without_meta("config")),
        "`config` is missing",
    );
    assert_file_error(
        edited_case(CLASSIC, |f| f.meta("config", "{not json")),
        "not valid JSON",
    );
    assert_file_error(
        edited_case(CLASSIC, |f| f.meta("config", "{\"name\": 1}")),
        "no `sizes`",
    );
    assert_file_error(
        edited_case(CLASSIC, |f| {
            f.meta("config", "{\"sizes\": {\"d_model\": 32}}")
        }),
        "sizes.num_heads is missing",
    );
    assert_file_error(
        edited_case(CLASSIC, |f| {
            f.meta(
                "config",
                "{\"sizes\": {\"d_model\": 32, \"num_heads\": -4}}",
            )
        }),
        "positive integer",
    );
    assert_file_error(
        edited_case(CLASSIC, |f| f.meta("err_f32_vs_f64", "abc")),
        "err_f32_vs_f64",
    );
    // Without err_f32_vs_f64 the case still loads and gets the fallback bound.
    let case = edited_case(CLASSIC, |f| f.without_meta("err_f32_vs_f64")).unwrap();
    let max = case.out_f64.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    assert_eq!(case.bound(), 1e-4 * (1.0 + max));
}

#[test]
fn rejects_wrong_variant() {
    assert_file_error(
        edited_case(CLASSIC, |f| f.meta("variant", "encoder")),
        "\"encoder\"",
    );
    // A classic file labelled per-head (and the other way round): the sizes or layout disagree.
    assert_file_error(
        edited_case(CLASSIC, |f| {
            f.meta("variant", "perhead").meta(
                "config",
                "{\"sizes\": {\"emb_size\": 32, \"q_k_size\": 8, \"v_size\": 8, \"head\": 4}}",
            )
        }),
        "layout",
    );
    assert_file_error(
        edited_case(PER_HEAD, |f| {
            f.meta("variant", "dmodel")
                .meta("config", "{\"sizes\": {\"d_model\": 32, \"num_heads\": 4}}")
        }),
        "layout",
    );
    // Sizes that contradict the weights.
    assert_file_error(
        edited_case(CLASSIC, |f| {
            f.meta("config", "{\"sizes\": {\"d_model\": 64, \"num_heads\": 4}}")
        }),
        "sizes give",
    );
}

#[test]
fn rejects_case_tensor_problems() {
    assert_file_error(edited_case(CLASSIC, |f| f.without("Q")), "`Q` is missing");
    assert_file_error(
        edited_case(PER_HEAD, |f| f.without("x_k_v")),
        "`x_k_v` is missing",
    );
    assert_file_error(
        edited_case(CLASSIC, |f| f.without("out_f64")),
        "`out_f64` is missing",
    );
    assert_file_error(
        edited_case(CLASSIC, |f| f.typed("Q", Dtype::I32, &[2, 6, 32])),
        "I32",
    );
    assert_file_error(
        edited_case(CLASSIC, |f| f.typed("mask", Dtype::F32, &[1, 1, 6, 6])),
        "U8 or BOOL",
    );
    assert!(matches!(
        edited_case(CLASSIC, |f| f.typed("mask", Dtype::U8, &[1, 1, 5, 6])),
        Err(Error::Mask(_))
    ));
    assert!(matches!(
        edited_case(CLASSIC, |f| f.f32("K", &[2, 6, 31])),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        edited_case(CLASSIC, |f| f.f32("out_f64", &[2, 6, 31])),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        edited_case(CLASSIC, |f| f.without("W_o.weight")),
        Err(Error::Weight { name, .. }) if name == "W_o.weight"
    ));
    // Unknown tensors and metadata are ignored.
    let case = edited_case(CLASSIC, |f| {
        f.f32("mask_keep", &[3]).meta("format", "future/9")
    })
    .unwrap();
    assert_eq!(case.variant, CaseVariant::Classic);
    // No mask tensor: no mask.
    let case = edited_case(PER_HEAD, |f| f.without("attn_mask")).unwrap();
    assert_eq!(case.mask, Mask::None);
}

// ---------------------------------------------------------------------------------------------
// The CLI.

fn cli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_wgpu-mha"))
}

#[test]
fn cli_check_counts_a_missing_file_as_failed() {
    let missing = fixtures().join("no_such_case.safetensors");
    let out = cli()
        .arg("check")
        .arg(fixtures().join(CLASSIC))
        .arg(&missing)
        .arg(fixtures().join(PER_HEAD))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "exit code must be non-zero\n{stdout}"
    );
    assert!(
        stdout.lines().any(|l| l == "2 passed, 1 failed"),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("no_such_case") && l.ends_with("FAIL")),
        "the missing file has its own line:\n{stdout}"
    );
    assert_eq!(
        stdout.lines().filter(|l| l.ends_with("PASS")).count(),
        2,
        "{stdout}"
    );
    assert!(
        !stdout.contains("panicked") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

#[test]
fn cli_check_all_fixtures_passes() {
    let out = cli().arg("check").args(case_files()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.lines().any(|l| l == "28 passed, 0 failed"),
        "{stdout}"
    );
}

#[test]
fn cli_run_writes_out() {
    let dir = std::env::temp_dir().join(format!("wgpu-mha-cli-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // --case
    let out_path = dir.join("case_out.safetensors");
    let status = cli()
        .args(["run", "--case"])
        .arg(fixtures().join(PER_HEAD))
        .arg("--out")
        .arg(&out_path)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let case = Case::from_file(fixtures().join(PER_HEAD)).unwrap();
    let written = SafetensorsFile::open(&out_path).unwrap();
    assert_eq!(written.dtype("out"), Some(Dtype::F32));
    let got = written.tensor_f32("out").unwrap();
    assert_eq!(got.shape(), case.out_shape.as_slice());
    assert!(case.max_abs_err(got.data()) <= case.bound());

    // --weights (prefix from the file's metadata) --inputs
    let w = weight_file("mha_packed_prefixed_e32_h4");
    let out_path = dir.join("weights_out.safetensors");
    let status = cli()
        .args(["run", "--weights"])
        .arg(&w)
        .arg("--inputs")
        .arg(&w)
        .arg("--out")
        .arg(&out_path)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let got = SafetensorsFile::open(&out_path)
        .unwrap()
        .tensor_f32("out")
        .unwrap();
    let (_, want) = SafetensorsFile::open(&w)
        .unwrap()
        .tensor_f64("out_f64")
        .unwrap();
    assert!(max_err(got.data(), &want) <= tolerance(&want));

    // An explicit wrong prefix: one clear error line, non-zero exit, no panic.
    let bad = cli()
        .args(["run", "--weights"])
        .arg(&w)
        .args(["--prefix", "decoder.", "--heads", "4", "--inputs"])
        .arg(&w)
        .arg("--out")
        .arg(dir.join("never.safetensors"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("error: ") && l.contains("no attention weights")),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!dir.join("never.safetensors").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
