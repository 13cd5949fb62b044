//! What a checkpoint stores its weights as, from its headers alone (no tensor is read): the
//! dtype holding most of its weight bytes, so that loading can say what a leaner dtype would
//! save (docs/methods.md#loading-memory).

use crate::model::readers::gguf::Gguf;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// The dtype of most of the weight bytes at `path` (a safetensors checkpoint's `BF16`, `F16`,
/// `F32`; a GGUF's `Q4_K`, `BF16`), or `None` where the headers cannot say (other formats).
pub fn stored(path: &Path) -> Option<String> {
    if path.is_file() && path.extension().is_some_and(|e| e == "gguf") {
        return Gguf::open(path).ok()?.stored().map(str::to_string);
    }
    if let Some(g) = crate::model::families::llama_gguf::find_gguf(path) {
        return Gguf::open(&g).ok()?.stored().map(str::to_string);
    }
    let mut by: BTreeMap<String, u128> = BTreeMap::new();
    for f in safetensors_files(path)? {
        for (dtype, bytes) in header_bytes(&f)? {
            *by.entry(dtype).or_default() += bytes;
        }
    }
    by.into_iter().max_by_key(|(_, b)| *b).map(|(d, _)| d)
}

/// The safetensors files of an HF directory: `model.safetensors`, else the shards its index
/// lists.
fn safetensors_files(dir: &Path) -> Option<Vec<std::path::PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Some(vec![single]);
    }
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("model.safetensors.index.json")).ok()?).ok()?;
    let mut files: Vec<&str> = index.get("weight_map")?.as_object()?.values().filter_map(|v| v.as_str()).collect();
    files.sort();
    files.dedup();
    // Names outside the directory are refused by `hf::weights` when it loads; not read here.
    Some(
        files
            .into_iter()
            .filter(|f| !f.contains('/') && !f.contains('\\') && *f != "..")
            .map(|f| dir.join(f))
            .collect(),
    )
}

/// Bytes per dtype in one safetensors file, from its header (at most 100 MB read).
fn header_bytes(path: &Path) -> Option<Vec<(String, u128)>> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).ok()?;
    let n = u64::from_le_bytes(len);
    if n > 100 << 20 || n > f.metadata().ok()?.len() {
        return None;
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).ok()?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header).ok()?;
    Some(
        header
            .iter()
            .filter(|(k, _)| *k != "__metadata__")
            .filter_map(|(_, v)| {
                let offs = v.get("data_offsets")?.as_array()?;
                let (b, e) = (offs.first()?.as_u64()?, offs.get(1)?.as_u64()?);
                Some((v.get("dtype")?.as_str()?.to_string(), e.saturating_sub(b) as u128))
            })
            .collect(),
    )
}

/// What holding weights stored as `stored` in float32 costs against bf16: `Some((f32 bytes,
/// bf16 bytes))` for `n_params` weights when the checkpoint is 16-bit or quantised and the
/// model is loaded in float32.
pub fn bf16_saving(stored: Option<&str>, loaded: tch::Kind, n_params: i64) -> Option<(f64, f64)> {
    let narrow = stored.is_some_and(|s| !matches!(s, "F32" | "F64" | "I64" | "I32"));
    (narrow && loaded == tch::Kind::Float).then_some((n_params as f64 * 4.0, n_params as f64 * 2.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dtype_of_most_bytes_from_the_header() {
        let dir = std::env::temp_dir().join(format!("hs-stored-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let header = br#"{"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"__metadata__":{"format":"pt"}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(&[0u8; 12]);
        std::fs::write(dir.join("model.safetensors"), &bytes).unwrap();
        assert_eq!(stored(&dir).as_deref(), Some("BF16"));
        // A header that declares more than the file holds says nothing.
        std::fs::write(dir.join("model.safetensors"), u64::MAX.to_le_bytes()).unwrap();
        assert_eq!(stored(&dir), None);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(bf16_saving(Some("BF16"), tch::Kind::Float, 10), Some((40.0, 20.0)));
        assert_eq!(bf16_saving(Some("Q4_K"), tch::Kind::Float, 10), Some((40.0, 20.0)));
        assert_eq!(bf16_saving(Some("F32"), tch::Kind::Float, 10), None);
        assert_eq!(bf16_saving(Some("BF16"), tch::Kind::BFloat16, 10), None);
        assert_eq!(bf16_saving(None, tch::Kind::Float, 10), None);
    }
}
