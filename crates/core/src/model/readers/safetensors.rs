//! A safetensors reader over a memory map: one copy per tensor, straight from the page cache
//! into the dtype the model is loaded in, a piece at a time, each piece's pages released once
//! copied (`bytes::Pages`), so a checkpoint loads within its weights plus one piece.

use crate::model::readers::bytes::Pages;
use crate::model::ModelError;
use std::collections::HashMap;
use std::path::Path;
use tch::{Kind as DType, Tensor};

/// Maps a file read-only. The checkpoint must not be modified while it is being loaded.
pub fn map(path: &Path) -> Result<memmap2::Mmap, ModelError> {
    let file = std::fs::File::open(path).map_err(|e| ModelError::Io(path.display().to_string(), e.to_string()))?;
    // SAFETY: read-only map, used only during loading; every tensor is copied out of it.
    unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::Io(path.display().to_string(), e.to_string()))
}

/// Every tensor of the file, floating-point ones in dtype `to` where given (else as stored).
pub fn read(path: &Path, to: Option<DType>) -> Result<HashMap<String, Tensor>, ModelError> {
    let m = map(path)?;
    read_pages(&m, &path.display().to_string(), to)
}

/// Every tensor of a safetensors file's bytes `m`, as stored; `file` names it in errors.
pub fn read_bytes(m: &[u8], file: &str) -> Result<HashMap<String, Tensor>, ModelError> {
    read_pages(&m, file, None)
}

fn read_pages(pages: &dyn Pages, file: &str, to: Option<DType>) -> Result<HashMap<String, Tensor>, ModelError> {
    let m = pages.bytes();
    let bad = |why: String| ModelError::Corrupt { file: file.into(), why };
    if m.len() < 8 {
        return Err(bad("shorter than its 8-byte header length".into()));
    }
    let n = u64::from_le_bytes(m[..8].try_into().unwrap_or([0; 8]));
    if n > (m.len() - 8) as u64 {
        return Err(bad(format!("header length {n} (bytes 0..8) passes the end of the file ({} bytes)", m.len())));
    }
    let n = n as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&m[8..8 + n]).map_err(|e| bad(format!("header is not JSON: {e}")))?;
    let data = &m[8 + n..];
    let mut out = HashMap::with_capacity(header.len());
    for (name, info) in header {
        if name == "__metadata__" {
            continue;
        }
        let dtype = match info["dtype"].as_str() {
            Some("F64") => DType::Double,
            Some("F32") => DType::Float,
            Some("F16") => DType::Half,
            Some("BF16") => DType::BFloat16,
            Some("I64") => DType::Int64,
            Some("I32") => DType::Int,
            Some("I8") => DType::Int8,
            other => return Err(bad(format!("tensor '{name}' has unsupported dtype {other:?}"))),
        };
        let Some(dims) = info["shape"].as_array() else { return Err(bad(format!("tensor '{name}' has no shape"))) };
        let Some(shape) = dims.iter().map(|x| x.as_i64()).collect::<Option<Vec<i64>>>() else {
            return Err(bad(format!("tensor '{name}': shape {} is not a list of integers", info["shape"])));
        };
        let count = crate::model::readers::bytes::elements(
            shape.iter().map(|&d| d as i128),
            &format!("tensor '{name}'"),
            file,
        )?;
        let offs: Vec<u64> =
            info["data_offsets"].as_array().map(|a| a.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default();
        let [begin, end] = offs[..] else { return Err(bad(format!("tensor '{name}' has no data_offsets"))) };
        let elem = dtype.elt_size_in_bytes();
        if count.checked_mul(elem).is_none_or(|need| need > data.len()) {
            return Err(bad(format!("tensor '{name}': shape {shape:?} declares {count} elements of {elem} bytes, more than the data area of {} bytes holds", data.len())));
        }
        if begin > end || end > data.len() as u64 || count.checked_mul(elem) != Some((end - begin) as usize) {
            return Err(bad(format!(
                "tensor '{name}': data_offsets {begin}..{end} do not match shape {shape:?} in a data area of {} bytes",
                data.len()
            )));
        }
        let start = 8 + n + begin as usize;
        let t = crate::model::readers::bytes::tensor_out(pages, start, &shape, count, dtype, to)?;
        out.insert(name, t);
    }
    Ok(out)
}
