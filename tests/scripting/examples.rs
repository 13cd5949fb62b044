//! Every script under examples/ runs to the end (each gets a temporary output directory as
//! its first argument).

use crate::common;

#[test]
fn every_example_runs() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut ran = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        // any_model.rhai takes a model directory: see `any_model_runs_on_every_family`.
        if path.extension().and_then(|e| e.to_str()) != Some("rhai") || path.ends_with("any_model.rhai") {
            continue;
        }
        let out = tempfile::tempdir().unwrap();
        let r = std::process::Command::new(env!("CARGO_BIN_EXE_headscope"))
            .arg("run")
            .arg(&path)
            .arg(out.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&r.stdout);
        assert!(r.status.success(), "{} failed:\n{}\n{}", path.display(), stdout, String::from_utf8_lossy(&r.stderr));
        if path.ends_with("tour.rhai") {
            assert!(stdout.contains("== end of tour =="), "tour did not finish:\n{stdout}");
            for f in ["confidence_enc.png", "confidence_cross.png", "positional_enc.png", "analysis.json"] {
                assert!(out.path().join(f).exists(), "the tour did not write {f}");
            }
            assert!(stdout.contains("O gato está dormindo no sofá."), "{stdout}");
        }
        ran += 1;
    }
    assert!(ran >= 1, "no examples found in {}", dir.display());
}

/// `examples/any_model.rhai DIR` runs unchanged on every HF tiny checkpoint (the 2026 families
/// included: where LRP's rules do not cover a family's layers it says why in one line and runs
/// AttnLRP) and on the real
/// encoder and translation models (SmolLM2 takes about 6 minutes on 2 cores: run by hand).
#[test]
fn any_model_runs_on_every_family() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let tiny = root.join("tests/fixtures/tiny_hf");
    let mut dirs: Vec<(String, &str)> = ["gpt2", "llama", "llama_sharded", "qwen2", "mistral"]
        .iter()
        .map(|d| (tiny.join(d).display().to_string(), "kinds: [\"dec\"]"))
        .collect();
    dirs.push((tiny.join("roberta").display().to_string(), "kinds: [\"enc\"]"));
    for d in ["marian", "marian_torchbin", "bart", "m2m100", "mbart", "t5", "flan_t5", "mt5", "t5_gguf"] {
        dirs.push((tiny.join(d).display().to_string(), "kinds: [\"enc\", \"dec\", \"cross\"]"));
    }
    // The 2026 families (tests/fixtures/make_tiny_hf_2026.py) and GGUFs of some of them
    // (make_tiny_gguf_2026.py).
    for d in [
        "llama3",
        "qwen3",
        "qwen3_gguf",
        "phi3",
        "phi3_gguf",
        "neox_sequential",
        "pythia",
        "pythia_gguf",
        "olmo2",
        "gemma",
        "gemma2",
        "gemma3",
        "gemma3_gguf",
        // The 2025 families (make_tiny_hf_2025.py): experts, latent attention, Llama 4.
        "mixtral",
        "olmoe",
        "qwen2_moe",
        "qwen3_moe",
        "gpt_oss",
        "smollm3",
        "olmo3",
        "deepseek_v3",
        "deepseek_v2",
        "llama4_text",
        // Hybrids: short-convolution layers (make_tiny_hf_hybrid.py), Mamba-2 layers
        // (make_tiny_hf_mamba2.py), gated DeltaNet layers (make_tiny_hf_deltanet.py) and Mamba
        // layers (make_tiny_hf_jamba.py) beside attention layers.
        "lfm2",
        "granite_h",
        "qwen3_next",
        "jamba",
    ] {
        dirs.push((tiny.join(d).display().to_string(), "kinds: [\"dec\"]"));
    }
    dirs.push(("minilm".into(), "kinds: [\"enc\"]"));
    dirs.push(("enpt".into(), "kinds: [\"enc\", \"cross\"]"));
    for (d, kinds) in dirs {
        let r = std::process::Command::new(env!("CARGO_BIN_EXE_headscope"))
            .args(["run", "examples/any_model.rhai", &d, "12"])
            .current_dir(root)
            // Some tiny checkpoints have 64 positions, fewer than the treebank's sentences.
            .env("HEADSCOPE_PAST_POSITIONS", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&r.stdout);
        assert!(r.status.success(), "any_model.rhai {d} failed:\n{stdout}\n{}", String::from_utf8_lossy(&r.stderr));
        // LRP's rules cover sequential two-norm layers; the others say why and run AttnLRP,
        // or, through a pre-norm translation decoder, LRP on the encoder alone.
        let prenorm_decoder = ["m2m100", "mbart", "t5", "flan_t5", "mt5", "t5_gguf"].iter().any(|f| d.ends_with(f));
        let own_rules = !prenorm_decoder
            && ![
                "pythia",
                "pythia_gguf",
                "olmo2",
                "gemma2",
                "gemma3",
                "gemma3_gguf",
                "mixtral",
                "olmoe",
                "qwen2_moe",
                "qwen3_moe",
                "gpt_oss",
                "olmo3",
                "deepseek_v3",
                "deepseek_v2",
                "llama4_text",
                "lfm2",
                "granite_h",
                "qwen3_next",
                "jamba",
            ]
            .iter()
            .any(|f| d.ends_with(f));
        let lrp = if prenorm_decoder {
            "LRP (ab, seed norm)"
        } else if own_rules {
            "LRP (ab"
        } else {
            "LRP (attnlrp"
        };
        for want in ["ablation sweep", lrp, "pruning: 4 steps", kinds] {
            assert!(stdout.contains(want), "any_model.rhai {d}: no {want:?} in\n{stdout}");
        }
        assert_eq!(stdout.contains("LRP (ab) does not apply: "), !own_rules, "any_model.rhai {d}:\n{stdout}");
    }
}

/// `examples/any_model.rhai` on what users of 2026 hold (issue 46): every transformers-5
/// checkpoint (`tests/fixtures/tiny_hf_tf5`), a model named by its id from a Hugging Face cache
/// (`HF_HUB_CACHE`; a transformers-5 Gemma 3 saved there as huggingface_hub lays it out), and a
/// `.gguf` file path.
#[test]
fn any_model_runs_on_transformers_5_checkpoints_model_ids_and_gguf_paths() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let tf5 = root.join("tests/fixtures/tiny_hf_tf5");
    let mut names: Vec<String> = std::fs::read_dir(&tf5)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("config.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 18, "{names:?}");
    let cache = tempfile::tempdir().unwrap();
    let g3 = tf5.join("gemma3");
    common::hf_cache_repo(
        cache.path(),
        "tiny-org/gemma3-tf5",
        "main",
        "00112233445566778899aabbccddeeff00112233",
        &[
            ("config.json", g3.join("config.json")),
            ("model.safetensors", g3.join("model.safetensors")),
            ("tokenizer.json", g3.join("tokenizer.json")),
        ],
    );
    let mut runs: Vec<String> = names.iter().map(|n| tf5.join(n).display().to_string()).collect();
    runs.push("tiny-org/gemma3-tf5".into());
    runs.push(root.join("tests/fixtures/tiny_hf/qwen3_gguf/model.gguf").display().to_string());
    for d in runs {
        let r = std::process::Command::new(env!("CARGO_BIN_EXE_headscope"))
            .args(["run", "examples/any_model.rhai", &d, "4"])
            .env("HF_HUB_CACHE", cache.path())
            .env("HEADSCOPE_PAST_POSITIONS", "1")
            .current_dir(root)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&r.stdout);
        assert!(r.status.success(), "any_model.rhai {d} failed:\n{stdout}\n{}", String::from_utf8_lossy(&r.stderr));
        for want in ["ablation sweep", "LRP (", "pruning: 4 steps", "kinds: ["] {
            assert!(stdout.contains(want), "any_model.rhai {d}: no {want:?} in\n{stdout}");
        }
        if d == "tiny-org/gemma3-tf5" {
            assert!(stdout.contains("<Model tiny-org/gemma3-tf5 (gemma3_text)"), "named by its id:\n{stdout}");
        }
    }
}
