//! A sharded run on a real Slurm cluster: `scripts/slurm/local-cluster` brings up a one-node
//! cluster from Debian's packages (munged, slurmctld, slurmd) in a temporary directory,
//! `scripts/slurm/submit` submits `scripts/slurm/demo.rhai` (MiniLM over the 1000 PUD
//! sentences) as a 4-task job array and the merge job after it, and the merged results must
//! equal what one process gives. Skipped, saying why, where the cluster cannot run (not root,
//! the packages missing, a daemon that does not start); `scripts/slurm/test-local` runs it on
//! demand with its output.

use crate::common::{self, root};

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SHARDS: usize = 4;
/// For the array and the merge, and for the one-process run (each about 1-2 minutes on this
/// 2-core machine, more when it is busy).
const TIMEOUT: Duration = Duration::from_secs(600);
/// The model runs in float64 (`demo.rhai`'s DTYPE): a shard's sentences form other length
/// buckets than in one process, which changes their values only by rounding, and sums and
/// counts add exactly (in float32 the same comparison holds to about 1e-6).
const REL: f64 = 1e-9;

/// Stops the cluster (daemons, leftover job steps) and removes its directory, whatever happens.
struct Cluster {
    dir: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let r = Command::new(root().join("scripts/slurm/local-cluster")).arg("stop").arg(&self.dir).status();
        if !matches!(r, Ok(s) if s.success()) {
            eprintln!("warning: stopping the cluster in {} failed: {r:?}", self.dir.display());
        }
    }
}

/// Why this machine cannot run the cluster, if it cannot.
fn cannot_run() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref().ok() != Some("0") {
        return Some(
            "not root (slurmd runs each job as its submitting user, so the one-node cluster needs root)".into(),
        );
    }
    let missing: Vec<&str> = ["munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol"]
        .into_iter()
        .filter(|c| {
            !Command::new("sh")
                .arg("-c")
                .arg(format!("command -v {c}"))
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if !missing.is_empty() {
        return Some(format!(
            "{} not installed (scripts/setup-test installs slurm-wlm and munge with apt-get as root)",
            missing.join(", ")
        ));
    }
    None
}

/// Runs `cmd` with its output in files (a daemon or a `sleep` holding a pipe cannot hang us),
/// killing it after `limit`; returns (success, stdout, stderr).
fn run_logged(mut cmd: Command, logs: &Path, name: &str, limit: Duration) -> (bool, String, String) {
    let (out, err) = (logs.join(format!("{name}.stdout")), logs.join(format!("{name}.stderr")));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let ok = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.success();
        }
        if start.elapsed() > limit {
            child.kill().ok();
            child.wait().ok();
            let mut e = std::fs::read_to_string(&err).unwrap_or_default();
            e.push_str(&format!("\n(killed after {} s)", limit.as_secs()));
            std::fs::write(&err, e).ok();
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    (ok, std::fs::read_to_string(&out).unwrap_or_default(), std::fs::read_to_string(&err).unwrap_or_default())
}

/// Keys whose values may differ between a merge and one process: `seconds` is wall time
/// (a merge reports the shards' summed time).
const UNCOMPARED: &[&str] = &["seconds"];

/// Compares two results: the same keys, strings, booleans and integers (counts), floats within
/// `rel` relative. Returns the largest relative float difference, or the first difference
/// beyond that, by path.
fn compare(a: &Value, b: &Value, path: &str, rel: f64) -> Result<f64, String> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            let d = if x == y { 0.0 } else { (x - y).abs() / x.abs().max(y.abs()) };
            if d <= rel {
                Ok(d)
            } else {
                Err(format!("{path}: {x} vs {y} (relative difference {d:.2e})"))
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return Err(format!("{path}: {} vs {} elements", x.len(), y.len()));
            }
            x.iter()
                .zip(y)
                .enumerate()
                .try_fold(0.0, |w: f64, (i, (x, y))| Ok(w.max(compare(x, y, &format!("{path}[{i}]"), rel)?)))
        }
        (Value::Object(x), Value::Object(y)) => {
            let (kx, ky): (Vec<_>, Vec<_>) = (x.keys().collect(), y.keys().collect());
            if kx != ky {
                return Err(format!("{path}: keys {kx:?} vs {ky:?}"));
            }
            x.iter()
                .filter(|(k, _)| !UNCOMPARED.contains(&k.as_str()))
                .try_fold(0.0, |w: f64, (k, v)| Ok(w.max(compare(v, &y[k], &format!("{path}.{k}"), rel)?)))
        }
        _ if a == b => Ok(0.0),
        _ => Err(format!("{path}: {a} vs {b}")),
    }
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn json_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    v.sort();
    v
}

#[test]
fn job_array_over_pud_merges_to_the_one_process_result() {
    let started = Instant::now();
    if let Some(why) = cannot_run() {
        common::skip("slurm", &why);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let cluster = Cluster { dir: tmp.path().join("cluster") };
    let mut up = Command::new(root().join("scripts/slurm/local-cluster"));
    up.arg("start").arg(&cluster.dir);
    let (ok, stdout, stderr) = run_logged(up, &logs, "local-cluster", Duration::from_secs(120));
    if !ok {
        common::skip("slurm", &format!("the one-node Slurm cluster did not come up on this machine:\n{stderr}"));
        return;
    }
    print!("{stderr}");
    let conf = stdout
        .lines()
        .last()
        .and_then(|l| l.strip_prefix("export SLURM_CONF="))
        .unwrap_or_else(|| panic!("no SLURM_CONF line in\n{stdout}"))
        .to_string();
    assert_eq!(Path::new(&conf), cluster.dir.join("slurm.conf"));
    println!("cluster up in {:.1} s", started.elapsed().as_secs_f64());

    // The job array and the merge job, through the script a user runs.
    let script = root().join("scripts/slurm/demo.rhai");
    let out = tmp.path().join("run");
    let t = Instant::now();
    let mut submit = Command::new(root().join("scripts/slurm/submit"));
    submit
        .arg(&script)
        .arg(SHARDS.to_string())
        .arg("--out")
        .arg(&out)
        .args(["--arg", "-", "--arg", "f64"])
        .arg("--wait");
    submit.env("SLURM_CONF", &conf).env("HEADSCOPE", env!("CARGO_BIN_EXE_headscope")).current_dir(root());
    let (ok, stdout, stderr) = run_logged(submit, &logs, "submit", TIMEOUT);
    print!("{stdout}");
    assert!(ok, "scripts/slurm/submit failed:\n{stdout}\n{stderr}");
    println!("job array of {SHARDS} and merge: {:.1} s", t.elapsed().as_secs_f64());
    assert!(stdout.contains("array job ") && stdout.contains("COMPLETED"), "{stdout}");

    // Every task wrote its shard of every dataset-consuming call, and the merge one file each.
    let shards = json_files(&out.join("shards"));
    let merged = json_files(&out.join("merged"));
    assert_eq!(
        merged,
        ["ablation_sweep-1.json", "analyze-1.json"],
        "what the merge wrote to {}",
        out.join("merged").display()
    );
    for name in &merged {
        let stem = name.strip_suffix(".json").unwrap();
        let want: Vec<String> = (0..SHARDS).map(|i| format!("{stem}.shard-{i}-of-{SHARDS}.json")).collect();
        let have: Vec<String> = shards.iter().filter(|s| s.starts_with(&format!("{stem}.shard-"))).cloned().collect();
        assert_eq!(have, want, "shards of {stem}");
    }
    assert_eq!(shards.len(), merged.len() * SHARDS, "shards {shards:?} vs merged {merged:?}");
    for i in 0..SHARDS {
        let log = std::fs::read_dir(out.join("logs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().unwrap().to_string_lossy().ends_with(&format!("_{i}.out")));
        let log = std::fs::read_to_string(log.unwrap_or_else(|| panic!("no log of task {i}"))).unwrap();
        assert!(log.contains(&format!("headscope shard {i}/{SHARDS}")), "task {i}'s log:\n{log}");
    }

    // One process, no shards: the same script.
    let t = Instant::now();
    let one = tmp.path().join("one");
    let mut single = Command::new(env!("CARGO_BIN_EXE_headscope"));
    single.arg("run").arg(&script).arg(&one).arg("f64").current_dir(root());
    let (ok, stdout, stderr) = run_logged(single, &logs, "one-process", TIMEOUT);
    assert!(ok, "one-process run failed:\n{stdout}\n{stderr}");
    println!("one process: {:.1} s", t.elapsed().as_secs_f64());

    assert_eq!(json_files(&one), merged, "what the one-process run wrote");
    let analysis = read_json(&out.join("merged/analyze-1.json"));
    assert_eq!(analysis["sentences"], 1000, "the merged analysis covers every PUD sentence");
    for name in &merged {
        let m = read_json(&out.join("merged").join(name));
        let o = read_json(&one.join(name));
        match compare(&m, &o, name, REL) {
            Ok(worst) => println!("merged {name} equals the one-process result (counts identical, largest relative float difference {worst:.1e})"),
            Err(d) => panic!("merged {name} differs from the one-process result: {d}"),
        }
    }
    // The comparison sees a quarter of the data: shard 0's sweep alone is not the result.
    let part = read_json(&out.join(format!("shards/ablation_sweep-1.shard-0-of-{SHARDS}.json")));
    let whole = read_json(&one.join("ablation_sweep-1.json"));
    let e = compare(&part["kinds"], &whole["kinds"], "kinds", REL).expect_err("shard 0's sweep equals the whole sweep");
    println!("shard 0 alone differs, as it should: {e}");
    println!("total {:.1} s", started.elapsed().as_secs_f64());
}
