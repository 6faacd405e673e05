//! The command-line tool's subcommands beyond `info` and the demo: case files, benchmarks, soak.

pub mod bench;
pub mod bench_compile;
pub mod bench_config;
pub mod bench_decode;
pub mod bench_sdpa;
pub mod bench_serve;
pub mod hf;
pub mod interop;
pub mod progress;
pub mod run_args;
pub mod soak;
pub mod torch_layout;
