//! PyTorch's own conventions, checked against PyTorch's own module: case files made by
//! `tools/gen_torch_conventions.py` from `nn.MultiheadAttention` state dicts as saved, with a
//! float `attn_mask` (0/−inf causal, ALiBi-like bias, a row of only −inf), `key_padding_mask`
//! alone and combined with bool and float masks, a `scale` override, and `add_bias_kv` /
//! `add_zero_attn` alone and with masks — on both paths; PyTorch's own test samples for
//! `nn.MultiheadAttention` and `F.multi_head_attention_forward`. Malformed options are
//! refused, never guessed.

mod common;

use std::path::Path;

use common::{cases_pass_on_both_paths, cli, file_name as name, fixtures};
use wgpu_mha::{Case, Mask, SafetensorsFile};

/// `wgpu-mha run --weights F --inputs F --out DIR/name(F) ARGS`: a fixture holding both the
/// state dict and the inputs. Asserts success; returns the written file.
fn run_on_itself(dir: &Path, fixture: &Path, args: &[&str]) -> SafetensorsFile {
    let (p, out) = (fixture.to_str().unwrap(), dir.join(name(fixture)));
    let mut all = vec![
        "run",
        "--weights",
        p,
        "--inputs",
        p,
        "--out",
        out.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let (code, text) = cli(&all);
    assert_eq!(code, 0, "{}: {text}", name(fixture));
    SafetensorsFile::open(&out).expect("output file")
}

#[test]
fn pytorch_conventions_match_pytorch_on_both_paths() {
    cases_pass_on_both_paths("torch");
}

/// `sample_inputs_multi_head_attention_forward`: packed and separate weights, bias_k/bias_v,
/// 2-D and 3-D float masks, sequence-first and unbatched inputs (stored batch-first).
#[test]
fn pytorch_functional_samples_match_pytorch_on_both_paths() {
    assert_eq!(fixtures("torch_functional").len(), 96);
    cases_pass_on_both_paths("torch_functional");
}

#[test]
fn masks_are_read_in_their_pytorch_meaning() {
    let kind = |file: &str| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/torch")
            .join(file);
        Case::from_file(path).expect("case").mask
    };
    // A float mask is added (0/−inf), never read as bytes.
    assert!(matches!(
        kind("torch_float_causal_mask.safetensors"),
        Mask::Bias(_)
    ));
    // key_padding_mask is true = padding: [B, Lk] becomes [B, 1, 1, Lk] of "masked".
    match kind("torch_key_padding_cross.safetensors") {
        Mask::Block(t) => {
            assert_eq!(t.shape(), [3, 1, 1, 7]);
            // Lengths 7, 3, 5: batch 1 masks keys 3.. and nothing before.
            assert_eq!(&t.data()[7..14], &[0, 0, 0, 1, 1, 1, 1]);
        }
        other => panic!("key padding read as {other:?}"),
    }
    // Combined with a float bias, padding is −inf.
    match kind("torch_alibi_bias_and_key_padding.safetensors") {
        Mask::Bias(t) => {
            assert_eq!(t.shape(), [2, 3, 5, 5]);
            let batch1_row0 = &t.data()[3 * 25..3 * 25 + 5];
            assert!(batch1_row0[..3].iter().all(|v| v.is_finite()));
            assert!(batch1_row0[3..].iter().all(|&v| v == f32::NEG_INFINITY));
        }
        other => panic!("bias + key padding read as {other:?}"),
    }
    // bias_k/bias_v come with the weights, add_zero_attn from the metadata.
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/torch/torch_bias_kv_zero_attn_bool_mask_and_key_padding.safetensors");
    let case = Case::from_file(path).expect("case");
    assert!(case.config.add_bias_kv && case.config.add_zero_attn);
    assert_eq!(case.config.appended_keys(), 2);
    let bias_kv = case.weights.bias_kv.as_ref().expect("bias_k, bias_v");
    assert_eq!((bias_kv.k.len(), bias_kv.v.len()), (24, 24));
}

#[test]
fn malformed_pytorch_options_are_refused_not_guessed() {
    for (path, phrase) in fixtures("refused")
        .into_iter()
        .zip(["add_zero_attn", "bias_v"])
    {
        let err = Case::from_file(&path).expect_err("refused");
        assert!(err.to_string().contains(phrase), "{}: {err}", name(&path));
        let (code, out) = cli(&["check", path.to_str().unwrap()]);
        assert_ne!(code, 0, "{out}");
        assert!(
            out.contains(phrase) && out.contains("0 passed, 1 failed"),
            "{out}"
        );
    }
}

/// `run --weights F --inputs F`: the state dict and the inputs (with `attn_mask` and
/// `key_padding_mask`, or a `--scale`) of one torch fixture, compared with PyTorch's answer.
#[test]
fn run_takes_pytorch_masks_and_scale_from_an_inputs_file() {
    let dir = std::env::temp_dir().join(format!("wgpu-mha-torch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (file, extra) in [
        ("torch_alibi_bias_and_key_padding.safetensors", &[][..]),
        ("torch_bool_mask_and_key_padding.safetensors", &[]),
        // The case's metadata `scale` (0.9), given as the flag.
        ("torch_scale_override.safetensors", &["--scale", "0.9"]),
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/torch")
            .join(file);
        let mut args = vec!["--heads", "3"];
        args.extend_from_slice(extra);
        let got = run_on_itself(&dir, &path, &args)
            .tensor_f32("out")
            .expect("out");
        let case = Case::from_file(&path).expect("case");
        let err = case.max_abs_err(got.data());
        assert!(
            err <= case.bound(),
            "{file}: {err:.3e} > {:.3e}",
            case.bound()
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `run --weights F --inputs F` on whole `nn.TransformerEncoder`/`Decoder` and
/// `nn.MultiheadAttention` state dicts (the attention found by the file's `prefix`), with the
/// inputs that reach the attention module in PyTorch's layout — sequence-first, batch-first,
/// unbatched — and the containers' masks; output and attention weights against float64 PyTorch.
#[test]
fn run_takes_pytorch_layouts_and_returns_attention_weights() {
    let dir = std::env::temp_dir().join(format!("wgpu-mha-torch-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let samples = fixtures("torch_run")
        .iter()
        .filter(|p| name(p).starts_with("module_inputs_"))
        .count();
    assert_eq!(
        samples, 64,
        "every module_inputs_torch_nn_MultiheadAttention sample"
    );
    for path in fixtures("torch_run") {
        let file = SafetensorsFile::open(&path).expect("fixture");
        let flags: serde_json::Value =
            serde_json::from_str(file.metadata("run_flags").expect("run_flags")).expect("json");
        let mut args = vec![];
        for (flag, arg) in [
            ("seq_first", "--seq-first"),
            ("probs", "--probs"),
            ("average", "--average"),
            ("add_zero_attn", "--add-zero-attn"),
        ] {
            if flags[flag] == true {
                args.push(arg);
            }
        }
        let got = run_on_itself(&dir, &path, &args);
        let err: f64 = file.metadata("err_f32_vs_f64").unwrap().parse().unwrap();
        for (tensor, want) in [("out", "out_f64"), ("attn_weights", "attn_weights_f64")] {
            let got = got.tensor_f32(tensor).expect("written");
            let (shape, want) = file.tensor_f64(want).expect("expected");
            assert_eq!(got.shape(), shape, "{} {tensor}", name(&path));
            let e = common::max_err(got.data(), &want);
            assert!(
                e <= (10.0 * err).max(1e-5),
                "{} {tensor}: {e:.3e}",
                name(&path)
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
