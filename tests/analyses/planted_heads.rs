//! Planted heads: a tiny BERT-style model whose layer-0 heads attend, by construction, to the
//! previous token (enc.0.0), the next token (enc.0.1) and the rarest token (enc.0.2); enc.0.3
//! and all of layer 1 attend uniformly. The analyses must find exactly those heads. The same
//! model gives synthetic attention for a hand-counted syntactic test on a small CoNLL-U.

use crate::common;
use crate::common::{lin, zeros};

use headscope::analysis::options::{FreqSource, Options, Stat};
use headscope::analysis::result::Function;
use headscope::analysis::{analyze, freq_table};
use headscope::data::Dataset;
use headscope::model::nn::{Activation, Attention, Ffn, Gates, NormPosition};
use headscope::model::transformer::{Embeddings, Positions, StackLayer};
use headscope::model::{Family, HeadId, Kind, Model};
use tch::{Device, Kind as DType, Tensor};

const WORDS: [&str; 10] = ["a", "b", "c", "d", "e", "f", "g", "h", "zyx", "qqq"];
const COUNTS: [u64; 10] = [1000, 900, 800, 700, 600, 500, 400, 300, 1, 2];
const V: i64 = 14; // [PAD] [CLS] [SEP] [UNK] + 10 words
const P: i64 = 16;
const D: i64 = 32;
const H: i64 = 4;
const DH: i64 = 8;

/// Layer 0: planted heads. Scores are q.k / sqrt(DH), made sharp by the scale S.
fn planted_attention() -> Attention {
    let theta = 0.3f64;
    let s = (400.0 * (DH as f64).sqrt()).sqrt();
    let (mut wq, mut wk, mut bq) = (vec![0f32; (D * D) as usize], vec![0f32; (D * D) as usize], vec![0f32; D as usize]);
    let set = |w: &mut Vec<f32>, out: i64, inp: i64, v: f64| w[(out * D + inp) as usize] = v as f32;
    for p in 0..P {
        let x = V + p; // position one-hot dimension
        let t = theta * p as f64;
        // head 0 (previous token): q_t = (cos t, sin t), k_s = (cos (s+1), sin (s+1)).
        set(&mut wq, 0, x, s * t.cos());
        set(&mut wq, 1, x, s * t.sin());
        set(&mut wk, 0, x, s * (t + theta).cos());
        set(&mut wk, 1, x, s * (t + theta).sin());
        // head 1 (next token): k_s = (cos (s-1), sin (s-1)).
        set(&mut wq, DH, x, s * t.cos());
        set(&mut wq, DH + 1, x, s * t.sin());
        set(&mut wk, DH, x, s * (t - theta).cos());
        set(&mut wk, DH + 1, x, s * (t - theta).sin());
    }
    // head 2 (rarest token): constant query, key = rarity of the token (-ln count).
    bq[(2 * DH) as usize] = s as f32;
    for (i, c) in COUNTS.iter().enumerate() {
        set(&mut wk, 2 * DH, 4 + i as i64, s * -(*c as f64).ln());
    }
    for special in 0..4 {
        set(&mut wk, 2 * DH, special, s * -20.0);
    }
    let eye = Tensor::eye(D, (DType::Float, Device::Cpu));
    Attention::new(
        lin(Tensor::from_slice(&wq).view([D, D]), Tensor::from_slice(&bq)),
        lin(Tensor::from_slice(&wk).view([D, D]), zeros(&[D])),
        lin(eye.copy(), zeros(&[D])),
        lin(eye, zeros(&[D])),
        H,
        H,
        DH,
    )
}

fn uniform_attention() -> Attention {
    let eye = Tensor::eye(D, (DType::Float, Device::Cpu));
    Attention::new(
        lin(zeros(&[D, D]), zeros(&[D])),
        lin(zeros(&[D, D]), zeros(&[D])),
        lin(eye.copy(), zeros(&[D])),
        lin(eye, zeros(&[D])),
        H,
        H,
        DH,
    )
}

fn layer(attn: Attention) -> StackLayer {
    StackLayer::new(
        attn,
        common::layer_norm(D),
        Ffn {
            up: lin(zeros(&[8, D]), zeros(&[8])),
            down: lin(zeros(&[D, 8]), zeros(&[D])),
            act: Activation::Gelu,
            gate: None,
        },
        common::layer_norm(D),
        NormPosition::Post,
    )
}

fn planted_model(dir: &std::path::Path) -> Model {
    let tokens = Tensor::eye_m(V, D, (DType::Float, Device::Cpu));
    let positions = Tensor::zeros([P, D], (DType::Float, Device::Cpu));
    for p in 0..P {
        let _ = positions.get(p).get(V + p).fill_(1.0);
    }
    let embed =
        Embeddings { tokens, scale: 1.0, positions: Positions::Learned(positions), token_type: None, norm: None };
    common::hand_built(
        dir,
        &WORDS,
        embed,
        vec![layer(planted_attention()), layer(uniform_attention())],
        Kind::Enc,
        Family::Bert,
    )
}

fn write_counts(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("counts.tsv");
    std::fs::write(&p, WORDS.iter().zip(COUNTS).map(|(w, c)| format!("{w}\t{c}\n")).collect::<String>()).unwrap();
    p
}

fn head(l: usize, h: usize) -> HeadId {
    HeadId { kind: Kind::Enc, layer_idx: l, head: h }
}

#[test]
fn classifications_find_exactly_the_planted_heads() {
    let dir = tempfile::tempdir().unwrap();
    let model = planted_model(dir.path());
    // 12-word sentences, each with one rare word somewhere.
    let sentences = [
        "a b c d e f g h a b zyx c",
        "b c zyx d e f g h a b c d",
        "h g f e d c b a qqq a b c",
        "zyx a a b b c c d d e e f",
        "c d e f g h a b c d e qqq",
    ];
    let corpus = dir.path().join("c.txt");
    std::fs::write(&corpus, sentences.join("\n")).unwrap();
    let data = Dataset::corpus(&corpus).unwrap();
    let mut opts = Options::new(vec![Stat::Confidence, Stat::Positional, Stat::Rare], vec![Kind::Enc], corpus.clone());
    opts.freq = FreqSource::Counts(write_counts(dir.path()));
    opts.rare_top_n = 3;
    let freq = freq_table(&model, &opts.freq, opts.rare_top_n).unwrap();
    let a = analyze(&model, &data, &opts, Some(&freq), &Gates::none(), &|| false, &mut |_, _| {}).unwrap();

    let found: Vec<(HeadId, Vec<Function>)> = a.functions().into_iter().filter(|(_, f)| !f.is_empty()).collect();
    assert_eq!(
        found,
        vec![
            (head(0, 0), vec![Function::Positional(-1)]),
            (head(0, 1), vec![Function::Positional(1)]),
            (head(0, 2), vec![Function::Rare(1.0)])
        ],
        "functions found: {found:?}"
    );
    let k = a.kind(Kind::Enc).unwrap();
    let pos = k.positional.as_ref().unwrap();
    assert_eq!(pos[0][0].fraction, 1.0);
    // The next-token head's last real query has its next key on [SEP] (excluded): 11 of 12.
    assert!((pos[0][1].fraction - 11.0 / 12.0).abs() < 1e-9, "{}", pos[0][1].fraction);
    let conf = k.confidence.as_ref().unwrap();
    assert!(conf[0][0] > 0.99 && conf[0][2] > 0.99, "planted heads are confident: {conf:?}");
    assert!(conf[1][0] < 0.1, "uniform heads are not: {}", conf[1][0]);
    let rare = k.rare.as_ref().unwrap();
    assert_eq!(rare.sentences, 5);
    assert_eq!(k.queries, 60);

    // exclude_keys "special": the first word's previous token is [CLS], now excluded, so the
    // previous-token head lands elsewhere for 1 query in 12.
    opts.exclude_keys = headscope::analysis::options::ExcludeKeys::Special;
    let b = analyze(&model, &data, &opts, Some(&freq), &Gates::none(), &|| false, &mut |_, _| {}).unwrap();
    let pos = b.kind(Kind::Enc).unwrap().positional.as_ref().unwrap();
    assert!((pos[0][0].fraction - 11.0 / 12.0).abs() < 1e-9, "{}", pos[0][0].fraction);
    assert!(b.options.iter().any(|(k, v)| k == "exclude_keys" && v == "special"));
}

/// Two 12-word sentences with edges at known offsets (target - query, for g->d):
/// sentence 1: nsubj 2->1 (g->d offset -1), dobj 2->4 (+2), amod 4->3 (-1), advmod 2->5 (+3)
/// sentence 2: nsubj 3->2 (-1), dobj 3->4 (+1), amod 6->5 (-1), amod 6->7 (+1)
const TREEBANK: &str = "# text = a b c d e f g h a b c d
1\ta\t_\tX\t_\t_\t2\tnsubj\t_\t_
2\tb\t_\tX\t_\t_\t0\troot\t_\t_
3\tc\t_\tX\t_\t_\t4\tamod\t_\t_
4\td\t_\tX\t_\t_\t2\tobj\t_\t_
5\te\t_\tX\t_\t_\t2\tadvmod\t_\t_
6\tf\t_\tX\t_\t_\t2\tdep\t_\t_
7\tg\t_\tX\t_\t_\t2\tdep\t_\t_
8\th\t_\tX\t_\t_\t2\tdep\t_\t_
9\ta\t_\tX\t_\t_\t2\tdep\t_\t_
10\tb\t_\tX\t_\t_\t2\tdep\t_\t_
11\tc\t_\tX\t_\t_\t2\tdep\t_\t_
12\td\t_\tX\t_\t_\t2\tdep\t_\t_

1\th\t_\tX\t_\t_\t3\tdep\t_\t_
2\tg\t_\tX\t_\t_\t3\tnsubj\t_\t_
3\tf\t_\tX\t_\t_\t0\troot\t_\t_
4\te\t_\tX\t_\t_\t3\tdobj\t_\t_
5\td\t_\tX\t_\t_\t6\tamod\t_\t_
6\tc\t_\tX\t_\t_\t3\tdep\t_\t_
7\tb\t_\tX\t_\t_\t6\tamod\t_\t_
8\ta\t_\tX\t_\t_\t3\tdep\t_\t_
9\th\t_\tX\t_\t_\t3\tdep\t_\t_
10\tg\t_\tX\t_\t_\t3\tdep\t_\t_
11\tf\t_\tX\t_\t_\t3\tdep\t_\t_
12\te\t_\tX\t_\t_\t3\tdep\t_\t_

";

#[test]
fn syntactic_accuracy_and_baselines_equal_a_hand_count() {
    let dir = tempfile::tempdir().unwrap();
    let model = planted_model(dir.path());
    let tb = dir.path().join("t.conllu");
    std::fs::write(&tb, TREEBANK).unwrap();
    let data = Dataset::treebank(&tb).unwrap();
    let opts = Options::new(vec![Stat::Syntactic], vec![Kind::Enc], tb.clone());
    let a = analyze(&model, &data, &opts, None, &Gates::none(), &|| false, &mut |_, _| {}).unwrap();
    let rels = a.kind(Kind::Enc).unwrap().syntactic.as_ref().unwrap();
    let get = |rel: &str, dir: &str| rels.iter().find(|r| r.relation == rel && r.direction == dir).unwrap();
    // Hand counts. Head enc.0.0 answers "previous word", enc.0.1 "next word".
    // (relation, direction, edges, acc of prev head, acc of next head, baseline offset, baseline)
    let want: &[(&str, &str, usize, f64, f64, i64, f64)] = &[
        ("nsubj", "g->d", 2, 1.0, 0.0, -1, 1.0),                  // offsets -1, -1
        ("nsubj", "d->g", 2, 0.0, 1.0, 1, 1.0),                   // +1, +1
        ("dobj", "g->d", 2, 0.0, 0.5, 1, 0.5), // +2, +1 (obj counts as dobj); tie -> smaller |offset| first
        ("dobj", "d->g", 2, 0.5, 0.0, -1, 0.5), // -2, -1
        ("amod", "g->d", 3, 2.0 / 3.0, 1.0 / 3.0, -1, 2.0 / 3.0), // -1, -1, +1
        ("amod", "d->g", 3, 1.0 / 3.0, 2.0 / 3.0, 1, 2.0 / 3.0), // +1, +1, -1
        ("advmod", "g->d", 1, 0.0, 0.0, 3, 1.0), // +3
        ("advmod", "d->g", 1, 0.0, 0.0, -3, 1.0), // -3
    ];
    for &(rel, d, edges, prev, next, off, base) in want {
        let r = get(rel, d);
        assert_eq!(r.edges, edges, "{rel} {d} edges");
        assert!(
            (r.accuracy[0][0] - prev).abs() < 1e-9,
            "{rel} {d}: previous-word head accuracy {} != {prev}",
            r.accuracy[0][0]
        );
        assert!(
            (r.accuracy[0][1] - next).abs() < 1e-9,
            "{rel} {d}: next-word head accuracy {} != {next}",
            r.accuracy[0][1]
        );
        assert_eq!(r.baseline_offset, off, "{rel} {d} baseline offset");
        assert!((r.baseline - base).abs() < 1e-9, "{rel} {d} baseline {} != {base}", r.baseline);
    }
    // The +10 rule: nsubj g->d by the previous-word head is 1.0 vs baseline 1.0: not syntactic;
    // dobj d->g by the previous-word head is 0.5 vs 0.5: not syntactic either.
    let t = a.syntactic_table().unwrap();
    assert_eq!(t.rows.len(), 8);
}
