//! Interop: case files, safetensors weight layouts, their rejections, and the `check`/`run` CLI.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use wgpu_mha::{
    reference, AttentionPath, AttentionWeights, Case, CaseVariant, Error, Mask, MultiHeadAttention,
    SafetensorsFile, WeightLayout,
};

use common::{
    assert_close, assert_within, gpu, max_err, max_err_f64, options, relative_tolerance, tolerance,
};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// `tests/fixtures/*.safetensors`, sorted (the case files; weight files live in `weights/`).
fn case_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("tests/fixtures")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no case files in tests/fixtures");
    files
}

/// Every case file, loaded, with its file name.
fn cases() -> Vec<(String, Case)> {
    case_files()
        .iter()
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let case = Case::from_file(path).unwrap_or_else(|e| panic!("{name}: cannot read: {e}"));
            (name, case)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Case files: every fixture passes the check rule, on both attention paths.

#[test]
fn every_case_fixture_passes_the_check() {
    let cases = cases();
    for variant in [CaseVariant::Classic, CaseVariant::PerHead] {
        assert!(
            cases.iter().any(|(_, case)| case.variant == variant),
            "no {variant:?} case file"
        );
    }
    for (name, case) in &cases {
        assert!(
            case.err_f32_vs_f64.is_some(),
            "{name}: err_f32_vs_f64 metadata"
        );
        for path in [AttentionPath::Auto, AttentionPath::MultiPass] {
            let result = case
                .run(gpu(), &options(path, false))
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
}

/// The f64 CPU reference on the loaded case reproduces `out_f64` (so the loader hands the engine
/// exactly what PyTorch ran: weights, inputs, mask polarity, key = value for per-head).
#[test]
fn case_files_load_what_pytorch_ran() {
    for (name, case) in cases() {
        let r = case
            .reference()
            .unwrap_or_else(|e| panic!("{name}: reference: {e}"));
        assert_eq!(r.shape, case.out_shape, "{name}");
        let err = max_err_f64(&r.output, &case.out_f64);
        // The reference takes the scale as f32 (`config.scale()`), which costs ~1e-8 against a
        // pure f64 run; anything lost in loading (a bias, a mask polarity) is far larger.
        assert!(err <= 1e-6, "{name}: reference vs out_f64 {err:.3e}");
        if let Some(attn) = &case.attn_f64 {
            let perr = max_err_f64(&r.probs, attn);
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
    let options = options(AttentionPath::MultiPass, true);
    for (name, case) in cases() {
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
    let ref_err = max_err_f64(&want.output, &out_f64);
    assert!(
        ref_err <= 1e-6,
        "{name}: CPU reference vs out_f64 {ref_err:.3e}"
    );

    let mha = MultiHeadAttention::new(gpu(), c, &loaded.weights).unwrap();
    let got = mha.forward(&query, &key, &value, &Mask::None).unwrap();
    assert_eq!(got.shape(), shape.as_slice(), "{name}");
    let tol = tolerance(&out_f64);
    assert_within(
        &format!("{name}: GPU vs out_f64"),
        got.data(),
        &out_f64,
        tol,
    );
    assert_within(
        &format!("{name}: GPU vs CPU reference"),
        got.data(),
        &want.output,
        tol,
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

fn assert_mentions(problem: &str, phrases: &[&str]) {
    for phrase in phrases {
        assert!(
            problem.contains(phrase),
            "`{problem}` should mention `{phrase}`"
        );
    }
}

/// Asserts an `Error::File` whose problem mentions each of `phrases`.
fn assert_file_error<T: std::fmt::Debug>(result: Result<T, Error>, phrases: &[&str]) {
    match result {
        Err(Error::File { problem, .. }) => assert_mentions(&problem, phrases),
        other => panic!("expected Error::File mentioning {phrases:?}, got {other:?}"),
    }
}

/// Asserts an `Error::Weight` naming `tensor` whose problem contains `phrase`.
fn assert_weight_error(result: Result<wgpu_mha::LoadedWeights, Error>, tensor: &str, phrase: &str) {
    match result {
        Err(Error::Weight { name, problem }) => {
            assert_eq!(name, tensor, "problem: {problem}");
            assert_mentions(&problem, &[phrase]);
        }
        other => panic!("expected Error::Weight for `{tensor}`, got {other:?}"),
    }
}

/// `file` without `tensor` is refused, naming the tensor as missing.
fn assert_refused_without(file: StFile, tensor: &str) {
    assert_weight_error(load(&file.without(tensor), "", None), tensor, "missing");
}

/// `file` with `tensor` replaced by one of `shape` is refused, naming the tensor and `phrase`.
fn assert_refused_with_shape(file: StFile, tensor: &str, shape: &[usize], phrase: &str) {
    assert_weight_error(load(&file.f32(tensor, shape), "", None), tensor, phrase);
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
    assert_refused_without(classic16(), "W_k.weight");
    assert_refused_without(packed16(), "out_proj.weight");
}

#[test]
fn rejects_missing_bias_when_others_have_one() {
    assert_refused_without(classic16(), "W_v.bias");
    assert_refused_without(packed16(), "out_proj.bias");
}

#[test]
fn rejects_wrong_shapes() {
    assert_refused_with_shape(classic16(), "W_k.weight", &[15, 16], "[15, 16]");
    assert_refused_with_shape(classic16(), "W_o.weight", &[16, 12], "shape");
    assert_refused_with_shape(classic16(), "W_q.bias", &[8], "[8]");
    assert_refused_with_shape(classic16(), "W_q.weight", &[16, 16, 1], "rank 2");
    assert_refused_with_shape(packed16(), "in_proj_weight", &[47, 16], "[3·E, E]");
    assert_refused_with_shape(packed16(), "in_proj_bias", &[32], "[48]");
    // 16 rows do not split into 3 heads.
    assert_weight_error(load(&classic16(), "", Some(3)), "W_q.weight", "3 heads");
}

#[test]
fn rejects_unknown_layout() {
    let f = StFile::empty()
        .meta("num_heads", "2")
        .f32("linear.weight", &[4, 4]);
    // The message lists what the file holds.
    assert_file_error(
        load(&f, "", None),
        &["no attention weights", "linear.weight"],
    );
    // The right names under another prefix: the message suggests it.
    let prefixed = weight_file("mha_packed_prefixed_e32_h4");
    assert_file_error(
        AttentionWeights::from_safetensors(&prefixed, "", None),
        &["encoder.layers.0.self_attn."],
    );
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
fn rejects_unknown_heads_and_half_a_bias_kv_pair() {
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
    // add_bias_kv: bias_k and bias_v together, [1, 1, E] each; half a pair is refused.
    let with_both = packed16()
        .f32("bias_k", &[1, 1, 16])
        .f32("bias_v", &[1, 1, 16]);
    let loaded = load(&with_both, "", None).expect("bias_k and bias_v");
    assert!(loaded.config.add_bias_kv && loaded.weights.bias_kv.is_some());
    assert_weight_error(
        load(&packed16().f32("bias_k", &[1, 1, 16]), "", None),
        "bias_v",
        "missing",
    );
    assert_weight_error(
        load(&with_both.f32("bias_v", &[1, 1, 8]), "", None),
        "bias_v",
        "[1, 1, 16]",
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

type Edit = fn(StFile) -> StFile;

/// Each (committed case file, edit, phrase): the edited file is refused with an `Error::File`
/// that mentions the phrase.
fn assert_edits_refused(edits: &[(&str, Edit, &str)]) {
    for &(name, edit, phrase) in edits {
        assert_file_error(edited_case(name, edit), &[phrase]);
    }
}

/// Metadata missing or malformed.
#[rustfmt::skip]
const MISSING_METADATA: &[(&str, Edit, &str)] = &[
    (CLASSIC, |f| f.without_meta("variant"), "`variant` is missing"),
    (CLASSIC, |f| f.without_meta("config"), "`config` is missing"),
    (CLASSIC, |f| f.meta("config", "{not json"), "not valid JSON"),
    (CLASSIC, |f| f.meta("config", r#"{"name": 1}"#), "no `sizes`"),
    (CLASSIC, |f| f.meta("config", r#"{"sizes": {"d_model": 32}}"#), "sizes.num_heads is missing"),
    (CLASSIC, |f| f.meta("config", r#"{"sizes": {"d_model": 32, "num_heads": -4}}"#), "positive integer"),
    (CLASSIC, |f| f.meta("err_f32_vs_f64", "abc"), "err_f32_vs_f64"),
];

/// A variant that is unknown or contradicts the sizes or the weights.
#[rustfmt::skip]
const WRONG_VARIANT: &[(&str, Edit, &str)] = &[
    (CLASSIC, |f| f.meta("variant", "encoder"), "\"encoder\""),
    // A classic file labelled per-head (and the other way round): the sizes or layout disagree.
    (CLASSIC, |f| f.meta("variant", "perhead")
        .meta("config", r#"{"sizes": {"emb_size": 32, "q_k_size": 8, "v_size": 8, "head": 4}}"#), "layout"),
    (PER_HEAD, |f| f.meta("variant", "dmodel")
        .meta("config", r#"{"sizes": {"d_model": 32, "num_heads": 4}}"#), "layout"),
    // Sizes that contradict the weights.
    (CLASSIC, |f| f.meta("config", r#"{"sizes": {"d_model": 64, "num_heads": 4}}"#), "sizes give"),
];

/// Case tensors missing or of the wrong dtype.
#[rustfmt::skip]
const TENSOR_PROBLEMS: &[(&str, Edit, &str)] = &[
    (CLASSIC, |f| f.without("Q"), "`Q` is missing"),
    (PER_HEAD, |f| f.without("x_k_v"), "`x_k_v` is missing"),
    (CLASSIC, |f| f.without("out_f64"), "`out_f64` is missing"),
    (CLASSIC, |f| f.typed("Q", Dtype::I32, &[2, 6, 32]), "I32"),
    (CLASSIC, |f| f.typed("mask", Dtype::F32, &[1, 1, 6, 6]), "U8 or BOOL"),
];

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

#[test]
fn rejects_missing_metadata() {
    assert_edits_refused(MISSING_METADATA);
    // Without err_f32_vs_f64 the case still loads and gets the fallback bound.
    let case = edited_case(CLASSIC, |f| f.without_meta("err_f32_vs_f64")).unwrap();
    assert_eq!(case.bound(), relative_tolerance(1e-4, &case.out_f64));
}

#[test]
fn rejects_wrong_variant() {
    assert_edits_refused(WRONG_VARIANT);
}

#[test]
fn rejects_case_tensor_problems() {
    assert_edits_refused(TENSOR_PROBLEMS);
    assert!(matches!(
        edited_case(CLASSIC, |f| f.typed("mask", Dtype::U8, &[1, 1, 5, 6])),
        Err(Error::Mask(_))
    ));
    let mis_shaped: [Edit; 2] = [
        |f| f.f32("K", &[2, 6, 31]),
        |f| f.f32("out_f64", &[2, 6, 31]),
    ];
    for edit in mis_shaped {
        assert!(matches!(
            edited_case(CLASSIC, edit),
            Err(Error::Shape { .. })
        ));
    }
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

/// Runs `wgpu-mha run ARGS --out OUT` and asserts it succeeded.
fn cli_run_ok(args: &[&OsStr], out: &Path) {
    let run = cli()
        .arg("run")
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
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
    let files = case_files();
    let out = cli().arg("check").args(&files).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let summary = format!("{} passed, 0 failed", files.len());
    assert!(stdout.lines().any(|l| l == summary), "{summary}:\n{stdout}");
}

#[test]
fn cli_run_writes_out() {
    let dir = std::env::temp_dir().join(format!("wgpu-mha-cli-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // --case
    let out_path = dir.join("case_out.safetensors");
    let case_file = fixtures().join(PER_HEAD);
    cli_run_ok(&["--case".as_ref(), case_file.as_ref()], &out_path);
    let case = Case::from_file(fixtures().join(PER_HEAD)).unwrap();
    let written = SafetensorsFile::open(&out_path).unwrap();
    assert_eq!(written.dtype("out"), Some(Dtype::F32));
    let got = written.tensor_f32("out").unwrap();
    assert_eq!(got.shape(), case.out_shape.as_slice());
    assert!(case.max_abs_err(got.data()) <= case.bound());

    // --weights (prefix from the file's metadata) --inputs
    let w = weight_file("mha_packed_prefixed_e32_h4");
    let out_path = dir.join("weights_out.safetensors");
    cli_run_ok(
        &[
            "--weights".as_ref(),
            w.as_ref(),
            "--inputs".as_ref(),
            w.as_ref(),
        ],
        &out_path,
    );
    let got = SafetensorsFile::open(&out_path)
        .unwrap()
        .tensor_f32("out")
        .unwrap();
    let (_, want) = SafetensorsFile::open(&w)
        .unwrap()
        .tensor_f64("out_f64")
        .unwrap();
    assert_close("run --weights: out vs out_f64", got.data(), &want);

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
