//! Core script functions: showing values, assertions, small file helpers, and the functions
//! bound to a session (display goes to the session's sink; temp paths live in its temp dir).

use crate::script::convert::{err, ScriptResult};
use rhai::plugin::*;
use rhai::{Dynamic, Engine, FuncRegistration};
use std::path::PathBuf;
use std::rc::Rc;

#[export_module]
pub mod api {
    use super::*;

    /// Fails the script with "assertion failed" when `condition` is false.
    ///
    /// ```rhai
    /// assert(1 + 1 == 2);
    /// ```
    #[rhai_fn(name = "assert", return_raw)]
    pub fn assert1(condition: bool) -> ScriptResult<()> {
        if condition {
            Ok(())
        } else {
            err("assertion failed")
        }
    }

    /// Fails the script with `message` when `condition` is false.
    ///
    /// ```rhai
    /// assert(2 > 1, "two is more than one");
    /// ```
    #[rhai_fn(name = "assert", return_raw)]
    pub fn assert2(condition: bool, message: &str) -> ScriptResult<()> {
        if condition {
            Ok(())
        } else {
            err(format!("assertion failed: {message}"))
        }
    }

    /// The whole content of a UTF-8 text file.
    ///
    /// ```rhai
    /// let p = temp_path("a.txt");
    /// write_text(p, "hello");
    /// assert(read_text(p) == "hello");
    /// ```
    #[rhai_fn(return_raw)]
    pub fn read_text(path: &str) -> ScriptResult<String> {
        match std::fs::read(path) {
            Ok(b) => String::from_utf8(b).or_else(|e| {
                err(format!(
                    "read_text: '{path}' is not UTF-8 text (invalid byte at offset {})",
                    e.utf8_error().valid_up_to()
                ))
            }),
            Err(e) => err(format!("read_text: cannot read '{path}': {e}")),
        }
    }

    /// The lines of a UTF-8 text file, without their line endings.
    ///
    /// ```rhai
    /// let p = temp_path("l.txt");
    /// write_text(p, "a\r\nb\n");
    /// assert(read_lines(p) == ["a", "b"]);
    /// ```
    #[rhai_fn(return_raw)]
    pub fn read_lines(path: &str) -> ScriptResult<rhai::Array> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => return err(format!("read_lines: cannot read '{path}' as UTF-8 text: {e}")),
        };
        Ok(text.lines().map(|l| Dynamic::from(l.to_string())).collect())
    }

    /// Creates a directory and its parents (nothing happens if it exists).
    ///
    /// ```rhai
    /// let d = temp_path("figs");
    /// make_dir(d);
    /// assert(exists(d));
    /// ```
    #[rhai_fn(return_raw)]
    pub fn make_dir(path: &str) -> ScriptResult<()> {
        std::fs::create_dir_all(path).or_else(|e| err(format!("make_dir: cannot create '{path}': {e}")))
    }

    /// Writes text to a file atomically (temporary file, then rename).
    ///
    /// ```rhai
    /// let p = temp_path("b.txt");
    /// write_text(p, "x\ny\n");
    /// assert(file_size(p) == 4);
    /// ```
    #[rhai_fn(return_raw)]
    pub fn write_text(path: &str, text: &str) -> ScriptResult<()> {
        crate::files::write_atomic(std::path::Path::new(path), text.as_bytes())
            .or_else(|e| err(format!("write_text: cannot write '{path}': {e}")))
    }

    /// Writes an array of numbers (1-D) or a rectangular array of arrays of numbers (2-D) as a
    /// float64 `.npy`, atomically (docs/methods.md#export). numpy: `np.load(path)`.
    ///
    /// ```rhai
    /// let p = temp_path("x.npy");
    /// write_npy(p, [[1, 2.5], [3, 4]]);
    /// assert(file_size(p) == 128 + 4 * 8);
    /// write_npy(p, [0.5, 1.5]);
    /// assert(file_size(p) == 128 + 2 * 8);
    /// ```
    #[rhai_fn(return_raw)]
    pub fn write_npy(path: &str, values: rhai::Array) -> ScriptResult<()> {
        use crate::script::convert::{to_f64_vec, to_matrix};
        let nested = values.first().is_some_and(|v| v.is_array());
        let (shape, flat) = if nested {
            let m = to_matrix(&values, "write_npy: values")?;
            (vec![m.len(), m.first().map_or(0, |r| r.len())], m.concat())
        } else {
            (vec![values.len()], to_f64_vec(&values, "write_npy: values")?)
        };
        let bytes = crate::export::npy_bytes(&shape, &flat).or_else(|e| err(format!("write_npy: {e}")))?;
        crate::export::write(path, &bytes).or_else(|e| err(format!("write_npy: {e}")))
    }

    /// Size of a file in bytes.
    ///
    /// ```rhai
    /// let p = temp_path("c.txt");
    /// write_text(p, "abc");
    /// assert(file_size(p) == 3);
    /// ```
    #[rhai_fn(return_raw)]
    pub fn file_size(path: &str) -> ScriptResult<i64> {
        std::fs::metadata(path).map(|m| m.len() as i64).or_else(|e| err(format!("file_size: '{path}': {e}")))
    }

    /// Whether a file or directory exists.
    ///
    /// ```rhai
    /// assert(!exists("/no/such/file"));
    /// ```
    pub fn exists(path: &str) -> bool {
        std::path::Path::new(path).exists()
    }

    /// Panics inside native code on purpose, to check that a Rust panic under a call becomes a
    /// script error and the session survives.
    ///
    /// ```rhai,error
    /// debug_panic("boom");
    /// ```
    pub fn debug_panic(message: &str) {
        panic!("{message}");
    }
}

/// Where rendered values go: the frontend's sink.
pub type DisplayFn = Rc<dyn Fn(Dynamic)>;

/// Registers the functions that need the session: `display`/`show` and `temp_path`.
pub fn register(engine: &mut Engine, display: DisplayFn, temp_dir: Rc<PathBuf>) {
    engine.register_global_module(exported_module!(api).into());
    for name in ["display", "show"] {
        let d = display.clone();
        FuncRegistration::new(name)
            .with_comments([
                "/// Shows a value now (a table, a plot, any value) in the frontend's best form:",
                "/// text in the terminal, HTML or an image in a notebook.",
                "///",
                "/// ```rhai",
                "/// table([\"x\"], [[1]]).show();",
                "/// display(\"any value\");",
                "/// ```",
            ])
            .with_params_info(["value: Dynamic"])
            .register_into_engine(engine, move |v: Dynamic| d(v));
    }
    FuncRegistration::new("temp_path")
        .with_comments([
            "/// A path for `name` in a temporary directory of this session, removed when it ends.",
            "///",
            "/// ```rhai",
            "/// let p = temp_path(\"plot.svg\");",
            "/// assert(p.ends_with(\"plot.svg\"));",
            "/// ```",
        ])
        .with_params_info(["name: &str", "String"])
        .register_into_engine(engine, move |name: &str| -> ScriptResult<String> {
            if name.is_empty() || name.contains('/') || name == ".." {
                return err(format!("temp_path: '{name}' must be a plain file name"));
            }
            std::fs::create_dir_all(&*temp_dir)
                .or_else(|e| err(format!("temp_path: cannot create {}: {e}", temp_dir.display())))?;
            Ok(temp_dir.join(name).display().to_string())
        });
}
