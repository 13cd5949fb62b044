//! The script API of [`HeadView`] (its script name too): the page as a file or a string, and
//! the renderer (plain-text summary, the interactive fragment in Jupyter).

use super::HeadView;
use crate::files::write_atomic;
use crate::output::{Output, Render};
use crate::script::convert::{err, ScriptResult};
use rhai::plugin::*;
use rhai::{Dynamic, Engine};

#[export_module]
pub mod api {
    use super::*;

    /// Writes the head view as a self-contained HTML page (no network needed to open it),
    /// atomically; returns the path.
    ///
    /// ```rhai
    /// let v = load_model("minilm").view("The cat sleeps.");
    /// let path = v.to_html(temp_path("heads.html"));
    /// assert(file_size(path) > 1000);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn to_html(v: &mut HeadView, path: &str) -> ScriptResult<String> {
        write_atomic(std::path::Path::new(path), v.html().as_bytes())
            .or_else(|e| err(format!("to_html: cannot write '{path}': {e}")))?;
        Ok(path.to_string())
    }

    /// The head view as a complete HTML document.
    ///
    /// ```rhai
    /// let v = load_model("minilm").view("The cat sleeps.");
    /// assert(v.html.starts_with("<!DOCTYPE html>") && v.html.contains("hs-view"));
    /// ```
    #[rhai_fn(get = "html", pure)]
    pub fn html(v: &mut HeadView) -> String {
        v.html()
    }

    #[rhai_fn(name = "to_string", pure)]
    pub fn to_string(v: &mut HeadView) -> String {
        v.text()
    }

    #[rhai_fn(name = "to_debug", pure)]
    pub fn to_debug(v: &mut HeadView) -> String {
        v.text()
    }
}

pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<HeadView>("HeadView");
    engine.register_global_module(exported_module!(api).into());
}

pub fn render(v: &Dynamic) -> Option<Output> {
    v.clone().try_cast::<HeadView>().map(|v| v.render())
}
