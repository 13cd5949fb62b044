//! The script API of models and heads: `load_model`, `Model` (a view that may carry a head
//! mask, sharing the weights), `Head`, and `AttentionMatrix` (renders as a heatmap).

use crate::device::DeviceChoice;
use crate::model::readers::locate::{self, Located, Pick};
use crate::model::{HeadId, Kind, LoadOptions, Model};
use crate::output::{Output, Render};
use crate::script::convert::ScriptErr;
use crate::script::convert::{err, opt, opt_bool, opt_int, to_usize, OptSpec, Opts, ScriptResult};
use rhai::plugin::*;
use rhai::{Array, Dynamic, Engine, Map};
use std::rc::Rc;

/// A model as scripts see it: the core view (shared weights plus the heads it closes, its
/// continuous gates and mean ablation), registered as `Model`.
pub type ScriptModel = crate::model::view::View;
pub use crate::model::view::MeanAblation;

mod head;
pub mod hooks;
pub mod outputs;

pub const LOAD_OPTIONS: &[OptSpec] = &[
    crate::model::DEVICE_OPTION,
    crate::model::DTYPE_OPTION,
    opt("tgt_lang", "the checkpoint's forced_bos_token_id", "a translation model's target language (\"fra_Latn\", \"fr_XX\"): its code, forced first in translate and every translation analysis"),
    opt("revision", "\"main\"", "a model id's revision in the Hugging Face cache: a branch, a tag or a commit hash"),
    opt("gguf_file", "the only .gguf of the snapshot", "which .gguf of a cached GGUF repository holding several"),
    crate::model::ALLOW_UNKNOWN_CONFIG_OPTION,
];
pub const TRANSLATE_OPTIONS: &[OptSpec] = &[TGT_LANG];
/// `tgt_lang` of one call (translate and every verb that reads a translation model's targets).
pub const TGT_LANG: OptSpec = opt("tgt_lang", "the model's (load_model's tgt_lang, else the checkpoint's)", "a translation model's target language for this call (\"fra_Latn\", \"fr_XX\"): its code, forced first in its translations and in the greedy and reference targets");

/// The target language option `o` names (`tgt_lang`), forced for as long as the result lives;
/// none given: the model's own. Errors name the function and the code.
pub fn call_language(m: &ScriptModel, o: &Opts) -> ScriptResult<Option<crate::model::view::CallLanguage>> {
    match o.string("tgt_lang")? {
        None => Ok(None),
        Some(code) => m.call_language(&code).map(Some).or_else(|e| err(format!("{}: {e}", o.func()))),
    }
}
pub const FORWARD_OPTIONS: &[OptSpec] =
    &[opt_int("batch_tokens", crate::model::batch::DEFAULT_BATCH_TOKENS as i64, "tokens per batch, padding included")];
pub const GENERATE_OPTIONS: &[OptSpec] =
    &[opt_bool("cache", true, "run each new token over the key/value cache (false: the whole prefix again)")];

/// `load_model`'s typed options from a map checked against [`LOAD_OPTIONS`].
fn load_options_from(o: &Opts) -> ScriptResult<LoadOptions> {
    let device: DeviceChoice = o
        .string_or_default("device")?
        .parse()
        .or_else(|e: crate::device::DeviceError| err(format!("load_model: {e}")))?;
    let mut opts =
        LoadOptions::new(device, &o.string_or_default("dtype")?).or_else(|e| err(format!("load_model: {e}")))?;
    opts.allow_unknown_config = o.bool_or_default("allow_unknown_config")?;
    Ok(opts)
}

/// Loads a model from a directory or a named asset under typed options: what `load_model`
/// and the library API's `Model::load_with` run. Errors start with "load_model: ".
pub fn load(path: &str, opts: LoadOptions) -> Result<ScriptModel, String> {
    load_to(path, opts, None)
}

/// [`load`] with a target language (`tgt_lang`: a translation model's language code, forced
/// first in every translation), checked against the tokenizer's codes.
pub fn load_to(path: &str, opts: LoadOptions, tgt_lang: Option<&str>) -> Result<ScriptModel, String> {
    load_picked(path, opts, tgt_lang, &Pick::default())
}

/// Where `path` names a model (docs/formats.md#locating-a-model): an existing directory or
/// `.gguf` file (a Hugging Face cache repository or snapshot included), else a named asset,
/// else a model id in the Hugging Face cache. A local directory wins over the cache.
pub fn locate(path: &str, pick: &Pick) -> Result<Located, String> {
    let p = std::path::Path::new(path);
    if p.exists() {
        return locate::existing(p, pick);
    }
    match crate::assets::asset_path(path) {
        Ok(dir) => Ok(Located { path: dir, name: None }),
        Err(e @ crate::assets::AssetError::Missing { .. }) => {
            Err(format!("'{path}' is a model asset that is not set up ({e})"))
        }
        Err(e) if locate::is_model_id(path) => locate::in_cache(path, locate::hub_cache_root().as_deref(), pick)
            .map_err(|c| format!("{c} (nor a model asset: {e})")),
        Err(e) => Err(format!("'{path}' is neither a directory, a .gguf file nor a model asset ({e})")),
    }
}

/// [`load_to`] with a cached repository's revision and `.gguf` file chosen.
pub fn load_picked(path: &str, opts: LoadOptions, tgt_lang: Option<&str>, pick: &Pick) -> Result<ScriptModel, String> {
    let opts = opts.checked().map_err(|e| format!("load_model: {e}"))?;
    let found = locate(path, pick).map_err(|e| format!("load_model: {e}"))?;
    let mut model = Model::load(&found.path, opts).map_err(|e| format!("load_model: {e}"))?;
    model.id = found.name;
    for w in &model.warnings {
        crate::run::warn(&format!("load_model: {w}"));
    }
    if let Some(code) = tgt_lang {
        model.set_target_language(code).map_err(|e| format!("load_model: {e}"))?;
    }
    Ok(ScriptModel::new(model))
}

/// The `kinds` option of any function that takes one: the names given, each a kind the model
/// has, else every kind it has. Errors name the function the user called (`o.func()`).
pub fn kinds_option(m: &ScriptModel, o: &Opts) -> ScriptResult<Vec<Kind>> {
    let f = o.func();
    let Some(names) = o.strings("kinds")? else { return Ok(m.model.kinds().iter().map(|k| k.kind).collect()) };
    if names.is_empty() {
        return err(format!(
            "{f}: option 'kinds' is empty: name one or more of the model's kinds, or leave it out for all"
        ));
    }
    names
        .iter()
        .map(|s| {
            let k: Kind = s.parse().or_else(|e: String| err(format!("{f}: option 'kinds': {e}")))?;
            m.model.kind_shape(k).or_else(|e| err(format!("{f}: {e}")))?;
            Ok(k)
        })
        .collect()
}

pub use head::{attention_of, head_ids, AttentionMatrix, Head};

/// A kind by name; errors start with the function called (`func`).
fn kind(func: &str, s: &str) -> ScriptResult<Kind> {
    s.parse().or_else(|e: String| err(format!("{func}: {e}")))
}

fn head_id(m: &ScriptModel, k: &str, layer: i64, head: i64) -> ScriptResult<HeadId> {
    let layer_idx = to_usize(&Dynamic::from(layer), "head: layer")?;
    let h = to_usize(&Dynamic::from(head), "head: head")?;
    let id = HeadId { kind: kind("head", k)?, layer_idx, head: h };
    m.model.check_head(id).or_else(|e| err(format!("head: {e}")))?;
    Ok(id)
}

/// Sentences of a dataset, or of a text, a dataset row, or an array of them
/// ([`crate::data::script::dataset_arg`]).
pub fn dataset_texts(v: &Dynamic, what: &str) -> ScriptResult<Vec<String>> {
    let d = crate::data::script::dataset_arg(v, what)?;
    Ok(d.items.iter().map(|i| i.text.clone()).collect())
}

/// A tensor as nested arrays of floats (a scalar for a 0-dimensional one).
pub(crate) fn tensor_value(t: &tch::Tensor) -> ScriptResult<Dynamic> {
    let shape = t.size();
    let flat: Vec<f64> =
        Vec::<f64>::try_from(t.to_kind(tch::Kind::Double).reshape([-1])).or_else(|e| err(e.to_string()))?;
    fn nest(flat: &[f64], shape: &[i64]) -> Dynamic {
        match shape.split_first() {
            None => Dynamic::from(flat.first().copied().unwrap_or(f64::NAN)),
            Some((&n, rest)) => {
                let step: usize = rest.iter().product::<i64>().max(0) as usize;
                Dynamic::from(
                    (0..n as usize)
                        .map(|i| nest(&flat[(i * step).min(flat.len())..((i + 1) * step).min(flat.len())], rest))
                        .collect::<Array>(),
                )
            }
        }
    }
    Ok(nest(&flat, &shape))
}

#[export_module]
pub mod api {
    use super::*;

    /// Loads a model from a directory (or a named asset: "minilm", "enpt", "pten"). The family
    /// is detected from the files. Options: `device` ("auto" = CUDA when available, "cpu",
    /// "cuda", "cuda:N"), `dtype` ("f32"; "f64" for checking numerics, about 2x slower; "bf16"
    /// and "f16" on CUDA), `tgt_lang` (a multilingual translation model's target language, its
    /// tokenizer's code: NLLB's "fra_Latn", mBART's "fr_XX"; forced as the first token of
    /// `translate` and of every translation analysis' targets; default: the checkpoint's
    /// `forced_bos_token_id`, if any).
    ///
    /// ```rhai
    /// let m = load_model("minilm", #{device: "cpu"});
    /// assert(m.family == "bert" && m.layers("enc") == 6 && m.heads_per_layer("enc") == 12);
    /// let nllb = load_model("tests/fixtures/tiny_hf/m2m100", #{device: "cpu", tgt_lang: "deu_Latn"});
    /// assert(nllb.family == "m2m_100" && nllb.translate("The cat sat.") == nllb.translate("The cat sat.", #{tgt_lang: "deu_Latn"}));
    /// ```
    #[rhai_fn(name = "load_model", return_raw)]
    pub fn load_model_opts(path: &str, options: Map) -> ScriptResult<ScriptModel> {
        let o = Opts::new(&options, "load_model", LOAD_OPTIONS)?;
        let (revision, gguf_file) = (o.string("revision")?, o.string("gguf_file")?);
        let pick = Pick { revision: revision.as_deref(), gguf_file: gguf_file.as_deref() };
        Ok(load_picked(path, load_options_from(&o)?, o.string("tgt_lang")?.as_deref(), &pick)?)
    }

    /// Loads a model on the default device in f32.
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// assert(m.kinds == ["enc", "cross"]);
    /// ```
    #[rhai_fn(name = "load_model", return_raw)]
    pub fn load_model(path: &str) -> ScriptResult<ScriptModel> {
        load_model_opts(path, Map::new())
    }

    /// The rotary settings the model's layers use, as loaded from either config shape
    /// (transformers 4's `rope_theta` / `rope_scaling`, transformers 5's `rope_parameters`, flat or
    /// per layer type): one line per group of layers sharing them.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/gemma3", #{device: "cpu"});
    /// assert(m.rope.contains("layer 0: rope_theta 50, rope_type default"));
    /// assert(m.rope.contains("layer 1: rope_theta 500, rope_type linear (factor 2)"));
    /// ```
    #[rhai_fn(get = "rope", pure)]
    pub fn rope(m: &mut ScriptModel) -> String {
        m.model.rope()
    }

    /// The model's name: its directory's, or the model id it was loaded by from the Hugging
    /// Face cache (`"org/name"`).
    ///
    /// ```rhai
    /// assert(load_model("tests/fixtures/tiny_hf/llama", #{device: "cpu"}).name == "llama");
    /// ```
    #[rhai_fn(get = "name", pure)]
    pub fn name(m: &mut ScriptModel) -> String {
        m.model.name()
    }

    /// The checkpoint family: its HF `model_type` ("bert", "llama", ...), "marian_bin", or a
    /// GGUF file's architecture ("llama (gguf)"); crates/core/src/model/families/family.rs lists them.
    ///
    /// ```rhai
    /// assert(load_model("enpt").family == "marian_bin");
    /// ```
    #[rhai_fn(get = "family", pure)]
    pub fn family(m: &mut ScriptModel) -> String {
        m.model.family_name()
    }

    /// The attention kinds the model has ("enc", "dec", "cross").
    ///
    /// ```rhai
    /// assert(load_model("minilm").kinds == ["enc"]);
    /// ```
    #[rhai_fn(get = "kinds", pure)]
    pub fn kinds(m: &mut ScriptModel) -> Array {
        m.model.kinds().iter().map(|k| Dynamic::from(k.kind.to_string())).collect()
    }

    /// Number of layers of one attention kind.
    ///
    /// ```rhai
    /// assert(load_model("enpt").layers("cross") == 2);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn layers(m: &mut ScriptModel, k: &str) -> ScriptResult<i64> {
        m.model.kind_shape(kind("layers", k)?).map(|s| s.n_layers as i64).or_else(|e| err(format!("layers: {e}")))
    }

    /// Number of heads per layer of one attention kind.
    ///
    /// ```rhai
    /// assert(load_model("enpt").heads_per_layer("enc") == 8);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn heads_per_layer(m: &mut ScriptModel, k: &str) -> ScriptResult<i64> {
        m.model
            .kind_shape(kind("heads_per_layer", k)?)
            .map(|s| s.n_heads as i64)
            .or_else(|e| err(format!("heads_per_layer: {e}")))
    }

    /// Number of parameters (a tied output matrix counted once).
    ///
    /// ```rhai
    /// assert(load_model("minilm").params > 22000000);
    /// ```
    #[rhai_fn(get = "params", pure)]
    pub fn params(m: &mut ScriptModel) -> i64 {
        m.model.n_params
    }

    /// The dtype most of the checkpoint's weight bytes are stored in, as its format names it
    /// (`"BF16"`, `"F32"`, a GGUF's `"Q4_K"`), or `()` where its headers do not say (Marian
    /// `.bin`, `pytorch_model.bin`). A 16-bit or quantised checkpoint loaded in float32 shows
    /// what `#{dtype: "bf16"}` would take in the model's description
    /// (docs/methods.md#loading-memory).
    ///
    /// ```rhai
    /// assert(load_model("tests/fixtures/tiny_hf/llama").stored == "F32");
    /// let m = load_model("smollm2");
    /// assert(m.stored == "Q4_1" && m.to_string().contains("with #{dtype: \"bf16\"}"));
    /// assert(!load_model("smollm2", #{dtype: "bf16"}).to_string().contains("stored as"));
    /// ```
    #[rhai_fn(get = "stored", pure)]
    pub fn stored(m: &mut ScriptModel) -> Dynamic {
        m.model.stored.clone().map_or(Dynamic::UNIT, Dynamic::from)
    }

    /// Seconds spent loading: `weights` (read, convert, build), `tokenizer` and `total`.
    ///
    /// ```rhai
    /// let t = load_model("enpt").load_seconds;
    /// assert(t.total >= t.weights && t.weights > 0.0);
    /// ```
    #[rhai_fn(get = "load_seconds", pure)]
    pub fn load_seconds(m: &mut ScriptModel) -> Map {
        let t = m.model.load_times;
        let mut r = Map::new();
        r.insert("weights".into(), Dynamic::from(t.weights));
        r.insert("tokenizer".into(), Dynamic::from(t.tokenizer));
        r.insert("total".into(), Dynamic::from(t.total));
        r
    }

    /// The device the weights live on ("cpu", "cuda:0").
    ///
    /// ```rhai
    /// assert(load_model("minilm", #{device: "cpu"}).device == "cpu");
    /// ```
    #[rhai_fn(get = "device", pure)]
    pub fn device(m: &mut ScriptModel) -> String {
        crate::device::device_name(m.model.device())
    }

    /// The same model on another device (the mask is kept).
    ///
    /// ```rhai
    /// let m = load_model("minilm", #{device: "cpu"}).to("cpu");
    /// assert(m.device == "cpu");
    /// ```
    #[rhai_fn(name = "to", return_raw, pure)]
    pub fn to_device(m: &mut ScriptModel, device: &str) -> ScriptResult<ScriptModel> {
        let d: DeviceChoice = device.parse().or_else(|e: crate::device::DeviceError| err(format!("to: {e}")))?;
        let model = m.model.to_device(d).or_else(|e| err(format!("to: {e}")))?;
        Ok(ScriptModel {
            model: Rc::new(model),
            closed: m.closed.clone(),
            soft: m.soft.clone(),
            ablation: None,
            streaming: m.streaming.clone(),
            experts: m.experts.clone(),
        })
    }

    /// The model's tokens for a text (special tokens included).
    ///
    /// ```rhai
    /// assert(load_model("minilm").tokenize("Hello world") == ["[CLS]", "hello", "world", "[SEP]"]);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn tokenize(m: &mut ScriptModel, text: &str) -> ScriptResult<Array> {
        let e = m.model.tokenize(text).or_else(|e| err(e.to_string()))?;
        Ok(e.tokens.into_iter().map(Dynamic::from).collect())
    }

    /// The token ids for a text.
    ///
    /// ```rhai
    /// let ids = load_model("enpt").token_ids("The cat");
    /// assert(ids[ids.len() - 1] == 0);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn token_ids(m: &mut ScriptModel, text: &str) -> ScriptResult<Array> {
        let e = m.model.tokenize(text).or_else(|e| err(e.to_string()))?;
        Ok(e.ids.into_iter().map(Dynamic::from).collect())
    }

    /// Greedy translation of a sentence (a string) or of many (an array or a Dataset, batched
    /// by length; an array of strings comes back).
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// assert(m.translate("The cat is sleeping on the sofa.") == "O gato está dormindo no sofá.");
    /// assert(m.translate(corpus(asset("pud_en.txt")).take(2)).len() == 2);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn translate(m: &mut ScriptModel, input: Dynamic) -> ScriptResult<Dynamic> {
        translate_opts(m, input, Map::new())
    }

    /// Greedy translation with options: `tgt_lang`, the target language's code (NLLB's
    /// "fra_Latn", mBART's "fr_XX"), forced as the first token of these translations (the
    /// model's own, from `load_model`'s `tgt_lang` or the checkpoint, otherwise).
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/m2m100", #{device: "cpu"});
    /// let fr = m.translate("The cat sat.", #{tgt_lang: "fra_Latn"});
    /// let de = m.translate("The cat sat.", #{tgt_lang: "deu_Latn"});
    /// assert(type_of(fr) == "string" && fr != de);
    /// ```
    #[rhai_fn(name = "translate", return_raw, pure)]
    pub fn translate_opts(m: &mut ScriptModel, input: Dynamic, options: Map) -> ScriptResult<Dynamic> {
        let o = Opts::new(&options, "translate", TRANSLATE_OPTIONS)?;
        let forced = match o.string("tgt_lang")? {
            Some(code) => Some(m.model.target_language(&code).or_else(|e| err(format!("translate: {e}")))?),
            None => m.model.net.forced_bos.get(),
        };
        let list = dataset_texts(&input, "translate")?;
        let refs: Vec<&str> = list.iter().map(|s| s.as_str()).collect();
        let gates = m.gates().script()?;
        let ids = m.model.translate_forced(&refs, &gates, 4096, forced).or_else(|e| err(format!("translate: {e}")))?;
        let outs = ids
            .iter()
            .map(|i| m.model.detokenize(i))
            .collect::<Result<Vec<_>, _>>()
            .or_else(|e| err(format!("translate: {e}")))?;
        Ok(if input.is_string() || input.is_map() {
            Dynamic::from(outs.into_iter().next().unwrap_or_default())
        } else {
            Dynamic::from(outs.into_iter().map(Dynamic::from).collect::<Array>())
        })
    }

    /// Runs the encoder over a dataset (or an array of sentences) in length buckets and reports
    /// what it did: `sentences`, `tokens` (real, special included), `padded_tokens`, `batches`,
    /// `seconds`, `tokens_per_second`. Options: `batch_tokens` (padded tokens per batch,
    /// default 1024). Nothing is kept: this measures a plain forward pass.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let r = m.forward(corpus(asset("pud_en.txt")).take(20), #{batch_tokens: 512});
    /// assert(r.sentences == 20 && r.tokens > 20 * 5 && r.batches >= 2);
    /// ```
    #[rhai_fn(name = "forward", return_raw, pure)]
    pub fn forward_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<Map> {
        let o = Opts::new(&options, "forward", FORWARD_OPTIONS)?;
        let batch_tokens = o.usize_or_default("batch_tokens")?.max(1);
        let list = dataset_texts(&data, "forward")?;
        let refs: Vec<&str> = list.iter().map(|s| s.as_str()).collect();
        let gates = m.gates().script()?;
        let t0 = std::time::Instant::now();
        let stats = m
            .model
            .encode_stream(&refs, batch_tokens, &gates, &crate::run::interrupted, &mut |_, _| Ok(()))
            .or_else(|e| err(format!("forward: {e}")))?;
        let secs = t0.elapsed().as_secs_f64();
        let mut r = Map::new();
        r.insert("sentences".into(), Dynamic::from(stats.sentences as i64));
        r.insert("tokens".into(), Dynamic::from(stats.tokens as i64));
        r.insert("padded_tokens".into(), Dynamic::from(stats.padded_tokens as i64));
        r.insert("batches".into(), Dynamic::from(stats.batches as i64));
        r.insert("seconds".into(), Dynamic::from(secs));
        r.insert("tokens_per_second".into(), Dynamic::from(stats.tokens as f64 / secs.max(1e-9)));
        Ok(r)
    }

    /// `forward` with the default batch size.
    ///
    /// ```rhai
    /// assert(load_model("enpt").forward(["Hello.", "Good morning."]).sentences == 2);
    /// ```
    #[rhai_fn(name = "forward", return_raw, pure)]
    pub fn forward(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<Map> {
        forward_opts(m, data, Map::new())
    }

    /// Greedy continuation of a text by a decoder-only model (at most `n` new tokens); a masked
    /// view generates with its heads masked.
    ///
    /// ```rhai
    /// let m = load_model("smollm2");
    /// assert(m.kinds == ["dec"] && m.heads_per_layer("dec") == 9);
    /// let s = m.generate("The capital of France is", 4);
    /// assert(s.len() > 0);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn generate(m: &mut ScriptModel, text: &str, n: i64) -> ScriptResult<String> {
        generate_opts(m, text, n, Map::new())
    }

    /// `generate` from a dataset row's `text`.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/gpt2");
    /// assert(m.generate(#{text: "a b c"}, 3) == m.generate("a b c", 3));
    /// ```
    #[rhai_fn(name = "generate", return_raw, pure)]
    pub fn generate_row(m: &mut ScriptModel, row: Map, n: i64) -> ScriptResult<String> {
        let text = crate::data::script::one_text(&Dynamic::from(row), "generate")?;
        // What the generation refuses (positions, memory) is the row's text: say so.
        let chars = text.chars().count();
        generate_opts(m, &text, n, Map::new()).map_err(|e| match *e {
            rhai::EvalAltResult::ErrorRuntime(msg, at) => Box::new(rhai::EvalAltResult::ErrorRuntime(
                Dynamic::from(format!("{msg} (the row's 'text', {chars} characters)")),
                at,
            )),
            other => Box::new(other),
        })
    }

    /// `generate` with options: `cache` (true: the prompt runs once and each new token runs
    /// over the key/value cache; false: the whole prefix runs again for every token, the
    /// reference the cache is checked against; both give the same tokens). A hybrid stack
    /// (LFM2) continues its conv layers from their carried states beside the attention cache.
    ///
    /// ```rhai
    /// let m = load_model("smollm2");
    /// assert(m.generate("The capital of France is", 6, #{cache: false}) == m.generate("The capital of France is", 6));
    /// let h = load_model("tests/fixtures/tiny_hf/lfm2");
    /// assert(h.generate("a b c", 6, #{cache: false}) == h.generate("a b c", 6));
    /// ```
    #[rhai_fn(name = "generate", return_raw, pure)]
    pub fn generate_opts(m: &mut ScriptModel, text: &str, n: i64, options: Map) -> ScriptResult<String> {
        let o = Opts::new(&options, "generate", GENERATE_OPTIONS)?;
        if !(1..=4096).contains(&n) {
            return err(format!("generate: n must be between 1 and 4096, got {n}"));
        }
        let gates = m.gates().script()?;
        let ids = m
            .model
            .generate_with(text, n as usize, &gates, o.bool_or_default("cache")?)
            .or_else(|e| err(format!("generate: {e}")))?;
        m.model.detokenize(&ids).or_else(|e| err(format!("generate: {e}")))
    }

    /// One head, checked against the model's shape.
    ///
    /// ```rhai
    /// let h = load_model("minilm").head("enc", 2, 5);
    /// assert(h.to_string() == "enc.2.5");
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn head(m: &mut ScriptModel, k: &str, layer: i64, index: i64) -> ScriptResult<Head> {
        Ok(Head { model: m.clone(), id: head_id(m, k, layer, index)? })
    }

    /// One head by its printed name (`KIND.LAYER.HEAD`, as results print heads).
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// assert(m.head("cross.1.2") == m.head("cross", 1, 2));
    /// ```
    ///
    /// ```rhai,error
    /// load_model("minilm").head("enc.9.0");
    /// ```
    #[rhai_fn(name = "head", return_raw, pure)]
    pub fn head_by_name(m: &mut ScriptModel, name: &str) -> ScriptResult<Head> {
        let id: HeadId = name.parse().or_else(|e: String| err(format!("head: {e}")))?;
        m.model.check_head(id).or_else(|e| err(format!("head: {e}")))?;
        Ok(Head { model: m.clone(), id })
    }

    /// Every head of one attention kind, layer by layer.
    ///
    /// ```rhai
    /// assert(load_model("enpt").heads("cross").len() == 16);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn heads(m: &mut ScriptModel, k: &str) -> ScriptResult<Array> {
        let s = m.model.kind_shape(kind("heads", k)?).or_else(|e| err(format!("heads: {e}")))?;
        let mut out = Array::new();
        for l in 0..s.n_layers {
            for h in 0..s.n_heads {
                out.push(Dynamic::from(Head { model: m.clone(), id: HeadId { kind: s.kind, layer_idx: l, head: h } }));
            }
        }
        Ok(out)
    }

    /// A view of the model with these heads masked (gates 0), sharing the weights; the
    /// original model is unchanged. Heads accumulate over repeated calls.
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// let masked = m.with_mask([m.head("enc", 0, 1), m.head("cross", 1, 7)]);
    /// assert(masked.masked.len() == 2 && m.masked.len() == 0);
    /// ```
    ///
    /// Heads may also be given by name, or as a table of heads (`g.top(3)`):
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// let g = m.confidence(corpus(asset("pud_en.txt")).take(2));
    /// assert(m.with_mask(["enc.0.1", "enc.5.5"]).masked.len() == 2);
    /// assert(m.with_mask(g.top(3)).masked.len() == 3);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn with_mask(m: &mut ScriptModel, heads: Dynamic) -> ScriptResult<ScriptModel> {
        Ok(m.closing(&head_ids(m, &heads, "with_mask")?))
    }

    /// The heads this view masks.
    ///
    /// ```rhai
    /// let m = load_model("minilm");
    /// assert(m.with_mask([m.head("enc", 1, 1)]).masked[0].to_string() == "enc.1.1");
    /// ```
    #[rhai_fn(get = "masked", pure)]
    pub fn masked(m: &mut ScriptModel) -> Array {
        m.closed.iter().map(|&id| Dynamic::from(Head { model: m.clone(), id })).collect()
    }

    /// The gates of this view: per kind, a layers x heads matrix of 1 (open) and 0 (masked).
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// let g = m.with_mask([m.head("cross", 1, 3)]).gates;
    /// assert(g.cross[1][3] == 0.0 && g.cross[0][3] == 1.0 && g.enc[5][7] == 1.0);
    /// ```
    #[rhai_fn(get = "gates", pure)]
    pub fn gates(m: &mut ScriptModel) -> Map {
        let mut out = Map::new();
        for s in m.model.kinds() {
            let rows: Array = (0..s.n_layers)
                .map(|l| {
                    Dynamic::from(
                        (0..s.n_heads)
                            .map(|h| {
                                Dynamic::from(if m.closed.contains(&HeadId { kind: s.kind, layer_idx: l, head: h }) {
                                    0.0
                                } else {
                                    1.0
                                })
                            })
                            .collect::<Array>(),
                    )
                })
                .collect();
            out.insert(s.kind.to_string().into(), Dynamic::from(rows));
        }
        out
    }

    #[rhai_fn(name = "to_string", pure)]
    pub fn model_to_string(m: &mut ScriptModel) -> String {
        m.describe()
    }

    #[rhai_fn(name = "to_debug", pure)]
    pub fn model_to_debug(m: &mut ScriptModel) -> String {
        m.describe()
    }
}

pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<ScriptModel>("Model");
    engine.register_type_with_name::<Head>("Head");
    engine.register_type_with_name::<AttentionMatrix>("AttentionMatrix");
    engine.register_global_module(exported_module!(api).into());
    engine.register_global_module(exported_module!(head::api).into());
    engine.register_global_module(exported_module!(hooks::api).into());
    engine.register_global_module(exported_module!(outputs::api).into());
}

pub fn render(v: &Dynamic) -> Option<Output> {
    if let Some(m) = v.clone().try_cast::<ScriptModel>() {
        return Some(Output::text(m.describe()));
    }
    if let Some(h) = v.clone().try_cast::<Head>() {
        return Some(Output::text(h.id.to_string()));
    }
    v.clone().try_cast::<AttentionMatrix>().map(|a| a.render())
}
