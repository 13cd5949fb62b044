//! Gate-training checkpoints (pruning's Hard Concrete gates, DuoAttention's mix):
//! `DIR/checkpoint.json`, written atomically, holding the gates, Adam's moments, the curve, and
//! what the run was (model, data, options) so that a resume on anything else is refused with a
//! clear error.

use super::{CurvePoint, Layout, PruneOptions, TrainState};
use crate::data::Dataset;
use crate::files::write_atomic;
use crate::model::Model;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use tch::Tensor;

/// Which training a checkpoint holds: its format tag, the function named in errors and the
/// name of its parameter vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub format: &'static str,
    pub who: &'static str,
    pub param: &'static str,
}

/// Pruning's Hard Concrete gates.
pub const PRUNE: Run = Run { format: "headscope-prune-checkpoint/1", who: "prune", param: "log_alpha" };

pub struct Checkpoint {
    pub file: PathBuf,
    run: Run,
    /// What the run is: compared on resume.
    identity: Value,
    /// The number of gated heads: the length of every parameter vector.
    heads: usize,
}

fn identity(model: &Model, data: &Dataset, opts: &PruneOptions, layout: &Layout) -> Value {
    json!({
        "model": model.name(),
        "family": model.family.to_string(),
        "gated": layout.kinds.iter().map(|(k, l, h)| format!("{k} {l}x{h}")).collect::<Vec<_>>(),
        "dataset": data.name,
        "sentences": data.len(),
        "options": opts.run_defining().into_iter().map(|(k, v)| (k, Value::String(crate::output::echo_text(&v)))).collect::<serde_json::Map<_, _>>(),
    })
}

impl Checkpoint {
    /// Prepares `dir` (created if missing) and checks it can be written. A directory that
    /// already holds a run is only accepted with `resume: true`: a new run never overwrites
    /// an old one.
    pub fn open(
        dir: &Path,
        model: &Model,
        data: &Dataset,
        opts: &PruneOptions,
        layout: &Layout,
    ) -> Result<Checkpoint, String> {
        Checkpoint::open_run(dir, PRUNE, identity(model, data, opts, layout), layout.len(), opts.resume)
    }

    /// [`open`](Self::open) for any gate training: `identity` holds `model`, `family`,
    /// `gated`, `dataset`, `sentences` and the run-defining `options`; `n` parameters.
    pub fn open_run(dir: &Path, run: Run, identity: Value, n: usize, resume: bool) -> Result<Checkpoint, String> {
        let (d, who) = (dir.display(), run.who);
        std::fs::create_dir_all(dir).map_err(|e| format!("{who}: checkpoint directory {d}: cannot create it: {e}"))?;
        let probe = dir.join(format!(".write-test.{}", std::process::id()));
        std::fs::write(&probe, b"x").map_err(|e| format!("{who}: checkpoint directory {d} is not writable: {e}"))?;
        let _ = std::fs::remove_file(&probe);
        let file = dir.join("checkpoint.json");
        if file.exists() && !resume {
            return Err(format!("{who}: {} already holds a run; pass resume: true to continue it, or choose another checkpoint directory", file.display()));
        }
        Ok(Checkpoint { file, run, identity, heads: n })
    }

    /// The saved state, if there is one; an error when it belongs to another run.
    pub fn load(&self) -> Result<Option<TrainState>, String> {
        if !self.file.exists() {
            return Ok(None);
        }
        let f = self.file.display();
        let bytes =
            std::fs::read(&self.file).map_err(|e| format!("{}: cannot read checkpoint {f}: {e}", self.run.who))?;
        parse_run(self.run, &bytes, &f.to_string(), &self.identity, self.heads).map(Some)
    }

    pub fn save(&self, s: &TrainState) -> Result<(), String> {
        let v = json!({
            "format": self.run.format,
            "identity": self.identity,
            "step": s.step,
            self.run.param: s.log_alpha.iter().map(|&x| x as f64).collect::<Vec<_>>(),
            "adam_m": s.adam_m.iter().map(|&x| x as f64).collect::<Vec<_>>(),
            "adam_v": s.adam_v.iter().map(|&x| x as f64).collect::<Vec<_>>(),
            "lagrange": s.lagrange,
            "curve": s.curve.iter().map(|p| json!({"step": p.step, "loss": p.loss, "penalty": p.penalty, "expected_open": p.expected_open, "open": p.open, "eval": p.eval})).collect::<Vec<_>>(),
        });
        let bytes = serde_json::to_vec(&v).map_err(|e| e.to_string())?;
        write_atomic(&self.file, &bytes)
            .map_err(|e| format!("{}: cannot write checkpoint {}: {e}", self.run.who, self.file.display()))?;
        // The JSON names the step; weights of other steps (joint training) are now stale.
        let keep = self.weights_file(s.step);
        if let Some(dir) = self.file.parent() {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                if name.starts_with("weights-") && name.ends_with(".pt") && p != keep {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
        Ok(())
    }

    fn weights_file(&self, step: usize) -> PathBuf {
        self.file.with_file_name(format!("weights-{step}.pt"))
    }

    /// Joint training: the weights and their Adam moments at `step`, written before the JSON
    /// that names that step (temp file, then rename).
    pub fn save_weights(&self, step: usize, model: &mut Model, m: &[Tensor], v: &[Tensor]) -> Result<(), String> {
        let params = model.net.params_mut();
        let mut named: Vec<(String, &Tensor)> = Vec::new();
        for (i, p) in params.iter().enumerate() {
            named.push((format!("p{i}"), &**p));
            named.push((format!("m{i}"), &m[i]));
            named.push((format!("v{i}"), &v[i]));
        }
        let file = self.weights_file(step);
        let tmp =
            crate::files::temp_beside(&file).map_err(|e| format!("prune: cannot write {}: {e}", file.display()))?;
        if let Err(e) = Tensor::save_multi(&named, &tmp) {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!("prune: cannot write {}: {}", file.display(), crate::model::one_line(&e.to_string())));
        }
        crate::files::commit(&tmp, &file).map_err(|e| format!("prune: cannot write {}: {e}", file.display()))
    }

    /// Restores what [`save_weights`](Self::save_weights) wrote for `step`.
    pub fn load_weights(
        &self,
        step: usize,
        model: &mut Model,
        m: &mut [Tensor],
        v: &mut [Tensor],
    ) -> Result<(), String> {
        let file = self.weights_file(step);
        let f = file.display();
        let loaded = Tensor::load_multi(&file).map_err(|e| format!("prune: joint checkpoint {f}: {e}"))?;
        let map: std::collections::HashMap<String, Tensor> = loaded.into_iter().collect();
        let _g = tch::no_grad_guard();
        for (i, p) in model.net.params_mut().into_iter().enumerate() {
            let get = |k: String| {
                map.get(&k).ok_or_else(|| format!("prune: joint checkpoint {f} lacks tensor {k} (from another model?)"))
            };
            let (sp, sm, sv) = (get(format!("p{i}"))?, get(format!("m{i}"))?, get(format!("v{i}"))?);
            if sp.size() != p.size() {
                return Err(format!(
                    "prune: joint checkpoint {f}: tensor p{i} has shape {:?}, the model's has {:?}",
                    sp.size(),
                    p.size()
                ));
            }
            p.f_copy_(sp).map_err(|e| e.to_string())?;
            m[i] = sm.shallow_clone();
            v[i] = sv.shallow_clone();
        }
        Ok(())
    }
}

/// The training state in the bytes of a `checkpoint.json` (`f` names it in errors), checked
/// against the identity of the run that resumes it, which gates `heads` heads.
pub fn parse_state(bytes: &[u8], f: &str, identity: &Value, heads: usize) -> Result<TrainState, String> {
    parse_run(PRUNE, bytes, f, identity, heads)
}

/// [`parse_state`] for the training `run` names.
pub fn parse_run(run: Run, bytes: &[u8], f: &str, identity: &Value, heads: usize) -> Result<TrainState, String> {
    let (who, param) = (run.who, run.param);
    let v: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("{who}: checkpoint {f} is not valid JSON: {e}"))?;
    if v["format"] != run.format {
        return Err(format!("{who}: {f} is not a headscope {who} checkpoint (format {})", v["format"]));
    }
    let have = &v["identity"];
    for key in ["model", "family", "gated", "dataset", "sentences"] {
        // GGUF checkpoints' family was named `llama_gguf` before the family table.
        let legacy = key == "family" && have[key] == "llama_gguf" && identity[key] == "gguf";
        if have[key] != identity[key] && !legacy {
            let what = if matches!(key, "dataset" | "sentences") { "data" } else { "model" };
            return Err(format!(
                "{who}: checkpoint {f} is from another {what}: its {key} is {}, this run's is {}",
                have[key], identity[key]
            ));
        }
    }
    if let Some(opts) = identity["options"].as_object() {
        for (k, want) in opts {
            if &have["options"][k] != want {
                return Err(format!(
                    "{who}: checkpoint {f} was made with {k} = {}, this run has {k} = {want}",
                    have["options"][k]
                ));
            }
        }
        // Options echoed only when set (a target, a view's ablation): the checkpoint's must not
        // be dropped by the run resuming it.
        for k in ["target", "ablation"] {
            if let (Some(had), None) = (have["options"].get(k), opts.get(k)) {
                return Err(format!("{who}: checkpoint {f} was made with {k} = {had}, this run has none"));
            }
        }
    }
    let floats = |key: &str| -> Result<Vec<f32>, String> {
        v[key]
            .as_array()
            .ok_or_else(|| format!("{who}: checkpoint {f}: '{key}' is missing"))?
            .iter()
            .map(|x| {
                x.as_f64().map(|x| x as f32).ok_or_else(|| format!("{who}: checkpoint {f}: '{key}' holds a non-number"))
            })
            .collect()
    };
    let curve = v["curve"]
        .as_array()
        .ok_or_else(|| format!("{who}: checkpoint {f}: 'curve' is missing"))?
        .iter()
        .map(|p| CurvePoint {
            step: p["step"].as_u64().unwrap_or(0) as usize,
            loss: p["loss"].as_f64().unwrap_or(f64::NAN),
            penalty: p["penalty"].as_f64().unwrap_or(f64::NAN),
            expected_open: p["expected_open"].as_f64().unwrap_or(f64::NAN),
            open: p["open"].as_u64().unwrap_or(0) as usize,
            eval: p["eval"].as_f64(),
        })
        .collect();
    let state = TrainState {
        step: v["step"].as_u64().ok_or_else(|| format!("{who}: checkpoint {f}: 'step' is missing"))? as usize,
        log_alpha: floats(param)?,
        adam_m: floats("adam_m")?,
        adam_v: floats("adam_v")?,
        curve,
        lagrange: [v["lagrange"][0].as_f64().unwrap_or(0.0), v["lagrange"][1].as_f64().unwrap_or(0.0)],
    };
    let n = state.log_alpha.len();
    if state.adam_m.len() != n || state.adam_v.len() != n {
        return Err(format!("{who}: checkpoint {f} is damaged: parameter vectors differ in length"));
    }
    if n != heads {
        return Err(format!(
            "{who}: checkpoint {f} is damaged: '{param}' holds {n} values, this run gates {heads} heads"
        ));
    }
    Ok(state)
}
