//! Helpers shared by the test binaries (`tests/GROUP/main.rs` includes this file as `common`):
//! paths, goldens, loading checkpoints on the CPU, tensor comparisons, small layer builders and
//! tiny models built by hand, and the locks that keep tests of one binary (threads of one
//! process) from disturbing each other.
#![allow(dead_code)]

use headscope::model::nn::{Linear, Norm, NormKind};
use headscope::model::{LoadOptions, Model};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use tch::{Device, Kind as DType, Tensor};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `tests/fixtures`.
pub fn fixtures() -> PathBuf {
    root().join("tests/fixtures")
}

/// The project venv's Python (transformers and the other references; `scripts/setup`).
pub fn python() -> PathBuf {
    root().join(".venv/bin/python")
}

/// The first `n` PUD sentences of 15 to 60 characters (the sentences the tiny-checkpoint
/// goldens were made from, in their order).
pub fn short_pud_sentences(n: usize) -> Vec<String> {
    std::fs::read_to_string(root().join("assets/pud_en.txt"))
        .unwrap()
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| (15..=60).contains(&l.chars().count()))
        .take(n)
        .collect()
}

/// Runs a Python fixture script (`tests/fixtures/SCRIPT`) with `args`, the headscope binary
/// in `HEADSCOPE_BIN`; returns whether it succeeded and its stdout and stderr (printed too).
pub fn run_fixture_script(script: &str, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(python())
        .arg(fixtures().join(script))
        .args(args)
        .env("HEADSCOPE_BIN", env!("CARGO_BIN_EXE_headscope"))
        .current_dir(root())
        .output()
        .expect("run .venv/bin/python (scripts/setup creates it)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    (out.status.success(), text)
}

/// The tensors of an `.npz` file.
pub fn npz(path: &Path) -> HashMap<String, Tensor> {
    Tensor::read_npz(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).into_iter().collect()
}

/// The tensors of a golden `.npz` under `tests/fixtures` (`rel`: its path there).
pub fn golden(rel: &str) -> HashMap<String, Tensor> {
    npz(&fixtures().join(rel))
}

/// A golden JSON file under `tests/fixtures`.
pub fn golden_json(rel: &str) -> serde_json::Value {
    let path = fixtures().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The checkpoint at `dir` on `device` in `dtype` ("f32", "f64", ...); panics naming `dir`.
pub fn load_on(dir: &Path, device: headscope::device::DeviceChoice, dtype: &str) -> Model {
    Model::load(dir, LoadOptions::new(device, dtype).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// The checkpoint at `dir` on the CPU in `dtype`.
pub fn load(dir: &Path, dtype: &str) -> Model {
    load_on(dir, headscope::device::DeviceChoice::Cpu, dtype)
}

/// `tests/fixtures/tiny_hf`: tiny checkpoints in each family's layout and their goldens.
pub fn tiny_hf_dir() -> PathBuf {
    fixtures().join("tiny_hf")
}

/// A tiny HF checkpoint of `tests/fixtures/tiny_hf` (`make_tiny_hf*.py`) on the CPU in `dtype`.
pub fn tiny_hf(name: &str, dtype: &str) -> Model {
    load(&tiny_hf_dir().join(name), dtype)
}

/// A named asset (`minilm`, `enpt`, `smollm2`, ...: `scripts/setup`) on the CPU in `dtype`.
pub fn asset(name: &str, dtype: &str) -> Model {
    load(&headscope::assets::asset_path(name).unwrap(), dtype)
}

/// The largest absolute difference of two tensors of one shape, in float64 on the CPU.
pub fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shape mismatch");
    (a.to_device(Device::Cpu).to_kind(DType::Double) - b.to_device(Device::Cpu).to_kind(DType::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// float32's unit roundoff, `u = 2^-24`.
pub const U32: f64 = 1.0 / 16_777_216.0;

/// The float32 bound every comparison against a reference implementation uses (docs/testing.md,
/// issue 53): two correct float32 evaluations of one network (headscope's and the reference's,
/// on any x86-64 CPU, AVX2 or AVX-512 kernels) differ by at most
///
/// ```text
/// |a - b| <= C32 * u * scale * sqrt(depth)
/// ```
///
/// - `u * sqrt(depth)`: the probabilistic rounding error of a computation whose outputs sum
///   `depth` rounded terms along their longest chain (Higham & Mary 2019: a sum of n terms in any
///   order errs by `lambda sqrt(n) u` of the terms' scale with probability `1 - 2 exp(-lambda^2 / 2)`);
/// - `C32 = 64`: `lambda = 8` (a failure probability of 1e-14 per value, so the largest of a
///   million values stays inside), times 2 (two implementations, each within the bound), times 4
///   (what norms and softmax may amplify: a LayerNorm divides by the deviation, a softmax turns an
///   absolute score error into a relative weight error);
/// - `scale`: the largest magnitude of what is compared (logits, hidden states), or 1 for
///   attention weights, whose error is the score error times the weight (at most 1).
///
/// Nothing here is tuned to one machine: the suite checks it under AVX-512 and under forced AVX2
/// kernels (`scripts/test`'s second numeric pass).
pub fn f32_bound(scale: f64, depth: f64) -> f64 {
    64.0 * U32 * scale.max(f64::MIN_POSITIVE) * depth.max(1.0).sqrt()
}

/// The accumulation depth of a model's forward over `t` tokens: per layer (every stack), the
/// model width, the MLP width and the keys summed, as [`f32_bound`] counts them.
pub fn depth(m: &Model, t: usize) -> f64 {
    let width = |w: &Tensor| w.size().first().copied().unwrap_or(0) as f64;
    let d = m.net.embed.tokens.size()[1] as f64;
    let enc: f64 =
        m.net.stack.iter().map(|l| d + l.dense().map_or(l.mlp().width() as f64, |f| width(&f.up.w)) + t as f64).sum();
    let dec: f64 =
        m.net.decoder.iter().map(|l| 2.0 * d + width(&l.dense().expect("a dense MLP").up.w) + 2.0 * t as f64).sum();
    enc + dec
}

/// The largest magnitude of a tensor.
pub fn scale(t: &Tensor) -> f64 {
    t.to_kind(DType::Double).abs().max().double_value(&[])
}

/// Zeros, float32 on the CPU.
pub fn zeros(shape: &[i64]) -> Tensor {
    Tensor::zeros(shape, (DType::Float, Device::Cpu))
}

/// A linear map with bias `b`.
pub fn lin(w: Tensor, b: Tensor) -> Linear {
    Linear { w, b: Some(b) }
}

/// LayerNorm over `d` features as initialised (weight 1, bias 0, eps 1e-5): the identity on
/// normalised inputs.
pub fn layer_norm(d: i64) -> Norm {
    Norm {
        kind: NormKind::Layer,
        weight: Tensor::ones([d], (DType::Float, Device::Cpu)),
        bias: Some(zeros(&[d])),
        eps: 1e-5,
    }
}

/// RMSNorm over `d` features, weight 1, eps 1e-6.
pub fn rms_norm(d: i64) -> Norm {
    Norm { kind: NormKind::Rms, weight: Tensor::ones([d], (DType::Float, Device::Cpu)), bias: None, eps: 1e-6 }
}

static HEAVY: Mutex<()> = Mutex::new(());
static RNG: Mutex<()> = Mutex::new(());

/// Held by a test that loads SmolLM2 (or runs its Python reference): one such model at a time
/// per test binary, as when each file was a binary of its own. A test that panicked while
/// holding it does not poison it for the others.
pub fn heavy() -> MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Held for the whole of a test that seeds or draws from libtorch's global random generator
/// (`tch::manual_seed`, `Tensor::randn`, and `prune`, which seeds it for its gate noise): tests
/// of one binary share the generator, and a draw by another thread between a seed and its use
/// would change the numbers.
pub fn rng() -> MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

/// A word-level tokenizer.json: [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3, then `words` from id 4, with
/// BERT's `[CLS] ... [SEP]` framing.
pub fn word_level_tokenizer(words: &[&str]) -> String {
    let special = |id: u32, t: &str| {
        format!(
            r#"{{"id":{id},"content":"{t}","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}}"#
        )
    };
    let mut vocab =
        vec![r#""[PAD]":0"#.to_string(), r#""[CLS]":1"#.into(), r#""[SEP]":2"#.into(), r#""[UNK]":3"#.into()];
    vocab.extend(words.iter().enumerate().map(|(i, w)| format!(r#""{w}":{}"#, i + 4)));
    format!(
        r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":[{},{},{},{}],"normalizer":null,
        "pre_tokenizer":{{"type":"WhitespaceSplit"}},
        "post_processor":{{"type":"TemplateProcessing",
          "single":[{{"SpecialToken":{{"id":"[CLS]","type_id":0}}}},{{"Sequence":{{"id":"A","type_id":0}}}},{{"SpecialToken":{{"id":"[SEP]","type_id":0}}}}],
          "pair":[{{"SpecialToken":{{"id":"[CLS]","type_id":0}}}},{{"Sequence":{{"id":"A","type_id":0}}}},{{"SpecialToken":{{"id":"[SEP]","type_id":0}}}},{{"Sequence":{{"id":"B","type_id":1}}}},{{"SpecialToken":{{"id":"[SEP]","type_id":1}}}}],
          "special_tokens":{{"[CLS]":{{"id":"[CLS]","ids":[1],"tokens":["[CLS]"]}},"[SEP]":{{"id":"[SEP]","ids":[2],"tokens":["[SEP]"]}}}}}},
        "decoder":null,"model":{{"type":"WordLevel","vocab":{{{}}},"unk_token":"[UNK]"}}}}"#,
        special(0, "[PAD]"),
        special(1, "[CLS]"),
        special(2, "[SEP]"),
        special(3, "[UNK]"),
        vocab.join(",")
    )
}

/// A model built by hand: the self-attention stack `layers` over `embed`, with the word-level
/// tokenizer of `words` written to `dir`; no output head, float32 on the CPU. A `Dec` stack is
/// causal (decoder-only), an `Enc` stack bidirectional.
pub fn hand_built(
    dir: &std::path::Path,
    words: &[&str],
    embed: headscope::model::transformer::Embeddings,
    layers: Vec<headscope::model::transformer::StackLayer>,
    stack_kind: headscope::model::Kind,
    family: headscope::model::Family,
) -> headscope::model::Model {
    use headscope::model::tokenize::tokenizer::{Framing, Tok};
    use headscope::model::{transformer::Transformer, Kind, LoadOptions, LoadTimes, Model};
    std::fs::write(dir.join("tokenizer.json"), word_level_tokenizer(words)).unwrap();
    let tok = Tok::from_file(&dir.join("tokenizer.json"), Framing::Tokenizer).unwrap();
    let d_model = embed.tokens.size()[1];
    let net = Transformer {
        embed,
        stack: layers,
        stack_kind,
        causal: stack_kind == Kind::Dec,
        window: None,
        final_norm: None,
        decoder: vec![],
        output: None,
        d_model,
        eos_id: 2,
        dec_embed: None,
        dec_start: None,
        banned: vec![],
        logit_softcap: None,
        forced_bos: Default::default(),
        rel_bias: None,
        max_positions: None,
    };
    let opts = LoadOptions { device: tch::Device::Cpu, dtype: tch::Kind::Float, allow_unknown_config: false };
    Model {
        load_times: LoadTimes::default(),
        family,
        architecture: None,
        path: dir.to_path_buf(),
        id: None,
        warnings: vec![],
        stored: None,
        net,
        tok,
        opts,
        n_params: 0,
        removed: vec![],
    }
}

/// One pass of `run` recording `points` through the trace: `(hook point, value)` in the order
/// the forward met them, and what `run` returned.
pub fn recorded<T>(
    points: &[headscope::model::hooks::Point],
    run: impl FnOnce(&mut dyn headscope::model::hooks::Hooks) -> T,
) -> (Vec<(headscope::model::hooks::At, tch::Tensor)>, T) {
    let mut seen = Vec::new();
    let mut on = |at: headscope::model::hooks::At, t: &tch::Tensor| {
        seen.push((at, t.shallow_clone()));
        Ok(())
    };
    let mut rec = headscope::model::hooks::Record::new(points, &mut on);
    let out = run(&mut rec);
    (seen, out)
}

/// The values recorded at `point`, in order.
pub fn at_point(
    seen: &[(headscope::model::hooks::At, tch::Tensor)],
    point: headscope::model::hooks::Point,
) -> Vec<tch::Tensor> {
    seen.iter().filter(|(a, _)| a.point == point).map(|(_, t)| t.shallow_clone()).collect()
}

/// HF's `output_hidden_states` of one sentence (each layer's input, then the stack's output,
/// batch row 0) and each layer's attention, recorded at `hook_resid_pre` and `hook_pattern` of
/// one pass `run` that returns the stack's output.
pub fn hidden_and_attention(
    run: impl FnOnce(&mut dyn headscope::model::hooks::Hooks) -> tch::Tensor,
) -> (Vec<tch::Tensor>, Vec<tch::Tensor>) {
    use headscope::model::hooks::Point;
    let (seen, out) = recorded(&[Point::ResidPre, Point::Pattern], run);
    let mut hidden: Vec<tch::Tensor> = at_point(&seen, Point::ResidPre).iter().map(|h| h.get(0)).collect();
    hidden.push(out.get(0));
    (hidden, at_point(&seen, Point::Pattern).iter().map(|a| a.get(0)).collect())
}

/// A repository of a Hugging Face cache under `root`, laid out as `huggingface_hub` writes it:
/// each file's bytes in `blobs/` (named by a digest of them, as the hub's etags name blobs), a
/// relative symlink to it in `snapshots/<hash>/`, and `refs/<branch>` holding the hash.
pub fn hf_cache_repo(root: &Path, id: &str, branch: &str, hash: &str, files: &[(&str, PathBuf)]) -> PathBuf {
    let repo = root.join(format!("models--{}", id.replace('/', "--")));
    let snap = repo.join("snapshots").join(hash);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    for (name, src) in files {
        let bytes = std::fs::read(src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        let digest = bytes.iter().fold(0xcbf29ce484222325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100000001b3));
        let blob = format!("{digest:016x}{:08x}", bytes.len());
        std::fs::write(repo.join("blobs").join(&blob), &bytes).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{blob}"), snap.join(name)).unwrap();
    }
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join(branch), hash).unwrap();
    repo
}

/// The tools and files a test may find missing, as `HEADSCOPE_REQUIRE` names them.
pub const TOOLS: &[&str] = &["cuda", "chromium", "slurm", "afl", "assets", "tmpfs"];

/// Whether the environment asks for `tool`: `HEADSCOPE_REQUIRE` is a comma-separated list of
/// [`TOOLS`] (or `all`). `.ci/run` sets what CI installs, so a test that would skip there fails.
/// A name not in [`TOOLS`] fails every caller, so a misspelt requirement cannot pass silently.
pub fn required(tool: &str) -> bool {
    assert!(TOOLS.contains(&tool), "common::required: unknown tool '{tool}' (known: {})", TOOLS.join(", "));
    let Ok(list) = std::env::var("HEADSCOPE_REQUIRE") else { return false };
    let asked: Vec<&str> = list.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    for a in &asked {
        assert!(
            *a == "all" || TOOLS.contains(a),
            "HEADSCOPE_REQUIRE names '{a}', which is not one of {} or all",
            TOOLS.join(", ")
        );
    }
    asked.iter().any(|a| *a == "all" || *a == tool)
}

/// A test that cannot run because `tool` is missing (`why` says what is missing): prints
/// `skipped (tool): why` so the log tells a skip from a pass, or fails when [`required`].
pub fn skip(tool: &str, why: &str) {
    if required(tool) {
        panic!("HEADSCOPE_REQUIRE asks for {tool}, but {why}");
    }
    println!("skipped ({tool}): {why}");
}
