//! `m.needle_test(#{...})`: needle-in-a-haystack accuracy over lengths and depths
//! (docs/methods.md#needle-test), on any view (masked, gated or streaming heads).

use crate::analysis::needle::{needle_test, NeedleOptions};
use crate::model::script::ScriptModel;
use crate::script::convert::{err, opt, opt_int, OptSpec, Opts, ScriptErr, ScriptResult};
use crate::table::{Cell, Table};
use rhai::plugin::*;
use rhai::Map;

pub const NEEDLE_TEST_OPTIONS: &[OptSpec] = &[
    opt("contexts", "[1024]", "sequence lengths in tokens (an integer or a list): haystack, needle, needle again"),
    opt(
        "depths",
        "[0.1, 0.5, 0.9]",
        "where the needle starts, as a fraction of the haystack before it (0: first, 1: last)",
    ),
    opt_int("n", 4, "sequences per length and depth, each its own needle and stretch of haystack"),
    opt_int("needle", 8, "the needle's length in random tokens"),
    opt_int("seed", 0, "seed of the needles (and of the random haystack without data)"),
    opt("data", "none: random tokens", "the haystack's text (its tokens one text after another)"),
];

#[export_module]
pub mod api {
    /// Needle in a haystack on this model or view (docs/methods.md#needle-test): for each
    /// length of `contexts` and each of `depths`, `n` sequences `hay[:a] needle hay[a:] needle`
    /// (a needle of `needle` random tokens, the haystack the data's text or random tokens), and
    /// the fraction of the needle's tokens after its first that the model predicts (argmax,
    /// teacher forced) in its second copy. A Table: context, depth, accuracy, sequences. Masks,
    /// gates and streaming heads of the view apply.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/llama");
    /// let t = m.needle_test(#{contexts: [40, 64], depths: [0.0, 1.0], n: 2, needle: 4});
    /// assert(t.len() == 4 && t[3].context == 64 && t[3].depth == 1.0);
    /// assert(t[0].accuracy >= 0.0 && t[0].accuracy <= 1.0 && t[0].sequences == 2);
    /// let d = corpus(asset("pud_en.txt")).take(20);
    /// assert(m.needle_test(#{contexts: 48, depths: [0.5], n: 1, data: d}).len() == 1);
    /// ```
    #[rhai_fn(name = "needle_test", return_raw, pure)]
    pub fn needle_test_opts(m: &mut ScriptModel, options: Map) -> ScriptResult<Table> {
        let f = "needle_test";
        let o = Opts::new(&options, f, NEEDLE_TEST_OPTIONS)?;
        if !m.model.decoder_only() {
            return err(format!("{f}: {} is not a decoder-only model: it does not continue a text", m.model.name()));
        }
        let contexts = match o.value("contexts").map(|v| v.as_int()) {
            Some(Ok(c)) => vec![c as f64],
            _ => o.numbers("contexts")?.unwrap_or_else(|| vec![1024.0]),
        };
        let contexts: Vec<i64> = contexts
            .iter()
            .map(|&c| {
                if c.fract() != 0.0 || c < 1.0 || !c.is_finite() {
                    err(format!("{f}: contexts must be whole numbers of tokens, got {c}"))
                } else {
                    Ok(c as i64)
                }
            })
            .collect::<ScriptResult<_>>()?;
        let depths = o.numbers("depths")?.unwrap_or_else(|| vec![0.1, 0.5, 0.9]);
        let data = match o.value("data") {
            Some(d) => Some(crate::data::script::dataset_arg(d, &format!("{f}: data"))?),
            None => None,
        };
        let no = NeedleOptions {
            contexts,
            depths,
            n: o.usize_or_default("n")?,
            needle: o.usize_or_default("needle")?,
            seed: o.usize_or_default("seed")? as u64,
        };
        if no.n == 0 {
            return err(format!("{f}: n must be 1 or more sequences, got 0"));
        }
        let mut progress = |done: usize, total: usize| crate::run::progress(f, done, total);
        let rows = needle_test(m, data.as_ref(), &no, &crate::run::interrupted, &mut progress).script()?;
        let mut t = Table::new(["context", "depth", "accuracy", "sequences"].iter().map(|s| s.to_string()).collect());
        t.title = Some(format!(
            "needle_test: {} (needle of {} tokens, haystack {}, seed {})",
            m.model.name(),
            no.needle,
            data.as_ref().map_or("random tokens".to_string(), |d| d.name.clone()),
            no.seed
        ));
        for r in rows {
            t.push_row(vec![
                Cell::Int(r.context),
                Cell::Float(r.depth),
                Cell::Float(r.accuracy),
                Cell::Int(r.sequences as i64),
            ])
            .or_else(|e| err(format!("{f}: {e}")))?;
        }
        Ok(t)
    }
}
