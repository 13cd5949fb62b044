//! Writes that survive (docs/methods.md#writes): every kind of file headscope writes, killed
//! with SIGKILL at random points of the write, interrupted with Ctrl-C, run out of disk, and
//! written by two shard processes at once, is afterwards either absent or whole (byte-equal to
//! a version the writer finished), the old file intact, the session alive.
//!
//! The runs use the write test hook (`HEADSCOPE_WRITE_FAULT`, crates/core/src/files.rs):
//! `slow:MICROS` stretches each write so that the kills land inside it, `enospc:N` fails the
//! N-th chunk as a full disk would. `HEADSCOPE_KILL_RUNS` sets the kill runs per writer kind
//! (CI: 6; `scripts/write-tests` runs the long form and prints the tally).

use crate::common;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_headscope");

fn spawn(dir: &Path, args: &[&str], fault: &str, stdin: Stdio) -> Child {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("HEADSCOPE_WRITE_FAULT", fault)
        .env("HEADSCOPE_THREADS", "1")
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn headscope")
}

fn output(dir: &Path, args: &[&str], fault: &str, stdin: Option<&str>) -> (i32, String, String) {
    use std::io::Write;
    let mut c = spawn(dir, args, fault, if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    if let Some(s) = stdin {
        c.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    let o = c.wait_with_output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

fn signal(c: &Child, sig: i32) {
    // SAFETY: kill(2) on a child this test spawned and has not yet reaped.
    unsafe { libc::kill(c.id() as i32, sig) };
}

/// A small deterministic generator (the kill times; no dependency for it).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

fn kill_runs() -> usize {
    std::env::var("HEADSCOPE_KILL_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(6)
}

/// The script writers: each writes its version A and B once to `ref-a-NAME` / `ref-b-NAME`, then
/// alternates A and B over `NAME` until killed. Strings in big texts make the writes span
/// several 64 KiB chunks.
const RESULTS: &str = r#"
let m = load_model("minilm");
let d = corpus(asset("pud_en.txt"));
let line = "the quick brown fox jumps over the lazy dog, 0123456789\n";
let ta = ""; let tb = "";
for i in 0..6000 { ta += line; }
for i in 0..9000 { tb += line; }
let rows_a = []; let rows_b = [];
for i in 0..4000 { rows_a.push([`enc.${i}`, i * 0.5]); }
for i in 0..7000 { rows_b.push([`dec.${i}`, i * 0.25]); }
let tab_a = table(["head", "score"], rows_a);
let tab_b = table(["head", "score"], rows_b);
let an_a = m.analyze(d.take(2), #{stats: ["confidence"]});
let an_b = m.analyze(d.skip(2).take(3), #{stats: ["confidence"]});
let ga = an_a.confidence; let gb = an_b.confidence;
let pa = heatmap([[1.0, 2.0], [3.0, 4.0]], #{title: "a"});
let pb = heatmap([[4.0, 3.0, 2.0], [1.0, 0.0, 1.0]], #{title: "b"});
let va = m.view("The cat sleeps."); let vb = m.view("A dog barks at the moon tonight.");
fn put(which, name, v) {
    switch which {
        "text" => write_text(name, v),
        "csv" => v.to_csv(name),
        "parquet" => v.to_parquet(name),
        "json" => v.to_json(name),
        "npz" => v.to_npz(name),
        "png" => v.save(name),
        "html" => v.to_html(name),
    }
}
let kinds = [["text", "r.txt", ta, tb], ["csv", "r.csv", tab_a, tab_b], ["parquet", "r.parquet", tab_a, tab_b],
             ["json", "r.json", an_a, an_b], ["npz", "r.npz", ga, gb], ["png", "r.png", pa, pb], ["html", "r.html", va, vb]];
for k in kinds { put(k[0], "ref-a-" + k[1], k[2]); put(k[0], "ref-b-" + k[1], k[3]); }
print("ready");
loop {
    for k in kinds { put(k[0], k[1], k[2]); }
    for k in kinds { put(k[0], k[1], k[3]); }
}
"#;

const TARGETS: &[&str] = &["r.txt", "r.csv", "r.parquet", "r.json", "r.npz", "r.png", "r.html"];

/// A file's bytes with what differs between two writes of one value taken out: the head
/// view's element ids (`hs-view-...`, unique per render so that two views share a notebook).
fn normalized(target: &str, bytes: Vec<u8>) -> Vec<u8> {
    if !target.ends_with(".html") {
        return bytes;
    }
    let text = String::from_utf8(bytes).expect("the head view is UTF-8");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(i) = rest.find("hs-view-") {
        out.push_str(&rest[..i + 8]);
        rest = rest[i + 8..].trim_start_matches(|c: char| c.is_ascii_hexdigit() || c == '-');
    }
    out.push_str(rest);
    out.into_bytes()
}

/// What a target was found as after a run.
fn state_of(dir: &Path, target: &str) -> Result<&'static str, String> {
    let p = dir.join(target);
    if !p.exists() {
        return Ok("absent");
    }
    let got = normalized(target, std::fs::read(&p).unwrap());
    for (v, name) in [("a", "whole A"), ("b", "whole B")] {
        let r = dir.join(format!("ref-{v}-{target}"));
        let want = std::fs::read(&r)
            .map_err(|e| format!("{target} exists but its reference {} does not: {e}", r.display()))?;
        let want = normalized(target, want);
        // A result's JSON records the seconds its run took: a file the previous run left is
        // the same result with other seconds.
        if got == want || (target.ends_with(".json") && same_result(&got, &want)) {
            return Ok(name);
        }
    }
    Err(format!("{target}: {} bytes, neither version (a torn write)", got.len()))
}

/// Starts `results.rhai` in `d` with stretched writes and returns once its references are
/// written (its loop of A and B then begins).
fn start_results_writer(d: &Path) -> Child {
    let mut c = spawn(d, &["run", "results.rhai"], "slow:3000", Stdio::null());
    let t0 = Instant::now();
    while !d.join("ref-b-r.html").exists() {
        assert!(t0.elapsed() < Duration::from_secs(120), "the writer never became ready");
        if let Ok(Some(s)) = c.try_wait() {
            let o = c.wait_with_output().unwrap();
            panic!("the writer exited ({s}): {}", String::from_utf8_lossy(&o.stderr));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    c
}

/// Removes a run's references (the next run writes its own; the targets stay).
fn remove_references(d: &Path) {
    for e in std::fs::read_dir(d).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("ref-") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
}

/// Temporary files a killed writer left (removed by the next write to the same path).
fn temps(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".tmp")).count()
}

#[test]
fn sigkill_at_random_points_of_every_script_write_leaves_whole_files() {
    let _lock = common::rng();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("results.rhai"), RESULTS).unwrap();
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    let runs = kill_runs();
    for run in 0..runs {
        let mut c = start_results_writer(d);
        // Kill within ~1.5 loops.
        std::thread::sleep(Duration::from_millis(rng.below(600)));
        signal(&c, libc::SIGKILL);
        c.wait().unwrap();
        for t in TARGETS {
            let s = state_of(d, t).unwrap_or_else(|e| panic!("run {run}: {e}"));
            *tally.entry(format!("{t}: {s}")).or_default() += 1;
        }
        *tally.entry("temp files left by the kill".into()).or_default() += temps(d);
        // The next run starts from what this one left (old files stay until replaced).
        remove_references(d);
    }
    println!("{runs} SIGKILL runs of {} script writers:", TARGETS.len());
    for (k, n) in &tally {
        println!("  {k}: {n}");
    }
    // The kills landed inside the writes: a temp file was left at least once.
    assert!(tally["temp files left by the kill"] > 0 || runs < 3, "no kill landed inside a write: {tally:?}");
}

#[test]
fn sigkill_during_save_shard_merge_and_kernel_install() {
    let _lock = common::rng();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut rng = Rng(0x2545f4914f6cdd1d);
    let runs = kill_runs();
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    let mut count = |k: &str| *tally.entry(k.to_string()).or_default() += 1;

    // `:save` in a piped session, after each input: version k names k inputs and holds k lines.
    let session: String = (0..400).map(|i| format!("let x{i} = {i};\n:save s.rhai\n")).collect();
    for run in 0..runs {
        let _ = std::fs::remove_file(d.join("s.rhai"));
        let mut c = spawn(d, &[], "slow:2000", Stdio::piped());
        let (mut w, text) = (c.stdin.take().unwrap(), session.clone());
        let feeder = std::thread::spawn(move || {
            use std::io::Write;
            let _ = w.write_all(text.as_bytes());
        });
        std::thread::sleep(Duration::from_millis(500 + rng.below(1500)));
        signal(&c, libc::SIGKILL);
        c.wait().unwrap();
        let _ = feeder.join();
        match std::fs::read_to_string(d.join("s.rhai")) {
            Err(_) => count(":save: absent"),
            Ok(text) => {
                let header = text.lines().next().unwrap_or_default();
                let n: usize = header
                    .split(" session: ")
                    .nth(1)
                    .and_then(|r| r.split(' ').next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("run {run}: s.rhai has no whole header: {header:?}"));
                let lets = text.lines().filter(|l| l.starts_with("let x")).count();
                assert_eq!(lets, n, "run {run}: s.rhai says {n} inputs and holds {lets}: a torn write");
                assert!(text.ends_with('\n'));
                count(":save: whole");
            }
        }
    }

    // A sharded run's result and a merge, each killed at a random point.
    std::fs::write(
        d.join("conf.rhai"),
        "let m = load_model(\"minilm\");\nlet a = m.analyze(corpus(asset(\"pud_en.txt\")).take(6), #{stats: [\"confidence\"]});\n",
    )
    .unwrap();
    let (code, _, err) = output(d, &["run", "--shard", "0/2", "--shard-dir", "whole", "conf.rhai"], "", None);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = output(d, &["run", "--shard", "1/2", "--shard-dir", "whole", "conf.rhai"], "", None);
    assert_eq!(code, 0, "{err}");
    let shard_file = "analyze-1.shard-0-of-2.json";
    let want = std::fs::read(d.join("whole").join(shard_file)).unwrap();
    let (code, _, err) = output(d, &["merge", "-o", "merged-whole", "whole"], "", None);
    assert_eq!(code, 0, "{err}");
    let merged = std::fs::read(d.join("merged-whole/analyze-1.json")).unwrap();
    for run in 0..runs {
        let parts = d.join(format!("parts{run}"));
        let mut c = spawn(
            d,
            &["run", "--shard", "0/2", "--shard-dir", &parts.to_string_lossy(), "conf.rhai"],
            "slow:400000",
            Stdio::null(),
        );
        let t0 = Instant::now();
        while !parts.exists() && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(rng.below(2000)));
        signal(&c, libc::SIGKILL);
        c.wait().unwrap();
        match std::fs::read(parts.join(shard_file)) {
            Err(_) => count("shard file: absent"),
            Ok(b) => {
                assert!(same_result(&b, &want), "run {run}: a torn shard file");
                count("shard file: whole");
            }
        }
        let out = d.join(format!("merged{run}"));
        let mut c = spawn(d, &["merge", "-o", &out.to_string_lossy(), "whole"], "slow:400000", Stdio::null());
        std::thread::sleep(Duration::from_millis(300 + rng.below(900)));
        signal(&c, libc::SIGKILL);
        c.wait().unwrap();
        match std::fs::read(out.join("analyze-1.json")) {
            Err(_) => count("merged file: absent"),
            Ok(b) => {
                assert!(same_result(&b, &merged), "run {run}: a torn merged file");
                count("merged file: whole");
            }
        }
    }

    // The kernelspec install, killed at a random point; the old spec stays until replaced.
    let prefix = d.join("prefix");
    let (code, _, err) = output(d, &["kernel", "install", "--prefix", &prefix.to_string_lossy()], "", None);
    assert_eq!(code, 0, "{err}");
    let spec_dir = walk(&prefix).into_iter().find(|p| p.ends_with("kernel.json")).expect("kernel.json installed");
    let spec = std::fs::read(&spec_dir).unwrap();
    for run in 0..runs {
        let mut c =
            spawn(d, &["kernel", "install", "--prefix", &prefix.to_string_lossy()], "slow:300000", Stdio::null());
        std::thread::sleep(Duration::from_millis(rng.below(1200)));
        signal(&c, libc::SIGKILL);
        c.wait().unwrap();
        let b = std::fs::read(&spec_dir).unwrap_or_else(|e| panic!("run {run}: the old kernel.json is gone: {e}"));
        assert!(b == spec, "run {run}: a torn kernel.json");
        serde_json::from_slice::<serde_json::Value>(&b).unwrap();
        count("kernel.json: whole");
    }
    println!("{runs} SIGKILL runs each of :save, a shard write, a merge and a kernelspec install:");
    for (k, n) in &tally {
        println!("  {k}: {n}");
    }
}

/// Two result files hold the same result: both parse, and they are equal but for the
/// `seconds` a run took.
fn same_result(a: &[u8], b: &[u8]) -> bool {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove("seconds");
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let parse = |x: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(x).ok().map(|mut v| {
            strip(&mut v);
            v
        })
    };
    matches!((parse(a), parse(b)), (Some(x), Some(y)) if x == y)
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn ctrl_c_mid_write_stops_the_script_and_leaves_whole_files() {
    let _lock = common::rng();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("results.rhai"), RESULTS).unwrap();
    let mut rng = Rng(0x51ed270b27a3c0d5);
    for (run, twice) in [(0, false), (1, false), (2, true), (3, true)] {
        let c = start_results_writer(d);
        std::thread::sleep(Duration::from_millis(50 + rng.below(400)));
        signal(&c, libc::SIGINT);
        if twice {
            std::thread::sleep(Duration::from_millis(2));
            signal(&c, libc::SIGINT);
        }
        let t1 = Instant::now();
        let o = c.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(t1.elapsed() < Duration::from_secs(10), "run {run}: Ctrl-C did not stop the script");
        if twice {
            assert!(err.contains("interrupted"), "run {run}: {err}");
        } else {
            assert!(err.contains("interrupted"), "run {run}: stopped without saying why: {err}");
            assert_eq!(temps(d), 0, "run {run}: a Ctrl-C left a temp file (the write in flight is finished first)");
        }
        assert_ne!(o.status.code(), Some(0), "run {run}: an interrupted script exits 0");
        for t in TARGETS {
            state_of(d, t).unwrap_or_else(|e| panic!("run {run} (Ctrl-C{}): {e}", if twice { " twice" } else { "" }));
        }
        remove_references(d);
    }
}

/// A session that writes A, then fails to write the bigger B, then reads the file back.
fn full_disk_session(target: &str) -> String {
    format!(
        "let line = \"the quick brown fox jumps over the lazy dog, 0123456789\\n\";\n\
         let a = \"\"; for i in 0..8000 {{ a += line; }}\n\
         let b = \"\"; for i in 0..16000 {{ b += line; }}\n\
         write_text(\"{target}\", a);\n\
         write_text(\"{target}\", b);\n\
         print(`alive: ${{read_text(\"{target}\") == a}}`);\n"
    )
}

fn check_full_disk(code: i32, out: &str, err: &str, target: &str, bytes: &str) {
    let line = err.lines().find(|l| l.contains("write_text")).unwrap_or_else(|| panic!("no error: {err}"));
    for want in [
        &format!("write_text: cannot write '{target}'"),
        "No space left on device",
        bytes,
        "the previous file is unchanged",
    ] {
        assert!(line.contains(want), "'{want}' not in: {line}");
    }
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.contains("alive: true"), "the session died or the old file changed: {out}\n{err}");
    let _ = code;
}

#[test]
fn a_writer_failing_on_a_chosen_call_keeps_the_old_file_and_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A is 448,000 bytes (chunks 1-7 of 64 KiB); the 3rd chunk of B (896,000 bytes) fails.
    let (code, out, err) = output(d, &[], "enospc:10", Some(&full_disk_session("f.txt")));
    check_full_disk(code, &out, &err, "f.txt", "after 131072 of 896000 bytes");
    assert_eq!(temps(d), 0, "the failed write left its temp file");
}

#[test]
fn a_full_disk_keeps_the_old_file_and_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mnt)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        common::skip("tmpfs", "a 1 MiB tmpfs cannot be mounted here (not root, or no mount rights)");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _u = Unmount(&mnt);
    // A (448 KB) fits the 1 MiB disk; B (896 KB) does not fit beside it.
    let (code, out, err) = output(&mnt, &[], "", Some(&full_disk_session("f.txt")));
    check_full_disk(code, &out, &err, "f.txt", "of 896000 bytes");
    assert_eq!(temps(&mnt), 0, "the failed write left its temp file (the disk stays full)");
    println!("1 MiB tmpfs: {}", err.lines().find(|l| l.contains("write_text")).unwrap());
}

#[test]
fn shard_processes_writing_one_directory_at_once_never_corrupt_each_other() {
    let _lock = common::rng();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("conf.rhai"),
        "let m = load_model(\"minilm\");\nlet d = corpus(asset(\"pud_en.txt\")).take(9);\nm.analyze(d, #{stats: [\"confidence\"]});\nm.analyze(d, #{stats: [\"positional\"]});\n",
    )
    .unwrap();
    // Alone, one after the other: the reference files.
    for i in 0..3 {
        let (code, _, err) =
            output(d, &["run", "--shard", &format!("{i}/3"), "--shard-dir", "alone", "conf.rhai"], "", None);
        assert_eq!(code, 0, "{err}");
    }
    // At once, every shard twice (a requeued job beside its first run), stretched writes.
    let kids: Vec<Child> = (0..6)
        .map(|k| {
            spawn(
                d,
                &["run", "--shard", &format!("{}/3", k % 3), "--shard-dir", "shared", "conf.rhai"],
                "slow:20000",
                Stdio::null(),
            )
        })
        .collect();
    for k in kids {
        let o = k.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let names: Vec<String> = {
        let mut v: Vec<String> = std::fs::read_dir(d.join("shared"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names.len(), 6, "{names:?}");
    for n in &names {
        let (a, b) =
            (std::fs::read(d.join("shared").join(n)).unwrap(), std::fs::read(d.join("alone").join(n)).unwrap());
        assert!(same_result(&a, &b), "{n} differs from the same shard run alone");
    }
    let (code, out, err) = output(d, &["merge", "-o", "merged", "shared"], "", None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("analyze-1: 3 shards, 9 sentences") && out.contains("analyze-2: 3 shards"), "{out}");
}
