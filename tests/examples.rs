//! Every script under examples/ runs to the end (each gets a temporary output directory as
//! its first argument).

#[test]
fn every_example_runs() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut ran = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("rhai") {
            continue;
        }
        let out = tempfile::tempdir().unwrap();
        let r = std::process::Command::new(env!("CARGO_BIN_EXE_headscope"))
            .arg("run")
            .arg(&path)
            .arg(out.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&r.stdout);
        assert!(r.status.success(), "{} failed:\n{}\n{}", path.display(), stdout, String::from_utf8_lossy(&r.stderr));
        if path.ends_with("tour.rhai") {
            assert!(stdout.contains("== end of tour =="), "tour did not finish:\n{stdout}");
            for f in ["confidence_enc.png", "confidence_cross.png", "positional_enc.png", "analysis.json"] {
                assert!(out.path().join(f).exists(), "the tour did not write {f}");
            }
            assert!(stdout.contains("O gato está dormindo no sofá."), "{stdout}");
        }
        ran += 1;
    }
    assert!(ran >= 1, "no examples found in {}", dir.display());
}
