//! Writes the committed seed corpus to `fuzz/seeds/<target>/`, after checking that every
//! seed is what it claims (`ottla_fuzz::seeds::validate`). With `--check`, writes nothing
//! and fails if a committed seed differs, is missing, or is not generated any more.
//! Files named `regression-*` are inputs that once crashed a target; they are kept as
//! found and replayed with the rest.
//!
//! ```sh
//! cargo run --manifest-path fuzz/Cargo.toml --example seeds            # after a schema change
//! cargo run --manifest-path fuzz/Cargo.toml --example seeds -- --check # what CI runs
//! ```

use std::collections::BTreeSet;
use std::path::Path;
use std::process::ExitCode;

use ottla_fuzz::seeds::{TARGETS, all, validate};

fn main() -> ExitCode {
    let check = std::env::args().any(|a| a == "--check");
    validate();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let seeds = all();
    let mut stale = Vec::new();
    for seed in &seeds {
        let path = root.join(seed.target).join(&seed.name);
        if check {
            match std::fs::read(&path) {
                Ok(bytes) if bytes == seed.bytes => {}
                Ok(_) => stale.push(format!("{} differs", path.display())),
                Err(e) => stale.push(format!("{}: {e}", path.display())),
            }
        } else {
            std::fs::create_dir_all(path.parent().expect("a directory")).expect("mkdir");
            std::fs::write(&path, &seed.bytes).expect("write");
        }
    }
    let expected: BTreeSet<(String, String)> = seeds
        .iter()
        .map(|s| (s.target.to_string(), s.name.clone()))
        .collect();
    for target in TARGETS {
        let Ok(dir) = std::fs::read_dir(root.join(target)) else {
            continue;
        };
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // Crashes found by fuzzing, kept as they were found.
            if name.starts_with("regression-") {
                continue;
            }
            if !expected.contains(&(target.to_string(), name.clone())) {
                if check {
                    stale.push(format!("{} is not generated", entry.path().display()));
                } else {
                    std::fs::remove_file(entry.path()).expect("remove");
                }
            }
        }
    }
    let bytes: usize = seeds.iter().map(|s| s.bytes.len()).sum();
    if !stale.is_empty() {
        for s in &stale {
            eprintln!("{s}");
        }
        eprintln!("the seeds are stale: cargo run --manifest-path fuzz/Cargo.toml --example seeds");
        return ExitCode::FAILURE;
    }
    println!(
        "{} seeds, {bytes} bytes, {}",
        seeds.len(),
        if check { "up to date" } else { "written" }
    );
    ExitCode::SUCCESS
}
