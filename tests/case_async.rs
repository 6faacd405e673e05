//! `Case::run_async` (the form a browser runs: device tensors in, `read_async` out) gives what
//! `Case::run` gives, on every case file `wgpu-mha check` runs: the browser tests (web/) hold the
//! async path to the files' f64 answers, and this holds it to the blocking path natively.

use wgpu_mha::{Case, ForwardOptions, Gpu};

#[test]
fn the_async_run_of_every_case_file_equals_the_blocking_run() {
    let gpu = Gpu::new().expect("an adapter");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut files: Vec<_> = ["", "torch", "torch_functional", "hf"]
        .iter()
        .flat_map(|dir| std::fs::read_dir(root.join(dir)).expect("fixture folder"))
        .map(|e| e.expect("fixture entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    assert!(files.len() >= 100, "{} case files", files.len());
    let options = ForwardOptions::default();
    for path in &files {
        let case = Case::from_file(path).expect("a case file");
        let blocking = case.run(&gpu, &options).expect("the blocking run");
        let not_blocking =
            pollster::block_on(case.run_async(&gpu, &options)).expect("the async run");
        // Equal to the bit, NaN where a case expects NaN (a row PyTorch leaves with no key).
        let same = |a: &f32, b: &f32| a == b || (a.is_nan() && b.is_nan());
        let (a, b) = (
            blocking.forward.output.data(),
            not_blocking.forward.output.data(),
        );
        assert!(
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y)),
            "{}: the async run differs",
            path.display()
        );
        assert_eq!(blocking.forward.path, not_blocking.forward.path);
        assert!(
            not_blocking.passed(),
            "{}: {:.3e}",
            path.display(),
            not_blocking.max_abs_err
        );
    }
}
