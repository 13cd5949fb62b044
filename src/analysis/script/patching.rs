//! Activation patching on a model: `m.patch(pairs, #{...})` (docs/methods.md#activation-patching).

use crate::analysis::patching::{
    attribute, attribute_translation, patch_only, patch_translation, path_patch, Direction, PairIds, PatchAcc,
    PatchMetric, PatchSpec, Patched, PathInput, Receiver, Site, SourcePair, Unit,
};
use crate::data::pairs::Pairs;
use crate::data::pairs_script::pairs_arg;
use crate::data::script::Plan;
use crate::grid::Grid;
use crate::model::script::ScriptModel;
use crate::model::Kind;
use crate::model::Model;
use crate::script::convert::ScriptErr;
use crate::script::convert::{err, opt, opt_int, opt_str, OptSpec, Opts, ScriptResult};
use crate::table::{Cell, Table};
use rhai::plugin::*;
use rhai::{Array, Dynamic, Map};
use serde_json::json;

pub const PATCH_OPTIONS: &[OptSpec] = &[
    opt_str("site", "z", "what is patched: \"z\" (= \"result\"), \"q\", \"k\", \"v\" (by key/value head), \"pattern\", the residual stream's \"resid_pre\", \"attn_out\", \"mlp_out\", or each expert's output \"expert_out\" (mixtures of experts)"),
    opt_str("positions", "all", "\"all\" (every position at once) or \"each\" (one position at a time; the pairs must share one token length)"),
    opt_str("direction", "denoise", "\"denoise\" (clean values into the corrupted run) or \"noise\" (corrupted into clean)"),
    opt_str("metric", "logit_diff", "\"logit_diff\" (answer - wrong), \"prob\" (of the answer), \"kl\" (clean || run) or \"loss\" (-log p(answer)), at the last position"),
    opt_str("method", "exact", "\"exact\" (one run per patch, batched) or \"attribution\" (the first-order estimate: two forwards and one backward; docs/methods.md#attribution-patching)"),
    opt("kinds", "every kind (translation models; the residual stream: enc and dec)", "the attention kinds patched, for translation models: \"enc\", \"dec\", \"cross\""),
    opt_int("verify", 0, "with method \"attribution\": patch the k units of largest |estimated effect| exactly (-1: every unit) and report the agreement"),
    opt("receiver", "none", "path patching (docs/methods.md#path-patching): a head (\"dec.5.3\") or \"logits\"; every sender head's output reaches only that receiver's input"),
    opt_int("batch_tokens", crate::model::batch::DEFAULT_BATCH_TOKENS as i64, "prompt tokens per batch of pairs (what bounds the recorded runs' memory)"),
    opt_str("receiver_input", "q", "with a receiver head: the input its senders reach, \"q\", \"k\" or \"v\" (k, v: the key/value head serving it)"),
    crate::model::script::TGT_LANG,
    crate::data::script::SHARD_OPTION,
];

options_enum!(Method, "patching method", {
    Exact = "exact",
    Attribution = "attribution",
});

/// The one token of an answer (special tokens such as a BOS the tokenizer adds left out).
fn answer_id(model: &Model, text: &str, what: &str, origin: &str) -> ScriptResult<i64> {
    let e = model.tokenize(text).or_else(|e| err(format!("patch: {origin}: the {what} {text:?}: {e}")))?;
    let toks: Vec<(i64, &String)> =
        e.ids.iter().zip(&e.tokens).zip(&e.special).filter(|(_, s)| !**s).map(|((i, t), _)| (*i, t)).collect();
    match toks.as_slice() {
        [(id, _)] => Ok(*id),
        [] => err(format!("patch: {origin}: the {what} {text:?} has no tokens")),
        many => err(format!(
            "patch: {origin}: the {what} {text:?} is {} tokens ({}), not one; patching reads one next token",
            many.len(),
            many.iter().map(|(_, t)| format!("{t:?}")).collect::<Vec<_>>().join(", ")
        )),
    }
}

fn token_ids(m: &ScriptModel, pairs: &Pairs) -> ScriptResult<(Vec<PairIds>, Vec<String>)> {
    let model = &m.model;
    let mut out = Vec::with_capacity(pairs.len());
    let mut first_tokens = Vec::new();
    let vocab = model.net.embed.vocab();
    for p in pairs.items.iter() {
        if p.ids.is_none() && p.answer.is_empty() {
            return err(format!("patch: {}: no answer: a language model's pair is [clean, corrupted, answer, wrong] (the answer the clean prompt should get, a wrong one)", p.origin));
        }
        if let Some(t) = &p.ids {
            if let Some(bad) = t.clean.iter().chain(&t.corrupted).chain([&t.answer, &t.wrong]).find(|&&v| v >= vocab) {
                return err(format!(
                    "patch: {}: token id {bad} out of range: the vocabulary has ids 0..{}",
                    p.origin,
                    vocab - 1
                ));
            }
            if t.clean.len() != t.corrupted.len() {
                return err(format!("patch: {}: the clean prompt is {} tokens, the corrupted {}; a pair must have one length (positions are patched one for one)", p.origin, t.clean.len(), t.corrupted.len()));
            }
            if first_tokens.is_empty() {
                first_tokens = model.tok.ids_to_tokens(&t.clean);
            }
            out.push(PairIds {
                clean: t.clean.clone(),
                corrupted: t.corrupted.clone(),
                answer: t.answer,
                wrong: Some(t.wrong),
            });
            continue;
        }
        let tok = |t: &str, what: &str| {
            model.tokenize(t).or_else(|e| err(format!("patch: {}: the {what} prompt: {e}", p.origin)))
        };
        let (c, k) = (tok(&p.clean, "clean")?, tok(&p.corrupted, "corrupted")?);
        if c.ids.len() != k.ids.len() {
            return err(format!("patch: {}: the clean prompt is {} tokens, the corrupted {}; a pair must have one length (positions are patched one for one)", p.origin, c.ids.len(), k.ids.len()));
        }
        if first_tokens.is_empty() {
            first_tokens = c.tokens.clone();
        }
        out.push(PairIds {
            clean: c.ids,
            corrupted: k.ids,
            answer: answer_id(model, &p.answer, "answer", &p.origin)?,
            wrong: Some(answer_id(model, &p.wrong, "wrong answer", &p.origin)?),
        });
    }
    Ok((out, first_tokens))
}

/// The result map of a patching run: per kind its grid (`rs`: the kinds patched, each over
/// the same clean and corrupted runs).
#[allow(clippy::too_many_arguments)]
fn result(
    model: &str,
    pairs: &str,
    n_pairs: usize,
    spec: PatchSpec,
    rs: &[(Kind, Patched)],
    tokens: &[String],
    echo: crate::output::Echo,
    how: &str,
) -> ScriptResult<Map> {
    let what = format!(
        "{how}{} patching of {} ({}, {})",
        spec.direction,
        spec.site,
        spec.metric,
        if spec.each_position { "per position" } else { "all positions" }
    );
    let Some((_, first)) = rs.first() else { return err("patch: nothing was patched") };
    let mut out = Map::new();
    let pos_label = |p: usize| format!("{p}:{}", tokens.get(p).map_or("", |t| t.as_str()));
    let n_pos = rs.iter().flat_map(|(_, r)| r.patched.iter().map(|l| l.len())).max().unwrap_or(0);
    let normalised = |r: &Patched, v: f64| r.normalized(v);
    let raw = |_: &Patched, v: f64| v;
    if spec.site == Site::ExpertOut {
        // One value per expert as loaded (a dense layer's row empty): an expert grid.
        let grid = |f: &dyn Fn(&Patched, f64) -> f64, stat: &str| -> Dynamic {
            let values = first_kind(rs)
                .patched
                .iter()
                .map(|l| l.first().map_or_else(Vec::new, |row| row.iter().map(|&v| f(first_kind(rs), v)).collect()))
                .collect();
            Dynamic::from(crate::analysis::script::experts::ExpertGrid {
                stat: format!("{stat} of {what}"),
                model: model.to_string(),
                dataset: pairs.to_string(),
                values,
                options: echo.clone(),
            })
        };
        out.insert("effect".into(), grid(&normalised, "normalised effect"));
        out.insert("patched".into(), grid(&raw, &spec.metric.to_string()));
    } else if spec.site.per_head() {
        let by_pos = |f: &dyn Fn(&Patched, f64) -> f64, stat: &str| -> Dynamic {
            let grids: Vec<Grid> = (0..n_pos)
                .map(|p| {
                    let kinds = rs
                        .iter()
                        .map(|(k, r)| {
                            // A layer without units (a hybrid's conv layer) reads as removed
                            // heads: a row of NaN as wide as the kind's.
                            let width = r.patched.iter().flatten().map(|row| row.len()).max().unwrap_or(0);
                            (
                                *k,
                                r.patched
                                    .iter()
                                    .map(|l| match l.get(p).filter(|row| !row.is_empty()) {
                                        Some(row) => row.iter().map(|&v| f(r, v)).collect(),
                                        None => vec![f64::NAN; width],
                                    })
                                    .collect(),
                            )
                        })
                        .collect();
                    let at = if spec.each_position { format!(" at position {}", pos_label(p)) } else { String::new() };
                    Grid {
                        stat: format!("{stat} of {what}{at}"),
                        model: model.to_string(),
                        dataset: pairs.to_string(),
                        kinds,
                        options: echo.clone(),
                    }
                })
                .collect();
            if spec.each_position {
                Dynamic::from(grids.into_iter().map(Dynamic::from).collect::<Array>())
            } else {
                grids.into_iter().next().map_or(Dynamic::UNIT, Dynamic::from)
            }
        };
        out.insert("effect".into(), by_pos(&normalised, "normalised effect"));
        out.insert("patched".into(), by_pos(&raw, &spec.metric.to_string()));
    } else {
        let table = |f: &dyn Fn(&Patched, f64) -> f64, stat: &str| -> ScriptResult<Table> {
            let mut cols = vec!["layer".to_string()];
            cols.extend((0..n_pos).map(|p| if spec.each_position { pos_label(p) } else { "all".into() }));
            let mut t = Table::new(cols);
            t.title = Some(format!("{stat} of {what}: {model} on {pairs}"));
            t.digits = 3;
            for (kind, r) in rs {
                for (l, layer) in r.patched.iter().enumerate() {
                    let mut cells = vec![Cell::Text(format!("{kind}.{l}"))];
                    cells.extend(layer.iter().map(|row| row.first().map_or(Cell::Empty, |&v| Cell::Float(f(r, v)))));
                    t.push_row(cells).or_else(|e| err(e.to_string()))?;
                }
            }
            Ok(t)
        };
        out.insert("effect".into(), Dynamic::from(table(&normalised, "normalised effect")?));
        out.insert("patched".into(), Dynamic::from(table(&raw, &spec.metric.to_string())?));
    }
    out.insert("clean".into(), Dynamic::from(first.clean));
    out.insert("corrupted".into(), Dynamic::from(first.corrupted));
    out.insert("pairs".into(), Dynamic::from(n_pairs as i64));
    if spec.each_position {
        out.insert("tokens".into(), Dynamic::from(tokens.iter().cloned().map(Dynamic::from).collect::<Array>()));
    }
    out.insert("options".into(), Dynamic::from(crate::script::convert::echo_map(&echo)));
    Ok(out)
}

/// The first kind's result (a language model's only one).
fn first_kind(rs: &[(Kind, Patched)]) -> &Patched {
    &rs[0].1
}

/// A translation model's pairs: the sources tokenized (one length per pair), each scored on
/// the clean source's greedy translation (EOS appended); the tokens shown per position.
fn source_pairs(
    m: &ScriptModel,
    pairs: &Pairs,
    kind_each: Option<Kind>,
) -> ScriptResult<(Vec<SourcePair>, Vec<String>)> {
    let model = &m.model;
    // The sources tokenized and checked first, so that bad input is refused before any run.
    let mut sources = Vec::with_capacity(pairs.len());
    for p in pairs.items.iter() {
        if p.ids.is_some() || !p.answer.is_empty() {
            return err(format!("patch: {}: a translation model's pair is two source sentences [clean, corrupted] (its metric is read over the clean translation), not a prompt with answers", p.origin));
        }
        let tok = |t: &str, what: &str| {
            model.tokenize(t).or_else(|e| err(format!("patch: {}: the {what} source: {e}", p.origin)))
        };
        let (c, k) = (tok(&p.clean, "clean")?, tok(&p.corrupted, "corrupted")?);
        if c.ids.len() != k.ids.len() {
            return err(format!("patch: {}: the clean source is {} tokens, the corrupted {}; a pair must have one length (positions are patched one for one)", p.origin, c.ids.len(), k.ids.len()));
        }
        sources.push((c, k));
    }
    // Every clean source translated at once (batched by length), EOS appended.
    let cleans: Vec<&str> = pairs.items.iter().map(|p| p.clean.as_str()).collect();
    let translations = model
        .translate(&cleans, &m.gates().script()?, crate::model::batch::DEFAULT_BATCH_TOKENS)
        .or_else(|e| err(format!("patch: translating the clean sources: {e}")))?;
    let tokens = match (kind_each, sources.first(), translations.first()) {
        (Some(Kind::Enc) | None, Some((c, _)), _) => c.tokens.clone(),
        (Some(_), _, Some(t)) => model.tok.ids_to_tokens(&[t.as_slice(), &[model.net.eos_id]].concat()),
        _ => Vec::new(),
    };
    let out = sources
        .into_iter()
        .zip(translations)
        .map(|((c, k), mut target)| {
            target.push(model.net.eos_id);
            SourcePair { clean: c.ids, corrupted: k.ids, target }
        })
        .collect();
    Ok((out, tokens))
}

pub fn run_patch(m: &ScriptModel, data: &Dynamic, options: &Map) -> ScriptResult<Map> {
    const F: &str = "patch";
    let o = Opts::new(options, F, PATCH_OPTIONS)?;
    let _lang = crate::model::script::call_language(m, &o)?;
    let site: Site = o.parsed_or_default("site")?;
    let each = match o.string_or_default("positions")?.as_str() {
        "all" => false,
        "each" => true,
        other => return err(format!("patch: unknown positions '{other}' (expected \"all\" or \"each\")")),
    };
    if site == Site::ExpertOut {
        if !(0..m.model.net.stack.len()).any(|l| m.model.experts(l).is_some()) {
            return err(format!(
                "patch: site \"expert_out\" patches experts, and {} has no mixture-of-experts layers",
                m.model.name()
            ));
        }
        if each || o.has("receiver") || o.string_or_default("method")? != "exact" {
            return err("patch: site \"expert_out\" is patched exactly over all positions (positions \"all\", method \"exact\", no receiver)");
        }
    }
    let direction: Direction = o.parsed_or_default("direction")?;
    let metric: PatchMetric = o.parsed_or_default("metric")?;
    let method: Method = o.parsed_or_default("method")?;
    let verify = match o.value("verify").map(|v| v.as_int()) {
        None => 0,
        Some(Ok(k)) if k >= -1 => k,
        Some(_) => {
            return err(format!(
                "patch: verify must be an integer k >= 0 (or -1: every unit), got {}",
                crate::script::convert::quote(&options["verify"])
            ))
        }
    };
    if verify != 0 && method != Method::Attribution {
        return err(
            "patch: verify checks attribution patching against exact patching; give it with method: \"attribution\"",
        );
    }
    let receiver = match o.value("receiver") {
        None => None,
        Some(v) => {
            let name = v.clone().into_string().or_else(|_| {
                err(format!(
                    "patch: receiver must be a head name (\"dec.5.3\") or \"logits\", got {}",
                    crate::script::convert::quote(v)
                ))
            })?;
            if method != Method::Exact || verify != 0 {
                return err("patch: path patching (receiver) is exact; leave out method and verify");
            }
            if o.has("site") && !matches!(site, Site::Z | Site::Result) || each {
                return err("patch: path patching (option 'receiver') sends each head's whole output: site \"z\", positions \"all\"");
            }
            Some(if name == "logits" {
                if o.has("receiver_input") {
                    return err(
                        "patch: receiver_input names a receiver head's input; the receiver \"logits\" has none",
                    );
                }
                Receiver::Logits
            } else {
                let id = m.head(&name, "patch: receiver: ").or_else(|e| err(e.to_string()))?;
                Receiver::Head {
                    layer: id.layer_idx,
                    head: id.head,
                    input: o.parsed_or_default::<PathInput>("receiver_input")?,
                }
            })
        }
    };
    if receiver.is_none() && o.has("receiver_input") {
        return err("patch: receiver_input goes with a receiver head (receiver: \"dec.5.3\")");
    }
    let pairs = pairs_arg(data, F)?;
    let plan = Plan::for_pairs(&pairs, &o, F)?;
    if plan.shard.is_some() && verify != 0 {
        return err("patch: verify patches a shard's own top units exactly; run it on the whole pairs, or merge the shards' attribution first");
    }
    // A shard runs its slice of the pairs; the per-position labels are the whole set's first
    // pair's, so that every shard records the same.
    let part = if plan.shard.is_some() { pairs.slice(plan.rows.clone()) } else { pairs.clone() };
    if m.model.translates() {
        if receiver.is_some() {
            return err("patch: path patching of translation models is not offered yet; patch without a receiver");
        }
        if verify != 0 {
            return err("patch: verify (attribution's top units patched exactly) is offered for language models; for a translation model run method \"exact\" beside method \"attribution\"");
        }
        let metric = if o.has("metric") { metric } else { PatchMetric::Loss };
        let spec = PatchSpec {
            batch_tokens: o.usize_or_default("batch_tokens")?.max(1),
            ..PatchSpec::new(site, each, direction, metric)
        };
        let kinds: Vec<Kind> =
            match o.labels("kinds")? {
                Some(names) if names.is_empty() => return err(
                    "patch: option 'kinds' is empty: name one or more of the model's kinds, or leave it out for all",
                ),
                Some(names) => names
                    .iter()
                    .map(|n| n.parse::<Kind>().or_else(|e| err(format!("patch: option 'kinds': {e}"))))
                    .collect::<ScriptResult<_>>()?,
                None if site.per_head() => m.model.kinds().iter().map(|s| s.kind).collect(),
                None => vec![Kind::Enc, Kind::Dec],
            };
        if each && kinds.len() != 1 {
            return err("patch: per-position patching of a translation model takes one kind (kinds: [\"enc\"], [\"dec\"] or [\"cross\"]): their positions differ");
        }
        let kind_each = if each { kinds.first().copied() } else { None };
        let (sp, tokens) = source_pairs(m, &part, kind_each)?;
        let tokens = if plan.rows.start > 0 { source_pairs(m, &pairs.slice(0..1), kind_each)?.1 } else { tokens };
        let gates = m.gates().script()?;
        let mut rs = Vec::new();
        for (i, &k) in kinds.iter().enumerate() {
            let mut progress = |done: usize, total: usize| {
                crate::run::progress("patching (layers)", i * total + done, kinds.len() * total)
            };
            let r = match method {
                Method::Exact => {
                    patch_translation(&m.model, &sp, spec, k, &gates, &crate::run::interrupted, &mut progress)
                }
                Method::Attribution => attribute_translation(&m.model, &sp, spec, k, &gates, &crate::run::interrupted),
            };
            rs.push((k, r.or_else(|e| err(format!("{F}: {e}")))?));
        }
        let echo = vec![
            ("site".to_string(), json!(site.to_string())),
            ("positions".into(), json!(if each { "each" } else { "all" })),
            ("direction".into(), json!(direction.to_string())),
            ("metric".into(), json!(metric.to_string())),
            ("method".into(), json!(method.to_string())),
            ("kinds".into(), json!(kinds.iter().map(|k| k.to_string()).collect::<Vec<_>>())),
            ("targets".into(), json!("the clean source's greedy translation")),
        ];
        return finish_run(
            m,
            &part,
            &plan,
            spec,
            rs,
            &tokens,
            echo,
            if method == Method::Attribution { "attribution " } else { "" },
        );
    }
    let (ids, tokens) = token_ids(m, &part)?;
    let tokens = if plan.rows.start > 0 { token_ids(m, &pairs.slice(0..1))?.1 } else { tokens };
    let spec = PatchSpec {
        batch_tokens: o.usize_or_default("batch_tokens")?.max(1),
        ..PatchSpec::new(site, each, direction, metric)
    };
    let gates = m.gates().script()?;
    let mut progress = |done: usize, total: usize| crate::run::progress("patching (layers)", done, total);
    let r = match (method, receiver) {
        (_, Some(to)) => path_patch(&m.model, &ids, spec, to, &gates, &crate::run::interrupted, &mut progress),
        (Method::Exact, None) => {
            patch_only(&m.model, &ids, spec, None, &gates, &crate::run::interrupted, &mut progress)
        }
        (Method::Attribution, None) => attribute(&m.model, &ids, spec, &gates, &crate::run::interrupted),
    }
    .or_else(|e| err(format!("{F}: {e}")))?;
    let kind = m.model.net.stack_kind;
    let mut echo = vec![
        ("site".to_string(), json!(site.to_string())),
        ("positions".into(), json!(if each { "each" } else { "all" })),
        ("direction".into(), json!(direction.to_string())),
        ("metric".into(), json!(metric.to_string())),
        ("method".into(), json!(method.to_string())),
    ];
    let how = match receiver {
        None if method == Method::Attribution => "attribution ".to_string(),
        None => String::new(),
        Some(Receiver::Logits) => {
            echo.push(("receiver".into(), json!("logits")));
            "path (to the logits) ".to_string()
        }
        Some(Receiver::Head { layer, head, input }) => {
            echo.push(("receiver".into(), json!(format!("{kind}.{layer}.{head}"))));
            echo.push(("receiver_input".into(), json!(input.to_string())));
            format!("path (to {kind}.{layer}.{head}'s {input}) ")
        }
    };
    if verify == 0 {
        return finish_run(m, &part, &plan, spec, vec![(kind, r)], &tokens, echo, &how);
    }
    echo.push(("clean".into(), crate::script::convert::json_f64(r.clean)));
    echo.push(("corrupted".into(), crate::script::convert::json_f64(r.corrupted)));
    let mut out =
        result(&m.model.name(), &pairs.name, pairs.len(), spec, &[(kind, r.clone())], &tokens, echo.clone(), &how)?;
    {
        // The units of largest estimated |effect|, patched exactly.
        let base = match direction {
            Direction::Denoise => r.corrupted,
            Direction::Noise => r.clean,
        };
        let mut all: Vec<(Unit, f64)> =
            r.patched
                .iter()
                .enumerate()
                .flat_map(|(l, layer)| {
                    layer.iter().enumerate().flat_map(move |(p, row)| {
                        row.iter().enumerate().map(move |(u, &v)| ((l, p, u), (v - base).abs()))
                    })
                })
                .filter(|(_, v)| !v.is_nan())
                .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let k = if verify < 0 { all.len() } else { (verify as usize).min(all.len()) };
        let chosen: Vec<Unit> = all[..k].iter().map(|(u, _)| *u).collect();
        let exact = patch_only(&m.model, &ids, spec, Some(&chosen), &gates, &crate::run::interrupted, &mut progress)
            .or_else(|e| err(format!("{F}: {e}")))?;
        let ex =
            result(&m.model.name(), &pairs.name, pairs.len(), spec, &[(kind, exact.clone())], &tokens, echo, "exact ")?;
        out.insert("exact".into(), ex["effect"].clone());
        out.insert("agreement".into(), Dynamic::from(agreement(&r, &exact, &chosen, k == all.len(), base)?));
    }
    Ok(out)
}

/// The result of a patching run over `part` of the pairs: the map for the whole pairs, or for a
/// shard the shard's own result with its record (accumulators: the pairs' metric sums), which
/// `merge_results` turns into the whole's (docs/methods.md#shards).
#[allow(clippy::too_many_arguments)]
fn finish_run(
    m: &ScriptModel,
    part: &Pairs,
    plan: &Plan,
    spec: PatchSpec,
    rs: Vec<(Kind, Patched)>,
    tokens: &[String],
    echo: crate::output::Echo,
    how: &str,
) -> ScriptResult<Map> {
    let acc = PatchAcc::of(part.len(), &rs);
    let identity = plan.identity(
        m.identity(),
        json!({
            "options": echo,
            "spec": {"site": spec.site.to_string(), "each": spec.each_position, "direction": spec.direction.to_string(), "metric": spec.metric.to_string()},
            "kinds": rs.iter().map(|(k, _)| k.to_string()).collect::<Vec<_>>(),
            "tokens": tokens,
            "how": how,
        }),
    );
    if plan.shard.is_none() {
        return finish_patch(&identity, &acc).or_else(|e| err(format!("patch: {e}")));
    }
    let mut out = finish_patch(&identity, &acc).or_else(|e| err(format!("patch: {e}")))?;
    let options = out.get("options").and_then(|o| o.clone().try_cast::<Map>()).unwrap_or_default();
    let echo: crate::output::Echo =
        options.iter().map(|(k, v)| (k.to_string(), crate::script::convert::dynamic_json(v))).collect();
    let echo = plan
        .seal(
            "patch",
            identity,
            &acc,
            echo,
            |e| e,
            |e| json!({"options": e.iter().cloned().collect::<serde_json::Map<_, _>>()}),
        )
        .or_else(err)?;
    out.insert("options".into(), Dynamic::from(crate::script::convert::echo_map(&echo)));
    Ok(out)
}

/// Patching's result from its accumulators (one process's, or merged shards'): the metric
/// means over every pair, then the grids or tables as one run gives them.
pub fn finish_patch(identity: &serde_json::Value, acc: &PatchAcc) -> Result<Map, String> {
    let sp = &identity["spec"];
    let text =
        |k: &str| sp[k].as_str().map(str::to_string).ok_or_else(|| format!("the shard record's spec has no {k}"));
    let spec = PatchSpec::new(
        text("site")?.parse()?,
        sp["each"].as_bool().unwrap_or(false),
        text("direction")?.parse()?,
        text("metric")?.parse()?,
    );
    let kinds = identity["kinds"].as_array().ok_or("the shard record names no kinds")?;
    let mut rs = Vec::new();
    for k in kinds {
        let name = k.as_str().ok_or("a kind without a name")?;
        rs.push((name.parse::<Kind>()?, acc.patched(name)?));
    }
    let (clean, corrupted) = rs.first().map_or((f64::NAN, f64::NAN), |(_, r)| (r.clean, r.corrupted));
    let mut echo = super::sharded::echo_of(&identity["options"]);
    echo.push(("clean".into(), crate::script::convert::json_f64(clean)));
    echo.push(("corrupted".into(), crate::script::convert::json_f64(corrupted)));
    let tokens: Vec<String> = identity["tokens"]
        .as_array()
        .map_or_else(Vec::new, |t| t.iter().filter_map(|x| x.as_str().map(str::to_string)).collect());
    let model = identity["model"]["name"].as_str().unwrap_or_default();
    let pairs = identity["data"]["name"].as_str().unwrap_or_default();
    result(model, pairs, acc.pairs, spec, &rs, &tokens, echo, identity["how"].as_str().unwrap_or_default())
        .map_err(|e| e.to_string())
}

/// How attribution agrees with exact patching on the verified units: Spearman's rho of the
/// effects and, when every unit was verified, how many of the 10 largest |effects| both share.
fn agreement(attr: &Patched, exact: &Patched, units: &[Unit], every: bool, base: f64) -> ScriptResult<Table> {
    let at = |p: &Patched, (l, q, u): Unit| p.patched[l][q][u] - base;
    let a: Vec<f64> = units.iter().map(|&u| at(attr, u)).collect();
    let e: Vec<f64> = units.iter().map(|&u| at(exact, u)).collect();
    let mut t = Table::new(vec!["units".into(), "spearman".into(), "top".into(), "overlap".into()]);
    t.title = Some("agreement: attribution patching vs exact patching (effects on the verified units)".into());
    t.digits = 3;
    let top = if every { 10.min(units.len()) } else { 0 };
    let neg_abs = |v: &[f64]| v.iter().map(|x| -x.abs()).collect::<Vec<f64>>();
    let overlap = crate::analysis::importance::bottom_k_overlap(&neg_abs(&a), &neg_abs(&e), top);
    t.push_row(vec![
        Cell::Int(units.len() as i64),
        Cell::Float(crate::analysis::importance::spearman(&a, &e)),
        Cell::Int(top as i64),
        if every { Cell::Int(overlap as i64) } else { Cell::Empty },
    ])
    .or_else(|e| err(e.to_string()))?;
    Ok(t)
}

#[export_module]
pub mod api {
    use super::*;

    /// Activation patching (docs/methods.md#activation-patching): for every head of the
    /// model's stack (or every layer of the residual stream), the corrupted prompt run with that
    /// unit's activation taken from the clean run (denoising; `direction: "noise"` the reverse),
    /// the metric read at the last position and averaged over the pairs. Returns a map:
    /// `effect` (the normalised effect `(patched - corrupted) / (clean - corrupted)`, a Grid of
    /// layers x heads, per position an array of Grids, for the residual stream a Table),
    /// `patched` (the metric itself, alike), `clean`, `corrupted`, `pairs`, `tokens` (per
    /// position) and `options`. Options: `site` ("z"), `positions` ("all" | "each"),
    /// `direction` ("denoise"), `metric` ("logit_diff"), `method` ("exact", or "attribution":
    /// the gradient estimate, docs/methods.md#attribution-patching) and `verify` (with
    /// attribution: patch the k units of largest estimated effect exactly, -1 every unit; adds
    /// `exact` and an `agreement` table). Each layer's patches run as rows of one batch above
    /// the layers computed once; the view's masks and gates apply.
    ///
    /// Path patching (docs/methods.md#path-patching): with `receiver` (a head, or "logits"),
    /// each sender head's patched output reaches only that receiver's input (`receiver_input`:
    /// "q", "k" or "v") through the residual stream; the grid holds the senders (layers at and
    /// above the receiver's are empty).
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/llama");
    /// let p = pairs([["a b c d", "a b e d", " c", " e"]]);
    /// let r = m.patch(p, #{receiver: "dec.1.2", receiver_input: "k"});
    /// assert(r.options.receiver == "dec.1.2" && !r.effect["dec.0.3"].is_nan() && r.effect["dec.1.0"].is_nan());
    /// let l = m.patch(p, #{receiver: "logits"});
    /// assert(type_of(l.effect) == "Grid");
    /// ```
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/gpt2");
    /// let p = pairs([["a b c d", "a b e d", " c", " e"]]);
    /// let r = m.patch(p, #{site: "resid_pre", positions: "each"});
    /// // The whole residual stream of layer 0 at every position is the clean run.
    /// let all = m.patch(p, #{site: "resid_pre"});
    /// assert(abs(all.patched.column("all")[0] - all.clean) < 1e-5);
    /// let h = m.patch(p, #{site: "z", metric: "kl"});
    /// assert(h.effect.kinds == ["dec"]);
    /// let a = m.patch(p, #{method: "attribution", verify: -1});
    /// assert(a.agreement.column("units")[0] == 8 && type_of(a.exact) == "Grid");
    /// ```
    ///
    /// A translation model's pairs are two source sentences: both runs are teacher-forced on
    /// the clean source's greedy translation, the metric (`loss` by default, or `kl`) is read
    /// over its tokens, and `kinds` chooses among `enc`, `dec`, `cross` (per position: one
    /// kind; the residual stream: `enc`, `dec`).
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// let p = pairs([["The cat is sleeping.", "The dog is sleeping."]]);
    /// let r = m.patch(p, #{kinds: ["cross"]});
    /// assert(r.effect.kinds == ["cross"] && r.clean < r.corrupted && r.options.metric == "loss");
    /// let e = m.patch(p, #{kinds: ["enc"], site: "resid_pre", positions: "each"});
    /// assert(e.tokens[1] == "▁cat" && e.effect.column("1:▁cat")[0] > 0.99);
    /// let a = m.patch(p, #{kinds: ["cross"], method: "attribution"});
    /// assert(a.options.method == "attribution" && a.clean == r.clean);
    /// ```
    #[rhai_fn(name = "patch", return_raw, pure)]
    pub fn patch_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<Map> {
        run_patch(m, &data, &options)
    }

    /// `m.patch(pairs, #{})`: every head's `hook_z`, all positions, denoising, logit difference.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/llama");
    /// let r = m.patch(pairs([["a b c", "a e c", " b", " e"]]));
    /// assert(type_of(r.effect) == "Grid" && r.pairs == 1);
    /// ```
    #[rhai_fn(name = "patch", return_raw, pure)]
    pub fn patch_plain(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<Map> {
        run_patch(m, &data, &Map::new())
    }
}
