//! The shape of `src/`, held: the dependency order ARCHITECTURE.md states ("Dependency
//! order"), no import cycle between modules, no hand-written file over 1,000 lines and no
//! function over 100. Reads the source text only (no build of its own, no network): a
//! module's edges are the `crate::…` paths its non-test code names.
//!
//! A unit is a top-level module of `src/` (a folder or a file), or a submodule the order
//! names on its own (`lease::table`, a PURE core used below the rest of `lease`). A unit may
//! use the units of the lines above its own in the order, never one of its own line or
//! below.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Files that are test code though they are not named `tests.rs` (compiled under
/// `#[cfg(test)]` only): exempt from every rule here.
const TEST_ONLY: &[&str] = &["src/fuzz.rs", "src/lease/sim.rs"];
/// Files not written by hand, or holding data tables, exempt from the size rules. None
/// today: generated protobuf code lives in the `geostate-proto` crate.
const NOT_HAND_WRITTEN: &[&str] = &[];
const MAX_FILE_LINES: usize = 1_000;
const MAX_FUNCTION_LINES: usize = 100;

fn root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from)
}

/// A `src/` file as the rules see it: its path from the repository root and its lines,
/// without the inline `#[cfg(test)] mod … { … }` blocks.
struct Source {
    path: String,
    lines: Vec<String>,
}

fn sources() -> Vec<Source> {
    let mut files = Vec::new();
    walk(&root().join("src"), &mut files);
    files.sort();
    files
        .into_iter()
        .filter_map(|file| {
            let path = file
                .strip_prefix(root())
                .expect("under the root")
                .to_string_lossy()
                .replace('\\', "/");
            let test_file = file.file_name().is_some_and(|n| n == "tests.rs")
                || TEST_ONLY.contains(&path.as_str());
            (!test_file).then(|| Source {
                lines: without_test_modules(&std::fs::read_to_string(&file).expect("readable")),
                path,
            })
        })
        .collect()
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable").flatten() {
        let path = entry.path();
        if path.is_dir() {
            walk(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The lines of `text` without `#[cfg(test)]` modules written inline (rustfmt puts their
/// closing brace at the indent of `mod`).
fn without_test_modules(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut kept = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let opens_test_module = lines[i].trim() == "#[cfg(test)]"
            && lines.get(i + 1).is_some_and(|next| {
                let next = next.trim();
                next.starts_with("mod ") && next.ends_with('{')
            });
        if opens_test_module {
            let at = indent(lines[i + 1]);
            let mut j = i + 2;
            while j < lines.len() && !(indent(lines[j]) == at && lines[j].trim() == "}") {
                j += 1;
            }
            i = j + 1;
            continue;
        }
        kept.push(lines[i].to_string());
        i += 1;
    }
    kept
}

/// The order ARCHITECTURE.md states: the lines of the fenced block under "## Dependency
/// order", lowest first, each line's units separated by spaces (text after `#` is a note).
fn stated_order() -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let section = doc
        .split("\n## Dependency order")
        .nth(1)
        .expect("ARCHITECTURE.md has a section \"## Dependency order\"");
    let block = section
        .split("```")
        .nth(1)
        .expect("the section holds a fenced block");
    block
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default())
        .map(|line| {
            line.split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|units| !units.is_empty())
        .collect()
}

/// The unit a module path (`lease::table::shard_of`, `store`) falls in: the longest unit
/// of `units` it starts with.
fn unit_of<'a>(path: &str, units: &'a BTreeSet<String>) -> Option<&'a String> {
    units
        .iter()
        .filter(|unit| path == unit.as_str() || path.starts_with(&format!("{unit}::")))
        .max_by_key(|unit| unit.len())
}

/// The module path of a `src/` file: `src/lease/table.rs` → `lease::table`.
fn module_of(path: &str) -> String {
    let inner = path.trim_start_matches("src/").trim_end_matches(".rs");
    inner.trim_end_matches("/mod").replace('/', "::")
}

/// Every module path named after `crate::` in `line`, with `crate::{a, b::c}` groups
/// (nested too) expanded.
fn crate_paths(line: &str) -> Vec<String> {
    paths_after(line, "crate::", "")
}

/// Every module path `line` names after `super::` (repeated), resolved from `module`, the
/// module path of the file the line is in.
fn super_paths(line: &str, module: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("super::") {
        let starts = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
        let mut tail = &rest[at..];
        let mut up = 0;
        while let Some(next) = tail.strip_prefix("super::") {
            tail = next;
            up += 1;
        }
        if starts {
            let segments: Vec<&str> = module.split("::").collect();
            let base = segments[..segments.len().saturating_sub(up)].join("::");
            let prefix = if base.is_empty() {
                String::new()
            } else {
                format!("{base}::")
            };
            let end = tail.find(';').unwrap_or(tail.len());
            paths.extend(paths_after(&format!("@{}", &tail[..end]), "@", &prefix));
        }
        rest = tail;
    }
    paths
}

/// The paths after each `marker` in `line`, each under `prefix`.
fn paths_after(line: &str, marker: &str, prefix: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find(marker) {
        let tail = &rest[at + marker.len()..];
        if let Some(group) = tail.strip_prefix('{') {
            expand(group, prefix, &mut paths);
        } else {
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            let (path, after) = tail.split_at(end);
            match after.strip_prefix('{') {
                // `a::b::{c, d}`
                Some(group) if path.ends_with("::") => {
                    expand(group, &format!("{prefix}{path}"), &mut paths);
                }
                _ => paths.push(format!("{prefix}{path}").trim_end_matches(':').to_string()),
            }
        }
        rest = tail;
    }
    paths
}

/// Expands the inside of a `{…}` group (after its opening brace) under `prefix`.
fn expand(group: &str, prefix: &str, paths: &mut Vec<String>) {
    let mut depth = 0;
    let mut item = String::new();
    let mut items = Vec::new();
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut item));
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    items.push(item);
    for item in items {
        let item = item.trim();
        if let Some((head, inner)) = item.split_once("::{") {
            expand(inner, &format!("{prefix}{head}::"), paths);
        } else if !item.is_empty() {
            let name = item.split(" as ").next().unwrap_or(item).trim();
            paths.push(format!("{prefix}{name}"));
        }
    }
}

/// A `use` spread over several lines is joined, so that a group is read whole.
fn statements(lines: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut open = String::new();
    for line in lines {
        let code = line.trim();
        if code.starts_with("//") {
            continue;
        }
        if !open.is_empty() {
            open.push_str(code);
            if code.ends_with(';') {
                out.push(std::mem::take(&mut open));
            }
        } else if (code.starts_with("use ")
            || code.starts_with("pub use ")
            || code.starts_with("pub(crate) use "))
            && !code.ends_with(';')
        {
            open = code.to_string();
        } else {
            out.push(code.to_string());
        }
    }
    out
}

/// Per unit, the units its code names, each with the first file that does.
fn edges(units: &BTreeSet<String>) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for source in sources() {
        let module = module_of(&source.path);
        let Some(from) = unit_of(&module, units).cloned() else {
            continue; // main.rs, bin/: above every unit
        };
        for statement in statements(&source.lines) {
            let mut paths = crate_paths(&statement);
            paths.extend(super_paths(&statement, &module));
            for path in paths {
                if let Some(to) = unit_of(&path, units)
                    && *to != from
                {
                    let uses = edges.entry(from.clone()).or_default();
                    uses.entry(to.clone())
                        .or_insert_with(|| source.path.clone());
                }
            }
        }
    }
    edges
}

#[test]
fn every_module_uses_only_modules_below_it_in_the_stated_order() {
    let order = stated_order();
    let layer: BTreeMap<String, usize> = (order.iter().enumerate())
        .flat_map(|(at, units)| units.iter().map(move |u| (u.clone(), at)))
        .collect();
    let units: BTreeSet<String> = layer.keys().cloned().collect();
    let top_level: BTreeSet<String> = std::fs::read_dir(root().join("src"))
        .expect("src/")
        .flatten()
        .map(|e| {
            e.file_name()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .filter(|name| !["lib", "main", "bin"].contains(&name.as_str()))
        .filter(|name| !TEST_ONLY.contains(&format!("src/{name}.rs").as_str()))
        .collect();
    let unplaced: Vec<_> = top_level.difference(&units).collect();
    assert!(
        unplaced.is_empty(),
        "modules of src/ missing from ARCHITECTURE.md's dependency order: {unplaced:?}"
    );
    let mut against = Vec::new();
    for (from, uses) in edges(&units) {
        for (to, file) in uses {
            if layer[&to] >= layer[&from] {
                against.push(format!("{from} → {to} ({file})"));
            }
        }
    }
    assert!(
        against.is_empty(),
        "edges against ARCHITECTURE.md's dependency order (a module may use only modules on the lines above its own):\n  {}",
        against.join("\n  ")
    );
}

#[test]
fn no_import_cycle_between_modules() {
    let units: BTreeSet<String> = stated_order().into_iter().flatten().collect();
    let edges = edges(&units);
    // a unit is in a cycle when it reaches itself
    let mut cycles = BTreeSet::new();
    for start in &units {
        let mut seen = BTreeSet::new();
        let mut frontier = vec![start.clone()];
        while let Some(unit) = frontier.pop() {
            for next in edges.get(&unit).into_iter().flat_map(BTreeMap::keys) {
                if next == start {
                    cycles.insert(start.clone());
                }
                if seen.insert(next.clone()) {
                    frontier.push(next.clone());
                }
            }
        }
    }
    assert!(cycles.is_empty(), "modules in an import cycle: {cycles:?}");
}

#[test]
fn no_hand_written_file_over_1000_lines() {
    let long: Vec<String> = sources()
        .into_iter()
        .filter(|s| !NOT_HAND_WRITTEN.contains(&s.path.as_str()))
        .filter(|s| s.lines.len() > MAX_FILE_LINES)
        .map(|s| format!("{} ({} lines)", s.path, s.lines.len()))
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines, tests left out (split along what they do): {long:?}"
    );
}

#[test]
fn no_function_over_100_lines() {
    let mut long = Vec::new();
    for source in sources() {
        if NOT_HAND_WRITTEN.contains(&source.path.as_str()) {
            continue;
        }
        for (name, at, lines) in functions(&source.lines) {
            if lines > MAX_FUNCTION_LINES {
                long.push(format!("{}:{at} {name} ({lines} lines)", source.path));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines, tests left out: {long:?}"
    );
}

/// Every function with a body in `lines`: name, first line (1-based), length in lines from
/// `fn` to its closing brace (which rustfmt puts at the indent of `fn`).
fn functions(lines: &[String]) -> Vec<(String, usize, usize)> {
    let mut found = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let Some(name) = fn_name(code) else {
            continue;
        };
        if code.ends_with(';') || (code.contains('{') && code.ends_with('}')) {
            continue; // a declaration, or a body on one line
        }
        let end = (at + 1..lines.len())
            .find(|&j| indent(&lines[j]) == indent(line) && lines[j].trim_start().starts_with('}'))
            .unwrap_or(lines.len() - 1);
        found.push((name, at + 1, end - at + 1));
    }
    found
}

/// The name of the function `code` declares, if it declares one.
fn fn_name(code: &str) -> Option<String> {
    let mut words = code.split_whitespace().peekable();
    while let Some(&word) = words.peek() {
        let qualifier = word.starts_with("pub")
            || ["async", "const", "unsafe", "extern", "\"C\""].contains(&word);
        if !qualifier {
            break;
        }
        words.next();
    }
    (words.next()? == "fn").then_some(())?;
    let rest = words.next()?;
    let end = rest.find(['(', '<']).unwrap_or(rest.len());
    Some(rest[..end].to_string())
}

#[test]
fn the_reader_of_paths_sees_groups_and_nesting() {
    assert_eq!(
        crate_paths("use crate::store::Store;"),
        vec!["store::Store"]
    );
    assert_eq!(
        crate_paths("use crate::{pb, lease::{table::ShardId, leases}, log as l};"),
        vec!["pb", "lease::table::ShardId", "lease::leases", "log"]
    );
    assert_eq!(
        crate_paths("let x = crate::window::late_key(p, o) + crate::m::X;"),
        vec!["window::late_key", "m::X"]
    );
    assert_eq!(
        super_paths("use super::event::{Op, Rejection};", "ingest::batch"),
        vec!["ingest::event::Op", "ingest::event::Rejection"]
    );
    assert_eq!(
        super_paths(
            "use super::super::store::Store;",
            "replication::merger::tests"
        ),
        vec!["replication::store::Store"]
    );
    assert_eq!(super_paths("use super::*;", "lease::table"), vec!["lease"]);
    let units: BTreeSet<String> = ["lease", "lease::table", "store"].map(String::from).into();
    assert_eq!(
        unit_of("lease::table::ShardId", &units).unwrap(),
        "lease::table"
    );
    assert_eq!(unit_of("lease::leases", &units).unwrap(), "lease");
    assert_eq!(unit_of("leases", &units), None);
    assert_eq!(module_of("src/lease/table.rs"), "lease::table");
    assert_eq!(module_of("src/api/mod.rs"), "api");
    let body: Vec<String> = ["pub async fn f(", ") {", "    x", "}", "fn g() { 1 }"]
        .map(String::from)
        .into();
    assert_eq!(functions(&body), vec![("f".to_string(), 1, 4)]);
}
