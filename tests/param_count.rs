//! `Model::count_params` (the `params` a model reports) against transformers: every tiny HF
//! family, the tiny BERT and MarianMT of the LRP tests, MiniLM and SmolLM2 (its GGUF), with the
//! counts that `tests/fixtures/param_count_reference.py` wrote to `param_count_golden.json`:
//! `parameters`, transformers' `sum(p.numel() for p in model.parameters())`, less `unread`, the
//! learned position rows before the first position (RoBERTa's `padding_idx + 1`, BART's offset
//! 2), which headscope does not keep; `unread` is 0 for every other model.

use headscope::model::{LoadOptions, Model};
use std::path::Path;

#[test]
fn parameter_counts_equal_transformers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let golden: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root.join("tests/fixtures/param_count_golden.json")).unwrap()).unwrap();
    let models = golden["models"].as_object().unwrap();
    assert!(models.len() >= 12, "the golden covers {} checkpoints", models.len());
    let mut wrong = Vec::new();
    for (name, g) in models {
        let path = root.join(g["path"].as_str().unwrap());
        let m = Model::load(&path, LoadOptions::new(headscope::device::DeviceChoice::Cpu, "f32").unwrap()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = g["parameters"].as_i64().unwrap() - g["unread"].as_i64().unwrap();
        if m.n_params != want {
            wrong.push(format!("{name} ({}): headscope {} vs transformers {want} ({} less {} unread)", g["class"].as_str().unwrap(), m.n_params, g["parameters"], g["unread"]));
        }
    }
    assert!(wrong.is_empty(), "parameter counts differ:\n{}", wrong.join("\n"));
}
