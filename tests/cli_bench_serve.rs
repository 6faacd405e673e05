//! `wgpu-mha bench --only serve` at small sizes (`--config serve:div=64`): every row of the
//! issue is there with its fields, finite and positive, and the read probe measured beside each
//! row bounds the K/V rate of every kernel the row times. Bad sizes are one clear error.
//! No speed is claimed here: the figures live in the bench's output (docs/benchmarks.md, "Serving").

mod common;

use common::cli;

fn positive(row: &serde_json::Value, field: &str) -> f64 {
    let v = row[field]
        .as_f64()
        .unwrap_or_else(|| panic!("`{field}` missing or not a number in {row}"));
    assert!(v.is_finite() && v > 0.0, "`{field}` = {v} in {row}");
    v
}

#[test]
fn serve_bench_writes_every_row_with_both_bounds() {
    let dir = std::env::temp_dir().join(format!("wgpu-mha-serve-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("serve.json");
    let (code, text) = cli(&[
        "bench",
        "--only",
        "serve",
        "--config",
        "serve:div=64",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let ran: Vec<&serde_json::Value> = rows.iter().filter(|r| r["skipped"].is_null()).collect();
    for (variant, field) in [
        ("mixed_decode", "skew_ratio"),
        ("uniform_decode", "skew_ratio"),
        ("paged_vs_contiguous", "paged_vs_contiguous"),
        ("mixed_step", "vs_flash"),
    ] {
        // f32 runs wherever the bench runs; f16 rows may be skipped (no SHADER_F16), with why.
        let f32_rows: Vec<_> = ran
            .iter()
            .filter(|r| r["variant"] == variant && r["dtype"] == "f32")
            .collect();
        assert!(!f32_rows.is_empty(), "no f32 `{variant}` row ran:\n{text}");
        for row in rows.iter().filter(|r| r["variant"] == variant) {
            if let Some(why) = row["skipped"].as_str() {
                assert!(row["dtype"] == "f16" && !why.is_empty(), "{row}");
                continue;
            }
            positive(row, field);
            let kv = positive(row, "kv_gbps");
            let probe = positive(row, "probe_gbps");
            positive(row, "step_ms");
            positive(row, "host_read_gbps");
            assert!(row["probe_shapes"]
                .as_object()
                .is_some_and(|s| s.len() >= 3));
            // The probe is a bound: no kernel timed beside it reads faster.
            assert!(
                probe >= kv,
                "the read probe does not bound `{variant}`: {row}"
            );
            if variant == "paged_vs_contiguous" {
                let contiguous = positive(row, "contiguous_kv_gbps");
                assert!(
                    probe >= contiguous,
                    "the probe does not bound the contiguous pass: {row}"
                );
            }
        }
    }
    // Two sizes, each over an NHD and an HND pool against the same contiguous run.
    let layouts: Vec<&str> = rows
        .iter()
        .filter(|r| r["variant"] == "paged_vs_contiguous")
        .map(|r| r["kv_layout"].as_str().unwrap_or("missing"))
        .collect();
    assert_eq!(layouts, ["NHD", "HND", "NHD", "HND"], "{text}");
    assert!(rows.iter().all(|r| r["kv_layout"].is_string()), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_bench_refuses_bad_sizes_clearly() {
    for args in [
        &["bench", "--only", "serve", "--config", "serve:div=3"][..],
        &["bench", "--only", "serve", "--config", "serve:div=0"],
        &["bench", "--only", "serve", "--config", "serve:x=1"],
        &[
            "bench",
            "--only",
            "serve",
            "--config",
            "decode:h=4,d=64,ctx=8",
        ],
        &["bench", "--only", "decode", "--config", "serve:div=4"],
    ] {
        let (code, text) = cli(args);
        assert_ne!(code, 0, "{args:?}: must fail\n{text}");
        assert!(
            text.lines().any(|l| l.starts_with("error:")) && !text.contains("panicked"),
            "{args:?}: one clear error\n{text}"
        );
    }
}
