//! The `layers` step of `cargo xtask test`: the observer's modules import
//! each other only downwards (ARCHITECTURE.md), and no two files import
//! each other, directly or through others.
//!
//! Layers are the top folders of each crate's src: in observer-core,
//! `model` (pure) imports no other layer, `report` only `model`, `capture`
//! nothing; in observer, `node` only `model`; `bpf` `model` and `node`;
//! `cli` everything but `cmd`; `process` `model` and `node`; `monitor`
//! everything but `cmd`; `store` `model` and `parse`; `lab` only `cli`, `node` and `process` (it runs
//! the observer as a user would); `cmd` everything, but no command another
//! (`cmd::diagnose` may not import `cmd::attach`). `main.rs` is the binary
//! and may use anything. That observer-core imports nothing of observer's
//! layers, Cargo enforces: it is a crate below them.
//!
//! Written by hand over the source text rather than with a Rust parser:
//! the project's imports are `use crate::...`, `super::...` and paths in
//! code, which a small tokenizer finds; test modules (`#[cfg(test)]`) are
//! left out, as they may build fixtures from any layer.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use crate::util::workspace_root;

/// Which layers each layer may import.
const ALLOWED: [(&str, &[&str]); 12] = [
    ("capture", &[]),
    ("model", &[]),
    ("parse", &["model"]),
    ("report", &["model"]),
    ("node", &["model", "parse"]),
    ("bpf", &["model", "node"]),
    ("cli", &["model", "report", "bpf", "node"]),
    ("process", &["model", "node"]),
    // The client of the metrics store (`observer cluster`).
    ("store", &["model", "parse"]),
    (
        "monitor",
        &[
            "model", "parse", "report", "bpf", "node", "cli", "process", "capture",
        ],
    ),
    // The lab drives the observer as a user would: this binary, read
    // through its JSON; nothing of the engine or the kernel side. What it
    // prints, `report::lab` renders.
    ("lab", &["report", "cli", "node", "process"]),
    (
        "cmd",
        &[
            "model", "report", "bpf", "node", "cli", "process", "monitor", "lab", "store",
        ],
    ),
];

/// The crates' source folders the check reads.
const SOURCES: [&str; 2] = ["observer-core/src", "observer/src"];

/// Runs the check on every folder of [`SOURCES`].
pub fn check() -> Result<()> {
    for src in SOURCES {
        check_source(src)?;
    }
    Ok(())
}

fn check_source(dir: &str) -> Result<()> {
    let src = workspace_root().join(dir);
    let modules = read_modules(&src)?;
    let edges = edges(&modules);
    let mut problems = layer_violations(&edges);
    problems.extend(cycles(&edges).into_iter().map(|members| {
        let inside = |from: &String| {
            edges[from]
                .iter()
                .filter(|to| members.contains(to))
                .map(|to| format!("{from} -> {to}"))
                .collect::<Vec<_>>()
        };
        format!(
            "import cycle among {}: {}",
            members.join(", "),
            members
                .iter()
                .flat_map(inside)
                .collect::<Vec<_>>()
                .join("; ")
        )
    }));
    if !problems.is_empty() {
        for problem in &problems {
            println!("layers: {problem}");
        }
        bail!("{} layering problem(s) in {dir}", problems.len());
    }
    println!(
        "layers: {dir}: {} modules, {} imports between them, all downwards, no cycles",
        modules.len(),
        edges.values().map(BTreeSet::len).sum::<usize>()
    );
    Ok(())
}

/// A module's path (`cmd::lab::report`; `""` is the crate root) and its
/// source with comments, strings and test modules removed.
type Modules = BTreeMap<String, String>;

fn read_modules(src: &Path) -> Result<Modules> {
    let mut modules = Modules::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let Some(name) = module_path(src, &path) else {
                    continue;
                };
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                modules.insert(name, without_tests(&strip(&text)));
            }
        }
    }
    Ok(modules)
}

/// `bpf/mod.rs` -> `bpf`, `cmd/lab/report.rs` -> `cmd::lab::report`,
/// `lib.rs` -> ``; `None` for `main.rs` (the binary, a crate of its own).
fn module_path(src: &Path, file: &Path) -> Option<String> {
    let rel: PathBuf = file.strip_prefix(src).ok()?.with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    match parts.last().map(String::as_str) {
        Some("main") if parts.len() == 1 => return None,
        Some("lib") if parts.len() == 1 => parts.clear(),
        Some("mod") => {
            parts.pop();
        }
        _ => {}
    }
    Some(parts.join("::"))
}

/// The source without comments and the contents of string and char
/// literals, so words in them are not taken for paths.
fn strip(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1).copied()) {
            (b'/', Some(b'/')) => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            (b'/', Some(b'*')) => {
                let mut depth = 0;
                while i < bytes.len() {
                    if bytes[i..].starts_with(b"/*") {
                        depth += 1;
                        i += 2;
                    } else if bytes[i..].starts_with(b"*/") {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            (b'r', Some(b'#' | b'"')) if !ident_byte(i.checked_sub(1).map(|p| bytes[p])) => {
                // Raw string r"..." or r#"..."#.
                let hashes = bytes[i + 1..].iter().take_while(|&&b| b == b'#').count();
                let start = i + 1 + hashes;
                if bytes.get(start) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                i = start + 1;
                while i < bytes.len() && !bytes[i..].starts_with(&close) {
                    i += 1;
                }
                i += close.len();
                out.push_str("\"\"");
            }
            (b'"', _) => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            (b'\'', _) => {
                // A char literal ('a', '\n', '\u{..}') or a lifetime ('a).
                let end = bytes[i + 1..]
                    .iter()
                    .take(12)
                    .position(|&b| b == b'\'')
                    .map(|p| i + 1 + p);
                match end {
                    Some(end) if bytes[i + 1] == b'\\' || end == i + 2 || end <= i + 5 => {
                        i = end + 1;
                        out.push_str("' '");
                    }
                    _ => {
                        out.push('\'');
                        i += 1;
                    }
                }
            }
            _ => {
                let len = utf8_len(bytes[i]);
                out.push_str(&text[i..i + len]);
                i += len;
            }
        }
    }
    out
}

fn utf8_len(first: u8) -> usize {
    match first {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    }
}

fn ident_byte(byte: Option<u8>) -> bool {
    byte.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The source without `#[cfg(test)]` items (the attribute and the item it
/// guards, up to its closing brace or semicolon).
fn without_tests(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let mut depth = 0usize;
        let mut end = item.len();
        for (i, c) in item.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// Imports between modules: module -> modules it names (their longest
/// existing prefix), itself excluded.
fn edges(modules: &Modules) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges = BTreeMap::new();
    for (module, text) in modules {
        let mut targets = BTreeSet::new();
        for path in paths(text) {
            if let Some(target) = resolve(modules, module, &path)
                && &target != module
            {
                targets.insert(target);
            }
        }
        edges.insert(module.clone(), targets);
    }
    edges
}

/// Every path the source names: `use` trees expanded (`use a::{b, c::d}`
/// gives `a::b` and `a::c::d`) and paths in code (`crate::x::y(...)`).
/// `mod x;` declarations are structure, not imports, and are not paths.
fn paths(text: &str) -> Vec<Vec<String>> {
    let tokens = tokenize(text);
    let mut paths = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == "use" {
            let mut j = i + 1;
            let mut found = Vec::new();
            expand_use(&tokens, &mut j, &[], &mut found);
            // `pub use` re-exports are a module's facade, not something it
            // depends on: a parent re-exporting a child that uses the
            // parent's types is no cycle.
            if !is_reexport(&tokens, i) {
                paths.extend(found);
            }
            i = j;
            continue;
        }
        if matches!(tokens[i].as_str(), "crate" | "super" | "self")
            && tokens.get(i + 1).is_some_and(|t| t == "::")
        {
            let mut path = vec![tokens[i].clone()];
            let mut j = i + 1;
            while tokens.get(j).is_some_and(|t| t == "::")
                && let Some(segment) = tokens.get(j + 1).filter(|t| is_ident(t))
            {
                path.push(segment.clone());
                j += 2;
            }
            paths.push(path);
            i = j;
            continue;
        }
        i += 1;
    }
    paths
}

/// Whether the `use` at `tokens[at]` is `pub use` or `pub(...) use`.
fn is_reexport(tokens: &[String], at: usize) -> bool {
    match at.checked_sub(1).map(|p| tokens[p].as_str()) {
        Some("pub") => true,
        Some(")") => tokens[..at]
            .iter()
            .rposition(|t| t == "(")
            .and_then(|open| open.checked_sub(1))
            .is_some_and(|p| tokens[p] == "pub"),
        _ => false,
    }
}

/// Expands the use tree starting at `tokens[*at]` under `prefix`.
fn expand_use(tokens: &[String], at: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    while let Some(token) = tokens.get(*at) {
        match token.as_str() {
            "::" => *at += 1,
            "{" => {
                *at += 1;
                loop {
                    expand_use(tokens, at, &path, out);
                    match tokens.get(*at).map(String::as_str) {
                        Some(",") => *at += 1,
                        Some("}") => {
                            *at += 1;
                            break;
                        }
                        _ => break,
                    }
                    if tokens.get(*at).is_some_and(|t| t == "}") {
                        *at += 1;
                        break;
                    }
                }
                return;
            }
            "as" => *at += 2,
            "," | "}" => break,
            ";" => {
                *at += 1;
                break;
            }
            t if is_ident(t) || t == "*" => {
                path.push(t.to_string());
                *at += 1;
            }
            _ => break,
        }
    }
    if path.len() > prefix.len() {
        out.push(path);
    }
}

fn is_ident(token: &str) -> bool {
    token
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
}

/// Identifiers, `::` and single punctuation characters.
fn tokenize(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if c.is_whitespace() {
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' {
            let mut end = start + c.len_utf8();
            while let Some(&(i, next)) = chars.peek() {
                if next.is_ascii_alphanumeric() || next == '_' {
                    end = i + next.len_utf8();
                    chars.next();
                } else {
                    break;
                }
            }
            tokens.push(text[start..end].to_string());
        } else if c == ':' && chars.peek().is_some_and(|&(_, n)| n == ':') {
            chars.next();
            tokens.push("::".to_string());
        } else {
            tokens.push(c.to_string());
        }
    }
    tokens
}

/// The module a path names from inside `module`: its longest prefix that
/// is a module of the crate. `None` for other crates' paths.
fn resolve(modules: &Modules, module: &str, path: &[String]) -> Option<String> {
    let mut base: Vec<&str> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").collect()
    };
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        // In edition 2021 a bare `use child::X` names a child module.
        Some(first) => {
            let child = join(&base, first);
            if !modules.contains_key(&child) {
                return None;
            }
        }
        None => return None,
    }
    let mut found = join_all(&base);
    let mut current = base.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    for segment in rest {
        current.push(segment.clone());
        let candidate = current.join("::");
        if modules.contains_key(&candidate) {
            found = candidate;
        } else {
            break;
        }
    }
    Some(found)
}

fn join(base: &[&str], name: &str) -> String {
    if base.is_empty() {
        name.to_string()
    } else {
        format!("{}::{name}", base.join("::"))
    }
}

fn join_all(base: &[&str]) -> String {
    base.join("::")
}

/// The layer of a module: the first segment of its path.
fn layer(module: &str) -> &str {
    module.split("::").next().unwrap_or("")
}

/// The command a module belongs to (`cmd::replay::kernel` -> `replay`).
fn command(module: &str) -> Option<&str> {
    let mut parts = module.split("::");
    (parts.next() == Some("cmd"))
        .then(|| parts.next())
        .flatten()
}

fn layer_violations(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.into_iter().collect();
    let mut problems = Vec::new();
    for (from, targets) in edges {
        let from_layer = layer(from);
        // The crate root only declares the layers.
        if from.is_empty() {
            continue;
        }
        let Some(may) = allowed.get(from_layer) else {
            problems.push(format!(
                "{from}: in no layer (add it to ALLOWED in xtask/src/layers.rs)"
            ));
            continue;
        };
        for to in targets {
            let to_layer = layer(to);
            if let (Some(a), Some(b)) = (command(from), command(to))
                && a != b
            {
                problems.push(format!(
                    "{from} imports {to}: no command imports another (shared work goes in monitor)"
                ));
            }
            if to_layer != from_layer && !to.is_empty() && !may.contains(&to_layer) {
                problems.push(format!(
                    "{from} imports {to}: layer {from_layer} may import only {}",
                    if may.is_empty() {
                        "itself".to_string()
                    } else {
                        may.join(", ")
                    }
                ));
            }
        }
    }
    problems
}

/// Groups of modules that import each other (strongly connected
/// components of more than one module), each as one cycle's members.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's algorithm, iterative only in spirit: the module graph is
    // small (tens of nodes), recursion depth is not a concern.
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(state: &mut State<'a>, node: &'a str) {
        state.index.insert(node, state.next);
        state.low.insert(node, state.next);
        state.next += 1;
        state.stack.push(node);
        state.on_stack.insert(node);
        if let Some(targets) = state.edges.get(node) {
            for target in targets {
                let target = target.as_str();
                if !state.edges.contains_key(target) {
                    continue;
                }
                if !state.index.contains_key(target) {
                    visit(state, target);
                    let low = state.low[node].min(state.low[target]);
                    state.low.insert(node, low);
                } else if state.on_stack.contains(target) {
                    let low = state.low[node].min(state.index[target]);
                    state.low.insert(node, low);
                }
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack.remove(member);
                component.push(member.to_string());
                if member == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                state.found.push(component);
            }
        }
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.found.sort();
    state.found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modules(entries: &[(&str, &str)]) -> Modules {
        entries
            .iter()
            .map(|(name, text)| (name.to_string(), without_tests(&strip(text))))
            .collect()
    }

    #[test]
    fn use_trees_and_code_paths_become_edges() {
        let m = modules(&[
            ("", "pub mod model; pub mod report;"),
            ("model", "pub mod rows;"),
            ("model::rows", "pub struct Row;"),
            (
                "report",
                "use crate::{model::{rows::{self, Row}}, report::table as t};\n\
                 // crate::cmd::x in a comment\n\
                 fn f() { let _ = \"crate::bpf\"; crate::model::rows::Row; }",
            ),
            (
                "report::table",
                "use super::*; pub use crate::model::rows; fn g() {}",
            ),
        ]);
        let e = edges(&m);
        assert_eq!(
            e["report"],
            BTreeSet::from(["model::rows".to_string(), "report::table".to_string()])
        );
        assert_eq!(e["report::table"], BTreeSet::from(["report".to_string()]));
        assert_eq!(
            cycles(&e),
            [vec!["report".to_string(), "report::table".to_string()]]
        );
    }

    #[test]
    fn downward_imports_pass_and_upward_ones_are_named() {
        let m = modules(&[
            ("model", "use crate::report::Line;"),
            ("report", "use crate::model::Row;"),
            ("cmd", "use crate::{bpf, model, node, report};"),
            ("bpf", ""),
            ("node", ""),
        ]);
        let problems = layer_violations(&edges(&m));
        assert_eq!(
            problems,
            ["model imports report: layer model may import only itself"]
        );
    }

    #[test]
    fn no_command_imports_another() {
        let m = modules(&[
            ("cmd", "pub mod attach; pub mod diagnose;"),
            ("cmd::attach", "use crate::monitor::Monitor;"),
            ("cmd::diagnose", "use crate::cmd::attach::run;"),
            ("cmd::replay", "use crate::cmd::replay::kernel::X;"),
            ("cmd::replay::kernel", ""),
            ("monitor", ""),
        ]);
        assert_eq!(
            layer_violations(&edges(&m)),
            [
                "cmd::diagnose imports cmd::attach: no command imports another \
                 (shared work goes in monitor)"
            ]
        );
    }

    #[test]
    fn test_modules_and_literals_are_not_imports() {
        let m = modules(&[
            (
                "model",
                "fn f() { let c = '{'; }\n#[cfg(test)]\nmod tests { use crate::cmd; }",
            ),
            ("cmd", ""),
        ]);
        assert!(edges(&m)["model"].is_empty());
    }
}
