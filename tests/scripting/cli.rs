//! The binary end to end: exit codes, error positions and carets, bad input, piped REPL,
//! script arguments, stdlib imports from any directory. Cases are data: one row each.

use std::io::Write;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_headscope");

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run_in(dir: &std::path::Path, args: &[&str], stdin: Option<&str>) -> Run {
    let mut child = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("XDG_DATA_HOME", dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn headscope");
    {
        let mut si = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            si.write_all(s.as_bytes()).unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn assert_no_panic_trace(r: &Run) {
    for bad in ["RUST_BACKTRACE", "thread 'main' panicked", "stack backtrace"] {
        assert!(!r.stderr.contains(bad), "panic trace leaked: {}", r.stderr);
    }
}

/// (name, args, stdin, exit code, substrings of stdout, substrings of stderr)
type Case = (
    &'static str,
    &'static [&'static str],
    Option<&'static str>,
    i32,
    &'static [&'static str],
    &'static [&'static str],
);

const CASES: &[Case] = &[
    ("value of -e is printed", &["-e", "6 * 7"], None, 0, &["42"], &[]),
    (
        "integers where floats are expected",
        &["-e", "let p = heatmap([[1, 2]], #{vmin: 0, vmax: 3, title: \"ints\"}); `${p.title} ${p.to_svg().contains(\"<svg\")}`"],
        None,
        0,
        &["ints true"],
        &[],
    ),
    (
        "runtime error: position, source line, caret",
        &["-e", "let a = 1;\nlet b = nope(a);"],
        None,
        1,
        &[],
        &["-e:2:9: error: Function not found: nope (int)", "2 | let b = nope(a);", "  |         ^"],
    ),
    ("syntax error has a position", &["-e", "let x = ;"], None, 1, &[], &["-e:1:9: syntax error:", "^"]),
    (
        "error inside a stdlib module names the module",
        &["-e", "import \"stats\" as s;\ns::mean([])"],
        None,
        1,
        &[],
        &["stdlib/stats.rhai:", "stats::mean: the array is empty", "in call to `mean` at -e:2:4"],
    ),
    ("unknown stdlib module", &["-e", "import \"nosuch\" as n;"], None, 1, &[], &["-e:1:8: error: module not found: 'nosuch'", "no stdlib module of that name: tables, stats"]),
    ("panic in a bound function is a script error", &["-e", "debug_panic(\"boom\")"], None, 1, &[], &["internal error: a built-in function panicked: boom"]),
    ("bad option names the option", &["-e", "heatmap([[1]], #{colour: 1})"], None, 1, &[], &["heatmap: unknown option 'colour' (valid options: title, x_label"]),
    ("bad value is quoted", &["-e", "heatmap([[1, \"x\"]])"], None, 1, &[], &["heatmap: matrix[0][1]: expected a number, got \"x\" (string)"]),
    ("missing script", &["run", "no/such.rhai"], None, 1, &[], &["headscope: no/such.rhai: no such file"]),
    ("directory as a script", &["run", "."], None, 1, &[], &["headscope: .: is a directory, not a script"]),
    ("bad usage exits 2", &["--no-such-flag"], None, 2, &[], &["unexpected argument '--no-such-flag'"]),
    (
        "piped REPL: state persists across inputs, multi-line input, : commands",
        &[],
        Some("let x = 20;\nfn twice(v) {\n  v * 2\n}\ntwice(x) + 2\n:vars\n"),
        0,
        &["42", "x ", "i64"],
        &[],
    ),
    ("piped REPL: stdlib import survives across lines", &[], Some("import \"stats\" as s;\ns::mean([1, 2, 3])\n"), 0, &["2.0"], &[]),
    (
        "piped REPL: a panic does not end the session",
        &[],
        Some("let keep = 7;\ndebug_panic(\"boom\");\nkeep * 6\n"),
        1,
        &["42"],
        &["panicked: boom"],
    ),
    ("unknown : command", &[], Some(":frobnicate\n1 + 1\n"), 1, &["2"], &["unknown command ':frobnicate' (commands: :help, :vars"]),
    ("kernel without a connection file", &["kernel"], None, 1, &[], &["headscope: kernel: needs --connection-file FILE (Jupyter starts it so) or `install`"]),
    ("kernel with a missing connection file", &["kernel", "-f", "no/conn.json"], None, 1, &[], &["headscope: connection file no/conn.json: No such file"]),
    ("kernel with a bad connection file", &["kernel", "-f", "."], None, 1, &[], &["headscope: connection file .: "]),
    ("kernel install into a prefix", &["kernel", "install", "--prefix", "kp"], None, 0, &["installed kernelspec 'headscope' in kp/share/jupyter/kernels/headscope"], &[]),
    ("kernel install with a bad name", &["kernel", "install", "--prefix", "kp", "--name", "a b"], None, 1, &[], &["kernel name 'a b': use letters"]),
    ("print goes to stdout as it happens", &["-e", "print(\"hello\"); debug(\"x\"); 1"], None, 0, &["hello", "-e:1: \"x\"", "1"], &[]),
    ("a script named without `run`", &["tour.rhai"], None, 2, &[], &["'tour.rhai' is a script, not a command: run it with `headscope run tour.rhai`"]),
    ("a session command without its colon", &[], Some("help\n"), 1, &[], &["help is a session command: type :help"]),
    (
        "piped REPL: a transcript with prompts and output runs its inputs",
        &[],
        Some("hs> let t = [3, 4];\nhs> fn sq(x) {\n...   x * x\n... }\nhs> sq(t[1]) + 1\n17\n┌───┐ output of the transcript\nhs> :vars\n"),
        0,
        &["17", "t ", "array"],
        &[],
    ),
    (
        "piped REPL: a Python habit is an error and the next line runs alone",
        &[],
        Some("let keep = 41;\nfor h in [1]: print(h)\nkeep + 1\n"),
        1,
        &["42"],
        &["syntax error: Expecting '{' to start a statement block"],
    ),
];

#[test]
fn cli_cases() {
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for (name, args, stdin, code, outs, errs) in CASES {
        let r = run_in(dir.path(), args, *stdin);
        assert_no_panic_trace(&r);
        let mut why = Vec::new();
        if r.code != *code {
            why.push(format!("exit code {} (want {code})", r.code));
        }
        why.extend(outs.iter().filter(|s| !r.stdout.contains(*s)).map(|s| format!("stdout lacks {s:?}")));
        why.extend(errs.iter().filter(|s| !r.stderr.contains(*s)).map(|s| format!("stderr lacks {s:?}")));
        if !why.is_empty() {
            failures.push(format!("{name}: {}\n--- stdout:\n{}--- stderr:\n{}", why.join("; "), r.stdout, r.stderr));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn bad_inputs_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("latin1.rhai"), b"print(\"caf\xe9\");\n").unwrap();
    for args in [&["run", "missing.rhai"][..], &["run", "."], &["run", "latin1.rhai"]] {
        let r = run_in(dir.path(), args, None);
        assert_eq!(r.code, 1, "{args:?}: {}", r.stderr);
        assert_eq!(r.stderr.trim_end().lines().count(), 1, "{args:?} gave more than one line: {}", r.stderr);
        assert_no_panic_trace(&r);
    }
    let r = run_in(dir.path(), &["run", "latin1.rhai"], None);
    assert!(r.stderr.contains("latin1.rhai:1: not valid UTF-8 (byte offset 10)"), "{}", r.stderr);
}

#[test]
fn script_arguments_and_relative_imports() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("lib");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("helper.rhai"), "fn greet(n) { `hello ${n}` }\n").unwrap();
    std::fs::write(
        sub.join("main.rhai"),
        "import \"helper\" as h;\nimport \"tables\" as t;\nprint(h::greet(ARGS[0]));\nprint(ARGS.len());\nprint(t::from_matrix([[1]], [\"r\"], [\"c\"], \"x\").len());\n",
    )
    .unwrap();
    // Run from another directory: the local import resolves next to the script, stdlib from the binary.
    let r = run_in(dir.path(), &["run", "lib/main.rhai", "heads", "--flag"], None);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, "hello heads\n2\n1\n");
}

#[test]
fn colon_commands_in_a_piped_session() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("lib.rhai"), "let loaded = 41;\nfn bump(x) { x + 1 }\n").unwrap();
    let r = run_in(dir.path(), &[], Some(":load lib.rhai\nbump(loaded)\n:time on\n1 + 1\n:time off\n:device\n:help heatmap\n:help analyze\n:help\n:help nosuchfn\n:quit\n7 * 7\n"));
    assert!(r.stdout.contains("42"), "{}", r.stdout);
    assert!(
        r.stdout.contains("timing on") && r.stdout.contains("(took ") && r.stdout.contains("timing off"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("torch:   2.11.0") && r.stdout.contains("threads: "), "{}", r.stdout);
    assert!(r.stdout.contains("heatmap(matrix, options) -> Plot") && r.stdout.contains("```rhai"), "{}", r.stdout);
    assert!(
        r.stdout.contains("m.analyze(data, options) -> Analysis") && !r.stdout.contains("ScriptModel"),
        ":help shows script-facing signatures: {}",
        r.stdout
    );
    assert!(r.stdout.contains(":load FILE") && r.stdout.contains(":quit"), "{}", r.stdout);
    assert!(r.stderr.contains("no documented function or type named 'nosuchfn'"), "{}", r.stderr);
    assert!(!r.stdout.contains("49"), ":quit must end the session: {}", r.stdout);
    assert_eq!(r.code, 1, "a failed input makes the piped session exit 1");
}

#[test]
fn script_error_in_file_shows_file_line_col() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.rhai"), "let a = [1, 2];\nlet b = a[5];\n").unwrap();
    let r = run_in(dir.path(), &["run", "s.rhai"], None);
    assert_eq!(r.code, 1);
    assert!(r.stderr.starts_with("s.rhai:2:"), "{}", r.stderr);
    assert!(r.stderr.contains("2 | let b = a[5];"), "{}", r.stderr);
}

#[test]
fn table_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let code = r#"
        let t = table(["head", "confidence", "n"], [["enc.0.1", 0.91234, 120], ["enc.5.7", 0.4, 3], ["cross.1.2", 0.05, 1000]]);
        t.title = "Most confident heads";
        t.sort_by("confidence", true);
        t
    "#;
    let r = run_in(dir.path(), &["-e", code], None);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let snap = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/table.txt");
    let want = std::fs::read_to_string(&snap).unwrap();
    assert_eq!(r.stdout, want, "table output changed; if intended, update {}", snap.display());
}

#[test]
fn plots_save_decodable_png_and_svg_with_labels() {
    let dir = tempfile::tempdir().unwrap();
    let code = r#"
        let h = heatmap([[0.1, 0.9, 0.5], [0.3, 0.7, 1]], #{rows: ["layer 0", "layer 1"], cols: ["h0", "h1", "h2"], title: "Head confidence", width: 600, height: 360});
        h.save("heat.png"); h.save("heat.svg");
        bar(["enc", "dec", "cross"], [48, 16, 16], #{title: "Heads per kind"}).save("bar.png");
        line(#{bleu: [30, 29.5, 27], heads: [48, 30, 12]}, #{x: [0, 0.05, 0.1], title: "Pruning"}).save("line.svg");
    "#;
    let r = run_in(dir.path(), &["-e", code], None);
    assert_eq!(r.code, 0, "{}", r.stderr);

    let decode = |name: &str| {
        let f = std::fs::File::open(dir.path().join(name)).unwrap();
        let mut reader = png::Decoder::new(f).read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        buf.truncate(info.buffer_size());
        (info.width, info.height, buf)
    };
    let (w, h, px) = decode("heat.png");
    assert_eq!((w, h), (600, 360));
    let mut colours: Vec<&[u8]> = px.chunks(3).collect();
    colours.sort();
    colours.dedup();
    assert!(colours.len() > 50, "heatmap PNG looks blank: {} distinct colours", colours.len());
    // The viridis top colour (value 1) and bottom colour (0.1 is the minimum) are both drawn.
    assert!(px.chunks(3).any(|p| p == [253, 231, 37]), "no cell at the top of the colour scale");
    assert!(px.chunks(3).any(|p| p == [68, 1, 84]), "no cell at the bottom of the colour scale");
    let (bw, bh, bpx) = decode("bar.png");
    assert_eq!((bw, bh), (800, 500));
    assert!(bpx.chunks(3).filter(|p| *p != [255, 255, 255]).count() > 10_000, "bar chart is nearly blank");

    let svg = std::fs::read_to_string(dir.path().join("heat.svg")).unwrap();
    for label in ["Head confidence", "layer 0", "layer 1", "h0", "h2", "0.90"] {
        assert!(svg.contains(label), "heatmap SVG lacks {label:?}");
    }
    let svg = std::fs::read_to_string(dir.path().join("line.svg")).unwrap();
    for label in ["Pruning", "bleu", "heads"] {
        assert!(svg.contains(label), "line SVG lacks {label:?}");
    }
    let r = run_in(dir.path(), &["-e", "bar([\"a\"], [1]).save(\"x.jpg\")"], None);
    assert!(r.stderr.contains("save: cannot tell the format of 'x.jpg': use a .png or .svg file name"), "{}", r.stderr);
}

#[test]
fn doctor_reports_torch_cuda_threads_and_assets() {
    let dir = tempfile::tempdir().unwrap();
    let r = run_in(dir.path(), &["doctor"], None);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("torch:   2.11.0"), "{}", r.stdout);
    let cuda_line = r.stdout.lines().find(|l| l.starts_with("CUDA:")).unwrap();
    if tch::Cuda::is_available() {
        assert!(cuda_line.contains("available, "), "{cuda_line}");
    } else {
        assert!(cuda_line.contains("not available"), "{cuda_line}");
    }
    assert!(r.stdout.contains("threads: "), "{}", r.stdout);
    for a in ["minilm", "enpt", "pud_en.conllu", "brown.txt"] {
        assert!(r.stdout.contains(a), "doctor does not list asset {a}");
    }
}

/// Each `-e` code must fail (exit 1, no panic trace) with a message containing the text given.
fn expect_errors(dir: &std::path::Path, cases: &[(&str, &str)]) {
    let mut failures = Vec::new();
    for (code, want) in cases {
        let r = run_in(dir, &["-e", code], None);
        assert_no_panic_trace(&r);
        if r.code != 1 || !r.stderr.contains(want) {
            failures.push(format!("{code}\n  want: {want}\n  got ({}): {}", r.code, r.stderr.trim()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn bad_model_inputs_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A truncated Marian checkpoint next to a real tokenizer.
    let enpt = headscope::assets::asset_path("enpt").unwrap();
    std::fs::create_dir(d.join("trunc")).unwrap();
    let bin = std::fs::read(enpt.join("model.enpt.intgemm.alphas.bin")).unwrap();
    std::fs::write(d.join("trunc/model.x.bin"), &bin[..bin.len() / 2]).unwrap();
    std::fs::copy(enpt.join("tokenizer.json"), d.join("trunc/tokenizer.json")).unwrap();
    // A BERT directory whose safetensors header lies.
    std::fs::create_dir(d.join("badst")).unwrap();
    std::fs::copy(headscope::assets::asset_path("minilm").unwrap().join("config.json"), d.join("badst/config.json"))
        .unwrap();
    let mut st = 1000u64.to_le_bytes().to_vec();
    st.extend_from_slice(b"{}");
    std::fs::write(d.join("badst/model.safetensors"), st).unwrap();
    std::fs::create_dir(d.join("empty")).unwrap();

    let cases: &[(&str, &str)] = &[
        ("load_model(\"no/such/dir\")", "load_model: 'no/such/dir' is neither a directory, a .gguf file nor a model asset (unknown asset 'no/such/dir'"),
        ("load_model(\"no-org/no-such-model\")", "load_model: 'no-org/no-such-model' is not a directory or a named asset, and not in the Hugging Face cache (looked for "),
        ("load_model(\"empty\")", "is not a model directory headscope knows: expected an HF checkpoint (config.json + model.safetensors, sharded safetensors or pytorch_model.bin; model_type bart, bert, deepseek_v2, deepseek_v3, gemma, gemma2, gemma3_text, gpt2, gpt_neox, gpt_oss, granitemoehybrid, jamba, lfm2, llama, llama4_text, m2m_100, marian, mbart, mistral, mixtral, mt5, olmo2, olmo3, olmoe, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, qwen3_next, roberta, smollm3, t5)"),
        ("load_model(\"trunc\")", "trunc/model.x.bin: corrupt checkpoint: truncated while reading the data of"),
        ("load_model(\"badst\")", "badst/model.safetensors: corrupt checkpoint: header length 1000 (bytes 0..8) passes the end of the file (10 bytes)"),
        ("load_model(\"enpt\", #{dtype: \"f8\"})", "load_model: unknown dtype 'f8' (expected \"f32\", \"f64\", \"bf16\" or \"f16\")"),
        ("load_model(\"enpt\", #{device: \"tpu\"})", "load_model: unknown device 'tpu' (expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\")"),
        ("load_model(\"enpt\", #{colour: 1})", "load_model: unknown option 'colour' (valid options: device, dtype, tgt_lang, revision, gguf_file, allow_unknown_config)"),
        ("load_model(\"enpt\").head(\"enc\", 6, 0)", "layer 6 out of range: 'enc' has layers 0..5"),
        ("load_model(\"enpt\").head(\"enc\", 0, 8)", "head 8 out of range: 'enc' layers have heads 0..7"),
        ("load_model(\"enpt\").head(\"enc\", -1, 0)", "layer: expected a non-negative integer, got -1 (i64)"),
        ("load_model(\"enpt\").head(\"encoder\", 0, 0)", "unknown attention kind 'encoder' (expected \"enc\", \"dec\" or \"cross\")"),
        ("load_model(\"minilm\").head(\"cross\", 0, 0)", "minilm has no 'cross' attention (it has: enc)"),
        ("load_model(\"minilm\").translate(\"Hi\")", "translate: minilm cannot translate: it has no decoder"),
        ("load_model(\"enpt\").forward(corpus(asset(\"pud_en.txt\")).take(0))", "forward: the dataset pud_en.txt[:0] is empty"),
        ("let m = load_model(\"enpt\"); m.with_mask([1])", "with_mask: heads[0]: expected a Head or a head name like \"enc.5.5\", got 1 (i64)"),
        ("let a = load_model(\"enpt\"); let b = load_model(\"enpt\"); a.with_mask([b.head(\"enc\", 0, 0)])", "with_mask: heads[0]: head enc.0.0 belongs to another model"),
        ("treebank(\"missing.conllu\")", "treebank: missing.conllu: No such file or directory"),
    ];
    if !tch::Cuda::is_available() {
        let r = run_in(d, &["-e", "load_model(\"enpt\", #{device: \"cuda\"})"], None);
        assert!(
            r.stderr.contains("load_model: device 'cuda:0' asked for, but CUDA is not available on this machine"),
            "{}",
            r.stderr
        );
        let r = run_in(d, &["-e", "load_model(\"enpt\", #{device: \"cpu\", dtype: \"f16\"})"], None);
        assert!(
            r.stderr.contains("load_model: dtype 'f16' is only supported on CUDA; use bf16, f32 or f64 on the CPU"),
            "{}",
            r.stderr
        );
    }
    expect_errors(d, cases);
}

/// Pre-norm translation models (M2M100 / NLLB-200, mBART): an unknown target language, on
/// `load_model` and on `translate`, names the code and the codes there are; a language code for
/// a model that does not translate, or whose tokenizer has none, says so; a config.json whose
/// width disagrees with the weights names the file and the tensor. No panic, exit code 1.
#[test]
fn prenorm_translation_bad_inputs_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tiny = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_hf");
    let m2m = tiny.join("m2m100").display().to_string();
    std::fs::create_dir(d.join("wide")).unwrap();
    for f in std::fs::read_dir(tiny.join("mbart")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, d.join("wide").join(f.file_name().unwrap())).unwrap();
    }
    let cfg =
        std::fs::read_to_string(d.join("wide/config.json")).unwrap().replace("\"d_model\": 32", "\"d_model\": 48");
    std::fs::write(d.join("wide/config.json"), cfg).unwrap();
    let cases: Vec<(String, String)> = vec![
        (
            format!("load_model({m2m:?}, #{{tgt_lang: \"xx_Yyyy\"}})"),
            "load_model: tgt_lang 'xx_Yyyy' is not a language code of m2m100 (eng_Latn, fra_Latn, deu_Latn, por_Latn)"
                .into(),
        ),
        (
            format!("load_model({m2m:?}).translate(\"Hi\", #{{tgt_lang: \"fr\"}})"),
            "translate: tgt_lang 'fr' is not a language code of m2m100".into(),
        ),
        (
            format!("load_model({m2m:?}).translate(\"Hi\", #{{tgt_lang: 3}})"),
            "translate: option 'tgt_lang' must be a string, got 3".into(),
        ),
        (
            "load_model(\"enpt\", #{tgt_lang: \"fra_Latn\"})".into(),
            "load_model: tgt_lang 'fra_Latn' is not a language code of enpt (its tokenizer has none)".into(),
        ),
        (
            "load_model(\"minilm\", #{tgt_lang: \"fra_Latn\"})".into(),
            "load_model: tgt_lang 'fra_Latn': minilm does not translate".into(),
        ),
        (
            "load_model(\"wide\")".into(),
            "wide/model.safetensors: tensor 'model.shared.weight' has shape [304, 32], expected [304, 48]".into(),
        ),
    ];
    let refs: Vec<(&str, &str)> = cases.iter().map(|(c, w)| (c.as_str(), w.as_str())).collect();
    expect_errors(d, &refs);
}

/// Hostile or empty input to the engine core: each a one-line error naming the file,
/// sentence or argument, and a session that goes on after all of them.
#[test]
fn engine_core_bad_inputs_are_one_line_errors_and_the_session_survives() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let row = |id: u32, head: u32| format!("{id}\tw{id}\t_\tX\t_\t_\t{head}\tdep\t_\t_\n");
    std::fs::write(
        d.join("cyc.conllu"),
        format!("# sent_id = s1\n# text = w1 w2 w3\n{}{}{}\n", row(1, 0), row(2, 3), row(3, 2)),
    )
    .unwrap();
    std::fs::write(d.join("empty.conllu"), "").unwrap();
    std::fs::write(d.join("blank.txt"), "\n\n").unwrap();
    // Headers whose lengths pass the end of the file, or 2^63.
    std::fs::create_dir(d.join("st")).unwrap();
    std::fs::copy(headscope::assets::asset_path("minilm").unwrap().join("config.json"), d.join("st/config.json"))
        .unwrap();
    let mut st = ((1u64 << 63) + 5).to_le_bytes().to_vec();
    st.extend_from_slice(b"{}");
    std::fs::write(d.join("st/model.safetensors"), st).unwrap();
    std::fs::create_dir(d.join("st2")).unwrap();
    std::fs::copy(headscope::assets::asset_path("minilm").unwrap().join("config.json"), d.join("st2/config.json"))
        .unwrap();
    let header = br#"{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}}"#;
    let mut st2 = (header.len() as u64).to_le_bytes().to_vec();
    st2.extend_from_slice(header);
    st2.extend_from_slice(&[0u8; 16]);
    std::fs::write(d.join("st2/model.safetensors"), st2).unwrap();
    let smol = headscope::assets::asset_path("smollm2").unwrap();
    std::fs::create_dir(d.join("gg")).unwrap();
    std::fs::copy(smol.join("tokenizer.json"), d.join("gg/tokenizer.json")).unwrap();
    let mut gg = b"GGUF".to_vec();
    gg.extend_from_slice(&3u32.to_le_bytes());
    gg.extend_from_slice(&(1u64 << 62).to_le_bytes()); // tensors
    gg.extend_from_slice(&0u64.to_le_bytes());
    std::fs::write(d.join("gg/model.gguf"), gg).unwrap();
    let enpt = headscope::assets::asset_path("enpt").unwrap();
    std::fs::create_dir(d.join("mb")).unwrap();
    std::fs::copy(enpt.join("tokenizer.json"), d.join("mb/tokenizer.json")).unwrap();
    let mut mb = 1u64.to_le_bytes().to_vec();
    mb.extend_from_slice(&1u64.to_le_bytes()); // one tensor
    for v in [u64::MAX, 0x404, 2, 8] {
        mb.extend_from_slice(&v.to_le_bytes()); // name length 2^64 - 1
    }
    std::fs::write(d.join("mb/model.x.bin"), mb).unwrap();

    let cases: &[(&str, &str)] = &[
        ("treebank(\"cyc.conllu\")", "cyc.conllu:4: the heads of words 2 -> 3 -> 2 form a cycle (sentence 's1'); a dependency tree has none"),
        ("load_model(\"minilm\").analyze(treebank(\"empty.conllu\"))", "analyze: the dataset empty.conllu is empty (no sentences)"),
        ("load_model(\"enpt\").ablation_sweep(treebank(\"empty.conllu\"))", "ablation_sweep: the dataset empty.conllu is empty (no sentences)"),
        ("load_model(\"minilm\").diversity(treebank(\"empty.conllu\"))", "diversity: the dataset empty.conllu is empty (no sentences)"),
        ("load_model(\"minilm\").analyze(corpus(\"blank.txt\"))", "blank.txt"),
        ("heatmap([[parse_float(\"NaN\"), parse_float(\"NaN\")]])", "heatmap: all 2 values are NaN: there is nothing to draw"),
        ("heatmap([[1.0, 1.0 / 0.0]])", "heatmap: the value at row 0, column 1 is inf"),
        ("load_model(\"minilm\").head(\"enc\", 0, 0).attention(\"\")", "attention: the text is empty: there is nothing to run the model on"),
        ("load_model(\"enpt\").head(\"cross\", 0, 0).attention(\"  \")", "attention: the text is empty"),
        ("load_model(\"enpt\").translate(\"\")", "translate: the text is empty: there is nothing to run the model on"),
        ("load_model(\"enpt\").translate([\"Hi.\", \"\"])", "translate: sentence 1 is empty"),
        ("load_model(\"st\")", "st/model.safetensors: corrupt checkpoint: header length 9223372036854775813 (bytes 0..8) passes the end of the file"),
        ("load_model(\"st2\")", "st2/model.safetensors: corrupt checkpoint: tensor 'w': shape declares more than 2^63 elements"),
        ("load_model(\"gg\")", "gg/model.gguf: corrupt checkpoint: the tensor count: declares 4611686018427387904 items"),
        ("load_model(\"mb\")", "mb/model.x.bin: corrupt checkpoint: truncated while reading the name of tensor 0: 18446744073709551615 bytes declared"),
    ];
    expect_errors(d, cases);
    // The message is the error's first line (the source line and a caret follow).
    for (code, want) in cases {
        let r = run_in(d, &["-e", code], None);
        assert!(
            r.stderr.lines().next().unwrap_or_default().contains(want),
            "{code}: the message is not on the first line: {}",
            r.stderr
        );
    }
    // One session through all of them, alive at the end.
    let mut input: String = cases.iter().map(|(c, _)| format!("{c}\n")).collect();
    input.push_str("print(`alive ${6 * 7}`)\n");
    let r = run_in(d, &[], Some(&input));
    assert_no_panic_trace(&r);
    assert!(r.stdout.contains("alive 42"), "the session died: {}\n{}", r.stdout, r.stderr);
}

#[test]
fn bad_analysis_inputs_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("two.txt"), "The cat sleeps.\nA dog barks.\n").unwrap();
    std::fs::write(d.join("other.conllu"), "# text = The cat sleeps.\n1\tThe\t_\tX\t_\t_\t2\tdet\t_\t_\n2\tcat\t_\tX\t_\t_\t3\tnsubj\t_\t_\n3\tsleeps.\t_\tX\t_\t_\t0\troot\t_\t_\n\n# text = A cow moos.\n1\tA\t_\tX\t_\t_\t2\tdet\t_\t_\n2\tcow\t_\tX\t_\t_\t3\tnsubj\t_\t_\n3\tmoos.\t_\tX\t_\t_\t0\troot\t_\t_\n\n").unwrap();
    // A word that is not in the text: no token can be aligned with it.
    std::fs::write(d.join("unaligned.conllu"), "# text = The cat sleeps.\n1\tThe\t_\tX\t_\t_\t2\tdet\t_\t_\n2\tdog\t_\tX\t_\t_\t3\tnsubj\t_\t_\n3\tsleeps\t_\tX\t_\t_\t0\troot\t_\t_\n\n").unwrap();
    let cases: &[(&str, &str)] = &[
        ("load_model(\"enpt\").analyze(corpus(\"two.txt\"), #{stats: [\"confidence\", \"syntax\"]})", "analyze: option 'stats': unknown stat 'syntax' (expected \"confidence\", \"positional\", \"rare\" or \"syntactic\")"),
        ("load_model(\"enpt\").analyze(corpus(\"two.txt\"), #{exclude_keys: \"pad\"})", "analyze: unknown exclude_keys 'pad' (expected \"eos\", \"special\" or \"none\")"),
        ("load_model(\"enpt\").ablation_sweep(corpus(\"two.txt\"), #{metric: \"acc\"})", "ablation_sweep: unknown metric 'acc' (expected \"loss\", \"kl\", \"bleu\" or \"cosine\")"),
        ("load_model(\"enpt\").analyze(corpus(\"two.txt\"), #{stats: [\"syntactic\"]})", "analyze: the syntactic statistic needs a treebank: two.txt has no dependency trees (load it with treebank(path))"),
        ("load_model(\"enpt\").analyze(corpus(\"two.txt\"), #{treebank: treebank(\"other.conllu\")})", "analyze: sentence 1 of the treebank other.conllu does not match the dataset two.txt: \"A cow moos.\" vs \"A dog barks.\""),
        ("load_model(\"enpt\").analyze(corpus(\"two.txt\"), #{treebank: corpus(\"two.txt\")})", "analyze: option 'treebank': two.txt is not a treebank"),
        ("load_model(\"enpt\").analyze(treebank(\"unaligned.conllu\"), #{stats: [\"syntactic\"], relations: [\"nsubj\"]})", "analyze: sentence 0: word 2 'dog' is not found in the sentence text"),
        ("load_model(\"enpt\").analyze(treebank(\"other.conllu\"), #{relations: [\"nsubj\", \"nsbj\"]})", "analyze: relation 'nsbj' does not occur in other.conllu (relations there: det, nsubj, root)"),
        ("load_model(\"enpt\").analyze(corpus(\"two.txt\").take(0))", "analyze: the dataset two.txt[:0] is empty"),
        ("load_model(\"enpt\").analyze(corpus(\"two.txt\"), #{kinds: [\"dec\"]})", "analyze: enpt has no 'dec' attention (it has: enc, cross)"),
        ("load_model(\"enpt\").analyze(corpus(\"two.txt\"), #{threshold: 0.5})", "analyze: unknown option 'threshold' (valid options: stats, kinds"),
        ("load_model(\"enpt\").analyze(corpus(\"two.txt\"), #{rare_threshold: 5})", "analyze: option 'rare_threshold' must be between 0 and 1, got 5"),
        ("load_model(\"enpt\").analyze(corpus(\"two.txt\"), #{freq: \"nope.txt\"})", "analyze: frequency source nope.txt: No such file or directory"),
        ("load_model(\"enpt\").analyze(\"two.txt\")", "analyze: \"two.txt\" looks like a file name, not a text: read the file with corpus(\"two.txt\") (or treebank, parallel)"),
        ("load_model(\"enpt\").confidence(corpus(\"two.txt\")).heatmap(\"dec\")", "heatmap: no 'dec' in this result (it has: enc, cross)"),
        ("load_model(\"minilm\").lrp(corpus(\"two.txt\"), #{rule: \"eps\"})", "lrp: unknown LRP rule 'eps' (expected \"ab\", \"zplus\" or \"attnlrp\")"),
        ("load_model(\"minilm\").lrp(corpus(\"two.txt\"), #{seeds: \"all\"})", "lrp: unknown seeds 'all' (expected \"each\" or \"summed\")"),
        ("load_model(\"minilm\").lrp(corpus(\"two.txt\"), #{seed: \"logit\"})", "lrp: seed \"logit\" needs an output head; minilm has none: use seed \"norm\""),
        ("load_model(\"enpt\").lrp(corpus(\"two.txt\").take(0))", "lrp: the dataset two.txt[:0] is empty"),
    ];
    expect_errors(d, cases);
}

#[test]
fn bad_pruning_inputs_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("two.txt"), "The cat sleeps.\nA dog barks.\n").unwrap();
    // A directory nobody can write into (root ignores permissions, so a file stands in the way).
    std::fs::write(d.join("blocker"), "not a directory").unwrap();
    // A checkpoint left by a MiniLM run.
    let r = run_in(d, &["-e", "load_model(\"minilm\").prune(corpus(\"two.txt\"), #{steps: 1, batch_tokens: 100, checkpoint: \"ck_minilm\"})"], None);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let p = "load_model(\"enpt\").prune(corpus(\"two.txt\"), ";
    let cases: Vec<(String, &str)> = vec![
        (format!("{p}#{{lambda: -0.1}})"), "prune: lambda must be between 0 and 1e6, got -0.1"),
        (format!("{p}#{{steps: 0}})"), "prune: steps must be at least 1, got 0"),
        (format!("{p}#{{lr: 0.0}})"), "prune: lr must be > 0 and at most 1e3, got 0"),
        ("load_model(\"enpt\").prune(corpus(\"two.txt\").take(0), #{steps: 1})".into(), "prune: the dataset two.txt[:0] is empty"),
        (format!("{p}#{{steps: 1, checkpoint: \"blocker/run\"}})"), "prune: checkpoint directory blocker/run: cannot create it"),
        (format!("{p}#{{steps: 1, checkpoint: \"ck_minilm\", resume: true}})"), "prune: checkpoint ck_minilm/checkpoint.json is from another model: its model is \"minilm\", this run's is \"enpt\""),
        ("load_model(\"minilm\").prune(corpus(\"two.txt\"), #{steps: 1, batch_tokens: 100, checkpoint: \"ck_minilm\"})".into(), "prune: ck_minilm/checkpoint.json already holds a run; pass resume: true to continue it"),
        ("load_model(\"minilm\").prune(corpus(\"two.txt\"), #{steps: 1, batch_tokens: 100, checkpoint: \"ck_minilm\", resume: true, lambda: 0.5})".into(), "prune: checkpoint ck_minilm/checkpoint.json was made with lambda = \"0.05\", this run has lambda = \"0.5\""),
        (format!("{p}#{{resume: true}})"), "prune: resume: true needs a checkpoint directory"),
        (format!("{p}#{{kinds: [\"dec\"]}})"), "prune: enpt has no 'dec' attention (it has: enc, cross)"),
        (format!("{p}#{{penalty_scale: \"per_model\"}})"), "prune: unknown penalty_scale 'per_model' (expected \"per_head\" or \"per_layer\")"),
        (format!("{p}#{{lamda: 0.1}})"), "prune: unknown option 'lamda' (did you mean 'lambda'? valid options: lambda, steps"),
        (format!("{p}#{{eval_data: \"dev.txt\"}})"), "\"dev.txt\" looks like a file name, not a text: read the file with corpus(\"dev.txt\")"),
        ("let m = load_model(\"enpt\"); let r = m.prune(corpus(\"two.txt\"), #{steps: 1, batch_tokens: 100}); load_model(\"enpt\").with_gates(r)".into(), "with_gates: this result was trained on enpt, not on this model object"),
        ("let m = load_model(\"enpt\"); let r = m.prune(corpus(\"two.txt\"), #{steps: 1, batch_tokens: 100, init: -1.0, kinds: [\"enc\"]}); m.prune_heads(r).to(\"cpu\")".into(), "had heads or experts removed (prune_heads, prune_experts); move the original model, then prune it there"),
    ];
    let refs: Vec<(&str, &str)> = cases.iter().map(|(c, w)| (c.as_str(), *w)).collect();
    expect_errors(d, &refs);
}

/// A panic carrying a libtorch message (as an `unwrap()` on a tensor op would) prints one line:
/// libtorch's C++ trace is left out, unless RUST_BACKTRACE asks for it (then on stderr in full).
#[test]
fn a_libtorch_trace_never_reaches_the_user() {
    let dir = tempfile::tempdir().unwrap();
    let torch = r#"called `Result::unwrap()` on an `Err` value: Torch(\"The size of tensor a (48) must match the size of tensor b (64) at non-singleton dimension 2\\nException raised from infer_size_impl at /pytorch/aten/src/ATen/ExpandUtils.cpp:31 (most recent call first):\\nframe #0: c10::Error::Error\")"#;
    let code = format!("debug_panic(\"{torch}\")");
    let run = |backtrace: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_headscope"));
        c.args(["-e", &code]).current_dir(dir.path()).env_remove("RUST_BACKTRACE");
        if backtrace {
            c.env("RUST_BACKTRACE", "1");
        }
        let out = c.output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, stderr) = run(false);
    assert_eq!(code, Some(1), "{stderr}");
    let line = stderr.lines().find(|l| l.contains("panicked")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        line.contains(
            "must match the size of tensor b (64) at non-singleton dimension 2 (libtorch's C++ trace left out)"
        ),
        "{line}"
    );
    assert!(!stderr.contains("frame #0") && !stderr.contains("Exception raised from"), "{stderr}");
    // Asked for: the whole message on stderr, the error line still one line.
    let (_, stderr) = run(true);
    assert!(
        stderr.contains("frame #0: c10::Error::Error") && stderr.contains("(libtorch's C++ trace left out)"),
        "{stderr}"
    );
}
