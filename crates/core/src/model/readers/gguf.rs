//! GGUF checkpoints (llama.cpp's format, e.g. SmolLM2-135M in the assets): metadata, tensor
//! directory, and dequantisation of F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and MXFP4 tensors
//! into f32 tensors in PyTorch's dimension order. The reader is checked against the `gguf` Python package
//! (tests/readers/gguf.rs); `llama_gguf.rs` builds the decoder-only model from it.

use crate::model::readers::bytes::{in_pieces, Cursor, Pages, PIECE};
use crate::model::ModelError;
use std::collections::BTreeMap;
use std::path::Path;
use tch::{Kind as DType, Tensor};

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::U64(v) => Some(*v),
            Value::I64(v) if *v >= 0 => Some(*v as u64),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::F64(v) => Some(*v),
            Value::U64(v) => Some(*v as f64),
            Value::I64(v) => Some(*v as f64),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        if let Value::Str(s) = self {
            Some(s)
        } else {
            None
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: `dims[0]` is the innermost (contiguous) dimension.
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub offset: u64,
}

impl TensorInfo {
    /// The shape in PyTorch order (outermost first).
    pub fn shape(&self) -> Vec<i64> {
        self.dims.iter().rev().map(|&d| d as i64).collect()
    }
}

pub struct Gguf {
    pub file: String,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    data_start: usize,
    map: Box<dyn Pages>,
}

/// GGUF's strings and typed metadata values, on the shared checked cursor.
trait GgufValues {
    fn string(&mut self, what: &str) -> Result<String, ModelError>;
    fn value(&mut self, t: u32, what: &str, depth: usize) -> Result<Value, ModelError>;
}

impl GgufValues for Cursor<'_> {
    fn string(&mut self, what: &str) -> Result<String, ModelError> {
        let n = self.u64(what)?;
        Ok(String::from_utf8_lossy(self.take(n, what)?).into_owned())
    }
    fn value(&mut self, t: u32, what: &str, depth: usize) -> Result<Value, ModelError> {
        let mut num = |n: usize| -> Result<[u8; 8], ModelError> {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(self.take(n as u64, what)?);
            Ok(b)
        };
        Ok(match t {
            0 => Value::U64(num(1)?[0] as u64),
            1 => Value::I64(num(1)?[0] as i8 as i64),
            2 => Value::U64(u16::from_le_bytes(num(2)?[..2].try_into().unwrap_or([0; 2])) as u64),
            3 => Value::I64(i16::from_le_bytes(num(2)?[..2].try_into().unwrap_or([0; 2])) as i64),
            4 => Value::U64(u32::from_le_bytes(num(4)?[..4].try_into().unwrap_or([0; 4])) as u64),
            5 => Value::I64(i32::from_le_bytes(num(4)?[..4].try_into().unwrap_or([0; 4])) as i64),
            6 => Value::F64(f32::from_le_bytes(num(4)?[..4].try_into().unwrap_or([0; 4])) as f64),
            7 => Value::Bool(num(1)?[0] != 0),
            8 => Value::Str(self.string(what)?),
            9 if depth < 4 => {
                let et = self.u32(what)?;
                // The least bytes an element of the type takes: a string is its 8-byte length,
                // an array its type and count.
                let least = match et {
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    _ => 1,
                };
                let n = self.count(least, what)?;
                Value::Array((0..n).map(|_| self.value(et, what, depth + 1)).collect::<Result<_, _>>()?)
            }
            10 => Value::U64(u64::from_le_bytes(num(8)?)),
            11 => Value::I64(i64::from_le_bytes(num(8)?)),
            12 => Value::F64(f64::from_le_bytes(num(8)?)),
            other => {
                return Err(ModelError::Corrupt {
                    file: self.file.into(),
                    why: format!("{what}: unknown value type {other}"),
                })
            }
        })
    }
}

/// IEEE half to f32.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, m) => {
            // subnormal: normalise
            let mut e = 127 - 15 + 1;
            let mut m = m;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x3ff) << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

fn half(b: &[u8]) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

/// Bytes per block and elements per block of a ggml type.
fn block(t: u32) -> Option<(usize, usize, &'static str)> {
    match t {
        0 => Some((4, 1, "F32")),
        1 => Some((2, 1, "F16")),
        2 => Some((18, 32, "Q4_0")),
        3 => Some((20, 32, "Q4_1")),
        6 => Some((22, 32, "Q5_0")),
        7 => Some((24, 32, "Q5_1")),
        8 => Some((34, 32, "Q8_0")),
        10 => Some((84, 256, "Q2_K")),
        11 => Some((110, 256, "Q3_K")),
        12 => Some((144, 256, "Q4_K")),
        13 => Some((176, 256, "Q5_K")),
        14 => Some((210, 256, "Q6_K")),
        30 => Some((2, 1, "BF16")),
        39 => Some((17, 32, "MXFP4")),
        _ => None,
    }
}

/// The 6-bit scale and min of sub-block `j` (of 8) of a Q4_K/Q5_K block's 12 scale bytes.
fn k_scale_min(s: &[u8], j: usize) -> (f32, f32) {
    if j < 4 {
        ((s[j] & 0x3f) as f32, (s[4 + j] & 0x3f) as f32)
    } else {
        (((s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30)) as f32, ((s[j + 4] >> 4) | ((s[j] >> 2) & 0x30)) as f32)
    }
}

/// One super-block of 256 values of a K-quant (llama.cpp's `dequantize_row_q{2,3,4,5,6}_K`).
fn dequant_k(t: u32, blk: &[u8], o: &mut [f32]) {
    match t {
        // d, dmin, 12 scale bytes, 128 bytes of 4-bit values: sub-block s = 2i + k holds the
        // low (k = 0) or high (k = 1) nibbles of bytes 32i..32i+32.
        12 | 13 => {
            let (d, dmin) = (half(&blk[..2]), half(&blk[2..4]));
            let scales = &blk[4..16];
            let (qh, qs) = if t == 13 { (Some(&blk[16..48]), &blk[48..176]) } else { (None, &blk[16..144]) };
            for s in 0..8 {
                let (sc, mn) = k_scale_min(scales, s);
                let (i, k) = (s / 2, s % 2);
                for e in 0..32 {
                    let mut q = (qs[32 * i + e] >> (4 * k)) & 0x0f;
                    if let Some(qh) = qh {
                        // Q5_K: the fifth bit of sub-block s is bit s of qh[e].
                        q |= ((qh[e] >> s) & 1) << 4;
                    }
                    o[32 * s + e] = d * sc * q as f32 - dmin * mn;
                }
            }
        }
        // 16 scale bytes (low nibble the scale, high the min, of 16 values each), 64 bytes of
        // 2-bit values (value l is bits 2(r/32) of byte 32(l/128) + r%32, r = l%128), d, dmin.
        10 => {
            let (scales, qs, d, dmin) = (&blk[..16], &blk[16..80], half(&blk[80..82]), half(&blk[82..84]));
            for (l, out) in o.iter_mut().enumerate().take(256) {
                let (i, r) = (l / 128, l % 128);
                let q = (qs[32 * i + r % 32] >> (2 * (r / 32))) & 3;
                let sc = scales[l / 16];
                let (dl, ml) = (d * (sc & 0x0f) as f32, dmin * (sc >> 4) as f32);
                *out = dl * q as f32 - ml;
            }
        }
        // 32 bytes of high-bit mask (bit l/32 of byte l%32; a clear bit subtracts 4), 64 bytes
        // of 2-bit values laid out as Q2_K's, 12 bytes of 16 packed 6-bit scales (offset 32), d.
        11 => {
            let (hmask, qs, sc, d) = (&blk[..32], &blk[32..96], &blk[96..108], half(&blk[108..110]));
            for (l, out) in o.iter_mut().enumerate().take(256) {
                let (i, r) = (l / 128, l % 128);
                let low = ((qs[32 * i + r % 32] >> (2 * (r / 32))) & 3) as i32;
                let high = ((hmask[l % 32] >> (l / 32)) & 1) ^ 1;
                let k = l / 16;
                let scale = ((sc[k % 8] >> (4 * (k / 8))) & 0x0f) | (((sc[8 + k % 4] >> (2 * (k / 4))) & 3) << 4);
                let dl = d * (scale as i32 - 32) as f32;
                *out = dl * (low - 4 * high as i32) as f32;
            }
        }
        // 128 bytes of low 4 bits, 64 of high 2 bits, 16 signed 8-bit scales (one per 16
        // values), d.
        _ => {
            let (ql, qh, scales, d) = (&blk[..128], &blk[128..192], &blk[192..208], half(&blk[208..210]));
            for (l, out) in o.iter_mut().enumerate().take(256) {
                let (i, r) = (l / 128, l % 128);
                let low = (ql[64 * i + r % 64] >> (4 * (r / 64))) & 0x0f;
                let high = (qh[32 * i + r % 32] >> (2 * (r / 32))) & 0x03;
                let q = (low | (high << 4)) as i32 - 32;
                *out = d * (scales[l / 16] as i8) as f32 * q as f32;
            }
        }
    }
}

impl Gguf {
    pub fn open(path: &Path) -> Result<Gguf, ModelError> {
        let map = crate::model::readers::safetensors::map(path)?;
        Gguf::from_bytes(Box::new(map), path.display().to_string())
    }

    /// The metadata and tensor directory of a GGUF file's bytes; `file` names it in errors.
    /// Every tensor of a supported type must fit in the file after the data offset.
    pub fn from_bytes(map: Box<dyn Pages>, file: String) -> Result<Gguf, ModelError> {
        let (version, metadata, tensors, data_start) = {
            let mut c = Cursor::new(map.bytes(), &file);
            if c.take(4, "the magic")? != b"GGUF" {
                return Err(ModelError::Corrupt {
                    file: file.clone(),
                    why: "not a GGUF file (magic is not 'GGUF')".into(),
                });
            }
            let version = c.u32("the version")?;
            if version != 3 {
                return Err(ModelError::Corrupt {
                    file: file.clone(),
                    why: format!("GGUF version {version} is not supported (3 is)"),
                });
            }
            // A tensor entry is at least 24 bytes, a metadata entry at least 13.
            let n_tensors = c.count(24, "the tensor count")?;
            let n_kv = c.count(13, "the metadata count")?;
            let mut metadata = BTreeMap::new();
            for i in 0..n_kv {
                let key = c.string(&format!("metadata key {i}"))?;
                let t = c.u32(&key)?;
                let v = c.value(t, &key, 0)?;
                metadata.insert(key, v);
            }
            let mut tensors = Vec::with_capacity(n_tensors);
            for i in 0..n_tensors {
                let name = c.string(&format!("tensor name {i}"))?;
                let nd = c.u32(&name)? as usize;
                if nd > 8 {
                    return Err(ModelError::Corrupt {
                        file: file.clone(),
                        why: format!("tensor '{name}' has {nd} dimensions"),
                    });
                }
                let dims = (0..nd).map(|_| c.u64(&name)).collect::<Result<Vec<_>, _>>()?;
                crate::model::readers::bytes::elements(
                    dims.iter().map(|&d| d as i128),
                    &format!("tensor '{name}'"),
                    &file,
                )?;
                let ggml_type = c.u32(&name)?;
                let offset = c.u64(&name)?;
                tensors.push(TensorInfo { name, dims, ggml_type, offset });
            }
            let align = metadata.get("general.alignment").and_then(Value::as_u64).unwrap_or(32).max(1) as usize;
            let data_start = c.pos.div_ceil(align).saturating_mul(align);
            let left = c.b.len().saturating_sub(data_start);
            for t in &tensors {
                let Some((bytes, per, _)) = block(t.ggml_type) else { continue };
                let n = crate::model::readers::bytes::elements(
                    t.dims.iter().map(|&d| d as i128),
                    &format!("tensor '{}'", t.name),
                    &file,
                )?;
                let len = (n / per).saturating_mul(bytes);
                if t.offset.checked_add(len as u64).is_none_or(|end| end > left as u64) {
                    return Err(ModelError::Corrupt {
                        file: file.clone(),
                        why: format!("tensor '{}' declares {n} elements ({len} bytes) at data offset {} but the file has {left} bytes after the data offset", t.name, t.offset),
                    });
                }
            }
            (version, metadata, tensors, data_start)
        };
        Ok(Gguf { file, version, metadata, tensors, data_start, map })
    }

    /// The ggml type holding most of the file's tensor bytes (`Q4_K`, `BF16`), if any.
    pub fn stored(&self) -> Option<&'static str> {
        let mut by: BTreeMap<&'static str, u128> = BTreeMap::new();
        for t in &self.tensors {
            if let Some((bytes, per, name)) = block(t.ggml_type) {
                let n: u128 = t.dims.iter().map(|&d| d as u128).product();
                *by.entry(name).or_default() += n / per as u128 * bytes as u128;
            }
        }
        by.into_iter().max_by_key(|(_, b)| *b).map(|(n, _)| n)
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A tensor dequantised to f32, in PyTorch order.
    pub fn tensor(&self, name: &str) -> Result<Tensor, ModelError> {
        self.tensor_as(name, DType::Float)
    }

    /// A tensor dequantised straight into dtype `to` (floating point), in PyTorch order: a
    /// piece of blocks at a time through float32 (the same numbers as dequantising to float32
    /// and converting the whole), each piece's pages of the file released once read.
    pub fn tensor_as(&self, name: &str, to: DType) -> Result<Tensor, ModelError> {
        let info =
            self.info(name).ok_or_else(|| ModelError::MissingTensor { file: self.file.clone(), name: name.into() })?;
        let bad = |why: String| ModelError::Corrupt { file: self.file.clone(), why: format!("tensor '{name}': {why}") };
        let (bytes, per, tname) = block(info.ggml_type).ok_or_else(|| bad(format!("ggml type {} is not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4 are)", info.ggml_type)))?;
        let n = crate::model::readers::bytes::elements(
            info.dims.iter().map(|&d| d as i128),
            &format!("tensor '{name}'"),
            &self.file,
        )?;
        if !n.is_multiple_of(per) {
            return Err(bad(format!("{n} elements are not whole {tname} blocks of {per}")));
        }
        let len =
            (n / per).checked_mul(bytes).ok_or_else(|| bad(format!("{n} elements of {tname} pass 2^64 bytes")))?;
        let start = usize::try_from(info.offset).ok().and_then(|o| o.checked_add(self.data_start));
        let data = start
            .and_then(|s| Some((s, s.checked_add(len)?)))
            .and_then(|(s, e)| self.map.bytes().get(s..e))
            .ok_or_else(|| {
                bad(format!(
                    "data offset {} + {len} bytes lies past the end of the file ({} bytes)",
                    info.offset,
                    self.map.bytes().len()
                ))
            })?;
        let start = start.unwrap_or(0);
        let blocks = (PIECE / 4 / per).max(1);
        let mut buf = vec![0f32; (blocks * per).min(n)];
        let t = in_pieces(n, to, blocks * per, |at, m| {
            let (b0, nb) = (at / per, m / per);
            dequantise(info.ggml_type, bytes, &data[b0 * bytes..(b0 + nb) * bytes], &mut buf[..m]);
            let t = Tensor::f_from_slice(&buf[..m])?;
            self.map.release(start + b0 * bytes, nb * bytes);
            Ok(t)
        })?;
        Ok(t.f_view(info.shape().as_slice())?)
    }
}

/// Blocks `data` of ggml type `t` (`bytes` per block, checked by [`block`]) dequantised into
/// `out`.
fn dequantise(t: u32, bytes: usize, data: &[u8], out: &mut [f32]) {
    {
        match t {
            0 => out
                .iter_mut()
                .zip(data.chunks_exact(4))
                .for_each(|(o, c)| *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            1 => out.iter_mut().zip(data.chunks_exact(2)).for_each(|(o, c)| *o = half(c)),
            2 => {
                for (o, blk) in out.chunks_exact_mut(32).zip(data.chunks_exact(18)) {
                    let d = half(&blk[..2]);
                    for j in 0..16 {
                        o[j] = d * ((blk[2 + j] & 0x0f) as i32 - 8) as f32;
                        o[j + 16] = d * ((blk[2 + j] >> 4) as i32 - 8) as f32;
                    }
                }
            }
            3 => {
                for (o, blk) in out.chunks_exact_mut(32).zip(data.chunks_exact(20)) {
                    let (d, m) = (half(&blk[..2]), half(&blk[2..4]));
                    for j in 0..16 {
                        o[j] = d * (blk[4 + j] & 0x0f) as f32 + m;
                        o[j + 16] = d * (blk[4 + j] >> 4) as f32 + m;
                    }
                }
            }
            // d, (Q5_1: m,) 32 fifth bits (bit j for value j), 16 bytes of low nibbles (values
            // 0..16) and high nibbles (16..32).
            6 | 7 => {
                let q51 = t == 7;
                let at = if q51 { 4 } else { 2 };
                for (o, blk) in out.chunks_exact_mut(32).zip(data.chunks_exact(bytes)) {
                    let d = half(&blk[..2]);
                    let qh = u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
                    let qs = &blk[at + 4..at + 20];
                    for (j, out) in o.iter_mut().enumerate() {
                        let q = ((qs[j % 16] >> (4 * (j / 16))) & 0x0f) as u32 | (((qh >> j) & 1) << 4);
                        *out = if q51 { d * q as f32 + half(&blk[2..4]) } else { d * (q as i32 - 16) as f32 };
                    }
                }
            }
            8 => {
                for (o, blk) in out.chunks_exact_mut(32).zip(data.chunks_exact(34)) {
                    let d = half(&blk[..2]);
                    for j in 0..32 {
                        o[j] = d * (blk[2 + j] as i8) as f32;
                    }
                }
            }
            10..=14 => {
                for (o, blk) in out.chunks_exact_mut(256).zip(data.chunks_exact(bytes)) {
                    dequant_k(t, blk, o);
                }
            }
            30 => out
                .iter_mut()
                .zip(data.chunks_exact(2))
                .for_each(|(o, c)| *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)),
            // MXFP4: an E8M0 exponent e, half-scale 2^(e - 128) (ggml's `e8m0_to_fp32_half`), and
            // 32 e2m1 values as doubled integers, low nibbles (values 0..16) then high (16..32).
            39 => {
                const E2M1: [f32; 16] = [0., 1., 2., 3., 4., 6., 8., 12., 0., -1., -2., -3., -4., -6., -8., -12.];
                for (o, blk) in out.chunks_exact_mut(32).zip(data.chunks_exact(17)) {
                    let e = blk[0] as u32;
                    let d = f32::from_bits(if e < 2 { 0x0020_0000 << e } else { (e - 1) << 23 });
                    for j in 0..16 {
                        o[j] = d * E2M1[(blk[1 + j] & 0x0f) as usize];
                        o[j + 16] = d * E2M1[(blk[1 + j] >> 4) as usize];
                    }
                }
            }
            _ => unreachable!("checked by block()"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{f16_to_f32, Gguf, Value};
    use tch::Kind as DType;

    fn kv(key: &str, t: u32, payload: &[u8]) -> Vec<u8> {
        [&(key.len() as u64).to_le_bytes()[..], key.as_bytes(), &t.to_le_bytes(), payload].concat()
    }

    #[test]
    fn every_metadata_type_reads_its_own_width() {
        // A u16 once consumed four bytes, shifting every later key.
        let kvs = [
            kv("u8", 0, &[7]),
            kv("u16", 2, &9u16.to_le_bytes()),
            kv("i16", 3, &(-9i16).to_le_bytes()),
            kv("u32", 4, &10u32.to_le_bytes()),
            kv("i32", 5, &(-10i32).to_le_bytes()),
            kv("f32", 6, &0.5f32.to_le_bytes()),
            kv("bool", 7, &[1]),
            kv("u64", 10, &11u64.to_le_bytes()),
            kv(
                "u16s",
                9,
                &[&2u32.to_le_bytes()[..], &2u64.to_le_bytes(), &1u16.to_le_bytes(), &2u16.to_le_bytes()].concat(),
            ),
            kv("last", 1, &[0xff]),
        ];
        let mut b =
            [&b"GGUF"[..], &3u32.to_le_bytes(), &0u64.to_le_bytes(), &(kvs.len() as u64).to_le_bytes()].concat();
        kvs.iter().for_each(|k| b.extend_from_slice(k));
        let g = Gguf::from_bytes(Box::new(b), "t.gguf".into()).unwrap();
        let m = &g.metadata;
        assert_eq!(m["u8"], Value::U64(7));
        assert_eq!(m["u16"], Value::U64(9));
        assert_eq!(m["i16"], Value::I64(-9));
        assert_eq!(m["u32"], Value::U64(10));
        assert_eq!(m["i32"], Value::I64(-10));
        assert_eq!(m["f32"], Value::F64(0.5));
        assert_eq!(m["bool"], Value::Bool(true));
        assert_eq!(m["u64"], Value::U64(11));
        assert_eq!(m["u16s"], Value::Array(vec![Value::U64(1), Value::U64(2)]));
        assert_eq!(m["last"], Value::I64(-1));
    }

    /// A GGUF (v3, no metadata) of one tensor `w` of ggml type `t`, `dims` in GGUF order, and
    /// its data.
    fn one_tensor(t: u32, dims: &[u64], data: &[u8]) -> Vec<u8> {
        let mut b = [&b"GGUF"[..], &3u32.to_le_bytes(), &1u64.to_le_bytes(), &0u64.to_le_bytes()].concat();
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(b'w');
        b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| b.extend_from_slice(&d.to_le_bytes()));
        b.extend_from_slice(&t.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        while b.len() % 32 != 0 {
            b.push(0);
        }
        b.extend_from_slice(data);
        b
    }

    #[test]
    fn gguf_bf16_equals_f32_converted() {
        // Q4_K blocks of pseudo-random bytes with finite scales, more than one piece's worth
        // (PIECE / 4 / 256 blocks) and not a whole number of pieces; and BF16 and F16 tensors.
        let blocks = super::PIECE / 4 / 256 + 37;
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut data: Vec<u8> = (0..blocks * 144)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for blk in data.chunks_exact_mut(144) {
            blk[..2].copy_from_slice(&0x2e66u16.to_le_bytes()); // d = 0.1
            blk[2..4].copy_from_slice(&0x1c00u16.to_le_bytes()); // dmin = 2^-8
        }
        let g = Gguf::from_bytes(Box::new(one_tensor(12, &[256, blocks as u64], &data)), "t.gguf".into()).unwrap();
        assert_eq!(g.stored(), Some("Q4_K"));
        let f = g.tensor("w").unwrap();
        assert_eq!(f.size(), [blocks as i64, 256]);
        assert!(f.isfinite().all().int64_value(&[]) == 1 && f.abs().max().double_value(&[]) > 0.5);
        for to in [DType::BFloat16, DType::Half, DType::Double] {
            let t = g.tensor_as("w", to).unwrap();
            assert_eq!(t.kind(), to);
            assert!(t.equal(&f.to_kind(to)), "{to:?}");
        }
        // A bf16 tensor read as bf16 is its bytes.
        let bf: Vec<u8> = (0..1000u16).flat_map(|i| (0x3f80u16 + i).to_le_bytes()).collect();
        let g = Gguf::from_bytes(Box::new(one_tensor(30, &[10, 100], &bf)), "t.gguf".into()).unwrap();
        let t = g.tensor_as("w", DType::BFloat16).unwrap();
        assert!(t.equal(&tch::Tensor::from_data_size(&bf, &[100, 10], DType::BFloat16)));
        assert!(g.tensor("w").unwrap().to_kind(DType::BFloat16).equal(&t));
    }

    #[test]
    fn half_conversion() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24)); // smallest subnormal
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert!(f16_to_f32(0x7c00).is_infinite());
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
    }
}
