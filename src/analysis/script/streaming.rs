//! Streaming heads on a model (docs/methods.md#streaming-heads): `m.with_streaming(heads,
//! #{sink, recent, regime, prompt})`, the view every analysis, ablation and generation runs on.

use crate::model::nn::Regime;
use crate::model::script::ScriptModel;
use crate::script::convert::{err, opt, opt_int, opt_str, OptSpec, Opts, ScriptResult};
use rhai::plugin::*;
use rhai::{Dynamic, Map};

pub const WITH_STREAMING_OPTIONS: &[OptSpec] = &[
    opt_int("sink", 4, "the first tokens every streaming head keeps seeing (attention sinks)"),
    opt_int("recent", 64, "the recent window: a streaming head's query at position i sees the keys i - recent < j <= i"),
    opt_str("regime", "always", "\"always\" (streaming over the prompt and the generation: DuoAttention, PruLong) or \"decode\" (the prompt read in full, streaming after it: kvpress)"),
    opt("prompt", "a generation's prompt; a text analysed alone is all prompt", "with regime \"decode\": the tokens read in full (of every text analysed)"),
];

options_enum!(RegimeName, "streaming regime", {
    Always = "always",
    Decode = "decode",
});

/// The typed streaming setting of an option map (`with_streaming`, `kv_curve`).
pub fn streaming_options(o: &Opts) -> ScriptResult<(i64, i64, Regime)> {
    let func = o.func();
    let int = |key: &str| -> ScriptResult<i64> {
        let v = o.f64_or_default(key)?;
        if v.fract() != 0.0 || !v.is_finite() {
            return err(format!("{func}: {key} must be a whole number of tokens, got {v}"));
        }
        Ok(v as i64)
    };
    let (sink, recent) = (int("sink")?, int("recent")?);
    let prompt = match o.value("prompt") {
        None => None,
        Some(v) => match v.as_int() {
            Ok(p) => Some(p),
            Err(_) => return err(format!("{func}: prompt must be a number of tokens, got {}", crate::script::convert::quote(v))),
        },
    };
    let regime = match o.parsed_or_default::<RegimeName>("regime")? {
        RegimeName::Always if prompt.is_some() => return err(format!("{func}: 'prompt' is the part the decode regime reads in full; it needs regime: \"decode\"")),
        RegimeName::Always => Regime::Always,
        RegimeName::Decode => Regime::Decode { prompt },
    };
    Ok((sink, recent, regime))
}

#[export_module]
pub mod api {
    /// A view of the model whose key/value groups of `heads` stream (docs/methods.md#streaming-heads):
    /// each of their query heads sees only the first `sink` tokens and the `recent` last ones
    /// (keys keep their positions); the other heads see every token. Under grouped-query
    /// attention naming one query head streams its whole group (the cache holds a group's keys
    /// once). Every analysis, ablation, patching run and generation of the view runs with it.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/llama");
    /// let s = m.with_streaming(["dec.0.2"], #{sink: 2, recent: 3});
    /// assert(s.to_string().contains("dec.0.kv1"));
    /// let text = "the cat and the dog sat on the mat in the park all day";
    /// assert(s.loss(text) != m.loss(text));
    /// assert(m.with_streaming(["dec.0.2"], #{sink: 2, recent: 64}).loss(text) == m.loss(text));
    /// ```
    #[rhai_fn(name = "with_streaming", return_raw, pure)]
    pub fn with_streaming_opts(m: &mut ScriptModel, heads: Dynamic, options: Map) -> ScriptResult<ScriptModel> {
        let f = "with_streaming";
        let o = Opts::new(&options, f, WITH_STREAMING_OPTIONS)?;
        let (sink, recent, regime) = streaming_options(&o)?;
        let ids = crate::model::script::head_ids(m, &heads, f)?;
        Ok(m.streaming(&ids, sink, recent, regime, f)?)
    }

    /// `with_streaming` with the default sink (4) and recent window (64), regime "always".
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/gpt2");
    /// assert(m.with_streaming(["dec.1.3"]).to_string().contains("4 sink, 64 recent"));
    /// ```
    #[rhai_fn(name = "with_streaming", return_raw, pure)]
    pub fn with_streaming(m: &mut ScriptModel, heads: Dynamic) -> ScriptResult<ScriptModel> {
        with_streaming_opts(m, heads, Map::new())
    }
}
