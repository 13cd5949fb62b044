//! Every committed fuzz input, replayed without AFL: the seed corpus (`fuzz/corpus/<target>/`)
//! and the inputs that once crashed a reader (`fuzz/regressions/<target>/`) go through the
//! same entry points as the AFL targets (`headscope::fuzz::run`). None may panic or take a
//! second; the valid seeds must be accepted (so each target reaches past its first check) and
//! the hostile ones refused with an error naming the field.

use headscope::fuzz::{run, TARGETS};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn fuzz_dir(kind: &str, target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz").join(kind).join(target)
}

/// `Ok(())`, or the reader's error; a panic is turned into a test failure naming the file.
fn replay(target: &str, file: &Path) -> Result<(), String> {
    let bytes = std::fs::read(file).unwrap();
    let started = Instant::now();
    let got = std::panic::catch_unwind(|| run(target, &bytes));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "{target}: {} took {:.2} s", file.display(), took.as_secs_f64());
    got.unwrap_or_else(|_| panic!("{target}: {} panicked", file.display()))
}

#[test]
fn every_corpus_and_regression_file_is_read_without_panic() {
    let mut total = 0;
    for target in TARGETS {
        let seeds = files(&fuzz_dir("corpus", target));
        assert!(!seeds.is_empty(), "{target}: no seed corpus in fuzz/corpus/{target}");
        let mut accepted = 0;
        for f in seeds.iter().chain(&files(&fuzz_dir("regressions", target))) {
            if replay(target, f).is_ok() {
                accepted += 1;
            }
            total += 1;
        }
        assert!(accepted > 0, "{target}: no seed is accepted, so the fuzzer never gets past the first check");
    }
    assert!(total >= 30, "only {total} committed fuzz inputs");
    // An AFL binary per target, each named in the fuzz package.
    for target in TARGETS {
        let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/src/bin").join(format!("{target}.rs"));
        let text = std::fs::read_to_string(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        assert!(text.contains(&format!("run(\"{target}\"")), "{} does not run target {target}", bin.display());
    }
}

#[test]
fn seeds_are_read_as_expected() {
    let ok = |t: &str, f: &str| replay(t, &fuzz_dir("corpus", t).join(f)).unwrap_or_else(|e| panic!("{t}/{f}: {e}"));
    let err = |t: &str, f: &str| replay(t, &fuzz_dir("corpus", t).join(f)).expect_err(&format!("{t}/{f} was accepted"));
    ok("conllu", "simple.conllu");
    ok("conllu", "multiword_empty_crlf.conllu");
    assert!(err("conllu", "cycle.conllu").contains("form a cycle"));
    ok("safetensors", "small.safetensors");
    assert!(err("safetensors", "huge_shape.safetensors")
        .contains("tensor 'w': shape [262144, 1048576] declares 274877906944 elements"));
    assert!(err("safetensors", "huge_header.safetensors").contains("header length 1099511627776"));
    ok("gguf", "types.gguf");
    // The tokenizers in GGUF metadata (the gguf target builds them where a file has one).
    ok("gguf", "tokenizer_bpe.gguf");
    ok("gguf", "tokenizer_spm.gguf");
    assert!(err("gguf", "huge_tensor.gguf").contains("tensor 't' declares 274877906944 elements (1099511627776 bytes)"));
    assert!(err("gguf", "huge_array.gguf").contains("a: declares 1099511627776 items"));
    assert!(err("gguf", "huge_count.gguf").contains("the metadata count: declares 1099511627776 items"));
    // A model of each architecture family GGUF files are read for, built from its metadata.
    for f in [
        "llama.gguf",
        "phi3.gguf",
        "gptneox.gguf",
        "t5.gguf",
        "qwen3moe.gguf",
        "deepseek2.gguf",
        "gptoss.gguf",
        "lfm2.gguf",
    ] {
        ok("gguf_model", f);
    }
    assert_eq!(err("gguf_model", "unknown_arch.gguf"), "fuzz.gguf: bad config: architecture 'mamba' is not supported (llama, qwen2, qwen3, qwen3moe, olmoe, deepseek2, gpt-oss, gemma, gemma2, gemma3, phi3, gptneox, t5, lfm2, granitehybrid, jamba are)");
    let e = err("gguf_model", "qwen3moe_bad_experts.gguf");
    assert!(e.contains("tensor 'blk.0.ffn_up_exps.weight' has shape [3, 4, 3], expected [3, 4, 4]"), "{e}");
    let e = err("gguf_model", "deepseek2_bad_k_b.gguf");
    assert!(e.contains("tensor 'blk.0.attn_k_b.weight' has shape [2, 3, 2], expected [2, 2, 2]"), "{e}");
    let e = err("gguf_model", "gptoss_bad_bias.gguf");
    assert!(e.contains("tensor 'blk.0.ffn_up_exps.bias' has shape [3, 5], expected [3, 4]"), "{e}");
    let e = err("gguf_model", "lfm2_short_kv.gguf");
    assert!(e.contains("metadata lfm2.attention.head_count_kv has 1 entries for 2 blocks"), "{e}");
    let e = err("gguf_model", "granitehybrid_bad_a.gguf");
    assert!(e.contains("tensor 'blk.0.ssm_a' has shape [3, 1], expected [2]"), "{e}");
    let e = err("gguf_model", "jamba_bad_a.gguf");
    assert!(e.contains("tensor 'blk.0.ssm_a' has shape [8, 1], expected [8, 2]"), "{e}");
    let e = err("gguf_model", "llama_scalar_embd.gguf");
    assert!(e.contains("tensor 'token_embd.weight' has shape []: a token table is [vocab, width]"), "{e}");
    let e = err("gguf_model", "granitehybrid_scalar_q.gguf");
    assert!(e.contains("tensor 'blk.1.attn_q.weight' has shape [], expected [4, 4]"), "{e}");
    assert!(err("gguf_model", "phi3_one_factor.gguf")
        .contains("LongRoPE needs both rope_factors_short.weight and rope_factors_long.weight"));
    ok("marian_bin", "small.bin");
    assert!(err("marian_bin", "huge_count.bin").contains("the tensor count: declares 1099511627776 items"));
    let e = err("marian_bin", "huge_shape.bin");
    assert!(e.contains("fuzz.bin: corrupt checkpoint: tensor w: 0 bytes for 1099511627776 floats"), "{e}");
    ok("torch_pickle", "state.bin");
    ok("torch_pickle", "state_zip64.bin");
    assert!(err("torch_pickle", "evil.bin").contains("pytorch_model.bin"));
    ok("tokenizer_json", "lrp_bert.json");
    ok("tokenizer_json", "tiny_gpt2.json");
    ok("spm", "target40.spm");
    ok("spm", "charsmap.spm");
    ok("spm", "m2m100_bpe.spm");
    ok("marian_vocab", "small.json");
    assert!(err("marian_vocab", "twice.json").contains("vocab.json: bad config: id 0 is negative or given twice"));
    ok("checkpoint", "valid.json");
    assert!(err("checkpoint", "other_model.json").contains("is from another model: its model is \"other\""));
    assert!(err("checkpoint", "short.json").contains("parameter vectors differ in length"));
    // Regressions: inputs that once panicked, now errors naming what failed.
    let reg =
        |t: &str, f: &str| replay(t, &fuzz_dir("regressions", t).join(f)).expect_err(&format!("{t}/{f} was accepted"));
    let e = reg("gguf", "zero_dim_overflowing_shape.gguf");
    assert!(
        e.contains("fuzz.gguf: corrupt checkpoint: tensor '")
            && e.ends_with("': shape declares more than 2^63 elements"),
        "{e}"
    );
    assert!(reg("tokenizer_json", "template_special_missing.json").contains("cannot tokenize"));
    assert!(reg("tokenizer_json", "decoder_not_json.json")
        .starts_with("tokenizer: tokenizer.json: the tokenizers library failed: Helper"));
    assert!(run("no_such_target", b"").unwrap_err().contains("unknown fuzz target 'no_such_target'"));
}
