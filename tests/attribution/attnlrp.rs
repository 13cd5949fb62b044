//! AttnLRP (docs/methods.md#attnlrp) against LXT 2.1: `tests/fixtures/attnlrp_reference.py`
//! runs LXT's efficient AttnLRP patches on transformers' BertModel (MiniLM; seed: the final
//! hidden states with relevance h * h) and LlamaForCausalLM (SmolLM2 exported from its GGUF;
//! seed: the last position's top-1 logit), one sentence per backward, and records every input
//! token's and every head's relevance (`attnlrp_minilm.json`, `attnlrp_smollm2.json`).
//! headscope's must equal them within 1e-3 of each grid's largest magnitude (float32 noise moves
//! tiny entries by more than 1e-3 of themselves; see tests/fixtures/ATTNLRP_NOTES.md).

use crate::common::{self, root};

use headscope::analysis::attnlrp::relevance;
use headscope::analysis::lrp::Seed;
use headscope::device::DeviceChoice;
use headscope::model::nn::Gates;
use tch::{Device, Kind as DType, Tensor};

const TOL: f64 = 1e-3;

fn vec1(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(DType::Double).to_device(Device::Cpu).reshape([-1])).unwrap()
}

/// `|a - b| <= TOL * max |b|` over a grid; returns the worst ratio.
fn close(what: &str, got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs() / scale).fold(0f64, f64::max);
    assert!(worst <= TOL, "{what}: headscope {got:?}\nLXT {want:?}\nworst {worst:.2e} of the largest");
    worst
}

fn check(model: &str, dir: &str, seed: Seed, device: DeviceChoice) -> f64 {
    let m = common::load_on(&root().join(dir), device, "f32");
    let text = std::fs::read_to_string(root().join(format!("tests/fixtures/attnlrp_{model}.json"))).unwrap();
    let golden: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut worst: f64 = 0.0;
    for (i, s) in golden["sentences"].as_array().unwrap().iter().enumerate() {
        let ids: Vec<i64> = s["token_ids"].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect();
        let e = m.tokenize(s["text"].as_str().unwrap()).unwrap();
        assert_eq!(e.ids, ids, "{model} sentence {i}: token ids");
        let t = ids.len() as i64;
        let dev = m.device();
        let ids = Tensor::from_slice(&ids).view([1, t]).to_device(dev);
        let mask = Tensor::ones([1, t], (DType::Float, dev));
        let seed_at = match seed {
            Seed::Logit => Tensor::zeros([1, t], (DType::Float, dev)).index_fill(
                1,
                &Tensor::from_slice(&[t - 1]).to_device(dev),
                1.0,
            ),
            Seed::Norm => mask.shallow_clone(),
        };
        let r = relevance(&m, &ids, &mask, &seed_at, seed, &Gates::none(), None).unwrap();
        let want_seed = s["seed"].as_f64().unwrap();
        let got_seed = vec1(&r.seed)[0];
        assert!(
            (got_seed - want_seed).abs() <= 1e-4 * want_seed.abs(),
            "{model} sentence {i}: seed {got_seed} vs {want_seed}"
        );
        let want_in: Vec<f64> = s["input_relevance"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        worst = worst.max(close(&format!("{model} sentence {i} input"), &vec1(&r.input), &want_in));
        let want_heads: Vec<f64> = s["head_relevance"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|l| l.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
            .collect();
        let got_heads: Vec<f64> = r.heads.iter().flat_map(vec1).collect();
        worst = worst.max(close(&format!("{model} sentence {i} heads"), &got_heads, &want_heads));
    }
    println!("{model} on {device:?}: 5 sentences, worst difference {worst:.2e} of each grid's largest relevance");
    worst
}

#[test]
fn minilm_equals_lxt() {
    check("minilm", "assets/minilm", Seed::Norm, DeviceChoice::Cpu);
}

#[test]
fn smollm2_equals_lxt() {
    let _heavy = common::heavy();
    check("smollm2", "assets/smollm2", Seed::Logit, DeviceChoice::Cpu);
}

#[test]
fn cuda_equals_lxt() {
    let _heavy = common::heavy();
    if !tch::Cuda::is_available() {
        common::skip("cuda", "CUDA is not available");
        return;
    }
    check("minilm", "assets/minilm", Seed::Norm, DeviceChoice::Cuda(0));
    check("smollm2", "assets/smollm2", Seed::Logit, DeviceChoice::Cuda(0));
}

/// `token_relevance`'s target (docs/methods.md#attnlrp): seeding the top-1 token by id gives
/// exactly the default relevance; another target is seeded with that token's logit (equal to a
/// plain forward's) and explains differently; the script names the token explained and refuses
/// an id outside the vocabulary and a text of several tokens in one line naming the argument.
#[test]
fn a_target_token_is_seeded_with_its_own_logit_and_named() {
    let m = common::tiny_hf("llama", "f32");
    let e = m.tokenize("the cat sat on the mat").unwrap();
    let t = e.ids.len() as i64;
    let dev = m.device();
    let ids = Tensor::from_slice(&e.ids).view([1, t]).to_device(dev);
    let mask = Tensor::ones([1, t], (DType::Float, dev));
    let seed_at =
        Tensor::zeros([1, t], (DType::Float, dev)).index_fill(1, &Tensor::from_slice(&[t - 1]).to_device(dev), 1.0);
    // A plain forward's logits at the last position, outside the relevance code.
    let logits =
        tch::no_grad(|| m.net.logits_before_cap(&m.net.encode(&ids, &mask, &Gates::none(), None).unwrap()).unwrap());
    let last = vec1(&logits.get(0).get(t - 1));
    let top = (0..last.len()).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap() as i64;
    let other = (0..last.len()).min_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap() as i64;
    let plain = relevance(&m, &ids, &mask, &seed_at, Seed::Logit, &Gates::none(), None).unwrap();
    assert_eq!(
        plain.top.as_ref().unwrap().get(0).int64_value(&[t - 1]),
        top,
        "the token a plain seed explains is the top-1"
    );
    let by_id = relevance(&m, &ids, &mask, &seed_at, Seed::Logit, &Gates::none(), Some(top)).unwrap();
    assert_eq!(vec1(&by_id.input), vec1(&plain.input), "the top-1 as target is the default");
    let low = relevance(&m, &ids, &mask, &seed_at, Seed::Logit, &Gates::none(), Some(other)).unwrap();
    assert!(
        (vec1(&low.seed)[0] - last[other as usize]).abs() <= 1e-5 * last[other as usize].abs().max(1.0),
        "seed {} vs logit {}",
        vec1(&low.seed)[0],
        last[other as usize]
    );
    assert_ne!(vec1(&low.input), vec1(&plain.input));
    assert!(relevance(&m, &ids, &mask, &seed_at, Seed::Logit, &Gates::none(), Some(last.len() as i64)).is_err());

    use headscope::engine::{Session, SessionOptions};
    let mut s = Session::new(SessionOptions::default());
    let dir = root().join("tests/fixtures/tiny_hf/llama").display().to_string();
    s.eval("setup", &format!("let m = load_model({dir:?}, #{{device: \"cpu\"}});")).unwrap();
    let text =
        |s: &mut Session, code: &str| s.eval("case", code).unwrap_or_else(|e| panic!("{code}: {e}")).unwrap().text;
    let piece = m.tok.id_to_token(top);
    let title = text(&mut s, "m.token_relevance(\"the cat sat on the mat\").title");
    assert!(
        title.contains(&format!("explains {piece:?} (id {top}, text ")) && title.contains("the top-1 next token"),
        "{title}"
    );
    let title = text(&mut s, &format!("m.token_relevance(\"the cat sat on the mat\", {other}).title"));
    assert!(title.contains(&format!("(id {other}, text ")) && title.contains("the given target"), "{title}");
    let by_piece = text(
        &mut s,
        // The vocabulary's own string (a byte-level piece may read `⋯` when shown).
        &format!("m.token_relevance(\"the cat sat on the mat\", {:?}).to_string()", m.tok.raw_token(other).unwrap()),
    );
    assert_eq!(
        by_piece,
        text(&mut s, &format!("m.token_relevance(\"the cat sat on the mat\", {other}).to_string()")),
        "a piece and its id are the same target"
    );
    let error = |s: &mut Session, code: &str| {
        s.eval("case", code).err().map(|e| e.to_string()).unwrap_or_else(|| panic!("{code}: no error"))
    };
    let v = m.tok.vocab_size();
    let e = error(&mut s, &format!("m.token_relevance(\"the cat\", {v})"));
    assert!(e.contains(&format!("token_relevance: target id {v} is outside the vocabulary (0 to {})", v - 1)), "{e}");
    let e = error(&mut s, "m.token_relevance(\"the cat\", \"the cat sat\")");
    let n = m.tokenize("the cat sat").unwrap().special.iter().filter(|&&sp| !sp).count();
    assert!(
        n > 1
            && e.contains(&format!("token_relevance: target \"the cat sat\" is {n} tokens ("))
            && e.lines().next().unwrap().ends_with("not one; give one token (its text or id)"),
        "{e}"
    );
    let e = error(&mut s, "m.token_relevance(\"the cat\", \"\")");
    assert!(e.contains("token_relevance: target is empty"), "{e}");
}
