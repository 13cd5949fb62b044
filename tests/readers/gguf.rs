//! The GGUF reader against the `gguf` Python package on the real SmolLM2-135M Q4_1 file:
//! metadata, the tensor directory, and dequantised values of F32, Q4_1 and Q8_0 tensors.

use crate::common;

use headscope::model::readers::gguf::Gguf;
use std::path::Path;

#[test]
fn gguf_reader_matches_the_gguf_package() {
    let _heavy = common::heavy();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = headscope::assets::asset_path("smollm2").unwrap();
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "gguf"))
        .unwrap();
    let out = tempfile::tempdir().unwrap();
    let st = std::process::Command::new(common::python())
        .arg(root.join("tests/fixtures/gguf_reference.py"))
        .arg(&file)
        .arg(out.path())
        .status()
        .unwrap();
    assert!(st.success(), "the gguf reference script failed (scripts/setup installs the gguf package)");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("meta.json")).unwrap()).unwrap();

    let g = Gguf::open(&file).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.metadata["general.architecture"].as_str(), meta["general.architecture"].as_str());
    for key in
        ["llama.block_count", "llama.embedding_length", "llama.attention.head_count", "llama.attention.head_count_kv"]
    {
        assert_eq!(g.metadata[key].as_u64(), meta[key].as_u64(), "{key}");
    }
    assert!(
        (g.metadata["llama.rope.freq_base"].as_f64().unwrap() - meta["llama.rope.freq_base"].as_f64().unwrap()).abs()
            < 1e-3
    );
    let listed = meta["tensors"].as_array().unwrap();
    assert_eq!(g.tensors.len(), listed.len());
    for (ours, theirs) in g.tensors.iter().zip(listed) {
        assert_eq!(ours.name, theirs["name"].as_str().unwrap());
        let shape: Vec<i64> = theirs["shape"].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect();
        assert_eq!(ours.shape(), shape, "{}", ours.name);
    }
    let mut types = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(out.path()).unwrap() {
        let p = entry.unwrap().path();
        let Some(name) = p.file_name().unwrap().to_str().unwrap().strip_suffix(".npy").map(String::from) else {
            continue;
        };
        let want = tch::Tensor::read_npy(&p).unwrap();
        let got = g.tensor(&name).unwrap();
        let got = if want.dim() > 1 { got.narrow(0, 0, want.size()[0]) } else { got };
        assert_eq!(got.size(), want.size(), "{name}");
        let d = (got - &want).abs().max().double_value(&[]);
        assert!(d <= 1e-6, "{name}: dequantised values differ by {d}");
        types.insert(g.info(&name).unwrap().ggml_type);
    }
    assert_eq!(types.into_iter().collect::<Vec<_>>(), vec![0, 3, 8], "F32, Q4_1 and Q8_0 were all checked");
    assert!(Gguf::open(&root.join("Cargo.toml")).is_err());
}

/// K-quants (Q2_K .. Q6_K: the Q4_K_M / Q5_K_M / Q6_K files people download mix them), Q5_0,
/// Q5_1, BF16 and MXFP4 (gpt-oss's experts), against the `gguf` package's numpy dequantisation of the same bytes
/// (`tests/fixtures/make_kquants.py`: random blocks with finite f16 scales, so every bit of
/// each layout is read): equal, or within one float32 ulp; a truncated tensor is a one-line
/// error.
#[test]
fn k_quants_and_bf16_equal_the_gguf_package() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kquants");
    let g = Gguf::open(&dir.join("kquants.gguf")).unwrap();
    let golden: Vec<(String, tch::Tensor)> = tch::Tensor::read_npz(dir.join("golden.npz")).unwrap();
    assert_eq!(golden.len(), 9);
    let mut types = std::collections::BTreeSet::new();
    for (name, want) in &golden {
        let got = g.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got.size(), want.size(), "{name}");
        let (got, want) =
            (Vec::<f32>::try_from(got.flatten(0, -1)).unwrap(), Vec::<f32>::try_from(want.flatten(0, -1)).unwrap());
        let mut exact = 0;
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            // One ulp of the reference value (its spacing at its magnitude).
            let ulp = f32::from_bits(b.abs().to_bits() + 1) - b.abs();
            assert!((a - b).abs() <= ulp, "{name}[{i}]: {a} vs the gguf package's {b}");
            exact += (a == b) as usize;
        }
        assert!(want.iter().any(|x| *x != 0.0), "{name}: the reference is all zero");
        eprintln!("{name}: {exact} of {} values bit-equal, the rest within one ulp", want.len());
        types.insert(g.info(name).unwrap().ggml_type);
    }
    assert_eq!(
        types.into_iter().collect::<Vec<_>>(),
        vec![6, 7, 10, 11, 12, 13, 14, 30, 39],
        "Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 and MXFP4 were all checked"
    );
    // The file cut in the middle of the last tensor's data.
    let bytes = std::fs::read(dir.join("kquants.gguf")).unwrap();
    let cut = Gguf::from_bytes(Box::new(bytes[..bytes.len() - 100].to_vec()), "cut.gguf".into());
    let e = cut.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.starts_with("cut.gguf") && e.contains("mxfp4.weight") && e.lines().count() == 1, "{e}");
}
