//! Helpers shared by the tests that build tiny models by hand.
#![allow(dead_code)]

/// A word-level tokenizer.json: [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3, then `words` from id 4, with
/// BERT's `[CLS] ... [SEP]` framing.
pub fn word_level_tokenizer(words: &[&str]) -> String {
    let special = |id: u32, t: &str| format!(r#"{{"id":{id},"content":"{t}","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}}"#);
    let mut vocab = vec![r#""[PAD]":0"#.to_string(), r#""[CLS]":1"#.into(), r#""[SEP]":2"#.into(), r#""[UNK]":3"#.into()];
    vocab.extend(words.iter().enumerate().map(|(i, w)| format!(r#""{w}":{}"#, i + 4)));
    format!(
        r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":[{},{},{},{}],"normalizer":null,
        "pre_tokenizer":{{"type":"WhitespaceSplit"}},
        "post_processor":{{"type":"TemplateProcessing",
          "single":[{{"SpecialToken":{{"id":"[CLS]","type_id":0}}}},{{"Sequence":{{"id":"A","type_id":0}}}},{{"SpecialToken":{{"id":"[SEP]","type_id":0}}}}],
          "pair":[{{"SpecialToken":{{"id":"[CLS]","type_id":0}}}},{{"Sequence":{{"id":"A","type_id":0}}}},{{"SpecialToken":{{"id":"[SEP]","type_id":0}}}},{{"Sequence":{{"id":"B","type_id":1}}}},{{"SpecialToken":{{"id":"[SEP]","type_id":1}}}}],
          "special_tokens":{{"[CLS]":{{"id":"[CLS]","ids":[1],"tokens":["[CLS]"]}},"[SEP]":{{"id":"[SEP]","ids":[2],"tokens":["[SEP]"]}}}}}},
        "decoder":null,"model":{{"type":"WordLevel","vocab":{{{}}},"unk_token":"[UNK]"}}}}"#,
        special(0, "[PAD]"),
        special(1, "[CLS]"),
        special(2, "[SEP]"),
        special(3, "[UNK]"),
        vocab.join(",")
    )
}


/// A model built by hand: the self-attention stack `layers` over `embed`, with the word-level
/// tokenizer of `words` written to `dir`; no output head, float32 on the CPU. A `Dec` stack is
/// causal (decoder-only), an `Enc` stack bidirectional.
pub fn hand_built(dir: &std::path::Path, words: &[&str], embed: headscope::model::transformer::Embeddings, layers: Vec<headscope::model::transformer::EncoderLayer>, stack_kind: headscope::model::Kind, family: headscope::model::Family) -> headscope::model::Model {
    use headscope::model::tokenizer::{Framing, Tok};
    use headscope::model::{transformer::Transformer, Kind, LoadOptions, LoadTimes, Model};
    std::fs::write(dir.join("tokenizer.json"), word_level_tokenizer(words)).unwrap();
    let tok = Tok::from_file(&dir.join("tokenizer.json"), Framing::Tokenizer).unwrap();
    let d_model = embed.tokens.size()[1];
    let net = Transformer {
        embed,
        encoder: layers,
        stack_kind,
        causal: stack_kind == Kind::Dec,
        window: None,
        final_norm: None,
        decoder: vec![],
        output: None,
        d_model,
        eos_id: 2,
        dec_embed: None,
        dec_start: None,
        banned: vec![],
        logit_softcap: None,
    };
    let opts = LoadOptions { device: tch::Device::Cpu, dtype: tch::Kind::Float };
    Model { load_times: LoadTimes::default(), family, path: dir.to_path_buf(), net, tok, opts, n_params: 0, removed: vec![] }
}

/// One pass of `run` recording `points` through the trace: `(hook point, value)` in the order
/// the forward met them, and what `run` returned.
pub fn recorded<T>(points: &[headscope::model::hooks::Point], run: impl FnOnce(&mut dyn headscope::model::hooks::Hooks) -> T) -> (Vec<(headscope::model::hooks::At, tch::Tensor)>, T) {
    let mut seen = Vec::new();
    let mut on = |at: headscope::model::hooks::At, t: &tch::Tensor| {
        seen.push((at, t.shallow_clone()));
        Ok(())
    };
    let mut rec = headscope::model::hooks::Record::new(points, &mut on);
    let out = run(&mut rec);
    (seen, out)
}

/// The values recorded at `point`, in order.
pub fn at_point(seen: &[(headscope::model::hooks::At, tch::Tensor)], point: headscope::model::hooks::Point) -> Vec<tch::Tensor> {
    seen.iter().filter(|(a, _)| a.point == point).map(|(_, t)| t.shallow_clone()).collect()
}

/// HF's `output_hidden_states` of one sentence (each layer's input, then the stack's output,
/// batch row 0) and each layer's attention, recorded at `hook_resid_pre` and `hook_pattern` of
/// one pass `run` that returns the stack's output.
pub fn hidden_and_attention(run: impl FnOnce(&mut dyn headscope::model::hooks::Hooks) -> tch::Tensor) -> (Vec<tch::Tensor>, Vec<tch::Tensor>) {
    use headscope::model::hooks::Point;
    let (seen, out) = recorded(&[Point::ResidPre, Point::Pattern], run);
    let mut hidden: Vec<tch::Tensor> = at_point(&seen, Point::ResidPre).iter().map(|h| h.get(0)).collect();
    hidden.push(out.get(0));
    (hidden, at_point(&seen, Point::Pattern).iter().map(|a| a.get(0)).collect())
}
