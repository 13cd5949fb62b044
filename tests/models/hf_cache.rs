//! Models named as Python users name them (issue 46): a model id resolved offline in a Hugging
//! Face cache laid out exactly as `huggingface_hub` lays it (`models--org--name/refs/<rev>` -> a
//! commit hash, `snapshots/<hash>/` of symlinks into `blobs/`, two revisions, a GGUF repository
//! with two `.gguf` files), under each of the three roots (`HF_HUB_CACHE`, `$HF_HOME/hub`,
//! `~/.cache/huggingface/hub`), by branch, tag and commit hash; a `.gguf` file path; and the
//! one-line errors of a miss, a broken `refs` file and a dangling symlink.

use crate::common;
use headscope::model::readers::locate::{self, Pick};
use headscope::model::script::{load_picked, ScriptModel};
use headscope::model::LoadOptions;
use std::path::{Path, PathBuf};

const BIN: &str = env!("CARGO_BIN_EXE_headscope");
const HASH_MAIN: &str = "0123456789abcdef0123456789abcdef01234567";
const HASH_V1: &str = "89abcdef0123456789abcdef0123456789abcdef";
const HASH_GGUF: &str = "fedcba9876543210fedcba9876543210fedcba98";

/// A cache under `root`: `org/tiny-llama` (main: tiny_hf/llama; tag v1: tiny_hf/llama_linear),
/// `org/tiny-gguf` (main: the Qwen2 and Qwen3 GGUFs with one tokenizer.json), `org/one-gguf`
/// (main: one GGUF and its tokenizer.json).
fn make_cache(root: &Path) {
    let fx = common::tiny_hf_dir();
    let files = |dir: &str| -> Vec<(&'static str, PathBuf)> {
        ["config.json", "model.safetensors", "tokenizer.json"].into_iter().map(|f| (f, fx.join(dir).join(f))).collect()
    };
    common::hf_cache_repo(root, "org/tiny-llama", "main", HASH_MAIN, &files("llama"));
    common::hf_cache_repo(root, "org/tiny-llama", "v1", HASH_V1, &files("llama_linear"));
    common::hf_cache_repo(
        root,
        "org/tiny-gguf",
        "main",
        HASH_GGUF,
        &[
            ("qwen2-f32.gguf", fx.join("qwen2_gguf/model.gguf")),
            ("qwen3-f32.gguf", fx.join("qwen3_gguf/model.gguf")),
            ("tokenizer.json", fx.join("qwen2_gguf/tokenizer.json")),
        ],
    );
    common::hf_cache_repo(
        root,
        "org/one-gguf",
        "main",
        HASH_GGUF,
        &[
            ("model-f32.gguf", fx.join("qwen2_gguf/model.gguf")),
            ("tokenizer.json", fx.join("qwen2_gguf/tokenizer.json")),
        ],
    );
}

fn cpu() -> LoadOptions {
    LoadOptions { device: tch::Device::Cpu, dtype: tch::Kind::Float, allow_unknown_config: false }
}

fn load_id(root: &Path, id: &str, pick: &Pick) -> Result<ScriptModel, String> {
    let found = locate::in_cache(id, Some(root), pick)?;
    load_picked(&found.path.display().to_string(), cpu(), None, &Pick::default()).map(|mut m| {
        std::rc::Rc::get_mut(&mut m.model).unwrap().id = found.name;
        m
    })
}

/// Greedy continuation of one sentence, the model's fingerprint.
fn continuation(m: &ScriptModel) -> Vec<i64> {
    generated(&m.model)
}

fn generated(m: &headscope::model::Model) -> Vec<i64> {
    m.generate(&common::short_pud_sentences(1)[0], 6, &headscope::model::nn::Gates::none()).unwrap()
}

#[test]
fn model_ids_resolve_by_branch_tag_and_commit_hash() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    make_cache(&root);
    let main = load_id(&root, "org/tiny-llama", &Pick::default()).unwrap();
    assert_eq!(main.model.name(), "org/tiny-llama", "named by its id, not by the snapshot's hash");
    let direct = common::tiny_hf("llama", "f32");
    assert_eq!(continuation(&main), generated(&direct));
    let v1 = load_id(&root, "org/tiny-llama", &Pick { revision: Some("v1"), gguf_file: None }).unwrap();
    let by_hash = load_id(&root, "org/tiny-llama", &Pick { revision: Some(HASH_V1), gguf_file: None }).unwrap();
    assert_eq!(continuation(&v1), continuation(&by_hash), "tag v1 and its commit hash are one snapshot");
    assert_eq!(continuation(&v1), generated(&common::tiny_hf("llama_linear", "f32")));
    assert_ne!(continuation(&v1), continuation(&main), "two revisions, two models");
    // The repository directory and a snapshot directory given as paths load too, named by the id.
    let repo = root.join("models--org--tiny-llama");
    let found = locate::existing(&repo, &Pick::default()).unwrap();
    assert_eq!((found.path, found.name.as_deref()), (repo.join("snapshots").join(HASH_MAIN), Some("org/tiny-llama")));
    let snap = locate::existing(&repo.join("snapshots").join(HASH_V1), &Pick::default()).unwrap();
    assert_eq!(snap.name.as_deref(), Some("org/tiny-llama"));
}

#[test]
fn gguf_repositories_pick_their_file() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    make_cache(&root);
    let e = locate::in_cache("org/tiny-gguf", Some(&root), &Pick::default()).unwrap_err();
    assert!(
        e.contains("holds 2 .gguf files (qwen2-f32.gguf, qwen3-f32.gguf): choose one with the option gguf_file"),
        "{e}"
    );
    let q3 = load_id(&root, "org/tiny-gguf", &Pick { revision: None, gguf_file: Some("qwen3-f32.gguf") }).unwrap();
    assert_eq!(continuation(&q3), generated(&common::tiny_hf("qwen3_gguf", "f32")));
    let e = locate::in_cache("org/tiny-gguf", Some(&root), &Pick { revision: None, gguf_file: Some("q8.gguf") })
        .unwrap_err();
    assert!(e.contains("gguf_file 'q8.gguf' is not in") && e.contains("qwen2-f32.gguf, qwen3-f32.gguf"), "{e}");
    // The only .gguf of a repository.
    let one = load_id(&root, "org/one-gguf", &Pick::default()).unwrap();
    assert_eq!(one.model.name(), "org/one-gguf");
    assert_eq!(continuation(&one), generated(&common::tiny_hf("qwen2_gguf", "f32")));
}

#[test]
fn a_gguf_file_path_loads_directly() {
    let path = common::tiny_hf_dir().join("qwen2_gguf/model.gguf");
    let m = load_picked(&path.display().to_string(), cpu(), None, &Pick::default()).unwrap();
    assert_eq!(continuation(&m), generated(&common::tiny_hf("qwen2_gguf", "f32")), "the tokenizer.json beside it");
    assert_eq!(m.model.name(), "model");
    let e = load_picked(
        &common::tiny_hf_dir().join("llama/config.json").display().to_string(),
        cpu(),
        None,
        &Pick::default(),
    )
    .err()
    .unwrap();
    assert!(e.contains("is a file, not a model: give its directory, or a .gguf file"), "{e}");
}

#[test]
fn misses_broken_refs_and_dangling_links_are_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    make_cache(&root);
    let e = locate::in_cache("org/absent", Some(&root), &Pick::default()).unwrap_err();
    assert!(
        e.contains(&format!("looked for {}", root.join("models--org--absent").display()))
            && e.contains("huggingface-cli download org/absent")
            && e.contains("downloads nothing"),
        "{e}"
    );
    let e =
        locate::in_cache("org/tiny-llama", Some(&root), &Pick { revision: Some("dev"), gguf_file: None }).unwrap_err();
    assert!(e.contains("has no revision 'dev'") && e.contains("refs main, v1"), "{e}");
    let repo = root.join("models--org--tiny-llama");
    std::fs::write(repo.join("refs/main"), "not a hash").unwrap();
    let e = locate::in_cache("org/tiny-llama", Some(&root), &Pick::default()).unwrap_err();
    assert!(e.contains("refs/main: broken ref: expected a 40-digit commit hash, found \"not a hash\""), "{e}");
    std::fs::write(repo.join("refs/main"), "1111111111111111111111111111111111111111").unwrap();
    let e = locate::in_cache("org/tiny-llama", Some(&root), &Pick::default()).unwrap_err();
    assert!(e.contains("points at snapshot 1111111111111111111111111111111111111111, which is missing"), "{e}");
    // A blob gone (an interrupted download): the symlink dangles.
    let link = repo.join("snapshots").join(HASH_V1).join("model.safetensors");
    let blob = repo.join("snapshots").join(HASH_V1).join(std::fs::read_link(&link).unwrap());
    std::fs::remove_file(blob).unwrap();
    let e =
        locate::in_cache("org/tiny-llama", Some(&root), &Pick { revision: Some("v1"), gguf_file: None }).unwrap_err();
    assert!(e.contains("model.safetensors: dangling symlink to '../../blobs/") && e.contains("re-download"), "{e}");
    assert!(!e.contains('\n'), "one line: {e}");
}

/// `headscope -e` with only the given cache variables set.
fn run_with(env: &[(&str, &Path)], code: &str) -> (bool, String) {
    let mut c = std::process::Command::new(BIN);
    c.args(["-e", code]).env_remove("HF_HUB_CACHE").env_remove("HF_HOME").env_remove("HOME");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn the_cache_is_found_under_each_of_its_three_roots() {
    let tmp = tempfile::tempdir().unwrap();
    let code =
        r#"let m = load_model("org/tiny-llama", #{device: "cpu", revision: "v1"}); print(m.name); print(m.rope)"#;
    let roots: [(&str, PathBuf, PathBuf); 3] = [
        ("HF_HUB_CACHE", tmp.path().join("a/hub-cache"), tmp.path().join("a/hub-cache")),
        ("HF_HOME", tmp.path().join("b/hf-home"), tmp.path().join("b/hf-home/hub")),
        ("HOME", tmp.path().join("c/home"), tmp.path().join("c/home/.cache/huggingface/hub")),
    ];
    for (var, value, cache) in &roots {
        make_cache(cache);
        let (ok, out) = run_with(&[(var, value)], code);
        assert!(ok && out.contains("org/tiny-llama") && out.contains("rope_type linear"), "{var}: {out}");
    }
    // HF_HUB_CACHE wins over HF_HOME, which wins over HOME.
    let (ok, out) = run_with(&[("HF_HUB_CACHE", &tmp.path().join("nowhere")), ("HF_HOME", &roots[1].1)], code);
    assert!(!ok && out.contains(&tmp.path().join("nowhere/models--org--tiny-llama").display().to_string()), "{out}");
    // A local directory of the same name wins over the cache.
    let local = tmp.path().join("d");
    std::fs::create_dir_all(local.join("org")).unwrap();
    let fx = common::tiny_hf_dir().join("qwen3");
    let dst = local.join("org/tiny-llama");
    std::fs::create_dir_all(&dst).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(fx.join(f), dst.join(f)).unwrap();
    }
    let out = std::process::Command::new(BIN)
        .args(["-e", r#"print(load_model("org/tiny-llama", #{device: "cpu"}).family)"#])
        .env("HF_HUB_CACHE", &roots[0].1)
        .current_dir(&local)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "qwen3", "{}", String::from_utf8_lossy(&out.stderr));
}

/// huggingface_hub itself reads the test cache as headscope does: `hf_hub_download(...,
/// local_files_only=True)` resolves each revision to the snapshot headscope loads, and
/// `scan_cache_dir` finds the same repositories, refs and revisions without a warning
/// (`tests/fixtures/hf_cache_reference.py`, huggingface_hub from the venv).
#[test]
fn huggingface_hub_resolves_the_test_cache_as_headscope_does() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    make_cache(&root);
    let root_s = root.display().to_string();
    let mut args = vec![root_s.as_str()];
    let triples = [
        ("org/tiny-llama", "main", "config.json"),
        ("org/tiny-llama", "v1", "model.safetensors"),
        ("org/tiny-llama", HASH_V1, "tokenizer.json"),
        ("org/tiny-gguf", "main", "qwen3-f32.gguf"),
    ];
    for (repo, rev, file) in &triples {
        args.extend([*repo, *rev, *file]);
    }
    let (ok, out) = common::run_fixture_script("hf_cache_reference.py", &args);
    assert!(ok, "huggingface_hub could not read the test cache: {out}");
    let j: serde_json::Value = serde_json::from_str(out.lines().find(|l| l.starts_with('{')).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {out}"));
    for (r, (repo, rev, file)) in j["resolved"].as_array().unwrap().iter().zip(&triples) {
        let theirs = std::path::PathBuf::from(r["path"].as_str().unwrap());
        let gguf = file.ends_with(".gguf");
        let pick = Pick { revision: Some(rev), gguf_file: gguf.then_some(*file) };
        let ours = locate::in_cache(repo, Some(&root), &pick).unwrap().path;
        let ours = if gguf { ours } else { ours.join(file) };
        assert_eq!(ours, theirs, "{repo}@{rev}/{file}");
    }
    let repos = &j["repos"];
    assert_eq!(repos["org/tiny-llama"]["refs"], serde_json::json!(["main", "v1"]));
    assert_eq!(repos["org/tiny-llama"]["revisions"], serde_json::json!([HASH_MAIN, HASH_V1]));
    assert_eq!(
        repos["org/tiny-gguf"]["files"],
        serde_json::json!(["qwen2-f32.gguf", "qwen3-f32.gguf", "tokenizer.json"])
    );
    assert_eq!(j["warnings"], serde_json::json!([]), "huggingface_hub finds the layout corrupt");
}
