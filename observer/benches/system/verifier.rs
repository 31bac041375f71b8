//! How much of the verifier's 1,000,000-instruction budget each program
//! uses, on this kernel (loaded here, as `observer check` does) and on the
//! kernels of the VM matrix (from the last `cargo xtask vm-test`, whose
//! kernel suite records the same counts per kernel): `bench
//! verifier_PROGRAM[_KERNEL] N insns`.

use std::path::Path;

use super::{report, target_dir};

/// Reports the host's counts, then those `cargo xtask vm-test` left.
pub fn run() -> anyhow::Result<()> {
    let check = observer::cmd::check::check();
    for program in &check.programs {
        let value = match program.verified_insns {
            Some(n) => n.to_string(),
            None => format!("unavailable:{}", program.loaded),
        };
        report(&format!("verifier_{}", program.program), value, "insns");
    }
    let results = target_dir().join("vm").join("results");
    let Ok(kernels) = std::fs::read_dir(&results) else {
        eprintln!(
            "bench: no {} (run `cargo xtask vm-test` for the other kernels' counts)",
            results.display()
        );
        return Ok(());
    };
    let mut kernels: Vec<_> = kernels.flatten().map(|e| e.path()).collect();
    kernels.sort();
    for dir in kernels {
        let series = dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if series == "host" {
            continue;
        }
        for line in jsonl_lines(&dir) {
            let Ok(check) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let is_load = check["check"]
                .as_str()
                .is_some_and(|c| c.starts_with("load_"));
            if let (true, Some(program), Some(n)) = (
                is_load,
                check["detail"].as_str(),
                check["observer"].as_u64(),
            ) {
                report(&format!("verifier_{program}_{series}"), n, "insns");
            }
        }
    }
    Ok(())
}

/// Every line of the `.jsonl` files in `dir`.
fn jsonl_lines(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .flat_map(|text| text.lines().map(str::to_string).collect::<Vec<_>>())
        .collect()
}
