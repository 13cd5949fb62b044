//! Never ignore a config key that changes the computation (issue 46): every `config.X` that
//! transformers 5's modeling file of a family reads (`tests/fixtures/config_keys_tf5.json`, listed
//! by `config_keys_reference.py` from transformers' source) is read by headscope or listed
//! harmless with its reason (`crates/core/src/model/readers/config_keys.rs`); a default config as transformers saves
//! it passes; an invented key inside `rope_parameters`, an unknown `rope_type` and a key the family
//! reads that headscope does not are refused by default and load with a warning when asked.

use crate::common;
use headscope::model::readers::config_keys::{keys_of, COMMON};
use headscope::model::readers::locate::Pick;
use headscope::model::script::load_picked;
use headscope::model::LoadOptions;

/// Attributes the modeling files read that are not keys of config.json (Python properties,
/// transformers' run-time settings), each with why.
const NOT_KEYS: &[(&str, &str)] = &[
    ("_attn_implementation", "transformers' kernel choice at run time (eager, sdpa): the same function"),
    ("_experts_implementation", "transformers' kernel choice at run time"),
    ("use_return_dict", "a property: what transformers returns"),
    ("num_labels", "a property over id2label: task heads headscope does not load"),
    ("get_text_config", "a method"),
    ("to_dict", "a method"),
    ("rope_parameters", "read as a key (checked with the rope keys)"),
    ("standardize_rope_params", "a method"),
    ("is_encoder_decoder", "common"),
];

/// Per family: names transformers' `attribute_map` aliases to a key headscope reads (in
/// config.json an alias would be refused, a key headscope does not read), and the keys of the
/// multimodal config that shares a modeling file.
const ALIASES: &[(&str, &str, &str)] = &[
    ("bart", "hidden_size", "alias of d_model"),
    ("marian", "hidden_size", "alias of d_model"),
    ("mbart", "hidden_size", "alias of d_model"),
    ("m2m_100", "hidden_size", "alias of d_model"),
    ("t5", "hidden_size", "alias of d_model"),
    ("mt5", "hidden_size", "alias of d_model"),
    ("gpt2", "hidden_size", "alias of n_embd"),
    ("deepseek_v2", "num_experts", "alias of n_routed_experts (transformers 5's attribute map)"),
    ("deepseek_v3", "num_local_experts", "alias of n_routed_experts (transformers 5's attribute map)"),
    ("gpt2", "max_position_embeddings", "alias of n_positions"),
    ("gpt2", "num_attention_heads", "alias of n_head"),
    ("gpt2", "num_hidden_layers", "alias of n_layer"),
    (
        "gemma3_text",
        "image_token_id",
        "the multimodal Gemma 3 (model_type gemma3), whose modeling file gemma3_text shares",
    ),
    ("gemma3_text", "mm_tokens_per_image", "the multimodal Gemma 3"),
    ("gemma3_text", "text_config", "the multimodal Gemma 3"),
    ("gemma3_text", "vision_config", "the multimodal Gemma 3"),
    ("llama4_text", "image_size", "the multimodal Llama 4 (model_type llama4), whose modeling file llama4_text shares"),
    (
        "llama4_text",
        "image_token_id",
        "the multimodal Llama 4 (model_type llama4), whose modeling file llama4_text shares",
    ),
    (
        "llama4_text",
        "num_channels",
        "the multimodal Llama 4 (model_type llama4), whose modeling file llama4_text shares",
    ),
    ("llama4_text", "patch_size", "the multimodal Llama 4 (model_type llama4), whose modeling file llama4_text shares"),
    (
        "llama4_text",
        "pixel_shuffle_ratio",
        "the multimodal Llama 4 (model_type llama4), whose modeling file llama4_text shares",
    ),
    (
        "llama4_text",
        "projector_dropout",
        "the multimodal Llama 4 (model_type llama4), whose modeling file llama4_text shares",
    ),
    (
        "llama4_text",
        "projector_input_dim",
        "the multimodal Llama 4 (model_type llama4), whose modeling file llama4_text shares",
    ),
    (
        "llama4_text",
        "projector_output_dim",
        "the multimodal Llama 4 (model_type llama4), whose modeling file llama4_text shares",
    ),
    (
        "llama4_text",
        "text_config",
        "the multimodal Llama 4 (model_type llama4), whose modeling file llama4_text shares",
    ),
    (
        "llama4_text",
        "vision_config",
        "the multimodal Llama 4 (model_type llama4), whose modeling file llama4_text shares",
    ),
];

#[test]
fn every_key_transformers_reads_is_read_or_harmless() {
    let j = common::golden_json("config_keys_tf5.json");
    let families = j["families"].as_object().expect("families");
    let mut missing = Vec::new();
    let mut n = 0;
    for (model_type, f) in families {
        let keys = keys_of(model_type).unwrap_or_else(|| panic!("no key table for {model_type}"));
        for k in f["modeling_reads"].as_array().unwrap().iter().filter_map(|k| k.as_str()) {
            n += 1;
            let known = keys.reads.contains(&k)
                || keys.harmless.iter().chain(COMMON).any(|(h, _, _)| *h == k)
                || NOT_KEYS.iter().any(|(h, _)| *h == k)
                || ALIASES.iter().any(|(f, h, _)| f == model_type && *h == k);
            if !known {
                missing.push(format!("{model_type}: {k}"));
            }
        }
        // Every key of a default config as transformers 5 saves it is known.
        for k in f["saved_keys"]
            .as_array()
            .map(|a| a.iter().filter_map(|k| k.as_str()).collect::<Vec<_>>())
            .unwrap_or_default()
        {
            if !(keys.reads.contains(&k) || keys.harmless.iter().chain(COMMON).any(|(h, _, _)| *h == k)) {
                missing.push(format!("{model_type}: '{k}' of transformers' saved default config"));
            }
        }
    }
    assert!(n > 100, "only {n} keys listed");
    assert!(
        missing.is_empty(),
        "keys transformers 5 reads that headscope neither reads nor lists harmless:\n{}",
        missing.join("\n")
    );
}

fn edited(name: &str, edit: impl Fn(&mut serde_json::Value)) -> tempfile::TempDir {
    let src = common::tiny_hf_dir().join(name);
    let dir = tempfile::tempdir().unwrap();
    for f in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let mut c: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::fixtures().join("tiny_hf_tf5").join(name).join("config.json")).unwrap(),
    )
    .unwrap();
    edit(&mut c);
    std::fs::write(dir.path().join("config.json"), serde_json::to_string_pretty(&c).unwrap()).unwrap();
    dir
}

fn load(dir: &std::path::Path, allow: bool) -> Result<headscope::model::script::ScriptModel, String> {
    let opts = LoadOptions { device: tch::Device::Cpu, dtype: tch::Kind::Float, allow_unknown_config: allow };
    load_picked(&dir.display().to_string(), opts, None, &Pick::default())
}

#[test]
fn unknown_rope_settings_and_unread_keys_are_refused_unless_allowed() {
    let cases: Vec<(tempfile::TempDir, &str)> = vec![
        (
            edited("llama_linear", |c| c["rope_parameters"]["warp_factor"] = 3.into()),
            "rope_parameters.warp_factor is not a setting of rope_type 'linear'",
        ),
        (
            edited("llama_linear", |c| c["rope_parameters"]["rope_type"] = "spiral".into()),
            "rope_parameters: rope_type 'spiral' is not supported",
        ),
        (
            edited("gemma3", |c| c["rope_parameters"]["sliding_attention"]["factor"] = 4.into()),
            "rope_parameters.sliding_attention.factor is not a setting of rope_type 'default'",
        ),
        // A key Llama's modeling file reads in some versions that headscope does not.
        (
            edited("llama", |c| c["attn_temperature_tuning"] = true.into()),
            "key 'attn_temperature_tuning' is not read by headscope",
        ),
        (
            edited("gpt2", |c| c["scale_attn_by_inverse_layer_idx"] = true.into()),
            "key 'scale_attn_by_inverse_layer_idx' is true",
        ),
    ];
    for (dir, want) in &cases {
        let e = load(dir.path(), false).err().unwrap_or_else(|| panic!("loaded although {want}"));
        assert!(
            e.contains(want)
                && e.contains("config.json")
                && e.contains("allow_unknown_config: true")
                && !e.contains('\n'),
            "{e}"
        );
        let m = load(dir.path(), true).unwrap_or_else(|e| panic!("allow_unknown_config: {e}"));
        assert_eq!(m.model.warnings.len(), 1, "{:?}", m.model.warnings);
        assert!(m.model.warnings[0].contains("as allow_unknown_config asked"), "{:?}", m.model.warnings);
    }
    // The warning reaches the session once, as a printed line.
    let dir = &cases[0].0;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_headscope"))
        .args([
            "-e",
            &format!(
                r#"let m = load_model("{}", #{{device: "cpu", allow_unknown_config: true}}); print(m.rope)"#,
                dir.path().display()
            ),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && text.matches("warning: load_model:").count() == 1
            && text.contains("rope_type linear (factor 2)"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
