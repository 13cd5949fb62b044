//! `Model::count_params` (the `params` a model reports) against transformers: every tiny HF
//! family (the pre-norm encoder-decoders M2M100, mBART, T5, Flan-T5 and mT5 included), the tiny BERT and MarianMT of the LRP tests, MiniLM and SmolLM2 (its GGUF), with the
//! counts that `tests/fixtures/param_count_reference.py` wrote to `param_count_golden.json`:
//! `parameters`, transformers' `sum(p.numel() for p in model.parameters())`, less `unread`, the
//! learned position rows before the first position (RoBERTa's `padding_idx + 1`, BART's offset
//! 2), which headscope does not keep; `unread` is 0 for every other model.

use crate::common;

#[test]
fn parameter_counts_equal_transformers() {
    let _heavy = common::heavy(); // SmolLM2 among the checkpoints
    let golden = common::golden_json("param_count_golden.json");
    let models = golden["models"].as_object().unwrap();
    assert!(models.len() >= 12, "the golden covers {} checkpoints", models.len());
    let mut wrong = Vec::new();
    for (name, g) in models {
        let m = common::load(&common::root().join(g["path"].as_str().unwrap()), "f32");
        let want = g["parameters"].as_i64().unwrap() - g["unread"].as_i64().unwrap();
        if m.n_params != want {
            wrong.push(format!(
                "{name} ({}): headscope {} vs transformers {want} ({} less {} unread)",
                g["class"].as_str().unwrap(),
                m.n_params,
                g["parameters"],
                g["unread"]
            ));
        }
    }
    assert!(wrong.is_empty(), "parameter counts differ:\n{}", wrong.join("\n"));
}
