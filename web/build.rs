//! Lists the case files the browser tests run (`OUT_DIR/cases.rs`): every one `wgpu-mha check`
//! runs natively (tests/fixtures, its torch/, torch_functional/ and hf/ folders), embedded in the
//! test module with `include_bytes!` — a browser has no file system to read them from.

use std::fmt::Write;
use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut files = Vec::new();
    for dir in ["", "torch", "torch_functional", "hf"] {
        let dir = root.join(dir);
        println!("cargo:rerun-if-changed={}", dir.display());
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "safetensors") {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut out = String::from("/// Every case file, by its path under tests/fixtures.\n");
    out += "pub static CASES: &[(&str, &[u8])] = &[\n";
    for path in &files {
        let name = path
            .strip_prefix(&root)
            .unwrap_or(path)
            .display()
            .to_string();
        let _ = writeln!(
            out,
            "    ({name:?}, include_bytes!({:?})),",
            path.display().to_string()
        );
    }
    out += "];\n";
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out_dir.join("cases.rs"), out).expect("OUT_DIR is writable");
}
