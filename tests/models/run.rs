//! The run API (`Transformer::run` for the stack, `Transformer::decode` for a translation
//! model's decoder): every start and stop on the families' layer shapes, each resumption equal to
//! the whole run bit for bit, and bad starts and stops refused in one line.

use crate::common;
use headscope::model::hooks::{At, Point};
use headscope::model::nn::Gates;
use headscope::model::transformer::{DecStart, Start, Stop};
use headscope::model::Model;
use tch::{Kind as DType, Tensor};

/// Pre-norm (llama), parallel (pythia), post-sublayer norms (olmo2), four norms with soft-caps
/// (gemma2), GPT-2's learned positions, and a post-norm encoder (the LRP fixtures' BERT).
fn models() -> Vec<(String, Model)> {
    let mut v: Vec<(String, Model)> = ["llama", "pythia", "olmo2", "gemma2", "gpt2"]
        .iter()
        .map(|n| (n.to_string(), common::tiny_hf(n, "f32")))
        .collect();
    v.push(("bert".into(), common::load(&common::fixtures().join("lrp_tiny/bert"), "f32")));
    v
}

#[test]
fn every_start_and_stop_equals_the_whole_run() {
    let _g = tch::no_grad_guard();
    for (name, m) in models() {
        let ids = Tensor::from_slice(&m.tokenize("The cat sat on the mat.").unwrap().ids).view([1, -1]);
        let mask = Tensor::ones(ids.size(), (DType::Float, tch::Device::Cpu));
        let gates = Gates::none();
        let n = m.net.stack.len();
        // The whole run, with every layer's input and hook_z recorded.
        let (seen, whole) = common::recorded(&[Point::ResidPre, Point::Z], |h| {
            m.net.run(Start::Tokens { ids: &ids, mask: &mask }, Stop::FinalNorm, &gates, &mut Some(h)).unwrap()
        });
        assert_eq!(common::max_diff(&whole, &m.net.encode(&ids, &mask, &gates, None).unwrap()), 0.0, "{name}: encode");
        let kind = m.net.stack_kind;
        let value =
            |l: usize, p: Point| seen.iter().find(|(a, _)| *a == At::new(kind, l, p)).unwrap().1.shallow_clone();
        let bias = m.net.self_bias(&mask, DType::Float);
        for l in 0..n {
            // To after layer l, then on from layer l + 1: the whole run.
            let upto = m.net.run(Start::Tokens { ids: &ids, mask: &mask }, Stop::After(l), &gates, &mut None).unwrap();
            let next = if l + 1 < n { value(l + 1, Point::ResidPre) } else { upto.shallow_clone() };
            assert_eq!(common::max_diff(&upto, &next), 0.0, "{name}: stop after layer {l}");
            let rest = m.net.run(
                Start::Layer { layer: l + 1, x: &upto, bias: Some(&bias) },
                Stop::FinalNorm,
                &gates,
                &mut None,
            );
            assert_eq!(common::max_diff(&rest.unwrap(), &whole), 0.0, "{name}: resumed at layer {}", l + 1);
            // No bias given: the rows are unpadded, and the run makes the same bias itself.
            let rest =
                m.net.run(Start::Layer { layer: l + 1, x: &upto, bias: None }, Stop::FinalNorm, &gates, &mut None);
            assert_eq!(
                common::max_diff(&rest.unwrap(), &whole),
                0.0,
                "{name}: resumed at layer {} without a bias",
                l + 1
            );
            // Resumed at layer l's hook_z.
            let x = value(l, Point::ResidPre);
            let z = value(l, Point::Z);
            let from_z =
                m.net.run(Start::Z { layer: l, x: &x, z: &z, bias: Some(&bias) }, Stop::FinalNorm, &gates, &mut None);
            assert_eq!(common::max_diff(&from_z.unwrap(), &whole), 0.0, "{name}: resumed at layer {l}'s hook_z");
        }
        // The logits: the unembedding of the final norm.
        if m.net.output.is_some() {
            let l = m.net.run(Start::Tokens { ids: &ids, mask: &mask }, Stop::Logits, &gates, &mut None).unwrap();
            assert_eq!(common::max_diff(&l, &m.net.logits(&whole).unwrap()), 0.0, "{name}: Stop::Logits");
        }
        // Bad starts and stops: one line naming the layer.
        let x = value(0, Point::ResidPre);
        let e = m
            .net
            .run(Start::Layer { layer: n + 1, x: &x, bias: Some(&bias) }, Stop::FinalNorm, &gates, &mut None)
            .unwrap_err();
        assert!(e.to_string().contains(&format!("layer {} out of range", n + 1)), "{name}: {e}");
        let e = m
            .net
            .run(Start::Layer { layer: 1, x: &x, bias: Some(&bias) }, Stop::After(0), &gates, &mut None)
            .unwrap_err();
        assert!(e.to_string().contains("cannot stop after layer 0"), "{name}: {e}");
        let e = m.net.run(Start::Tokens { ids: &ids, mask: &mask }, Stop::After(n), &gates, &mut None).unwrap_err();
        assert!(
            e.to_string().contains(&format!("layer {n} out of range")) && !e.to_string().contains('\n'),
            "{name}: {e}"
        );
    }
}

/// The decoder's run: teacher forcing to each stop, a resume at every layer's cross-attention
/// `hook_z` (post-norm Marian, pre-norm M2M100 with a final decoder norm, T5's relative bias)
/// equal to the whole run bit for bit, a repeated source equal to the source of repeated rows
/// (within float32 rounding: twice the rows may take other kernels), and bad starts and stops
/// one line each.
#[test]
fn every_decoder_start_and_stop_equals_the_whole_run() {
    let _g = tch::no_grad_guard();
    for name in ["marian", "m2m100", "t5"] {
        let m = common::tiny_hf(name, "f32");
        // Two sources of different lengths (the shorter padded), so that rows cannot be mixed
        // up unnoticed.
        let b = m.batch(&["The cat sat on the mat near the door.", "A dog."]).unwrap();
        let (ids, mask) = (&b.ids, &b.mask);
        let tgt = Tensor::from_slice(&[5i64, 9, 7, 3, 8, 6, 4, 2]).view([2, 4]);
        let gates = Gates::none();
        let enc = m.net.encode(ids, mask, &gates, None).unwrap();
        let src = m.net.source(&enc, mask, &mut None).unwrap();
        let n = m.net.decoder.len();
        let (seen, whole) = common::recorded(&[Point::ResidPre, Point::Ln1, Point::ResidMid, Point::Z], |h| {
            m.net.decode(DecStart::Targets(&tgt), Stop::FinalNorm, &src, &gates, &mut Some(h)).unwrap()
        });
        let teacher = m.net.teacher(&enc, mask, &tgt, Stop::FinalNorm, &gates, None).unwrap();
        assert_eq!(common::max_diff(&teacher, &whole), 0.0, "{name}: teacher");
        let logits = m.net.teacher(&enc, mask, &tgt, Stop::Logits, &gates, None).unwrap();
        assert_eq!(common::max_diff(&logits, &m.net.logits(&whole).unwrap()), 0.0, "{name}: Stop::Logits");
        let last = m.net.decode(DecStart::Targets(&tgt), Stop::After(n - 1), &src, &gates, &mut None).unwrap();
        assert_eq!(common::max_diff(&last, &whole), 0.0, "{name}: stop after the last layer");
        let value = |at: At| seen.iter().find(|(a, _)| *a == at).map(|(_, v)| v.shallow_clone());
        let twice = src.repeat(2);
        for l in 0..n {
            let x = value(At::new(headscope::model::Kind::Dec, l, m.net.decoder[l].cross_resume_point())).unwrap();
            let z = value(At::new(headscope::model::Kind::Cross, l, Point::Z)).unwrap();
            let from_z =
                m.net.decode(DecStart::CrossZ { layer: l, x: &x, z: &z }, Stop::FinalNorm, &src, &gates, &mut None);
            assert_eq!(common::max_diff(&from_z.unwrap(), &whole), 0.0, "{name}: resumed at layer {l}'s cross hook_z");
            // The batch twice over the repeated source (rows `r` and `r + B`): each block the
            // whole run.
            let rows = m
                .net
                .decode(
                    DecStart::CrossZ { layer: l, x: &x.repeat([2, 1, 1]), z: &z.repeat([2, 1, 1, 1]) },
                    Stop::FinalNorm,
                    &twice,
                    &gates,
                    &mut None,
                )
                .unwrap();
            // A batch of twice the rows may take other BLAS kernels (another blocking, another
            // summation order): under ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU, MarianMT's
            // block 0 differs from the whole run by 9.5e-7 (one float32 step of the stream's
            // largest values); elsewhere 0. The float32 bound of the run's values holds both.
            let bound = common::f32_bound(common::scale(&whole), common::depth(&m, 8));
            for r in 0..2 {
                let d = common::max_diff(&rows.narrow(0, 2 * r, 2), &whole);
                assert!(d <= bound, "{name}: block {r} of layer {l}: {d:e} over the float32 bound {bound:e}");
            }
            if l + 1 < n {
                // Stopping after layer l, then on: the stream a resume above would read.
                let upto = m.net.decode(DecStart::Targets(&tgt), Stop::After(l), &src, &gates, &mut None).unwrap();
                let next = value(At::new(headscope::model::Kind::Dec, l + 1, Point::ResidPre)).unwrap();
                assert_eq!(common::max_diff(&upto, &next), 0.0, "{name}: stop after layer {l}");
            }
        }
        // Bad starts and stops: one line naming the layer.
        let x = value(At::new(headscope::model::Kind::Dec, 0, m.net.decoder[0].cross_resume_point())).unwrap();
        let z = value(At::new(headscope::model::Kind::Cross, 0, Point::Z)).unwrap();
        let e = m.net.decode(DecStart::CrossZ { layer: n, x: &x, z: &z }, Stop::FinalNorm, &src, &gates, &mut None);
        let e = e.unwrap_err().to_string();
        assert!(e.contains(&format!("decoder layer {n} out of range")) && !e.contains('\n'), "{name}: {e}");
        let e = m.net.decode(DecStart::Targets(&tgt), Stop::After(n), &src, &gates, &mut None).unwrap_err();
        assert!(e.to_string().contains(&format!("decoder layer {n} out of range")), "{name}: {e}");
        if n > 1 {
            let mut state = m.net.start_state();
            let step = DecStart::Step { prev: None, state: &mut state };
            let e = m.net.decode(step, Stop::After(0), &src, &gates, &mut None).unwrap_err().to_string();
            assert!(e.contains("a decoder step runs every layer"), "{name}: {e}");
            let resume = DecStart::CrossZ { layer: 1, x: &x, z: &z };
            let e = m.net.decode(resume, Stop::After(0), &src, &gates, &mut None).unwrap_err();
            assert!(e.to_string().contains("cannot stop after layer 0"), "{name}: {e}");
        }
    }
}
