//! Converts an E5S1 file into a model package directory, for manual checks against real runtimes.
//!
//! `cargo run --release -p care-modelio --example import_e5s1 -- <e5-small-q4.bin> <out_dir> [--int8]`

use std::process::ExitCode;

use care_modelio::{ImportOptions, import_e5s1_with};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let int8 = args.iter().any(|a| a == "--int8");
    let paths: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let [bin, out] = paths.as_slice() else {
        eprintln!("usage: import_e5s1 <e5-small-q4.bin> <out_dir> [--int8]");
        return ExitCode::from(2);
    };
    let started = std::time::Instant::now();
    match import_e5s1_with(bin, out, ImportOptions { int8_onnx: int8 }) {
        Ok(report) => {
            println!("{report:#?}");
            println!("took {:.1}s", started.elapsed().as_secs_f64());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("import failed: {e}");
            ExitCode::FAILURE
        }
    }
}
