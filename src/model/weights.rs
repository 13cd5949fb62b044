//! A checkpoint's tensors by name, handed out once each, checked for shape and placed on the
//! model's device and dtype. Shared by the checkpoint families.

use super::transformer::place;
use super::{LoadOptions, ModelError};
use std::collections::HashMap;
use tch::Tensor;

pub struct Weights {
    pub map: HashMap<String, Tensor>,
    /// The checkpoint file, named in errors.
    pub file: String,
    pub opts: LoadOptions,
    /// A prefix some checkpoints put before every name (`bert.`), tried second.
    pub prefix: Option<&'static str>,
}

impl Weights {
    pub fn new(map: HashMap<String, Tensor>, file: String, opts: LoadOptions, prefix: Option<&'static str>) -> Self {
        Weights { map, file, opts, prefix }
    }

    /// Removes and returns a tensor, unplaced (with the prefix tried second).
    pub fn take(&mut self, name: &str) -> Option<Tensor> {
        self.map.remove(name).or_else(|| self.prefix.and_then(|p| self.map.remove(&format!("{p}{name}"))))
    }

    /// The shape of a tensor still there.
    pub fn shape(&self, name: &str) -> Option<Vec<i64>> {
        self.map.get(name).or_else(|| self.prefix.and_then(|p| self.map.get(&format!("{p}{name}")))).map(|t| t.size())
    }

    /// A tensor checked for shape, on the model's device and dtype.
    pub fn get(&mut self, name: &str, shape: &[i64]) -> Result<Tensor, ModelError> {
        let t =
            self.take(name).ok_or_else(|| ModelError::MissingTensor { file: self.file.clone(), name: name.into() })?;
        if t.size() != shape {
            return Err(ModelError::BadShape {
                file: self.file.clone(),
                name: name.into(),
                want: shape.to_vec(),
                got: t.size(),
            });
        }
        Ok(place(t, self.opts.device, self.opts.dtype))
    }
}
