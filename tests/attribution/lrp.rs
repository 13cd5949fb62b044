//! LRP on the real models: relevance is conserved at every layer boundary (within 1e-3 of the
//! seed total, for every prediction), and each layer's head relevances sum to 1. The rules
//! themselves are checked against hand computations in crates/core/src/analysis/lrp.rs.

use crate::common;

use headscope::analysis::lrp::{lrp, LrpOptions, Rule, Seed};
use headscope::data::Dataset;
use headscope::model::nn::Gates;
use headscope::model::Model;

fn sentences(n: usize) -> Dataset {
    Dataset::corpus(&headscope::assets::asset_path("pud_en.txt").unwrap()).unwrap().take(n)
}

fn check(
    model: &Model,
    data: &Dataset,
    rule: Rule,
    seed: Seed,
    per_prediction: bool,
) -> headscope::analysis::lrp::LrpResult {
    let opts = LrpOptions { rule: rule.into(), seed: Some(seed), per_prediction, batch_tokens: 256 };
    let r = lrp(model, data, &opts, &Gates::none(), &|| false, &mut |_, _| {}).unwrap();
    println!(
        "{} {rule} {seed} each={per_prediction}: {} predictions, max conservation error {:.2e}",
        model.name(),
        r.predictions,
        r.max_conservation_error
    );
    assert!(r.max_conservation_error < 1e-3, "relevance not conserved: {}", r.max_conservation_error);
    assert!(r.predictions > 0);
    for (kind, heads) in &r.kinds {
        for (l, row) in heads.iter().enumerate() {
            let total: f64 = row.iter().sum();
            assert!((total - 1.0).abs() < 1e-6, "{kind} layer {l}: head relevances sum to {total}");
            assert!(row.iter().all(|v| *v >= 0.0));
        }
    }
    r
}

#[test]
fn minilm_conserves_relevance_under_both_rules() {
    let m = common::asset("minilm", "f32");
    let d = sentences(8);
    for rule in [Rule::Ab, Rule::Zplus] {
        check(&m, &d, rule, Seed::Norm, true);
    }
    check(&m, &d, Rule::Ab, Seed::Norm, false);
}

/// EN->PT from its output logits: back in time through the SSRU decoder, into the target
/// embeddings and, through cross-attention, the encoder. Every boundary of both stacks counts
/// the target side's share too.
#[test]
fn enpt_conserves_relevance_through_decoder_and_encoder() {
    let m = common::asset("enpt", "f32");
    let d = sentences(6);
    for rule in [Rule::Ab, Rule::Zplus] {
        let r = check(&m, &d, rule, Seed::Logit, true);
        let kinds: Vec<String> = r.kinds.iter().map(|(k, _)| k.to_string()).collect();
        assert_eq!(kinds, ["enc", "cross"]);
    }
    check(&m, &d, Rule::Ab, Seed::Logit, false);
    // The encoder alone, seeded at its output.
    let r = check(&m, &d, Rule::Ab, Seed::Norm, true);
    assert_eq!(r.kinds.len(), 1);
}

#[test]
fn smollm2_conserves_relevance_from_next_token_logits() {
    let _heavy = common::heavy();
    let m = common::asset("smollm2", "f32");
    let d = sentences(2);
    check(&m, &d, Rule::Ab, Seed::Logit, true);
    check(&m, &d, Rule::Zplus, Seed::Logit, false);
}
