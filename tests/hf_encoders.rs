//! Issue 38's encoder long tail (transformers 5.25): `run --hf` on each case file as a one-file
//! checkpoint (its `hf_config` metadata is the config) gives transformers' answer, and
//! `inspect` names what each module is. (tests/hf.rs runs the same files on both paths.)

mod common;

use std::path::Path;

use common::cli;
use wgpu_mha::{Case, SafetensorsFile};

/// `inspect` on `case` shows every phrase and `runs`; `run --hf` matches its `out_f64`.
fn inspect_and_run(case: &str, phrases: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf");
    let dir = std::env::temp_dir().join(format!("wgpu-mha-hf-enc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = root.join(format!("{case}.safetensors"));
    let (code, text) = cli(&["inspect", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{case}: {text}");
    for phrase in phrases.iter().chain(&["  runs"]) {
        assert!(
            text.contains(phrase),
            "{case}: inspect lacks `{phrase}`:\n{text}"
        );
    }
    let prefix = SafetensorsFile::open(&path)
        .expect("case")
        .metadata("prefix")
        .expect("prefix")
        .to_string();
    let out = dir.join(format!("{case}.out.safetensors"));
    let p = path.to_str().unwrap();
    let args = ["run", "--hf", p, "--prefix", &prefix, "--inputs", p, "--out"];
    let (code, text) = cli(&[&args[..], &[out.to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{case}: {text}");
    let got = SafetensorsFile::open(&out)
        .and_then(|f| f.tensor_f32("out"))
        .expect("out");
    let case = Case::from_file(&path).expect("case");
    let err = case.max_abs_err(got.data());
    assert!(err <= case.bound(), "{}: {err:.3e}", case.name);
    std::fs::remove_file(&out).ok();
}

#[test]
fn megatron_bert_runs_after_its_input_norm() {
    inspect_and_run(
        "megatron_bert_self_layer1_padding_pre_norm",
        &[
            "model_type megatron-bert",
            "input_norm=encoder.layer.1.attention.ln (not computed",
        ],
    );
}

#[test]
fn bert_copies_run_as_bert() {
    inspect_and_run(
        "data2vec_text_self_layer1_padding",
        &["model_type data2vec-text", "self  E=32 heads=4"],
    );
    inspect_and_run(
        "layoutlm_self_layer1_padding",
        &["model_type layoutlm", "self  E=32 heads=4"],
    );
}
