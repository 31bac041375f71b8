//! The `registered` step of `cargo xtask test`: every top-level `tests/*.rs`
//! has a `[[test]]` entry in observer/Cargo.toml, and every entry's file
//! exists. The integration tests live in the workspace's tests/ folder, not
//! in the package's, so cargo does not find them by itself: a file that is
//! not registered is silently never built nor run.

use std::{
    collections::BTreeSet,
    path::{Component, Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use crate::util::workspace_root;

/// The package whose manifest registers the tests, relative to the workspace.
const PACKAGE: &str = "observer";
/// The folder of the integration tests, relative to the workspace.
const TESTS: &str = "tests";

/// A `[[test]]` entry: its name and its file, relative to the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub path: PathBuf,
}

/// Something the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// A file in tests/ that no entry names (relative to the workspace).
    Unregistered(PathBuf),
    /// An entry whose file does not exist.
    Missing(Entry),
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Unregistered(path) => {
                let stem = path.file_stem().unwrap_or_default().to_string_lossy();
                write!(
                    f,
                    "{} has no [[test]] entry in {PACKAGE}/Cargo.toml, so it never runs \
                     (add: [[test]] name = \"{stem}\" path = \"../{}\")",
                    path.display(),
                    path.display()
                )
            }
            Problem::Missing(entry) => write!(
                f,
                "[[test]] \"{}\" in {PACKAGE}/Cargo.toml points to {}, which does not exist",
                entry.name,
                entry.path.display()
            ),
        }
    }
}

/// Runs the check on the workspace.
pub fn check() -> Result<()> {
    let root = workspace_root();
    let manifest_path = root.join(PACKAGE).join("Cargo.toml");
    let manifest = std::fs::read_to_string(&manifest_path)
        .with_context(|| format!("reading {}", manifest_path.display()))?;
    let entries = entries(&manifest)?;
    let files = test_files(&root.join(TESTS))?;
    let problems = compare(&files, &entries, |path| root.join(path).is_file());
    if !problems.is_empty() {
        for problem in &problems {
            println!("registered: {problem}");
        }
        bail!(
            "{} problem(s) between {TESTS}/*.rs and the [[test]] entries of {PACKAGE}/Cargo.toml",
            problems.len()
        );
    }
    println!(
        "registered: all {} files of {TESTS}/*.rs have a [[test]] entry, and all {} entries a file",
        files.len(),
        entries.len()
    );
    Ok(())
}

/// The top-level `*.rs` files of `dir`, relative to the workspace
/// (`tests/x.rs`); folders (support/) are not tests.
fn test_files(dir: &Path) -> Result<BTreeSet<PathBuf>> {
    let mut files = BTreeSet::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        let name = PathBuf::from(entry.file_name());
        if entry.file_type()?.is_file() && name.extension().is_some_and(|e| e == "rs") {
            files.insert(Path::new(TESTS).join(name));
        }
    }
    Ok(files)
}

/// The `[[test]]` entries of the package manifest `text`, their paths made
/// relative to the workspace. An entry without `path` is cargo's default,
/// `tests/<name>.rs` in the package.
pub fn entries(text: &str) -> Result<Vec<Entry>> {
    let manifest: toml::Table = text.parse().context("parsing the manifest")?;
    let Some(tests) = manifest.get("test") else {
        return Ok(Vec::new());
    };
    let tests = tests
        .as_array()
        .context("`test` is not an array of tables")?;
    tests
        .iter()
        .map(|test| {
            let name = test
                .get("name")
                .and_then(|n| n.as_str())
                .context("a [[test]] entry has no name")?;
            let path = match test.get("path") {
                Some(path) => path
                    .as_str()
                    .with_context(|| format!("[[test]] \"{name}\": path is not a string"))?
                    .to_string(),
                None => format!("tests/{name}.rs"),
            };
            Ok(Entry {
                name: name.to_string(),
                path: normalize(&Path::new(PACKAGE).join(path)),
            })
        })
        .collect()
}

/// `path` with `.` and `..` resolved lexically (`observer/../tests/x.rs`
/// is `tests/x.rs`).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if out.file_name().is_some() {
                    out.pop();
                } else {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// The problems between `files` (the top-level `tests/*.rs`) and
/// `entries`; `exists` says whether an entry's file exists (asked only for
/// entries outside `files`). Unregistered files first, sorted by path; then
/// missing files, in manifest order.
pub fn compare(
    files: &BTreeSet<PathBuf>,
    entries: &[Entry],
    exists: impl Fn(&Path) -> bool,
) -> Vec<Problem> {
    let registered: BTreeSet<&PathBuf> = entries.iter().map(|e| &e.path).collect();
    let unregistered = files
        .iter()
        .filter(|file| !registered.contains(file))
        .map(|file| Problem::Unregistered(file.clone()));
    let missing = entries
        .iter()
        .filter(|entry| !files.contains(&entry.path) && !exists(&entry.path))
        .map(|entry| Problem::Missing(entry.clone()));
    unregistered.chain(missing).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> BTreeSet<PathBuf> {
        names.iter().map(PathBuf::from).collect()
    }

    fn entry(name: &str, path: &str) -> Entry {
        Entry {
            name: name.to_string(),
            path: PathBuf::from(path),
        }
    }

    const MANIFEST: &str = r#"
[package]
name = "observer"

[[bin]]
name = "observer"
path = "src/main.rs"

[[test]]
name = "drops"
path = "../tests/drops.rs"

[[bench]]
name = "ns_per_packet"
harness = false

[[test]]
name = "local"
"#;

    #[test]
    fn entries_are_read_relative_to_the_workspace() {
        assert_eq!(
            entries(MANIFEST).unwrap(),
            vec![
                entry("drops", "tests/drops.rs"),
                entry("local", "observer/tests/local.rs"),
            ]
        );
    }

    #[test]
    fn a_manifest_without_tests_has_no_entries() {
        assert_eq!(
            entries("[package]\nname = \"x\"\n").unwrap(),
            Vec::<Entry>::new()
        );
    }

    #[test]
    fn an_entry_without_a_name_is_an_error() {
        assert!(entries("[[test]]\npath = \"../tests/a.rs\"\n").is_err());
    }

    #[test]
    fn everything_registered_is_no_problem() {
        let entries = [entry("a", "tests/a.rs"), entry("b", "tests/b.rs")];
        let problems = compare(&files(&["tests/a.rs", "tests/b.rs"]), &entries, |_| false);
        assert_eq!(problems, Vec::new());
    }

    #[test]
    fn an_unregistered_file_is_named() {
        let entries = [entry("a", "tests/a.rs")];
        let problems = compare(&files(&["tests/a.rs", "tests/new.rs"]), &entries, |_| false);
        assert_eq!(
            problems,
            vec![Problem::Unregistered(PathBuf::from("tests/new.rs"))]
        );
        let text = problems[0].to_string();
        assert!(
            text.starts_with("tests/new.rs has no [[test]] entry"),
            "{text}"
        );
        assert!(text.contains("path = \"../tests/new.rs\""), "{text}");
    }

    #[test]
    fn an_entry_without_its_file_is_named() {
        let entries = [entry("a", "tests/a.rs"), entry("gone", "tests/gone.rs")];
        let problems = compare(&files(&["tests/a.rs"]), &entries, |_| false);
        assert_eq!(
            problems,
            vec![Problem::Missing(entry("gone", "tests/gone.rs"))]
        );
        assert!(problems[0].to_string().contains("\"gone\""));
    }

    #[test]
    fn an_entry_outside_tests_counts_when_its_file_exists() {
        let entries = [
            entry("a", "tests/a.rs"),
            entry("local", "observer/tests/local.rs"),
        ];
        let exists = |p: &Path| p == Path::new("observer/tests/local.rs");
        assert_eq!(compare(&files(&["tests/a.rs"]), &entries, exists), vec![]);
        assert_eq!(
            compare(&files(&["tests/a.rs"]), &entries, |_| false),
            vec![Problem::Missing(entry("local", "observer/tests/local.rs"))]
        );
    }

    #[test]
    fn both_kinds_at_once_unregistered_first() {
        let entries = [entry("old", "tests/old.rs")];
        assert_eq!(
            compare(&files(&["tests/new.rs"]), &entries, |_| false),
            vec![
                Problem::Unregistered(PathBuf::from("tests/new.rs")),
                Problem::Missing(entry("old", "tests/old.rs")),
            ]
        );
    }

    #[test]
    fn paths_are_normalized() {
        assert_eq!(
            normalize(Path::new("observer/../tests/./x.rs")),
            PathBuf::from("tests/x.rs")
        );
        assert_eq!(
            normalize(Path::new("observer/../../../x.rs")),
            PathBuf::from("../../x.rs")
        );
    }
}
