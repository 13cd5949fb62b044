//! The safe `torch.save` reader against fixtures from tests/fixtures/make_torch_bin.py: exact
//! values against a golden, refused globals that never run, and hostile input that errs.

use headscope::model::readers::torch_pickle::read;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_bin").join(name)
}

/// The little-endian bytes of a contiguous copy of `t`.
fn bytes_of(t: &Tensor) -> Vec<u8> {
    let c = t.contiguous();
    let n = c.numel();
    let mut out = vec![0u8; n * c.kind().elt_size_in_bytes()];
    c.f_copy_data_u8(&mut out, n).expect("copy out");
    out
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

fn kind_of(torch_name: &str) -> Kind {
    match torch_name {
        "torch.float32" => Kind::Float,
        "torch.float16" => Kind::Half,
        "torch.bfloat16" => Kind::BFloat16,
        "torch.float64" => Kind::Double,
        "torch.int64" => Kind::Int64,
        "torch.int32" => Kind::Int,
        "torch.uint8" => Kind::Uint8,
        "torch.bool" => Kind::Bool,
        other => panic!("golden dtype {other} not mapped"),
    }
}

fn check_against_golden(file: &str) {
    let got = read(&fixture(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let gold: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("state.json")).unwrap()).unwrap();
    let want = gold["tensors"].as_object().unwrap();
    let mut names: Vec<&String> = got.keys().collect();
    names.sort();
    let mut want_names: Vec<&String> = want.keys().collect();
    want_names.sort();
    assert_eq!(names, want_names, "{file}: tensor names (the int entry 'step' is skipped)");
    for (name, w) in want {
        let t = &got[name];
        assert_eq!(t.device(), tch::Device::Cpu, "{name}");
        assert_eq!(t.kind(), kind_of(w["dtype"].as_str().unwrap()), "{file}: {name} dtype");
        let shape: Vec<i64> = w["shape"].as_array().unwrap().iter().map(|d| d.as_i64().unwrap()).collect();
        assert_eq!(t.size(), shape, "{file}: {name} shape");
        assert_eq!(bytes_of(t), unhex(w["hex"].as_str().unwrap()), "{file}: {name} values");
    }
    // Storage sharing survives: tied weights are one memory, the view looks into `base`.
    let ptr = |n: &str| got[n].data_ptr() as usize;
    assert_eq!(ptr("embed.weight"), ptr("tied.same_object"));
    assert_eq!(ptr("embed.weight"), ptr("tied.lm_head.weight"));
    assert_eq!(ptr("view"), ptr("base") + 2 * 4, "the view starts 2 floats into base's storage");
    assert_eq!(got["view"].stride(), [1, 6]);
    assert!(!got["view"].is_contiguous());
    assert_eq!(got["scalar"].dim(), 0);
}

#[test]
fn reads_torch_save_exactly() {
    check_against_golden("state.bin");
}

#[test]
fn reads_zip64_archives_with_any_folder_name() {
    check_against_golden("state_zip64.bin");
}

#[test]
fn flattens_nested_dicts() {
    let got = read(&fixture("nested.bin")).unwrap();
    let mut names: Vec<&str> = got.keys().map(|s| s.as_str()).collect();
    names.sort();
    assert_eq!(names, ["model.layers.0.w", "model.scale", "top"]);
    assert_eq!(got["model.layers.0.w"].size(), [2, 2]);
}

#[test]
fn refuses_code_execution_and_runs_nothing() {
    let marker = Path::new("/tmp/headscope_torch_pickle_evil_marker");
    for (file, global) in [("evil.bin", "posix.system"), ("evil_stack.bin", "os.system")] {
        let _ = std::fs::remove_file(marker);
        let err = read(&fixture(file)).err().unwrap_or_else(|| panic!("{file} was accepted")).to_string();
        assert!(err.contains(&format!("refused pickle global '{global}'")), "{file}: {err}");
        assert!(err.contains("evil.bin") || err.contains("evil_stack.bin"), "names the file: {err}");
        assert!(!marker.exists(), "{file}: the pickle's command ran");
    }
}

#[test]
fn corrupt_files_are_errors() {
    for (file, why) in [
        ("truncated.bin", "not a zip archive"),
        ("bad_pickle.bin", "truncated: a string needs"),
        ("bad_storage.bin", "storage 'state/data/0' has 8 bytes"),
        ("state.json", "not a zip archive"),
        ("deep.bin", "dicts nested deeper than"),
        ("cycle.bin", "dict 'k' is reached twice"),
        ("missing.bin", "No such file"),
    ] {
        let err = read(&fixture(file)).err().unwrap_or_else(|| panic!("{file} was accepted")).to_string();
        assert!(err.contains(file) && err.contains(why), "{file}: {err}");
        assert!(!err.contains('\n'), "one line: {err}");
        eprintln!("{err}");
    }
}

/// Every truncation and many single-byte corruptions of a real file: an answer, never a panic.
#[test]
fn mutated_files_never_panic() {
    let raw = std::fs::read(fixture("state.bin")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.bin");
    let try_bytes = |b: &[u8], what: String| {
        std::fs::write(&path, b).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read(&path).map(|m| m.len())));
        assert!(r.is_ok(), "panicked on {what}");
    };
    for n in 0..raw.len() {
        try_bytes(&raw[..n], format!("the first {n} bytes"));
    }
    for i in 0..raw.len() {
        for x in [0x01u8, 0x80, 0xFF] {
            let mut b = raw.clone();
            b[i] ^= x;
            try_bytes(&b, format!("byte {i} ^ {x:#x}"));
        }
    }
}
