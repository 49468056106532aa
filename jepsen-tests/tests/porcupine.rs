//! The in-repo register linearizability checker against Porcupine (Go, from the module
//! proxy, `jepsen-tests/porcupine/`), on a few hundred small random histories: reads,
//! writes and compare-and-sets of four processes, some indeterminate, some with a read
//! corrupted to a value it could not have seen. Both must give the same verdict on every
//! history, and both verdicts must occur.

use std::path::PathBuf;
use std::process::Command;

use geostate_jepsen::history::parse;
use geostate_jepsen::register;
use geostate_proto::workload::Rng;

const HISTORIES: u64 = 400;

/// One operation as generated: who, what, when, and how it ended.
struct Op {
    process: u64,
    f: &'static str,
    value: Option<i64>,
    expected: Option<i64>,
    invoke: u64,
    end: u64,
    /// `ok`, `fail`, `info`.
    kind: &'static str,
}

/// A history of one register that really happened (each operation takes effect at a
/// random point of its interval; an indeterminate one half the time), then maybe one read
/// corrupted.
fn history(rng: &mut Rng) -> String {
    let mut ops: Vec<Op> = Vec::new();
    let mut clock = 0;
    let mut free_at = [0u64; 4];
    let n = 8 + rng.below(16);
    for i in 0..n {
        let process = rng.below(4);
        clock += 1 + rng.below(4);
        let invoke = clock.max(free_at[process as usize]) + 1;
        let end = invoke + 1 + rng.below(12);
        free_at[process as usize] = end + 1;
        let (f, value) = match rng.below(3) {
            0 => ("read", None),
            1 => ("write", Some(i as i64 + 1)),
            _ => ("cas", Some(i as i64 + 1)),
        };
        ops.push(Op {
            process,
            f,
            value,
            expected: None,
            invoke,
            end,
            kind: "ok",
        });
    }
    // what really happened, in the order of each operation's point of effect
    let mut points: Vec<(u64, usize)> = ops
        .iter()
        .enumerate()
        .map(|(i, o)| (o.invoke * 16 + rng.below((o.end - o.invoke) * 16), i))
        .collect();
    points.sort_unstable();
    let mut state: Option<i64> = None;
    let mut written: Vec<i64> = Vec::new();
    for (_, i) in points {
        let op = &mut ops[i];
        let indeterminate = op.f != "read" && rng.below(8) == 0;
        let happened = !indeterminate || rng.below(2) == 0;
        match op.f {
            "read" => op.value = state,
            "write" => {
                if happened {
                    state = op.value;
                    written.extend(op.value);
                }
            }
            _ => {
                // expects the current value, or some older one (then it fails)
                let guess = if rng.below(3) > 0 || written.is_empty() {
                    state
                } else {
                    Some(written[rng.below(written.len() as u64) as usize])
                };
                let Some(expected) = guess else {
                    op.f = "write";
                    if happened {
                        state = op.value;
                        written.extend(op.value);
                    }
                    if indeterminate {
                        op.kind = "info";
                    }
                    continue;
                };
                op.expected = Some(expected);
                if state == Some(expected) {
                    if happened {
                        state = op.value;
                        written.extend(op.value);
                    }
                } else if !indeterminate {
                    op.kind = "fail";
                }
            }
        }
        if indeterminate {
            op.kind = "info";
        }
    }
    // a read that saw what it could not have
    if rng.below(2) == 0 {
        let reads: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].f == "read").collect();
        if let Some(&r) = reads.get(rng.below(reads.len().max(1) as u64) as usize) {
            ops[r].value = match rng.below(3) {
                0 => None,
                _ if !written.is_empty() => Some(written[rng.below(written.len() as u64) as usize]),
                _ => Some(999),
            };
        }
    }
    let mut lines: Vec<(u64, String)> = Vec::new();
    let value = |v: Option<i64>| v.map_or("null".to_string(), |v| v.to_string());
    for o in &ops {
        let expected = o
            .expected
            .map_or(String::new(), |e| format!(r#","expected":{e}"#));
        let invoked = if o.f == "read" { None } else { o.value };
        lines.push((o.invoke, format!(
            r#"{{"process":{},"type":"invoke","f":"{}","key":"surge/k","value":{}{expected},"region":"a","time_ns":{}}}"#,
            o.process, o.f, value(invoked), o.invoke
        )));
        lines.push((o.end, format!(
            r#"{{"process":{},"type":"{}","f":"{}","key":"surge/k","value":{}{expected},"region":"a","time_ns":{}}}"#,
            o.process, o.kind, o.f, value(o.value), o.end
        )));
    }
    lines.sort_by_key(|(t, _)| *t);
    lines.into_iter().map(|(_, l)| l + "\n").collect()
}

#[test]
fn the_register_checker_agrees_with_porcupine() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("porcupine-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // the folder cargo names when it runs the test, not the compiled-in one (a binary
    // built in another checkout sharing the target directory)
    let module = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("porcupine");
    let binary = dir.join("porcupine-check");
    let built = Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg(".")
        .current_dir(&module)
        .status()?;
    anyhow::ensure!(built.success(), "go build of {} failed", module.display());

    let mut rng = Rng(0x5eed);
    let mut ours = Vec::new();
    let mut files = Vec::new();
    for i in 0..HISTORIES {
        let text = history(&mut rng);
        let path = dir.join(format!("h{i}.jsonl"));
        std::fs::write(&path, &text)?;
        let events = parse(&text).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        ours.push(register::check(&events).is_empty());
        files.push(path);
    }
    let out = Command::new(&binary).args(&files).output()?;
    anyhow::ensure!(
        out.status.success(),
        "porcupine-check: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: Vec<bool> = String::from_utf8(out.stdout)?
        .lines()
        .map(|l| l.contains(r#""linearizable":true"#))
        .collect();
    assert_eq!(theirs.len(), files.len(), "one verdict per history");
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(
            a,
            b,
            "history {i} ({}): ours says linearizable = {a}, Porcupine {b}:\n{}",
            files[i].display(),
            std::fs::read_to_string(&files[i])?
        );
    }
    let linearizable = ours.iter().filter(|v| **v).count();
    println!(
        "{HISTORIES} histories: {linearizable} linearizable, {} not, same verdicts",
        ours.len() - linearizable
    );
    assert!(linearizable > 50 && ours.len() - linearizable > 50);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
