//! Results leave for pandas, pyarrow and numpy: columns to a Parquet file, arrays to an
//! `.npz` (docs/methods.md#export). Both are written whole in memory, then atomically
//! ([`crate::files::write_atomic`]); provenance (model, its source, the options, headscope's
//! version) goes in the file: a Parquet key-value entry `headscope` holding JSON, an `.npz`
//! member `headscope_metadata` holding its UTF-8 bytes. The formats are the maintained crates'
//! (`parquet`, `ndarray-npy`), not written by hand.

use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

use parquet::basic::{LogicalType, Repetition, Type as Physical};
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;

/// The key of the provenance entry in a Parquet file's metadata, and (with `_metadata`) the
/// name of the `.npz` member that holds it.
pub const PROVENANCE_KEY: &str = "headscope";

/// One column of a table to export; `None` is a missing value (null in pandas, NaN for floats).
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    Ints(Vec<Option<i64>>),
    Floats(Vec<Option<f64>>),
    Texts(Vec<Option<String>>),
}

impl Column {
    fn len(&self) -> usize {
        match self {
            Column::Ints(v) => v.len(),
            Column::Floats(v) => v.len(),
            Column::Texts(v) => v.len(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("column '{name}' has {got} values but the first column has {want}")]
    Ragged { name: String, got: usize, want: usize },
    #[error("array '{name}' has {got} values for the shape {shape:?}")]
    Shape { name: String, got: usize, shape: Vec<usize> },
    #[error("{0}")]
    Format(String),
    #[error("cannot write '{path}': {err}")]
    Io { path: String, err: std::io::Error },
}

fn format_err(e: impl std::fmt::Display) -> ExportError {
    ExportError::Format(e.to_string())
}

/// The provenance JSON every exported file carries: what the caller gives, with headscope's
/// version added.
pub fn provenance(mut fields: serde_json::Map<String, serde_json::Value>) -> String {
    fields.insert("headscope_version".into(), serde_json::Value::String(env!("CARGO_PKG_VERSION").into()));
    serde_json::Value::Object(fields).to_string()
}

/// The bytes of a Parquet file of `columns` (one row group), with `provenance` under
/// [`PROVENANCE_KEY`] in its key-value metadata.
pub fn parquet_bytes(columns: &[(String, Column)], provenance: &str) -> Result<Vec<u8>, ExportError> {
    let rows = columns.first().map_or(0, |(_, c)| c.len());
    if let Some((name, c)) = columns.iter().find(|(_, c)| c.len() != rows) {
        return Err(ExportError::Ragged { name: name.clone(), got: c.len(), want: rows });
    }
    let fields = columns
        .iter()
        .map(|(name, c)| {
            let b = match c {
                Column::Ints(_) => Type::primitive_type_builder(name, Physical::INT64),
                Column::Floats(_) => Type::primitive_type_builder(name, Physical::DOUBLE),
                Column::Texts(_) => Type::primitive_type_builder(name, Physical::BYTE_ARRAY)
                    .with_logical_type(Some(LogicalType::String)),
            };
            b.with_repetition(Repetition::OPTIONAL).build().map(Arc::new).map_err(format_err)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let schema = Arc::new(Type::group_type_builder("schema").with_fields(fields).build().map_err(format_err)?);
    let props = Arc::new(
        WriterProperties::builder()
            .set_key_value_metadata(Some(vec![KeyValue::new(PROVENANCE_KEY.into(), provenance.to_string())]))
            .set_created_by(format!("headscope {}", env!("CARGO_PKG_VERSION")))
            .build(),
    );
    let mut buf = Vec::new();
    let mut w = SerializedFileWriter::new(&mut buf, schema, props).map_err(format_err)?;
    let mut rg = w.next_row_group().map_err(format_err)?;
    let mut i = 0;
    while let Some(mut col) = rg.next_column().map_err(format_err)? {
        let c = &columns[i].1;
        // Definition level 1: present, 0: null; values hold the present ones only.
        let defs: Vec<i16> = match c {
            Column::Ints(v) => v.iter().map(|x| x.is_some() as i16).collect(),
            Column::Floats(v) => v.iter().map(|x| x.is_some() as i16).collect(),
            Column::Texts(v) => v.iter().map(|x| x.is_some() as i16).collect(),
        };
        match c {
            Column::Ints(v) => {
                let vals: Vec<i64> = v.iter().flatten().copied().collect();
                col.typed::<Int64Type>().write_batch(&vals, Some(&defs), None).map_err(format_err)?;
            }
            Column::Floats(v) => {
                let vals: Vec<f64> = v.iter().flatten().copied().collect();
                col.typed::<DoubleType>().write_batch(&vals, Some(&defs), None).map_err(format_err)?;
            }
            Column::Texts(v) => {
                let vals: Vec<ByteArray> = v.iter().flatten().map(|s| ByteArray::from(s.as_str())).collect();
                col.typed::<ByteArrayType>().write_batch(&vals, Some(&defs), None).map_err(format_err)?;
            }
        }
        col.close().map_err(format_err)?;
        i += 1;
    }
    rg.close().map_err(format_err)?;
    w.close().map_err(format_err)?;
    Ok(buf)
}

/// An array of float64 to store: its name in the archive, its shape (row-major) and values.
pub struct NpArray {
    pub name: String,
    pub shape: Vec<usize>,
    pub values: Vec<f64>,
}

/// The bytes of an uncompressed `.npz` holding `arrays` (float64) and the member
/// `headscope_metadata`: the UTF-8 bytes of `provenance` (`json.loads(bytes(z["headscope_metadata"]))`).
pub fn npz_bytes(arrays: &[NpArray], provenance: &str) -> Result<Vec<u8>, ExportError> {
    let mut npz = ndarray_npy::NpzWriter::new(Cursor::new(Vec::new()));
    for a in arrays {
        let want: usize = a.shape.iter().product();
        if want != a.values.len() {
            return Err(ExportError::Shape { name: a.name.clone(), got: a.values.len(), shape: a.shape.clone() });
        }
        let arr = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&a.shape), a.values.clone()).map_err(format_err)?;
        npz.add_array(a.name.as_str(), &arr).map_err(format_err)?;
    }
    let meta = ndarray::Array1::from_vec(provenance.as_bytes().to_vec());
    npz.add_array(format!("{PROVENANCE_KEY}_metadata"), &meta).map_err(format_err)?;
    Ok(npz.finish().map_err(format_err)?.into_inner())
}

/// The bytes of one `.npy` (float64) of `values` in `shape`.
pub fn npy_bytes(shape: &[usize], values: &[f64]) -> Result<Vec<u8>, ExportError> {
    use ndarray_npy::WriteNpyExt;
    let arr = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), values.to_vec()).map_err(format_err)?;
    let mut buf = Vec::new();
    arr.write_npy(&mut buf).map_err(format_err)?;
    Ok(buf)
}

/// Writes `bytes` to `path` atomically (temp file + rename).
pub fn write(path: &str, bytes: &[u8]) -> Result<(), ExportError> {
    crate::files::write_atomic(Path::new(path), bytes).map_err(|err| ExportError::Io { path: path.into(), err })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ragged_columns_and_bad_shapes_are_refused_by_name() {
        let cols = vec![
            ("layer".to_string(), Column::Ints(vec![Some(0), Some(1)])),
            ("value".to_string(), Column::Floats(vec![Some(0.5)])),
        ];
        let e = parquet_bytes(&cols, "{}").unwrap_err().to_string();
        assert!(e.contains("'value' has 1 values"), "{e}");
        let e = npz_bytes(&[NpArray { name: "dec".into(), shape: vec![2, 3], values: vec![0.0; 5] }], "{}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'dec' has 5 values for the shape [2, 3]"), "{e}");
    }

    #[test]
    fn parquet_starts_and_ends_with_its_magic() {
        let cols = vec![("head".to_string(), Column::Texts(vec![Some("dec.0.1".into()), None]))];
        let b = parquet_bytes(&cols, &provenance(Default::default())).unwrap();
        assert_eq!(&b[..4], b"PAR1");
        assert_eq!(&b[b.len() - 4..], b"PAR1");
    }
}
