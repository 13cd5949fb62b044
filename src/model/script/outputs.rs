//! The model's own outputs as values (docs/methods.md#model-outputs): `m.logits(text)`,
//! `m.top_tokens(text, k)`, `m.loss(text or data)`. Every one runs on the view as given
//! (masked heads, continuous gates, mean ablation).

use super::{dataset_texts, tensor_value, ScriptModel};
use crate::script::convert::ScriptErr;
use crate::script::convert::{err, opt_bool, opt_int, opt_str, OptSpec, Opts, ScriptResult};
use crate::table::{Cell, Table};
use rhai::plugin::*;
use rhai::{Dynamic, Map};

pub const LOGITS_OPTIONS: &[OptSpec] = &[
    opt_str(
        "positions",
        "last",
        "\"last\" (the next-token logits after the whole text) or \"all\" (every position: [pos][vocab])",
    ),
    crate::model::script::TGT_LANG,
];
pub const LOSS_OPTIONS: &[OptSpec] = &[
    opt_bool("per_token", false, "a table of every predicted token's loss (one text) instead of the mean"),
    opt_int(
        "batch_tokens",
        crate::model::batch::DEFAULT_BATCH_TOKENS as i64,
        "tokens per batch, padding included (many sentences)",
    ),
    crate::model::script::TGT_LANG,
];

fn text_arg(text: &str, func: &str) -> ScriptResult<()> {
    if text.trim().is_empty() {
        return err(format!("{func}: the text is empty"));
    }
    Ok(())
}

fn predictions(m: &ScriptModel, text: &str, func: &str) -> ScriptResult<crate::model::loss::TextPredictions> {
    text_arg(text, func)?;
    m.model.predictions(text, &m.gates().script()?).or_else(|e| err(format!("{func}: {e}")))
}

#[export_module]
pub mod api {
    use super::*;

    /// The next-token logits after `text` (a decoder-only language model): an array of one
    /// number per vocabulary entry, as transformers' `model(ids).logits[0, -1]` (soft-capped
    /// where the model says so). Option `positions: "all"` gives every position's, `[pos][vocab]`.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/gpt2");
    /// let l = m.logits("a b c");
    /// assert(l.len() == 320);
    /// assert(m.logits("a b c", #{positions: "all"}).len() == 3);
    /// ```
    #[rhai_fn(name = "logits", return_raw, pure)]
    pub fn logits_opts(m: &mut ScriptModel, text: &str, options: Map) -> ScriptResult<Dynamic> {
        let o = Opts::new(&options, "logits", LOGITS_OPTIONS)?;
        let _lang = crate::model::script::call_language(m, &o)?;
        let all = match o.string_or_default("positions")?.as_str() {
            "last" => false,
            "all" => true,
            other => return err(format!("logits: unknown positions '{other}' (expected \"last\" or \"all\")")),
        };
        let p = predictions(m, text, "logits")?;
        let t = p.logits.size()[0];
        if all {
            tensor_value(&p.logits)
        } else {
            tensor_value(&p.logits.get(t - 1))
        }
    }

    /// `logits` at the last position.
    ///
    /// ```rhai
    /// assert(load_model("tests/fixtures/tiny_hf/llama").logits("a b").len() == 320);
    /// ```
    #[rhai_fn(name = "logits", return_raw, pure)]
    pub fn logits(m: &mut ScriptModel, text: &str) -> ScriptResult<Dynamic> {
        logits_opts(m, text, Map::new())
    }

    /// The `k` most likely next tokens after `text`: a table of rank, token, id, probability
    /// and logit (the probabilities a softmax over the whole vocabulary).
    ///
    /// ```rhai
    /// let m = load_model("smollm2");
    /// let t = m.top_tokens("The capital of France is", 5);
    /// assert(t.len() == 5 && t.column("token")[0] == "␣Paris");
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn top_tokens(m: &mut ScriptModel, text: &str, k: i64) -> ScriptResult<Table> {
        let p = predictions(m, text, "top_tokens")?;
        let (t, v) = (p.logits.size()[0], p.logits.size()[1]);
        if k < 1 || k > v {
            return err(format!("top_tokens: k = {k} out of range: 1..{v} (the vocabulary)"));
        }
        let last = p.logits.get(t - 1).to_kind(tch::Kind::Double);
        let probs = last.softmax(-1, tch::Kind::Double);
        let (vals, idx) = last.topk(k, -1, true, true);
        let mut table = Table::new(["rank", "token", "id", "prob", "logit"].map(String::from).to_vec());
        table.title = Some(format!("top {k} next tokens after {:?}: {}", text, m.model.name()));
        table.digits = 4;
        for r in 0..k {
            let id = idx.int64_value(&[r]);
            table
                .push_row(vec![
                    Cell::Int(r + 1),
                    Cell::Text(crate::plot::reader_token(&m.model.tok.id_to_token(id))),
                    Cell::Int(id),
                    Cell::Float(probs.double_value(&[id])),
                    Cell::Float(vals.double_value(&[r])),
                ])
                .or_else(|e| err(e.to_string()))?;
        }
        Ok(table)
    }

    /// The task loss (docs/methods.md#task-loss) of a text, an array of texts or a Dataset: a
    /// language model's mean next-token loss over every predicted token, a translation model's
    /// teacher-forced loss (references, else its greedy output). Option `per_token: true` (one
    /// text, a language model) gives a table of position, token, next token and its loss.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/gpt2");
    /// let t = m.loss("a b c d", #{per_token: true});
    /// assert(t.len() == 3 && t.column("next")[0] == "␣b");
    /// let mean = t.column("loss").reduce(|s, x| s + x, 0.0) / 3.0;
    /// assert(abs(m.loss("a b c d") - mean) < 1e-5);
    /// ```
    #[rhai_fn(name = "loss", return_raw, pure)]
    pub fn loss_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<Dynamic> {
        let o = Opts::new(&options, "loss", LOSS_OPTIONS)?;
        let _lang = crate::model::script::call_language(m, &o)?;
        if o.bool_or_default("per_token")? {
            let Some(text) = data.clone().try_cast::<rhai::ImmutableString>() else {
                return err(format!("loss: per_token takes one text, got {}", crate::script::convert::quote(&data)));
            };
            let p = predictions(m, &text, "loss")?;
            let losses = p.next_token_losses().or_else(|e| err(format!("loss: {e}")))?;
            let mut t = Table::new(["position", "token", "next", "loss"].map(String::from).to_vec());
            t.title = Some(format!("next-token loss of {:?}: {}", text.as_str(), m.model.name()));
            t.digits = 4;
            for (i, l) in losses.iter().enumerate() {
                t.push_row(vec![
                    Cell::Int(i as i64),
                    Cell::Text(crate::plot::reader_token(&p.encoded.tokens[i])),
                    Cell::Text(crate::plot::reader_token(&p.encoded.tokens[i + 1])),
                    Cell::Float(*l),
                ])
                .or_else(|e| err(e.to_string()))?;
            }
            return Ok(Dynamic::from(t));
        }
        let (texts, refs): (Vec<String>, Option<Vec<String>>) = match data.clone().try_cast::<crate::data::Dataset>() {
            Some(d) if !d.is_empty() => {
                (d.items.iter().map(|i| i.text.clone()).collect(), d.items.iter().map(|i| i.target.clone()).collect())
            }
            _ => (dataset_texts(&data, "loss")?, None),
        };
        if let Some(i) = texts.iter().position(|t| t.trim().is_empty()) {
            return err(format!("loss: text {i} is empty"));
        }
        let tr: Vec<&str> = texts.iter().map(|s| s.as_str()).collect();
        let rr: Option<Vec<&str>> = refs.as_ref().map(|r| r.iter().map(|s| s.as_str()).collect());
        let bt = o.usize_or_default("batch_tokens")?.max(1);
        let (loss, _, _) = m
            .model
            .dataset_loss(&tr, rr.as_deref(), bt, &m.gates().script()?, &crate::run::interrupted)
            .or_else(|e| err(format!("loss: {e}")))?;
        Ok(Dynamic::from(loss))
    }

    /// `loss` with the default options: the mean task loss.
    ///
    /// ```rhai
    /// let m = load_model("smollm2");
    /// assert(m.loss(["The cat sat on the mat.", "I like green tea."]) > 0.0);
    /// ```
    #[rhai_fn(name = "loss", return_raw, pure)]
    pub fn loss(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<Dynamic> {
        loss_opts(m, data, Map::new())
    }
}
