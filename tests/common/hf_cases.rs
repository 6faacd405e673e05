//! The transformers case files of `tests/fixtures/hf`, each also a one-file checkpoint (its
//! `hf_config` metadata is the config): the module a file holds, the CLI over a file, and
//! which families a set of cases covers.

use std::path::{Path, PathBuf};

use wgpu_mha::io::hf::{HfAttention, HfCheckpoint};
use wgpu_mha::{Case, SafetensorsFile};

use super::cli;
use super::hf_dirs::TempDir;

/// `tests/fixtures/hf/<case>.safetensors`.
pub fn hf_case(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(format!("{case}.safetensors"))
}

/// A case file, and the module its `prefix` metadata names, loaded from the file itself.
pub fn case_module(path: &Path) -> (SafetensorsFile, HfAttention) {
    let file = SafetensorsFile::open(path).expect("case");
    let prefix = file.metadata("prefix").expect("prefix").to_string();
    let module = HfCheckpoint::open(path)
        .expect("checkpoint")
        .attention(&prefix, None)
        .expect("module");
    (file, module)
}

/// The `out` tensor `wgpu-mha run` wrote to `out` is within `case`'s bound of its `out_f64`.
pub fn assert_run_matches_case(out: &Path, case: &Path) {
    let got = SafetensorsFile::open(out)
        .and_then(|f| f.tensor_f32("out"))
        .expect("out");
    let case = Case::from_file(case).expect("case");
    let err = case.max_abs_err(got.data());
    assert!(err <= case.bound(), "{}: {err:.3e}", case.name);
}

/// `inspect` on `case` shows every phrase and `runs`; `run --hf` on the file matches its
/// `out_f64`.
pub fn inspect_and_run(case: &str, phrases: &[&str]) {
    let dir = TempDir::new(&format!("run-{case}"));
    let path = hf_case(case);
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
    let out = dir.path().join(format!("{case}.out.safetensors"));
    let p = path.to_str().unwrap();
    let args = [
        "run", "--hf", p, "--prefix", &prefix, "--inputs", p, "--out",
    ];
    let (code, text) = cli(&[&args[..], &[out.to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{case}: {text}");
    assert_run_matches_case(&out, &path);
}

/// Every family has a name in `names` that starts with it (`what`: what was done with them).
pub fn assert_every_family_in(names: &[String], families: &[&str], what: &str) {
    for family in families {
        assert!(
            names.iter().any(|n| n.starts_with(family)),
            "no case of {family} {what}: {names:?}"
        );
    }
}
