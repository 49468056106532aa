//! `docs/configuration.md` documents every field the node's configuration takes. The
//! fields come from the parser itself: a table holding only an unknown key is refused
//! with the list of the fields it takes (`deny_unknown_fields`), so the test walks the
//! whole tree by asking, and fails naming each field the reference does not mention.

use geostate::config::{Config, WitnessConfig};

const PROBE: &str = "__probe__";

/// One step of a path: a table, or an array of tables (`[[namespace]]`).
#[derive(Clone)]
struct Step {
    name: String,
    array: bool,
}

/// A file that sets `PROBE` in the table at `path` (nothing else).
fn probe_file(path: &[Step]) -> String {
    let mut text = String::new();
    for i in 1..=path.len() {
        let dotted: Vec<&str> = path[..i].iter().map(|s| s.name.as_str()).collect();
        let dotted = dotted.join(".");
        if path[i - 1].array {
            text.push_str(&format!("[[{dotted}]]\n"));
        } else {
            text.push_str(&format!("[{dotted}]\n"));
        }
    }
    text.push_str(&format!("{PROBE} = 1\n"));
    text
}

/// The fields named in "unknown field `__probe__`, expected one of `a`, `b`" (or
/// "expected `a`"); `None` when the error is not about the probe (the path is a value).
fn fields_in(error: &str) -> Option<Vec<String>> {
    let rest = error.split_once(&format!("unknown field `{PROBE}`"))?.1;
    let line = rest.lines().next().unwrap_or_default();
    Some(
        line.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect(),
    )
}

/// Every leaf field under `path`, dotted.
fn walk(parse: &dyn Fn(&str) -> Result<(), String>, path: &mut Vec<Step>, out: &mut Vec<String>) {
    let Err(error) = parse(&probe_file(path)) else {
        panic!("a probe was accepted at {}", dotted(path));
    };
    if error.contains("expected a sequence") && !path.last().is_some_and(|s| s.array) {
        path.last_mut().expect("a path").array = true;
        walk(parse, path, out);
        path.last_mut().expect("a path").array = false;
        return;
    }
    match fields_in(&error) {
        Some(fields) => {
            for field in fields {
                path.push(Step {
                    name: field,
                    array: false,
                });
                walk(parse, path, out);
                path.pop();
            }
        }
        None => out.push(dotted(path)),
    }
}

fn dotted(path: &[Step]) -> String {
    path.iter()
        .map(|s| s.name.as_str())
        .collect::<Vec<_>>()
        .join(".")
}

/// Whether the reference names `field`: as `a.b.c`, `[a.b]`/`[[a.b]]`, or its last part in
/// backquotes on a line that also names its parent (`a.b.c`, `` `d` `` rows).
fn documented(reference: &str, field: &str) -> bool {
    let quoted = |s: &str| format!("`{s}`");
    if reference.contains(&quoted(field))
        || reference.contains(&quoted(&format!("[{field}]")))
        || reference.contains(&quoted(&format!("[[{field}]]")))
    {
        return true;
    }
    let Some((parent, last)) = field.rsplit_once('.') else {
        return false;
    };
    reference.lines().any(|line| {
        line.contains(&quoted(last))
            && (line.contains(&format!("`{parent}."))
                || line.contains(&quoted(&format!("[{parent}]")))
                || line.contains(&quoted(&format!("[[{parent}]]"))))
    })
}

fn undocumented(parse: &dyn Fn(&str) -> Result<(), String>) -> (Vec<String>, Vec<String>) {
    let reference = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md"),
    )
    .expect("docs/configuration.md");
    let mut fields = Vec::new();
    walk(parse, &mut Vec::new(), &mut fields);
    let missing = fields
        .iter()
        .filter(|f| !documented(&reference, f))
        .cloned()
        .collect();
    (fields, missing)
}

#[test]
fn every_field_of_a_region_file_is_in_the_configuration_reference() {
    let (fields, missing) =
        undocumented(&|text| Config::parse(text).map(drop).map_err(|e| e.to_string()));
    println!("{} fields: {}", fields.len(), fields.join(" "));
    // the walk reaches the nested tables (a check that it reads the parser's lists)
    for deep in [
        "kafka.security.username",
        "namespace.window.size",
        "checkpoint.s3.bucket",
    ] {
        assert!(
            fields.iter().any(|f| f == deep),
            "no {deep} among {fields:?}"
        );
    }
    assert!(
        missing.is_empty(),
        "fields of a region file that docs/configuration.md does not name: {missing:?}"
    );
}

#[test]
fn every_field_of_the_witness_file_is_in_the_configuration_reference() {
    let dir = tempfile::tempdir().expect("a temporary dir");
    let file = dir.path().join("witness.toml");
    let (fields, missing) = undocumented(&|text| {
        std::fs::write(&file, text).map_err(|e| e.to_string())?;
        WitnessConfig::load(&file, &[])
            .map(drop)
            .map_err(|e| e.to_string())
    });
    println!("{} fields: {}", fields.len(), fields.join(" "));
    assert!(
        missing.is_empty(),
        "fields of the witness file that docs/configuration.md does not name: {missing:?}"
    );
}

#[test]
fn a_field_missing_from_the_reference_is_found() {
    let reference = "| `kafka.bootstrap` | — | … |\n| `tls.cert`, `key` | — | … |\n";
    assert!(documented(reference, "kafka.bootstrap"));
    assert!(documented(reference, "tls.key"));
    assert!(!documented(reference, "kafka.format"));
    assert!(!documented(reference, "api.key"));
}
