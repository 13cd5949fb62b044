//! Results leave for pandas and numpy (docs/methods.md#export): a grid, a table, an attention
//! matrix and an array that headscope writes as Parquet, `.npz`, `.npy` and JSON, read back by
//! pandas / pyarrow / numpy without headscope, values equal to headscope's own JSON
//! (`tests/fixtures/read_exports.py`).

use crate::common;

#[test]
fn parquet_npz_and_npy_are_read_back_by_pandas_and_numpy() {
    let (ok, out) = common::run_fixture_script("read_exports.py", &[]);
    assert!(ok, "{out}");
    assert!(out.matches("ok  ").count() >= 16, "{out}");
}
