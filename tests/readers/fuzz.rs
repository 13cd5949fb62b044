//! The short fuzz run of CI: `scripts/fuzz --seconds 8` builds the AFL targets (fuzz/, its own
//! target dir) and runs each for 8 seconds from its committed corpus; any crash or hang over
//! 1 s fails. Without cargo-afl the script says "skipped: ..." and this test says so too, or fails when
//! HEADSCOPE_REQUIRE names afl (the corpus
//! and regression files are replayed without AFL by tests/readers/fuzz_corpus.rs either way). The long
//! run, 1,000,000 executions per target, is `scripts/fuzz` (docs/fuzzing.md).

use crate::common;
use std::path::Path;
use std::process::Command;

#[test]
fn short_fuzz_run_finds_no_crash_or_hang() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let started = std::time::Instant::now();
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("scripts/fuzz")).args(["--seconds", "8"]).current_dir(root);
    // The fuzz build is its own cargo invocation: nothing of this test's build leaks into it.
    for (k, _) in std::env::vars() {
        if k.starts_with("CARGO_") && k != "CARGO_HOME" || k == "RUSTFLAGS" || k == "RUSTC_WRAPPER" {
            cmd.env_remove(k);
        }
    }
    let out = cmd.output().expect("run scripts/fuzz");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n(scripts/fuzz --seconds 8 took {:.0} s, build included)", started.elapsed().as_secs_f64());
    if let Some(why) = stdout.strip_prefix("skipped: ") {
        common::skip("afl", why.trim());
        return;
    }
    let tail: String =
        stderr.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    assert!(out.status.success(), "scripts/fuzz failed:\n{stdout}\n{tail}");
    // One line per target: name, executions, crashes, hangs, execs/s, seconds.
    for target in headscope::fuzz::TARGETS {
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(target))
            .unwrap_or_else(|| panic!("no result for {target}:\n{stdout}"));
        let f: Vec<&str> = line.split_whitespace().collect();
        let execs: u64 = f[1].parse().unwrap_or_else(|_| panic!("{line}"));
        assert!(execs >= 1000, "{target}: only {execs} executions in 8 s: {line}");
        assert_eq!((f[2], f[3]), ("0", "0"), "{target}: crashes or hangs: {line}");
    }
}
