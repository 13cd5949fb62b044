//! Physically pruned models (layers of different widths, one layer emptied) run every analysis
//! and equal the original model with the same heads masked, head for head (within 1e-5);
//! removed heads are NaN in every grid. MiniLM (an encoder) and EN->PT (encoder, cross).

use crate::common;

use headscope::analysis::ablation::{evaluate, prepare, sweep, Metric};
use headscope::analysis::lrp::{lrp, LrpOptions, Rule, RuleSet, Seed};
use headscope::analysis::options::{Options, Stat};
use headscope::analysis::{analyze, freq_table};
use headscope::assets::asset_path;
use headscope::data::Dataset;
use headscope::model::nn::Gates;
use headscope::model::{HeadGrid, HeadId, Kind, Model};
use headscope::prune::physical::prune_heads;
use headscope::prune::{train, Hooks, PruneOptions};

const TOL: f64 = 1e-5;

fn h(kind: Kind, layer_idx: usize, head: usize) -> HeadId {
    HeadId { kind, layer_idx, head }
}

/// Every head of layer 2 of the stack, plus scattered heads (and cross heads for EN->PT).
fn uneven(model: &Model) -> Vec<HeadId> {
    let stack = model.net.stack_kind;
    let width = model.kind_shape(stack).unwrap().n_heads;
    let mut closed: Vec<HeadId> = (0..width).map(|i| h(stack, 2, i)).collect();
    closed.extend([h(stack, 0, 1), h(stack, 0, width - 1), h(stack, 4, 3)]);
    if model.kind_shape(Kind::Cross).is_ok() {
        closed.extend([h(Kind::Cross, 0, 2), h(Kind::Cross, 1, 0), h(Kind::Cross, 1, 7)]);
    }
    closed
}

/// `pruned` equals `masked` on the heads present; removed heads are NaN in `pruned`.
fn same_grid(what: &str, kind: Kind, masked: &HeadGrid, pruned: &HeadGrid, closed: &[HeadId], tol: f64) {
    assert_eq!(masked.len(), pruned.len(), "{what}: layers");
    for (l, (a, b)) in masked.iter().zip(pruned).enumerate() {
        assert_eq!(a.len(), b.len(), "{what}: width of layer {l}");
        for (hd, (x, y)) in a.iter().zip(b).enumerate() {
            if closed.contains(&h(kind, l, hd)) {
                assert!(y.is_nan(), "{what}: removed head {kind}.{l}.{hd} has a value {y}");
            } else {
                let scale = x.abs().max(1.0);
                assert!((x - y).abs() <= tol * scale, "{what}: head {kind}.{l}.{hd}: masked {x} vs pruned {y}");
            }
        }
    }
}

fn check_model(name: &str, metric: Metric) {
    let model = common::asset(name, "f32");
    let closed = uneven(&model);
    let pruned = prune_heads(&model, &closed, None).unwrap();
    let stack = model.net.stack_kind;
    assert_eq!(pruned.net.stack[2].attention().unwrap().n_heads, 0, "layer 2 is emptied");
    assert_eq!(
        pruned.kind_shape(stack).unwrap().n_heads,
        model.kind_shape(stack).unwrap().n_heads,
        "grids keep the original width"
    );
    let gates = model.gates_closing(&closed).unwrap();
    let kinds: Vec<Kind> = model.kinds().iter().map(|k| k.kind).collect();
    let never = || false;
    let quiet = &mut |_: usize, _: usize| {};

    // A removed head is refused by name.
    let e = pruned.check_head(h(stack, 2, 0)).unwrap_err().to_string();
    assert!(e.contains("was removed") && e.contains(&format!("{stack}.2.0")), "{e}");

    // analyze: every statistic, every kind.
    let tb = Dataset::treebank(&asset_path("pud_en.conllu").unwrap()).unwrap().take(12);
    let opts = Options::new(
        vec![Stat::Confidence, Stat::Positional, Stat::Rare, Stat::Syntactic],
        kinds.clone(),
        asset_path("brown.txt").unwrap(),
    );
    let freq = freq_table(&model, &opts.freq, opts.rare_top_n).unwrap();
    let a = analyze(&model, &tb, &opts, Some(&freq), &gates, &never, quiet).unwrap();
    let b = analyze(&pruned, &tb, &opts, Some(&freq), &Gates::none(), &never, quiet).unwrap();
    for (ka, kb) in a.kinds.iter().zip(&b.kinds) {
        let k = ka.kind;
        same_grid("confidence", k, ka.confidence.as_ref().unwrap(), kb.confidence.as_ref().unwrap(), &closed, TOL);
        let frac = |r: &Vec<Vec<headscope::analysis::result::PosHead>>| {
            r.iter().map(|l| l.iter().map(|p| p.fraction).collect()).collect::<HeadGrid>()
        };
        let off = |r: &Vec<Vec<headscope::analysis::result::PosHead>>| {
            r.iter()
                .map(|l| l.iter().map(|p| if p.fraction.is_nan() { f64::NAN } else { p.offset as f64 }).collect())
                .collect::<HeadGrid>()
        };
        same_grid(
            "positional fraction",
            k,
            &frac(ka.positional.as_ref().unwrap()),
            &frac(kb.positional.as_ref().unwrap()),
            &closed,
            TOL,
        );
        same_grid(
            "positional offset",
            k,
            &off(ka.positional.as_ref().unwrap()),
            &off(kb.positional.as_ref().unwrap()),
            &closed,
            0.0,
        );
        let (ra, rb) = (ka.rare.as_ref().unwrap(), kb.rare.as_ref().unwrap());
        same_grid("rare", k, &ra.score, &rb.score, &closed, TOL);
        if let (Some(sa), Some(sb)) = (&ka.syntactic, &kb.syntactic) {
            for (x, y) in sa.iter().zip(sb) {
                same_grid(&format!("syntactic {}", x.label), k, &x.accuracy, &y.accuracy, &closed, TOL);
            }
        }
    }

    // The single-head sweep of the pruned model equals masking each head alone on top of the
    // masked model; its reference (teacher targets, KL's and cosine's) is the model as given.
    let data = Dataset::corpus(&asset_path("pud_en.txt").unwrap()).unwrap().take(4);
    let p_pruned = prepare(&pruned, &data, metric, 256, Gates::none()).unwrap();
    let grids = sweep(&pruned, &p_pruned, &kinds, &never, quiet).unwrap();
    let p_masked = prepare(&model, &data, metric, 256, model.gates_closing(&closed).unwrap()).unwrap();
    for (k, grid) in &grids {
        let mut want: HeadGrid = Vec::new();
        for (l, row) in grid.iter().enumerate() {
            let mut r = Vec::new();
            for hd in 0..row.len() {
                let id = h(*k, l, hd);
                if closed.contains(&id) {
                    r.push(f64::NAN);
                    continue;
                }
                let mut all = closed.clone();
                all.push(id);
                r.push(evaluate(&model, &p_masked, &model.gates_closing(&all).unwrap(), &never).unwrap());
            }
            want.push(r);
        }
        same_grid(&format!("sweep ({metric})"), *k, &want, grid, &closed, TOL);
    }

    // LRP, both rules (the ab rule spreads W^O's bias over the open heads only). The z+ rule
    // divides by stabilised sums that cancel: in float32, float order alone (narrower
    // matrices sum in another order) moves it by ~1e-4 relative, so it is compared in float64.
    let (model64, name) = (common::asset(name, "f64"), name);
    let pruned64 = prune_heads(&model64, &closed, None).unwrap();
    let gates64 = model64.gates_closing(&closed).unwrap();
    for (rule, m, p, g) in [(Rule::Ab, &model, &pruned, &gates), (Rule::Zplus, &model64, &pruned64, &gates64)] {
        let o = LrpOptions {
            rule: rule.into(),
            seed: Some(if model.net.decoder.is_empty() { Seed::Norm } else { Seed::Logit }),
            per_prediction: false,
            batch_tokens: 256,
        };
        let a = lrp(m, &data, &o, g, &never, quiet).unwrap();
        let b = lrp(p, &data, &o, &Gates::none(), &never, quiet).unwrap();
        assert_eq!(a.kinds.len(), b.kinds.len());
        for ((k, ga), (_, gb)) in a.kinds.iter().zip(&b.kinds) {
            same_grid(&format!("lrp {rule:?} ({name})"), *k, ga, gb, &closed, TOL);
        }
        assert!(b.max_conservation_error < 1e-3, "lrp {rule:?} conservation {}", b.max_conservation_error);
    }

    // AttnLRP on the stack (signed and not conserved, so only the shares are compared): the
    // emptied layer hands out no contexts. A head's relevance sums signed terms that cancel,
    // which magnifies float32 order effects (~1e-3 on EN->PT), so it is compared in float64.
    let o = LrpOptions { rule: RuleSet::AttnLrp, seed: Some(Seed::Norm), per_prediction: false, batch_tokens: 256 };
    let a = lrp(&model64, &data, &o, &gates64, &never, quiet).unwrap();
    let b = lrp(&pruned64, &data, &o, &Gates::none(), &never, quiet).unwrap();
    for ((k, ga), (_, gb)) in a.kinds.iter().zip(&b.kinds) {
        same_grid(&format!("lrp attnlrp ({name})"), *k, ga, gb, &closed, TOL);
    }

    // Attention maps of a head in a narrowed layer.
    for head in [h(stack, 0, 2), h(stack, 4, 5)] {
        let text = "Researchers ask which heads matter.";
        let ma = model.attention_map(text, head, &gates).unwrap();
        let mb = pruned.attention_map(text, head, &Gates::none()).unwrap();
        assert_eq!(ma.query_tokens, mb.query_tokens);
        for (ra, rb) in ma.weights.iter().zip(&mb.weights) {
            for (x, y) in ra.iter().zip(rb) {
                assert!((x - y).abs() < TOL, "attention of {head}: {x} vs {y}");
            }
        }
    }
    assert!(pruned.attention_map("Hello.", h(stack, 2, 3), &Gates::none()).is_err());

    // Translation.
    if !model.net.decoder.is_empty() {
        let texts = ["The cat sat on the mat.", "Which heads matter, and how many can go?"];
        assert_eq!(model.translate(&texts, &gates, 64).unwrap(), pruned.translate(&texts, &Gates::none(), 64).unwrap());
    }

    // Pruning further: the pruned model, and the original with the same heads held closed.
    let mut o = PruneOptions::new(kinds.clone());
    (o.steps, o.lambda, o.batch_tokens) = (3, 0.05, 200);
    let ra = train(&model, &closed, &data, &o, Hooks { stop: &never, progress: &mut |_, _| {} }).unwrap();
    let rb = train(&pruned, &[], &data, &o, Hooks { stop: &never, progress: &mut |_, _| {} }).unwrap();
    for (x, y) in ra.state.curve.iter().zip(&rb.state.curve) {
        assert!(
            (x.loss - y.loss).abs() <= TOL * x.loss.abs().max(1.0),
            "prune loss at step {}: {} vs {}",
            x.step,
            x.loss,
            y.loss
        );
        assert!(
            (x.expected_open - y.expected_open).abs() <= TOL * x.expected_open.max(1.0),
            "expected open: {} vs {}",
            x.expected_open,
            y.expected_open
        );
        assert_eq!(x.open, y.open);
    }
    for (x, y) in ra.p_open().iter().zip(rb.p_open()) {
        assert!((x - y).abs() < TOL, "P(open): {x} vs {y}");
    }
    for id in &closed {
        assert!(rb.closed().contains(id), "{id} was removed, its gate must stay closed");
    }
}

#[test]
fn pruned_minilm_equals_masked_minilm() {
    let _rng = common::rng();
    check_model("minilm", Metric::Cosine);
}

#[test]
fn pruned_enpt_equals_masked_enpt() {
    let _rng = common::rng();
    check_model("enpt", Metric::Loss);
}
