//! The single-head ablation sweep returns exactly what masking one head at a time returns
//! (1e-5 relative), for every metric, on the real models.

use crate::common;

use headscope::analysis::ablation::{evaluate, prepare, sweep, Metric};
use headscope::assets::asset_path;
use headscope::data::Dataset;
use headscope::model::nn::Gates;
use headscope::model::{HeadId, Kind, Model};

fn data(n: usize) -> Dataset {
    Dataset::corpus(&asset_path("pud_en.txt").unwrap()).unwrap().take(n)
}

/// `abs_floor`: an absolute tolerance added to the 1e-5 relative one (0 for most metrics).
fn check(
    model: &Model,
    metric: Metric,
    kinds: &[Kind],
    n: usize,
    only: Option<&[(Kind, usize, usize)]>,
    abs_floor: f64,
) {
    let p = prepare(model, &data(n), metric, 128, headscope::model::nn::Gates::none()).unwrap();
    assert!(p.batches.len() >= 2, "use several batches");
    let grids = sweep(model, &p, kinds, &|| false, &mut |_, _| {}).unwrap();
    let base = evaluate(model, &p, &Gates::none(), &|| false).unwrap();
    let mut checked = 0;
    let mut differs = 0;
    for (kind, grid) in &grids {
        for (l, row) in grid.iter().enumerate() {
            for (h, &v) in row.iter().enumerate() {
                if only.is_some_and(|o| !o.contains(&(*kind, l, h))) {
                    continue;
                }
                let id = HeadId { kind: *kind, layer_idx: l, head: h };
                let one = evaluate(model, &p, &model.gates_closing(&[id]).unwrap(), &|| false).unwrap();
                let tol = 1e-5 * one.abs().max(1e-12) + abs_floor;
                assert!((v - one).abs() <= tol, "{metric} {id}: sweep {v} vs one at a time {one} (base {base})");
                checked += 1;
                if (one - base).abs() > 1e-9 {
                    differs += 1;
                }
            }
        }
    }
    assert!(checked > 0);
    assert!(differs * 2 > checked, "{metric}: masking single heads should change the metric");
}

#[test]
fn sweep_equals_one_at_a_time_loss() {
    check(&common::asset("enpt", "f32"), Metric::Loss, &[Kind::Enc, Kind::Cross], 6, None, 0.0);
}

/// KL of masking one head is ~1e-3 nats and second order in the logit change, so it sees the
/// f32 noise of libtorch's CPU kernels, which change with the number of rows in a batch (and
/// with threads): measured ~1e-6 relative in hidden states, ~2e-8 nats in these KLs, whatever
/// the algorithm. The ablation computes log-probabilities in double precision; the check is
/// 1e-5 relative or 1e-7 nats absolute, far below any head's effect (docs/methods.md#masking-and-ablation).
#[test]
fn sweep_equals_one_at_a_time_kl() {
    // A KL sums differences of log-probabilities near 10 in size, each within a float32 step
    // (6e-8 relative) whose order depends on the batch's shape and libtorch's threads: an
    // absolute floor of 2e-6 (about 32 such steps; seen: 5.5e-7 with two threads, 0 with one).
    check(&common::asset("enpt", "f32"), Metric::Kl, &[Kind::Enc, Kind::Cross], 6, None, 2e-6);
}

#[test]
fn sweep_equals_one_at_a_time_cosine() {
    check(&common::asset("minilm", "f32"), Metric::Cosine, &[Kind::Enc], 6, None, 0.0);
    check(&common::asset("enpt", "f32"), Metric::Cosine, &[Kind::Enc], 4, None, 0.0);
}

#[test]
fn sweep_equals_one_at_a_time_bleu() {
    let heads = [(Kind::Enc, 0, 0), (Kind::Enc, 5, 5), (Kind::Cross, 0, 3), (Kind::Cross, 1, 7)];
    check(&common::asset("enpt", "f32"), Metric::Bleu, &[Kind::Enc, Kind::Cross], 8, Some(&heads), 0.0);
}

/// Decoder self-attention heads (`dec`) of an encoder-decoder (the tiny HF MarianMT of
/// tests/fixtures/tiny_hf), with the other kinds, under loss and BLEU.
#[test]
fn sweep_over_decoder_self_attention_equals_one_at_a_time() {
    let m = common::tiny_hf("marian", "f32");
    check(&m, Metric::Loss, &[Kind::Enc, Kind::Dec, Kind::Cross], 8, None, 0.0);
    check(&m, Metric::Kl, &[Kind::Dec], 8, None, 1e-7);
    check(&m, Metric::Bleu, &[Kind::Dec], 8, None, 0.0);
}

/// The sweep's progress counts (sentence, head) pairs, reported after each chunk of heads:
/// it starts at 0, never goes back, moves more often than once per batch and ends at
/// sentences x heads (EN->PT: 6 sentences, enc 48 + cross 48 heads).
#[test]
fn sweep_progress_counts_sentences_times_heads() {
    let m = common::asset("enpt", "f32");
    let p = prepare(&m, &data(6), Metric::Loss, 128, Gates::none()).unwrap();
    let mut seen: Vec<(usize, usize)> = Vec::new();
    sweep(&m, &p, &[Kind::Enc, Kind::Cross], &|| false, &mut |d, t| seen.push((d, t))).unwrap();
    let heads: usize =
        [Kind::Enc, Kind::Cross].iter().map(|&k| m.kind_shape(k).map(|s| s.n_layers * s.n_heads).unwrap()).sum();
    let want = p.n_sentences * heads;
    assert_eq!(seen.first(), Some(&(0, want)), "the first report is 0 of the whole");
    assert_eq!(seen.last(), Some(&(want, want)), "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 == w[1].1), "{seen:?}");
    assert!(seen.len() > p.batches.len() + 1, "{} reports for {} batches", seen.len(), p.batches.len());
}

/// A sweep over part of a model (the options `layers` and `heads`): the chosen heads' sums
/// are those of the whole sweep (1e-5 relative: a chunk of fewer masks has fewer rows, and the
/// float32 products round with the row count); the others are not computed, and the progress
/// counts only the chosen ones.
#[test]
fn sweep_over_chosen_heads_equals_the_whole_sweep_there() {
    use headscope::analysis::ablation::sweep_acc;
    let m = common::asset("enpt", "f32");
    let p = prepare(&m, &data(4), Metric::Loss, 128, Gates::none()).unwrap();
    let kinds = [Kind::Enc, Kind::Cross];
    let all = sweep_acc(&m, &p, &kinds, None, &|| false, &mut |_, _| {}).unwrap();
    let only: Vec<HeadId> = [(Kind::Enc, 0, 1), (Kind::Enc, 5, 7), (Kind::Cross, 1, 0)]
        .iter()
        .map(|&(kind, layer_idx, head)| HeadId { kind, layer_idx, head })
        .collect();
    let mut seen: Vec<(usize, usize)> = Vec::new();
    let part = sweep_acc(&m, &p, &kinds, Some(&only), &|| false, &mut |d, t| seen.push((d, t))).unwrap();
    assert_eq!(seen.last(), Some(&(only.len() * p.n_sentences, only.len() * p.n_sentences)), "{seen:?}");
    let mut nonzero = 0;
    for ((ka, ga), (kp, gp)) in all.iter().zip(part.iter()) {
        assert_eq!(ka, kp);
        for (l, (ra, rp)) in ga.iter().zip(gp.iter()).enumerate() {
            for (h, (a, b)) in ra.iter().zip(rp.iter()).enumerate() {
                let id = HeadId { kind: *ka, layer_idx: l, head: h };
                if only.contains(&id) {
                    assert!((a.sum - b.sum).abs() <= 1e-5 * a.sum.abs(), "{id}: {} vs {}", a.sum, b.sum);
                    nonzero += 1;
                } else {
                    assert_eq!(b.sum, 0.0, "{id} was not chosen but was swept");
                }
            }
        }
    }
    assert_eq!(nonzero, only.len());
}

/// `ablate` of heads in the self-attention stack resumes the masked pass at the lowest masked
/// layer from the unmasked pass's input there: the same floats as two whole passes, for a
/// decoder LM and for an encoder-decoder's encoder, under loss, KL and cosine.
#[test]
fn ablate_resumed_at_the_lowest_layer_equals_two_whole_passes() {
    use headscope::analysis::ablation::{evaluate_acc, evaluate_closing};
    let lm = Model::load(&common::root().join("tests/fixtures/tiny_hf/gpt2"), Default::default()).unwrap();
    let enpt = common::asset("enpt", "f32");
    let cases: [(&Model, Metric, Vec<HeadId>); 4] = [
        (&lm, Metric::Loss, vec![HeadId { kind: Kind::Dec, layer_idx: 1, head: 2 }]),
        (
            &lm,
            Metric::Kl,
            vec![HeadId { kind: Kind::Dec, layer_idx: 1, head: 0 }, HeadId { kind: Kind::Dec, layer_idx: 1, head: 3 }],
        ),
        (&enpt, Metric::Loss, vec![HeadId { kind: Kind::Enc, layer_idx: 3, head: 1 }]),
        (&enpt, Metric::Cosine, vec![HeadId { kind: Kind::Enc, layer_idx: 4, head: 6 }]),
    ];
    for (m, metric, ids) in cases {
        let p = prepare(m, &data(5), metric, 128, Gates::none()).unwrap();
        let closed = m.gates_closing(&ids).unwrap();
        let from = ids.iter().map(|h| h.layer_idx).min();
        let (base, value) = evaluate_closing(m, &p, &closed, from, &|| false).unwrap();
        let want_base = evaluate_acc(m, &p, &p.base, &|| false).unwrap().value();
        let want = evaluate_acc(m, &p, &closed, &|| false).unwrap().value();
        assert!(
            (base.value() - want_base).abs() <= 1e-12 * want_base.abs(),
            "{metric}: base {} vs {want_base}",
            base.value()
        );
        assert!((value.value() - want).abs() <= 1e-12 * want.abs(), "{metric} {ids:?}: {} vs {want}", value.value());
        assert!((value.value() - base.value()).abs() > 1e-9, "{metric}: masking changed nothing");
    }
    // A base that closes a head below (its gates are ones at the layer resumed): the masked pass
    // resumes at that layer's contexts, still the floats of two whole passes.
    let below = HeadId { kind: Kind::Dec, layer_idx: 0, head: 1 };
    let p = prepare(&lm, &data(5), Metric::Loss, 128, lm.gates_closing(&[below]).unwrap()).unwrap();
    let closed = lm.gates_closing(&[below, HeadId { kind: Kind::Dec, layer_idx: 1, head: 2 }]).unwrap();
    let (base, value) = evaluate_closing(&lm, &p, &closed, Some(1), &|| false).unwrap();
    let want = evaluate_acc(&lm, &p, &closed, &|| false).unwrap().value();
    assert_eq!(base.value(), evaluate_acc(&lm, &p, &p.base, &|| false).unwrap().value());
    assert!((value.value() - want).abs() <= 1e-12 * want.abs(), "closed below: {} vs {want}", value.value());
}
