//! Module resolution: `import "tables" as t;` finds the stdlib module embedded in the binary
//! (so it works from any directory); other paths are `.rhai` files relative to the importing
//! script (or the working directory). Compiled modules are cached per session.

use super::error::Sources;
use rhai::module_resolvers::ModuleResolver;
use rhai::{Engine, EvalAltResult, Module, Position, Scope, Shared};
type SharedModule = Shared<Module>;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// The stdlib modules, embedded at build time. A test checks that every `stdlib/*.rhai` is here.
pub const STDLIB: &[(&str, &str)] = &[
    ("tables", include_str!("../../stdlib/tables.rhai")),
    ("stats", include_str!("../../stdlib/stats.rhai")),
    ("heads", include_str!("../../stdlib/heads.rhai")),
    ("prune", include_str!("../../stdlib/prune.rhai")),
];

#[derive(Default)]
pub struct Resolver {
    cache: RefCell<HashMap<String, SharedModule>>,
    /// Import path -> source name shown in errors.
    pub files: RefCell<HashMap<String, String>>,
    pub sources: Rc<RefCell<Sources>>,
    pub base_dir: RefCell<PathBuf>,
}

impl Resolver {
    pub fn new(sources: Rc<RefCell<Sources>>, base_dir: PathBuf) -> Self {
        Resolver { sources, base_dir: RefCell::new(base_dir), ..Default::default() }
    }

    /// (cache key, source name, text) of an import path.
    fn locate(
        &self,
        importer: Option<&str>,
        path: &str,
        pos: Position,
    ) -> Result<(String, String, String), Box<EvalAltResult>> {
        if let Some((_, text)) = STDLIB.iter().find(|(n, _)| *n == path || format!("{n}.rhai") == path) {
            let name = format!("stdlib/{}.rhai", path.trim_end_matches(".rhai"));
            return Ok((name.clone(), name, text.to_string()));
        }
        let mut p = PathBuf::from(path);
        if p.extension().is_none() {
            p.set_extension("rhai");
        }
        if p.is_relative() {
            let base = importer
                .map(Path::new)
                .and_then(|s| s.parent())
                .filter(|d| d.is_dir() && !d.as_os_str().is_empty())
                .map(Path::to_path_buf)
                .unwrap_or_else(|| self.base_dir.borrow().clone());
            p = base.join(p);
        }
        let known: Vec<&str> = STDLIB.iter().map(|(n, _)| *n).collect();
        let text = std::fs::read_to_string(&p).map_err(|e| {
            Box::new(EvalAltResult::ErrorRuntime(
                format!(
                    "module not found: '{path}' (no stdlib module of that name: {}; file {}: {e})",
                    known.join(", "),
                    p.display()
                )
                .into(),
                pos,
            ))
        })?;
        let name = p.display().to_string();
        Ok((name.clone(), name, text))
    }

    pub fn load(
        &self,
        engine: &Engine,
        importer: Option<&str>,
        path: &str,
        pos: Position,
    ) -> Result<SharedModule, Box<EvalAltResult>> {
        let (key, name, text) = self.locate(importer, path, pos)?;
        self.files.borrow_mut().insert(path.to_string(), name.clone());
        if let Some(m) = self.cache.borrow().get(&key) {
            return Ok(m.clone());
        }
        self.sources.borrow_mut().insert(name.clone(), text.clone());
        let in_module = |e: Box<EvalAltResult>| Box::new(EvalAltResult::ErrorInModule(path.to_string(), e, pos));
        let mut ast = engine.compile(&text).map_err(|e| in_module(e.into()))?;
        ast.set_source(name.as_str());
        let mut m = Module::eval_ast_as_new(Scope::new(), &ast, engine).map_err(in_module)?;
        m.build_index();
        let m: SharedModule = m.into();
        self.cache.borrow_mut().insert(key, m.clone());
        Ok(m)
    }
}

/// The resolver as the engine holds it, sharing state with the session.
pub struct SharedResolver(pub Rc<Resolver>);

impl ModuleResolver for SharedResolver {
    fn resolve(
        &self,
        engine: &Engine,
        source: Option<&str>,
        path: &str,
        pos: Position,
    ) -> Result<SharedModule, Box<EvalAltResult>> {
        self.0.load(engine, source, path, pos)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_stdlib_file_is_embedded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("stdlib");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".rhai").map(String::from))
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = super::STDLIB.iter().map(|(n, _)| n.to_string()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded);
    }
}
