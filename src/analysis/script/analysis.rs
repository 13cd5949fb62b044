//! The `Analysis` type and the functions that make it: `m.analyze(data, #{...})` (the
//! analyses of docs/methods.md in one pass) and `m.confidence(data)`.

use crate::analysis::options::{
    self, default_stats, fraction, no_empty_relations, ExcludeKeys, FreqSource, Options, Stat,
};
use crate::analysis::result::Analysis;
use crate::analysis::{accumulate, finish, freq_table, FreqTable};
use crate::data::script::Plan;
use crate::data::Dataset;
use crate::grid::{matrix, Grid};
use crate::model::script::ScriptModel;
use crate::model::view::View;
use crate::model::Kind;
use crate::output::{Output, Render};
use crate::script::convert::{err, opt, OptSpec, Opts, ScriptResult};
use crate::table::Table;
use rhai::plugin::*;
use rhai::{Array, Dynamic, Map};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

thread_local! {
    /// Frequency tables by (model path, source, top_n): tokenizing a corpus takes a while.
    static FREQ: RefCell<HashMap<(String, String, usize), Rc<FreqTable>>> = RefCell::new(HashMap::new());
}

#[derive(Clone)]
pub struct AnalysisObj(pub Rc<Analysis>);

impl AnalysisObj {
    /// One statistic as a grid, by the name scripts use for its property.
    pub fn stat_grid(&self, stat: &str) -> Result<Grid, String> {
        match stat {
            "confidence" => self.confidence_grid(),
            "positional" => self.positional_grid(),
            "rare" => self.rare_grid(),
            other => Err(format!("no statistic '{other}' as a grid (expected \"confidence\", \"positional\" or \"rare\"; syntactic grids come per relation)")),
        }
    }

    /// The confidence grid (`a.confidence`).
    pub fn confidence_grid(&self) -> Result<Grid, String> {
        self.grid("confidence", |k| k.confidence.clone())
    }

    /// The positional grid (`a.positional`): the fraction of queries at each head's most
    /// frequent offset.
    pub fn positional_grid(&self) -> Result<Grid, String> {
        self.grid("positional fraction", |k| {
            k.positional.as_ref().map(|p| p.iter().map(|r| r.iter().map(|x| x.fraction).collect()).collect())
        })
    }

    /// The rare-word grid (`a.rare`).
    pub fn rare_grid(&self) -> Result<Grid, String> {
        self.grid("rare-word score", |k| k.rare.as_ref().map(|r| r.score.clone()))
    }

    fn grid(
        &self,
        stat: &str,
        f: impl Fn(&crate::analysis::result::KindResult) -> Option<Vec<Vec<f64>>>,
    ) -> Result<Grid, String> {
        let kinds: crate::model::KindGrids = self.0.kinds.iter().filter_map(|k| f(k).map(|m| (k.kind, m))).collect();
        if kinds.is_empty() {
            return Err(format!(
                "this analysis did not compute '{stat}' (stats: {})",
                self.0
                    .options
                    .iter()
                    .find(|(k, _)| k == "stats")
                    .map_or(String::new(), |(_, v)| crate::output::echo_text(v))
            ));
        }
        Ok(Grid {
            stat: stat.into(),
            model: self.0.model.clone(),
            dataset: self.0.dataset.clone(),
            kinds,
            options: self.0.options.clone(),
        })
    }
}

impl Render for AnalysisObj {
    fn render(&self) -> Output {
        let a = &self.0;
        let mut text = a.summary();
        let mut html = format!("<p>{}</p>", crate::output::html_escape(&a.summary()));
        let f = a.functions_table();
        if !f.rows.is_empty() {
            text += &format!("\n{}", f.to_text());
            html += &f.to_html();
        }
        if let Some(t) = a.syntactic_table() {
            text += &format!("\n{}", t.to_text());
            html += &t.to_html();
        }
        Output { text, html: Some(html), ..Default::default() }
    }
}

pub const OPTIONS: &[OptSpec] = &[
    opt(
        "stats",
        "[\"confidence\", \"positional\", \"rare\"] (+ \"syntactic\" on a treebank)",
        "which statistics to compute",
    ),
    opt("kinds", "every kind", "the attention kinds analysed"),
    options::BATCH_TOKENS_OPTION,
    opt(
        "exclude_keys",
        "\"special\" for a decoder-only model (its BOS sink), else \"eos\"",
        "keys left out of argmax and confidence: \"eos\", \"special\" or \"none\"",
    ),
    options::POSITIONAL_THRESHOLD_OPTION,
    options::RARE_TOP_N_OPTION,
    options::RARE_THRESHOLD_OPTION,
    opt("freq", "the Brown corpus", "a text file whose token counts define rarity"),
    opt("freq_counts", "", "token<TAB>count lines instead of 'freq'"),
    options::RELATIONS_OPTION,
    options::SUBTYPES_OPTION,
    options::MARGIN_OPTION,
    options::TILE_ROWS_OPTION,
    opt("treebank", "", "a treebank matching a corpus sentence by sentence"),
    crate::data::script::SHARD_OPTION,
    crate::model::script::TGT_LANG,
];

/// The typed options of `analyze` from an option map checked against [`OPTIONS`]: what the
/// map gives, else the defaults of the list. `stats` and `kinds` are the caller's (they depend
/// on the model and the data); `brown` is the default frequency corpus.
pub fn options_from(
    o: &Opts,
    stats: Vec<Stat>,
    kinds: Vec<Kind>,
    brown: std::path::PathBuf,
    decoder_only: bool,
) -> ScriptResult<Options> {
    let f = o.func();
    let frac = |name: &str| -> ScriptResult<f64> { Ok(fraction(f, name, o.f64_or_default(name)?)?) };
    let freq = match (o.string("freq")?, o.string("freq_counts")?) {
        (Some(_), Some(_)) => {
            return err(format!(
                "{f}: give either 'freq' (a text file) or 'freq_counts' (token<TAB>count lines), not both"
            ))
        }
        (Some(p), None) => FreqSource::Text(p.into()),
        (None, Some(p)) => FreqSource::Counts(p.into()),
        (None, None) => FreqSource::Text(brown),
    };
    let relations = o.strings_or_default("relations")?;
    no_empty_relations(f, &relations)?;
    Ok(Options {
        stats,
        kinds,
        batch_tokens: o.usize_or_default("batch_tokens")?.max(1),
        exclude_keys: match o.string("exclude_keys")? {
            Some(v) => v.parse().or_else(|e: String| err(format!("{f}: {e}")))?,
            None => ExcludeKeys::default_for(decoder_only),
        },
        positional_threshold: frac("positional_threshold")?,
        rare_top_n: o.usize_or_default("rare_top_n")?,
        rare_threshold: frac("rare_threshold")?,
        freq,
        relations,
        subtypes: o.bool_or_default("subtypes")?,
        margin: frac("margin")?,
        tile_rows: o.usize_or_default("tile_rows")?,
    })
}

/// The options `m.analyze(data)` runs with when given none (the library API's
/// `analyze_options`): [`Options::for_model`] with the Brown corpus for rarity.
pub fn default_options(m: &View, data: &Dataset) -> Options {
    Options::for_model(m, data, brown_path())
}

/// The default frequency corpus: the Brown corpus among the assets.
fn brown_path() -> std::path::PathBuf {
    crate::assets::asset_path("brown.txt").unwrap_or_else(|_| "assets/brown.txt".into())
}

fn parse_options(
    m: &ScriptModel,
    data: &Dataset,
    options: &Map,
    func: &'static str,
) -> ScriptResult<(Options, Dataset)> {
    let o = Opts::new(options, func, OPTIONS)?;
    let is_tb = data.items.iter().all(|i| i.tree.is_some());
    let stats: Vec<Stat> = match o.strings("stats")? {
        Some(v) => v
            .iter()
            .map(|s| s.parse().or_else(|e: String| err(format!("{func}: option 'stats': {e}"))))
            .collect::<ScriptResult<_>>()?,
        None => default_stats(is_tb || o.has("treebank")),
    };
    let kinds = crate::model::script::kinds_option(m, &o)?;
    let opts = options_from(&o, stats, kinds, brown_path(), m.model.decoder_only())?;
    // A treebank given beside a corpus must match it sentence by sentence.
    let data = match o.value("treebank") {
        Some(tb) => {
            data.with_trees(&crate::data::script::dataset_arg(tb, &format!("{func}: option 'treebank'"))?, func)?
        }
        None => data.clone(),
    };
    Ok((opts, data))
}

fn freq_for(m: &View, opts: &Options, func: &str) -> Result<Option<Rc<FreqTable>>, String> {
    if !opts.wants(Stat::Rare) {
        return Ok(None);
    }
    let src = format!("{:?}", opts.freq);
    let key = (m.model.path.display().to_string(), src, opts.rare_top_n);
    if let Some(f) = FREQ.with(|c| c.borrow().get(&key).cloned()) {
        return Ok(Some(f));
    }
    let f = Rc::new(freq_table(&m.model, &opts.freq, opts.rare_top_n).map_err(|e| format!("{func}: {e}"))?);
    FREQ.with(|c| c.borrow_mut().insert(key, f.clone()));
    Ok(Some(f))
}

/// `analyze` (or `confidence`, `func`: the name errors and progress give) on `data` under
/// typed options, on the rows of `plan`: what the script functions and the library API run.
/// A shard's record is an analysis whichever function made it.
pub fn analyze_planned(
    m: &View,
    d: &Dataset,
    opts: &Options,
    plan: &Plan,
    func: &'static str,
) -> Result<AnalysisObj, String> {
    d.require_sentences(func)?;
    opts.check(m, func)?;
    // Parsing raises a batch of 0 tokens to 1; options built in Rust get the same.
    let clamped;
    let opts = if opts.batch_tokens == 0 {
        clamped = Options { batch_tokens: 1, ..opts.clone() };
        &clamped
    } else {
        opts
    };
    let freq = freq_for(m, opts, func)?;
    let gates = m.gates().map_err(|e| e.to_string())?;
    let mut progress = |done: usize, total: usize| crate::run::progress(func, done, total);
    // The whole dataset goes in (relations are checked against all of it); `rows` is the slice.
    plan.check(d, func)?;
    let (frame, acc) = accumulate(
        &m.model,
        d,
        plan.rows.clone(),
        opts,
        freq.as_deref(),
        &gates,
        &crate::run::interrupted,
        &mut progress,
    )
    .map_err(|e| format!("{func}: {e}"))?;
    let a = finish(&frame, &acc).map_err(|e| format!("{func}: {e}"))?;
    let identity = plan.identity(m.identity(), serde_json::json!({"frame": frame}));
    let a = plan.seal("analyze", identity, &acc, a, |a| &mut a.options, |a| a.to_json())?;
    Ok(AnalysisObj(Rc::new(a)))
}

/// `analyze` on the whole of `data` (the library API's `Model::analyze`).
pub fn analyze(m: &View, d: &Dataset, opts: &Options) -> Result<AnalysisObj, String> {
    analyze_planned(m, d, opts, &Plan::whole(d), "analyze")
}

/// Head confidence alone on the whole of `data`: `opts` with confidence as the one statistic
/// (the library API's `Model::confidence`).
pub fn confidence(m: &View, d: &Dataset, opts: &Options) -> Result<Grid, String> {
    let opts = Options { stats: vec![Stat::Confidence], ..opts.clone() };
    analyze_planned(m, d, &opts, &Plan::whole(d), "confidence")?.confidence_grid()
}

/// A script call of `analyze` (or `confidence`): the option map parsed at the edge, then the
/// typed run.
fn run(m: &ScriptModel, data: Dynamic, options: Map, func: &'static str) -> ScriptResult<AnalysisObj> {
    let d = crate::data::script::dataset_arg(&data, func)?;
    let (opts, d) = parse_options(m, &d, &options, func)?;
    let o = Opts::new(&options, func, OPTIONS)?;
    let _lang = crate::model::script::call_language(m, &o)?;
    let plan = Plan::new(&d, &o, func)?;
    Ok(analyze_planned(m, &d, &opts, &plan, func)?)
}

/// The analysis of merged shard accumulators (`merge_results`, `headscope merge`).
pub fn finish_merged(m: &crate::shard::Merged) -> Result<(Dynamic, serde_json::Value), String> {
    let frame: crate::analysis::Frame = serde_json::from_value(m.identity["frame"].clone())
        .map_err(|e| format!("{}: the shard record's frame: {e}", m.name))?;
    let acc: crate::analysis::AnalysisAcc = m.total()?;
    let a = finish(&frame, &acc).map_err(|e| format!("{}: {e}", m.name))?;
    let json = a.to_json();
    Ok((Dynamic::from(AnalysisObj(Rc::new(a))), json))
}

#[export_module]
pub mod api {
    use super::*;

    /// The analyses of Voita et al. (2019) in one streaming pass over a dataset, for every
    /// attention kind of the model. Options (defaults in docs/methods.md, all echoed in the result):
    /// `stats` (any of "confidence", "positional", "rare", "syntactic"; syntactic needs a
    /// treebank), `kinds`, `batch_tokens` (1024), `exclude_keys` ("eos" | "special" | "none";
    /// "special" also keeps BOS/CLS sinks out of a head's argmax; default "special" for a
    /// decoder-only model, "eos" otherwise: docs/methods.md#attention-sinks),
    /// `positional_threshold` (0.9), `rare_top_n` (500), `rare_threshold` (0.5), `freq` (a
    /// text file; default the Brown corpus) or `freq_counts` (token<TAB>count), `relations`
    /// (["nsubj", "dobj", "amod", "advmod"]), `subtypes` (false), `margin` (0.10),
    /// `treebank` (trees for a corpus dataset, matched sentence by sentence).
    ///
    /// ```rhai
    /// let m = load_model("enpt");
    /// let a = m.analyze(treebank(asset("pud_en.conllu")).take(20), #{stats: ["confidence", "positional", "syntactic"]});
    /// assert(a.sentences == 20);
    /// assert(a.confidence["enc"].len() == 6 && a.confidence["cross"][1].len() == 8);
    /// ```
    #[rhai_fn(name = "analyze", return_raw, pure)]
    pub fn analyze_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<AnalysisObj> {
        run(m, data, options, "analyze")
    }

    /// `analyze` with the default statistics for the dataset.
    ///
    /// ```rhai
    /// let a = load_model("minilm").analyze(corpus(asset("pud_en.txt")).take(10));
    /// assert(a.rare["enc"][0].len() == 12);
    /// ```
    #[rhai_fn(name = "analyze", return_raw, pure)]
    pub fn analyze_plain(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<AnalysisObj> {
        run(m, data, Map::new(), "analyze")
    }

    /// Head confidence alone: per kind, a layers x heads grid of the mean maximum attention
    /// weight over real query tokens, EOS/SEP keys excluded (every special key, the BOS sink
    /// included, for a decoder-only model: docs/methods.md#attention-sinks).
    ///
    /// ```rhai
    /// let c = load_model("enpt").confidence(corpus(asset("pud_en.txt")).take(10));
    /// assert(c["enc"][2][5] > 0.0 && c["enc"][2][5] <= 1.0);
    /// ```
    #[rhai_fn(name = "confidence", return_raw, pure)]
    pub fn confidence_of(m: &mut ScriptModel, data: Dynamic) -> ScriptResult<Grid> {
        confidence_opts(m, data, Map::new())
    }

    /// Head confidence with `analyze`'s options (`kinds`, `exclude_keys`, `batch_tokens`,
    /// `shard`; docs/methods.md#confidence); `stats` is confidence's own.
    ///
    /// ```rhai
    /// let m = load_model("smollm2");
    /// let d = corpus(asset("pud_en.txt")).take(4);
    /// let c = m.confidence(d);
    /// // A decoder-only model keeps its beginning-of-sequence sink out by default; with it
    /// // (the encoders' "eos"), a sink head's confidence is higher.
    /// assert(c.options.exclude_keys == "special" && c["dec.5.0"] < m.confidence(d, #{exclude_keys: "eos"})["dec.5.0"]);
    /// ```
    #[rhai_fn(name = "confidence", return_raw, pure)]
    pub fn confidence_opts(m: &mut ScriptModel, data: Dynamic, options: Map) -> ScriptResult<Grid> {
        if options.contains_key("stats") {
            return err(
                "confidence: option 'stats' is confidence's own; use analyze(data, #{stats: [...]}) for others",
            );
        }
        let mut o = options;
        o.insert("stats".into(), Dynamic::from(vec![Dynamic::from("confidence")]));
        Ok(run(m, data, o, "confidence")?.confidence_grid()?)
    }

    /// Confidence grid of an analysis.
    ///
    /// ```rhai
    /// let a = load_model("minilm").analyze(corpus(asset("pud_en.txt")).take(5), #{stats: ["confidence"]});
    /// assert(a.confidence.kinds == ["enc"]);
    /// ```
    #[rhai_fn(get = "confidence", return_raw, pure)]
    pub fn get_confidence(a: &mut AnalysisObj) -> ScriptResult<Grid> {
        Ok(a.confidence_grid()?)
    }

    /// Positional grid: the fraction of queries at each head's most frequent offset.
    ///
    /// ```rhai
    /// // With BOS/CLS keys excluded too, a sink head's confidence drops.
    /// let m = load_model("minilm");
    /// let d = corpus(asset("pud_en.txt")).take(5);
    /// let all = m.analyze(d, #{stats: ["confidence"]}).confidence["enc"];
    /// let no_special = m.analyze(d, #{stats: ["confidence"], exclude_keys: "special"}).confidence["enc"];
    /// assert(no_special[5][0] <= all[5][0]);
    /// ```
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(5), #{stats: ["positional"], kinds: ["enc"]});
    /// assert(a.positional["enc"][0][0] > 0.0);
    /// ```
    #[rhai_fn(get = "positional", return_raw, pure)]
    pub fn get_positional(a: &mut AnalysisObj) -> ScriptResult<Grid> {
        Ok(a.positional_grid()?)
    }

    /// Each head's most frequent offset `argmax(t) - t`.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(5), #{stats: ["positional"], kinds: ["enc"]});
    /// let d = a.offsets["enc"][0][0];
    /// assert(d >= -127.0 && d <= 127.0);
    /// ```
    #[rhai_fn(get = "offsets", return_raw, pure)]
    pub fn get_offsets(a: &mut AnalysisObj) -> ScriptResult<Grid> {
        Ok(a.grid("most frequent offset", |k| {
            k.positional.as_ref().map(|p| p.iter().map(|r| r.iter().map(|x| x.offset as f64).collect()).collect())
        })?)
    }

    /// Rare-word grid: the fraction of queries whose argmax is the sentence's rarest token.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(5), #{stats: ["rare"]});
    /// assert(a.rare["cross"][0][0] >= 0.0);
    /// ```
    #[rhai_fn(get = "rare", return_raw, pure)]
    pub fn get_rare(a: &mut AnalysisObj) -> ScriptResult<Grid> {
        Ok(a.rare_grid()?)
    }

    /// Syntactic accuracy grid of one relation and direction ("v->s", or "g->d" / "d->g").
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(treebank(asset("pud_en.conllu")).take(20), #{stats: ["syntactic"], kinds: ["enc"]});
    /// let g = a.syntactic("nsubj", "v->s");
    /// assert(g["enc"].len() == 6);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn syntactic(a: &mut AnalysisObj, relation: &str, direction: &str) -> ScriptResult<Grid> {
        let k = a.0.kinds.iter().find(|k| k.syntactic.is_some());
        let Some(k) = k else { return err("syntactic: this analysis has no syntactic statistic") };
        let rels = k.syntactic.as_deref().unwrap_or_default();
        let Some(rd) =
            rels.iter().find(|r| r.relation == relation && (r.label == direction || r.direction == direction))
        else {
            let have: Vec<String> = rels.iter().map(|r| format!("{} {}", r.relation, r.label)).collect();
            return err(format!("syntactic: no '{relation}' '{direction}' (have: {})", have.join(", ")));
        };
        Ok(Grid {
            stat: format!(
                "syntactic accuracy {relation} {} (baseline {})",
                rd.label,
                crate::output::fixed(rd.baseline, 3)
            ),
            model: a.0.model.clone(),
            dataset: a.0.dataset.clone(),
            kinds: vec![(k.kind, rd.accuracy.clone())],
            options: a.0.options.clone(),
        })
    }

    /// Table 1 of the paper: per relation and direction the best head, its accuracy, the
    /// most-frequent-offset baseline and whether it clears the +10 point rule.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(treebank(asset("pud_en.conllu")).take(20), #{stats: ["syntactic"], kinds: ["enc"]});
    /// assert(a.syntactic_table().len() == 8);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn syntactic_table(a: &mut AnalysisObj) -> ScriptResult<Table> {
        a.0.syntactic_table()
            .ok_or_else(|| err::<()>("syntactic_table: this analysis has no syntactic statistic").unwrap_err())
    }

    /// Heads with a function (the paper's Figure 1c): positional +-d, syntactic relation and
    /// direction, rare; with their confidence.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(30), #{kinds: ["enc"]});
    /// let f = a.functions();
    /// assert(f.columns == ["head", "function", "confidence"]);
    /// ```
    #[rhai_fn(pure)]
    pub fn functions(a: &mut AnalysisObj) -> Table {
        a.0.functions_table()
    }

    /// The functions of every head as an array of maps `#{head, functions}`.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(10), #{kinds: ["enc"]});
    /// assert(a.function_list.len() == 48);
    /// ```
    #[rhai_fn(get = "function_list", pure)]
    pub fn function_list(a: &mut AnalysisObj) -> Array {
        a.0.functions()
            .into_iter()
            .map(|(id, f)| {
                let mut m = Map::new();
                m.insert("head".into(), Dynamic::from(id.to_string()));
                m.insert(
                    "functions".into(),
                    Dynamic::from(f.iter().map(|x| Dynamic::from(x.to_string())).collect::<Array>()),
                );
                Dynamic::from(m)
            })
            .collect()
    }

    /// Per kind, a map of statistic -> layers x heads matrix: `a["enc"].confidence[2][5]`.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(5), #{stats: ["confidence"]});
    /// assert(a["enc"].confidence[2][5] == a.confidence["enc"][2][5]);
    /// ```
    #[rhai_fn(index_get, return_raw, pure)]
    pub fn by_kind(a: &mut AnalysisObj, kind: &str) -> ScriptResult<Map> {
        let k: Kind = kind.parse().or_else(|e: String| err(e))?;
        let Some(r) = a.0.kind(k) else { return err(format!("this analysis has no '{kind}'")) };
        let mut m = Map::new();
        if let Some(c) = &r.confidence {
            m.insert("confidence".into(), matrix(c));
        }
        if let Some(p) = &r.positional {
            m.insert(
                "positional".into(),
                matrix(&p.iter().map(|r| r.iter().map(|x| x.fraction).collect::<Vec<_>>()).collect::<Vec<_>>()),
            );
            m.insert(
                "offsets".into(),
                matrix(&p.iter().map(|r| r.iter().map(|x| x.offset as f64).collect::<Vec<_>>()).collect::<Vec<_>>()),
            );
        }
        if let Some(x) = &r.rare {
            m.insert("rare".into(), matrix(&x.score));
            m.insert("rare_two".into(), matrix(&x.two));
        }
        m.insert("queries".into(), Dynamic::from(r.queries as i64));
        Ok(m)
    }

    /// Options and counts: `model`, `dataset`, `sentences`, `tokens`, `seconds` and every option.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(3), #{stats: ["confidence"]});
    /// assert(a.meta.sentences == 3 && a.meta.exclude_keys == "eos");
    /// ```
    #[rhai_fn(get = "meta", pure)]
    pub fn meta(a: &mut AnalysisObj) -> Map {
        let mut m = Map::new();
        m.insert("model".into(), Dynamic::from(a.0.model.clone()));
        m.insert("dataset".into(), Dynamic::from(a.0.dataset.clone()));
        m.insert("sentences".into(), Dynamic::from(a.0.sentences as i64));
        m.insert("tokens".into(), Dynamic::from(a.0.tokens as i64));
        m.insert("seconds".into(), Dynamic::from(a.0.seconds));
        m.extend(crate::script::convert::echo_map(&a.0.options));
        m
    }

    /// Number of sentences analysed.
    ///
    /// ```rhai
    /// assert(load_model("minilm").analyze(corpus(asset("pud_en.txt")).take(4), #{stats: ["confidence"]}).sentences == 4);
    /// ```
    #[rhai_fn(get = "sentences", pure)]
    pub fn sentences(a: &mut AnalysisObj) -> i64 {
        a.0.sentences as i64
    }

    /// Writes the whole result (options, counts, every grid, head functions) as JSON, atomically.
    ///
    /// ```rhai
    /// let a = load_model("enpt").analyze(corpus(asset("pud_en.txt")).take(3), #{stats: ["confidence"]});
    /// let p = temp_path("a.json");
    /// a.to_json(p);
    /// assert(read_text(p).contains("\"confidence\""));
    /// ```
    #[rhai_fn(name = "to_json", return_raw, pure)]
    pub fn analysis_to_json(a: &mut AnalysisObj, path: &str) -> ScriptResult<()> {
        crate::grid::write_json(path, &a.0.to_json(), "to_json")
    }

    #[rhai_fn(name = "to_string", pure)]
    pub fn analysis_to_string(a: &mut AnalysisObj) -> String {
        a.render().text
    }

    #[rhai_fn(name = "to_debug", pure)]
    pub fn analysis_to_debug(a: &mut AnalysisObj) -> String {
        a.0.summary()
    }
}
