//! A user's files are sacred: `run --out` never writes over an input (by path, symlink or hard
//! link), checks its directory before any work, and replaces an existing output only whole;
//! every reader accepts only regular files and reads no more than their size allows.

mod common;

use common::cli;

use std::path::{Path, PathBuf};
use std::process::Command;

const CASE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/classic_b1_l4_d16_h2_none.safetensors"
);
const WEIGHTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/weights/mha_packed_e32_h4.safetensors"
);

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wgpu-mha-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn copy_of(src: &str, dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::copy(src, &path).expect("copy fixture");
    path
}

/// Files in `dir` other than those named (no temporaries left behind).
fn others(dir: &Path, names: &[&str]) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("readable")
        .map(|e| e.expect("entry").file_name().to_string_lossy().to_string())
        .filter(|n| !names.contains(&n.as_str()))
        .collect()
}

fn assert_refused(what: &str, (code, text): (i32, String), says: &str) {
    assert_ne!(code, 0, "{what}: must fail\n{text}");
    assert!(
        text.contains("error:") && text.contains(says),
        "{what}: {text}"
    );
    assert!(!text.contains("panicked"), "{what}: {text}");
}

#[test]
fn run_refuses_to_write_over_any_input() {
    let dir = scratch("over-input");
    let case = copy_of(CASE, &dir, "case.safetensors");
    let weights = copy_of(WEIGHTS, &dir, "weights.safetensors");
    let inputs = copy_of(CASE, &dir, "inputs.safetensors");
    let link = dir.join("link.safetensors");
    std::os::unix::fs::symlink(&case, &link).expect("symlink");
    let hard = dir.join("hard.safetensors");
    std::fs::hard_link(&inputs, &hard).expect("hard link");
    let before = std::fs::read(&case).unwrap();
    let c = case.to_str().unwrap();
    let (w, i) = (weights.to_str().unwrap(), inputs.to_str().unwrap());
    let attempts: [(&str, Vec<&str>); 5] = [
        ("--out the case", vec!["run", "--case", c, "--out", c]),
        (
            "--out a symlink to the case",
            vec!["run", "--case", c, "--out", link.to_str().unwrap()],
        ),
        (
            "--out the weights",
            vec!["run", "--weights", w, "--inputs", i, "--out", w],
        ),
        (
            "--out the inputs",
            vec!["run", "--weights", w, "--inputs", i, "--out", i],
        ),
        (
            "--out a hard link",
            vec![
                "run",
                "--weights",
                w,
                "--inputs",
                i,
                "--out",
                hard.to_str().unwrap(),
            ],
        ),
    ];
    for (what, args) in attempts {
        assert_refused(what, cli(&args), "would destroy it");
    }
    assert_eq!(
        std::fs::read(&case).unwrap(),
        before,
        "the case file changed"
    );
    assert_eq!(
        std::fs::read(&weights).unwrap(),
        std::fs::read(WEIGHTS).unwrap()
    );
    assert_eq!(std::fs::read(&inputs).unwrap(), before);
    let left = others(
        &dir,
        &[
            "case.safetensors",
            "weights.safetensors",
            "inputs.safetensors",
            "link.safetensors",
            "hard.safetensors",
        ],
    );
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn run_checks_the_output_directory_before_any_work() {
    let dir = scratch("out-dir");
    let missing = dir.join("no/such/dir/out.safetensors");
    let r = cli(&["run", "--case", CASE, "--out", missing.to_str().unwrap()]);
    assert_refused("a missing directory", r, "does not exist");
    // Not even root may create files in /proc.
    let r = cli(&[
        "run",
        "--case",
        CASE,
        "--out",
        "/proc/wgpu-mha-out.safetensors",
    ]);
    assert_refused("an unwritable directory", r, "cannot be written");
    let r = cli(&["run", "--case", CASE, "--out", dir.to_str().unwrap()]);
    assert_refused("a directory as the output", r, "is a directory");
}

#[test]
fn a_failed_run_leaves_an_existing_output_whole() {
    let dir = scratch("failed-run");
    let out = dir.join("out.safetensors");
    std::fs::write(&out, b"the user's previous result").unwrap();
    // Weights and inputs that do not fit each other: the run fails after the output was
    // prepared, and must leave it as it was, with no temporary file behind.
    let (code, text) = cli(&[
        "run",
        "--weights",
        WEIGHTS,
        "--inputs",
        CASE,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_ne!(code, 0, "{text}");
    assert_eq!(std::fs::read(&out).unwrap(), b"the user's previous result");
    assert!(others(&dir, &["out.safetensors"]).is_empty());
    // A successful run replaces it whole.
    let (code, text) = cli(&["run", "--case", CASE, "--out", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    let written = wgpu_mha::SafetensorsFile::open(&out).expect("a valid safetensors file");
    assert!(written.contains("out"));
    assert!(others(&dir, &["out.safetensors"]).is_empty());
}

#[test]
fn readers_refuse_what_is_not_a_regular_file() {
    let dir = scratch("not-regular");
    let fifo = dir.join("fifo.safetensors");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let cases = [
        ("/dev/zero", "not a regular file"),
        (fifo.to_str().unwrap(), "not a regular file"),
        (dir.to_str().unwrap(), "is a directory"),
    ];
    for (path, says) in cases {
        // Through the library and through both CLI readers: each returns at once.
        let err = wgpu_mha::SafetensorsFile::open(path)
            .expect_err(path)
            .to_string();
        assert!(err.contains(says), "{path}: {err}");
        let (code, text) = cli(&["check", path]);
        assert!(code != 0 && text.contains(says), "check {path}: {text}");
        let out = dir.join("out.safetensors");
        let r = cli(&["run", "--case", path, "--out", out.to_str().unwrap()]);
        assert_refused(&format!("run --case {path}"), r, says);
    }
}

#[test]
fn header_lengths_are_checked_before_the_data_is_read() {
    let dir = scratch("headers");
    let too_big = dir.join("huge_header.safetensors");
    let mut bytes = (1u64 << 40).to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(&too_big, &bytes).unwrap();
    let err = wgpu_mha::SafetensorsFile::open(&too_big)
        .expect_err("huge header")
        .to_string();
    assert!(
        err.contains("more than the 100000000 bytes accepted"),
        "{err}"
    );
    // A length within the limit but past the end of the file.
    let past_end = dir.join("past_end.safetensors");
    let mut bytes = 1000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(&past_end, &bytes).unwrap();
    let err = wgpu_mha::SafetensorsFile::open(&past_end)
        .expect_err("past end")
        .to_string();
    assert!(err.contains("but the file has 10 bytes"), "{err}");
    // The same rule for bytes already in memory.
    let err = wgpu_mha::SafetensorsFile::from_bytes("mem", bytes).expect_err("in memory");
    assert!(err.to_string().contains("the file has 10 bytes"), "{err}");
    // The largest header accepted still parses when it is real (a valid fixture opens).
    assert!(wgpu_mha::SafetensorsFile::open(CASE).is_ok());
}
