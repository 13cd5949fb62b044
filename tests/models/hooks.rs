//! The trace's hook points (docs/methods.md#hook-points) against HF transformers, read off the
//! checkpoints' own modules by `fixtures/hooks_reference.py` (`fixtures/hooks_golden.npz`):
//! every recorded value at its place, interventions against forward pre-hooks, zeroing
//! `hook_z` against masking, generation with the key/value cache against without it, and bad
//! hook input.

use crate::common;
use crate::common::{fixtures, max_diff};

use headscope::model::hooks::{to_tl_axes, At, Intervention, Interventions, Op, Point};
use headscope::model::nn::Gates;
use headscope::model::transformer::Stop;
use headscope::model::{HeadId, Kind, LoadOptions, Model};
use std::collections::HashMap;
use std::path::PathBuf;
use tch::{Kind as DType, Tensor};

const MODELS: [&str; 4] = ["gpt2", "llama", "marian", "bert"];

/// The tiny checkpoint of `name` in `dtype` (bert: the LRP fixtures' BERT).
fn checkpoint(name: &str, dtype: &str) -> Model {
    common::load(
        &if name == "bert" { fixtures().join("lrp_tiny/bert") } else { common::tiny_hf_dir().join(name) },
        dtype,
    )
}

/// One pass over the golden's ids (and targets, teacher-forced) with `hooks`: the model's
/// output (logits `[T, V]`, or an encoder's last hidden state `[T, D]`).
fn run(
    m: &Model,
    g: &HashMap<String, Tensor>,
    name: &str,
    gates: &Gates,
    hooks: &mut dyn headscope::model::hooks::Hooks,
) -> Tensor {
    let _g = tch::no_grad_guard();
    let ids = g[&format!("{name}/ids")].view([1, -1]);
    let mask = Tensor::ones(ids.size(), (DType::Float, tch::Device::Cpu));
    let enc = m.net.encode(&ids, &mask, gates, Some(&mut *hooks)).unwrap();
    if m.translates() {
        let targets = g[&format!("{name}/targets")].view([1, -1]);
        return m.net.teacher(&enc, &mask, &targets, Stop::Logits, gates, Some(hooks)).unwrap().get(0);
    }
    match &m.net.output {
        Some(_) => m.net.logits_hooked(&enc, &mut Some(hooks)).unwrap().get(0),
        None => enc.get(0),
    }
}

#[test]
fn every_hook_point_equals_transformers_at_its_place() {
    let g = common::golden("hooks_golden.npz");
    for name in MODELS {
        let m = checkpoint(name, "f32");
        let (seen, _) = common::recorded(&[], |r| run(&m, &g, name, &Gates::none(), r));
        let all = m.hook_points();
        let mut ours: HashMap<String, Tensor> = HashMap::new();
        for (at, t) in &seen {
            assert!(all.contains(at), "{name}: {at} was recorded but is not in hook_points()");
            ours.insert(at.to_string(), to_tl_axes(at.point, &t.get(0)));
        }
        let prefix = format!("{name}/");
        let mut compared = 0;
        let mut worst = (0.0f64, String::new());
        for (key, want) in &g {
            let Some(hook) = key.strip_prefix(&prefix) else { continue };
            if ["ids", "targets", "add_vec"].contains(&hook) || hook.starts_with("add_out/") {
                continue;
            }
            let got = ours.get(hook).unwrap_or_else(|| panic!("{name}: {hook} was not recorded"));
            assert_eq!(
                got.size(),
                want.size(),
                "{name}: {hook} has shape {:?}, transformers {:?}",
                got.size(),
                want.size()
            );
            // Scores: only where the mask lets a key through (the golden holds NaN elsewhere).
            let keep = want.isnan().logical_not();
            let (a, b) = (got.masked_select(&keep), want.masked_select(&keep));
            let scale = b.abs().max().double_value(&[]).max(1.0);
            let d = max_diff(&a, &b) / scale;
            assert!(
                d < 1e-5,
                "{name}: {hook} differs from transformers by {d:e} (relative to its largest value {scale})"
            );
            if d > worst.0 {
                worst = (d, hook.to_string());
            }
            compared += 1;
        }
        let want_points = if name == "marian" { 50 } else { 20 };
        assert!(compared >= want_points, "{name}: only {compared} hook points compared");
        eprintln!(
            "{name}: {compared} hook points equal transformers; largest difference {:.1e} at {}",
            worst.0, worst.1
        );
    }
}

#[test]
fn adding_at_resid_pre_equals_a_forward_pre_hook_in_float64() {
    let g = common::golden("hooks_golden.npz");
    for name in MODELS {
        let m = checkpoint(name, "f64");
        let vec = g[&format!("{name}/add_vec")].shallow_clone();
        let mut checked = 0;
        for (key, want) in &g {
            let Some(hook) = key.strip_prefix(&format!("{name}/add_out/")) else { continue };
            let at = m.hook_point(hook).unwrap();
            let mut iv = Interventions {
                list: vec![Intervention {
                    at,
                    op: Op::Add(vec.shallow_clone()),
                    heads: None,
                    positions: None,
                    rows: None,
                }],
            };
            let got = run(&m, &g, name, &Gates::none(), &mut iv);
            let plain = run(&m, &g, name, &Gates::none(), &mut Interventions::default());
            let d = max_diff(&got, want);
            assert!(d < 1e-6, "{name}: adding at {hook} differs from transformers' pre-hook by {d:e}");
            assert!(max_diff(&plain, want) > 1e-3, "{name}: the addition at {hook} must change the output");
            eprintln!("{name}: adding at {hook} equals transformers' pre-hook within {d:.1e} (float64)");
            checked += 1;
        }
        assert!(checked >= 1, "{name}: no intervention golden");
    }
}

#[test]
fn zeroing_a_heads_z_equals_masking_it_exactly() {
    let g = common::golden("hooks_golden.npz");
    for name in MODELS {
        let m = checkpoint(name, "f64");
        for s in m.kinds() {
            let head = HeadId { kind: s.kind, layer_idx: s.n_layers - 1, head: 1 };
            let masked = run(&m, &g, name, &m.gates_closing(&[head]).unwrap(), &mut Interventions::default());
            let at = At::new(s.kind, head.layer_idx, Point::Z);
            let mut iv = Interventions {
                list: vec![Intervention {
                    at,
                    op: Op::Replace(Tensor::from(0.0)),
                    heads: Some(vec![1]),
                    positions: None,
                    rows: None,
                }],
            };
            let zeroed = run(&m, &g, name, &Gates::none(), &mut iv);
            let plain = run(&m, &g, name, &Gates::none(), &mut Interventions::default());
            assert!(
                zeroed.equal(&masked),
                "{name}: zeroing {at} for head 1 differs from masking {head} by {:e}",
                max_diff(&zeroed, &masked)
            );
            assert!(!plain.equal(&masked), "{name}: masking {head} must change the output");
        }
    }
}

#[test]
fn generation_with_the_key_value_cache_equals_generation_without_it() {
    let _heavy = common::heavy();
    let tiny = fixtures().join("tiny_hf");
    let mut cases: Vec<(PathBuf, usize)> =
        ["gpt2", "llama", "qwen2", "mistral"].iter().map(|n| (tiny.join(n), 24)).collect();
    cases.push((headscope::assets::asset_path("smollm2").unwrap(), 12));
    for (dir, n) in cases {
        let m = Model::load(&dir, LoadOptions::new(headscope::device::DeviceChoice::Cpu, "f32").unwrap()).unwrap();
        for text in ["The cat sat on the mat because", "Where is"] {
            let cached = m.generate_with(text, n, &Gates::none(), true).unwrap();
            let plain = m.generate_with(text, n, &Gates::none(), false).unwrap();
            assert_eq!(cached, plain, "{}: {text:?}", dir.display());
            assert!(!cached.is_empty(), "{}: nothing generated", dir.display());
        }
        // Under a mask too.
        let head = HeadId { kind: Kind::Dec, layer_idx: 0, head: 0 };
        let gates = m.gates_closing(&[head]).unwrap();
        assert_eq!(
            m.generate_with("Where is", n, &gates, true).unwrap(),
            m.generate_with("Where is", n, &gates, false).unwrap()
        );
    }
}

/// Bad hook input from a script: an unknown name, a value that does not fit, a head or a
/// position out of range, an unknown intervention key: one-line errors naming the argument and
/// what is valid, and the session goes on.
#[test]
fn bad_hook_input_is_a_one_line_error_and_the_session_survives() {
    let dir = fixtures().join("tiny_hf/gpt2");
    let script = format!(
        r#"let m = load_model("{}", #{{device: "cpu"}});
let bad = [
  #{{names: ["dec.blocks.0.attn.hook_patern"]}},
  #{{names: ["dec.blocks.7.hook_resid_pre"]}},
  #{{interventions: [#{{hook: "dec.blocks.0.hook_resid_pre", add: [1.0, 2.0, 3.0]}}]}},
  #{{interventions: [#{{hook: "dec.blocks.0.attn.hook_z", replace: 0.0, heads: [9]}}]}},
  #{{interventions: [#{{hook: "dec.blocks.0.attn.hook_z", replace: 0.0, positions: [99]}}]}},
  #{{interventions: [#{{hook: "dec.blocks.0.attn.hook_z", replace: 0.0, head: [1]}}]}},
  #{{interventions: [#{{hook: "enc.blocks.0.hook_resid_pre", scale: 2.0}}]}},
];
for o in bad {{ try {{ m.run_with_cache("the cat", o); print("no error"); }} catch (e) {{ print(e); }} }}
print(m.run_with_cache("the cat", ["ln_final.hook_normalized"]).keys());"#,
        dir.display()
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_headscope")).args(["-e", &script]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 8, "{stdout}");
    let want = [
        "unknown point 'attn.hook_patern'",
        "layer 7 out of range: gpt2 has dec layers 0..1",
        "does not fit the point's shape [pos, d_model]",
        "head 9 out of range 0..3",
        "position 99 out of range 0..",
        "unknown key 'head' (valid keys: hook, replace, add, scale, heads, positions, rows)",
        "gpt2 has 'hook_resid_pre' for dec only",
    ];
    for (line, w) in lines.iter().zip(want) {
        assert!(line.starts_with("run_with_cache: ") && line.contains(w), "expected '{w}' in: {line}");
    }
    assert_eq!(lines[7], r#"["dec.ln_final.hook_normalized"]"#);
}

/// The forward checks the run's interrupt at every layer (`model::check_interrupt`): an
/// interrupt raised while layer 1 runs (here by a hook at its `hook_resid_mid`) stops the pass
/// before layer 2, with `ModelError::Interrupted`, in an encoder and in a translation decoder;
/// the same pass outside a run, or with the interrupt reset, runs to the end.
#[test]
fn an_interrupt_stops_the_forward_at_the_next_layer() {
    use headscope::model::hooks::{Hooks, Record};
    use headscope::model::ModelError;
    use headscope::run::{enter, Context, Interrupt};
    let g = common::golden("hooks_golden.npz");
    for (name, kind) in [("bert", Kind::Enc), ("gpt2", Kind::Dec), ("marian", Kind::Dec)] {
        let m = checkpoint(name, "f32");
        let interrupt = Interrupt::default();
        let _ctx = enter(Context {
            interrupt: interrupt.clone(),
            progress: std::rc::Rc::new(|_, _, _| {}),
            warn: std::rc::Rc::new(|_| {}),
        });
        let mut layers = Vec::new();
        let trigger = interrupt.clone();
        let mut on = |at: At, _: &Tensor| {
            if at.kind == kind {
                layers.push(at.layer);
                if at.layer == 0 && at.point == Point::ResidMid {
                    trigger.trigger();
                }
            }
            Ok(())
        };
        let mut rec = Record::new(&[Point::ResidPre, Point::ResidMid], &mut on);
        let hooks: &mut dyn Hooks = &mut rec;
        let _ng = tch::no_grad_guard();
        let ids = g[&format!("{name}/ids")].view([1, -1]);
        let mask = Tensor::ones(ids.size(), (DType::Float, tch::Device::Cpu));
        let err = if m.translates() {
            let enc = m.net.encode(&ids, &mask, &Gates::none(), None).unwrap();
            let targets = g[&format!("{name}/targets")].view([1, -1]);
            m.net.teacher(&enc, &mask, &targets, Stop::Logits, &Gates::none(), Some(hooks)).err()
        } else {
            m.net.encode(&ids, &mask, &Gates::none(), Some(hooks)).err()
        };
        assert!(matches!(err, Some(ModelError::Interrupted)), "{name}: {err:?}");
        assert!(
            m.net.stack.len().max(m.net.decoder.len()) >= 2,
            "{name}: the fixture has too few layers for this test"
        );
        assert_eq!(layers, vec![0, 0], "{name}: layer 0's resid_pre and resid_mid, then nothing");
        interrupt.reset();
        assert!(
            m.net.encode(&ids, &mask, &Gates::none(), None).is_ok(),
            "{name}: a reset interrupt still stops the pass"
        );
    }
    // Outside a run, nothing is interrupted.
    let m = checkpoint("bert", "f32");
    let ids = g["bert/ids"].view([1, -1]);
    let mask = Tensor::ones(ids.size(), (DType::Float, tch::Device::Cpu));
    assert!(m.net.encode(&ids, &mask, &Gates::none(), None).is_ok());
}

/// An SSRU decoder (Marian `.bin`, `fixtures/lrp_tiny/marian`) has its own hook points
/// (`dec.blocks.L.ssru.hook_forget|hook_candidate|hook_cell`): recorded, they are the
/// recurrence `c_t = f_t c_(t-1) + (1 - f_t) u_t` from a zero state, by hand, and the block's
/// output `hook_attn_out` is `relu(c)`; written, the recurrence reads the new value (a zero
/// candidate leaves every cell 0).
#[test]
fn ssru_hook_points_are_the_recurrence_and_can_be_written() {
    let m = common::load(&fixtures().join("lrp_tiny/marian"), "f64");
    let _g = tch::no_grad_guard();
    let ids = Tensor::from_slice(&[5i64, 9, 12, 7, 2]).view([1, -1]);
    let targets = Tensor::from_slice(&[6i64, 11, 4, 2]).view([1, -1]);
    let mask = Tensor::ones(ids.size(), (DType::Float, tch::Device::Cpu));
    let teach = |hooks: &mut dyn headscope::model::hooks::Hooks| {
        let enc = m.net.encode(&ids, &mask, &Gates::none(), None).unwrap();
        m.net.teacher(&enc, &mask, &targets, Stop::Logits, &Gates::none(), Some(hooks)).unwrap()
    };
    let (seen, plain) = common::recorded(&[], teach);
    let all = m.hook_points();
    for (at, _) in &seen {
        assert!(all.contains(at), "{at} was recorded but is not in hook_points()");
    }
    let get = |l: usize, p: Point| {
        seen.iter()
            .find(|(a, _)| *a == At::new(Kind::Dec, l, p))
            .unwrap_or_else(|| panic!("dec layer {l}: {p:?} not recorded"))
            .1
            .shallow_clone()
    };
    for l in 0..m.net.decoder.len() {
        let (f, u, c) = (get(l, Point::SsruForget), get(l, Point::SsruCandidate), get(l, Point::SsruCell));
        assert!(
            f.min().double_value(&[]) > 0.0 && f.max().double_value(&[]) < 1.0,
            "layer {l}: the forget gate is a sigmoid"
        );
        let mut prev = c.select(1, 0).zeros_like();
        for t in 0..c.size()[1] {
            let want = f.select(1, t) * &prev + (f.select(1, t).ones_like() - f.select(1, t)) * u.select(1, t);
            assert!(max_diff(&c.select(1, t), &want) < 1e-12, "layer {l} step {t}: the cell is not the recurrence");
            prev = want;
        }
        assert!(get(l, Point::AttnOut).equal(&c.relu()), "layer {l}: hook_attn_out is relu(hook_cell)");
    }
    let at = At::new(Kind::Dec, 0, Point::SsruCandidate);
    let mut iv = Interventions {
        list: vec![Intervention { at, op: Op::Replace(Tensor::from(0.0)), heads: None, positions: None, rows: None }],
    };
    let (seen0, zeroed) = common::recorded(&[Point::SsruCell], |r| {
        let mut both = headscope::model::hooks::Both(&mut iv, r);
        teach(&mut both)
    });
    let cell0 = &seen0.iter().find(|(a, _)| a.layer == 0).unwrap().1;
    assert_eq!(cell0.abs().max().double_value(&[]), 0.0, "a zero candidate leaves every cell of layer 0 at 0");
    assert!(!zeroed.equal(&plain), "zeroing layer 0's candidate must change the logits");
}

/// Every model directory of the tests' fixtures (tiny checkpoints of every family, transformers 5
/// layouts, GGUF files, the LRP fixtures' BERT and Marian `.bin`) and the small assets.
fn every_fixture_model() -> Vec<PathBuf> {
    let mut dirs = vec![];
    for parent in [common::tiny_hf_dir(), fixtures().join("tiny_hf_tf5"), fixtures().join("lrp_tiny")] {
        for e in std::fs::read_dir(&parent).unwrap() {
            let p = e.unwrap().path();
            let holds_model = std::fs::read_dir(&p).is_ok_and(|r| {
                r.flatten().any(|f| {
                    let n = f.file_name().to_string_lossy().into_owned();
                    n == "config.json" || n.ends_with(".gguf") || n.ends_with(".npz") || n == "decoder.yml"
                })
            });
            // Tokenizer fixtures, not models: t5_tokenizer_gguf; nllb_spm, whose NllbTokenizer
            // without tokenizer.json is not read yet (fixtures/M2M100_SPM_NOTES.md).
            if p.is_dir() && holds_model && !p.ends_with("t5_tokenizer_gguf") && !p.ends_with("nllb_spm") {
                dirs.push(p);
            }
        }
    }
    dirs.sort();
    for a in ["minilm", "enpt", "smollm2"] {
        dirs.push(headscope::assets::asset_path(a).unwrap());
    }
    dirs
}

/// `Model::hook_points` is exactly what one run visits (run_with_cache: the stack, a decoder
/// teacher-forced, the logits), each point once, on every model of the tests.
#[test]
fn hook_points_are_what_one_run_visits_on_every_family() {
    let (mut checked, mut failed) = (0, vec![]);
    for dir in every_fixture_model() {
        let m = match Model::load(&dir, LoadOptions::default()) {
            Ok(m) => m,
            Err(e) => {
                failed.push(format!("{}: {e}", dir.display()));
                continue;
            }
        };
        let listed = m.hook_points();
        let seen: Vec<At> = m
            .run_with_cache("The cat sat on the mat.", &Gates::none(), &|_| true, None)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .into_iter()
            .map(|(at, _)| at)
            .collect();
        let name = dir.display();
        let mut unique = seen.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), seen.len(), "{name}: a point was visited twice");
        let mut want = listed.clone();
        want.sort();
        assert_eq!(want.len(), listed.len(), "{name}: hook_points() lists a point twice");
        let missing: Vec<String> = want.iter().filter(|a| !unique.contains(a)).map(|a| a.to_string()).collect();
        let extra: Vec<String> = unique.iter().filter(|a| !want.contains(a)).map(|a| a.to_string()).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{name}: listed, never visited {missing:?}; visited, not listed {extra:?}"
        );
        assert!(m.net.output.is_none() || seen.last() == Some(&m.net.logits_at()), "{name}: the logits come last");
        checked += 1;
    }
    println!("{checked} models: hook_points() is what one run visits");
    assert!(failed.is_empty(), "did not load:\n{}", failed.join("\n"));
    assert!(checked >= 60, "only {checked} models checked");
}

/// `hook_logits` is the one unembedding: what a run records there is what `logits` returns,
/// soft-capped once on Gemma 2 (final cap 3: every recorded logit within it), and equal to
/// transformers' logits; a replacement written there is what the run returns.
#[test]
fn hook_logits_is_the_soft_capped_unembedding() {
    let g = common::golden("tiny_hf/golden_2026.npz");
    let m = common::tiny_hf("gemma2", "f32");
    let text = common::short_pud_sentences(1).remove(0);
    let at = m.hook_point("hook_logits").unwrap();
    assert_eq!(at, m.net.logits_at());
    let seen = m.run_with_cache(&text, &Gates::none(), &|a| a == at, None).unwrap();
    assert_eq!(seen.len(), 1);
    let recorded = &seen[0].1;
    let want = &g["gemma2_logits_0"];
    let depth = common::depth(&m, recorded.size()[0] as usize);
    let d = max_diff(recorded, want) / common::f32_bound(common::scale(want), depth);
    assert!(d <= 1.0, "hook_logits is {d:.3} of the float32 bound from transformers' logits");
    assert!(recorded.abs().max().double_value(&[]) <= 3.0, "the final soft-cap (3) was not applied");
    let ids = Tensor::from_slice(&m.tokenize(&text).unwrap().ids).view([1, -1]);
    let mask = Tensor::ones(ids.size(), (DType::Float, tch::Device::Cpu));
    let _g = tch::no_grad_guard();
    let states = m.net.encode(&ids, &mask, &Gates::none(), None).unwrap();
    assert_eq!(max_diff(&m.net.logits(&states).unwrap().get(0), recorded), 0.0, "logits() differs from the trace");
    // The cap bites on this sentence, and is applied once: 3 tanh(l / 3) of the projection.
    let raw = m.net.logits_before_cap(&states).unwrap().get(0);
    assert!(raw.abs().max().double_value(&[]) > 3.5, "no logit beyond the cap: the test would not see it");
    assert!(max_diff(&((&raw / 3.0).tanh() * 3.0), recorded) < 1e-6, "hook_logits is not 3 tanh(l / 3)");
    // Written: the run returns the replacement.
    let mut zero = Interventions::default();
    zero.list.push(Intervention { at, op: Op::Scale(0.0), heads: None, positions: None, rows: None });
    let out = m.net.logits_hooked(&states, &mut Some(&mut zero)).unwrap();
    assert_eq!(out.abs().max().double_value(&[]), 0.0, "the replacement at hook_logits was not returned");
}
