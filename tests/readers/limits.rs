//! Resource limits on hostile checkpoints: a file that declares a 1 TB tensor, 2^40 entries or
//! a 2^40-byte header is refused before anything of that size is allocated. Each case runs
//! `headscope -e 'load_model("DIR")'` as a child process and checks that it fails fast (under
//! 5 s) with a one-line error naming the field, and that its peak memory (the child's
//! `ru_maxrss`, from `wait4`) is within 100 MB of `headscope -e '1'`'s.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_headscope");
const TB_ELEMENTS: u64 = 1 << 38; // f32: 2^40 bytes
const MB: i64 = 1024 * 1024;

struct Run {
    code: i32,
    stderr: String,
    took: Duration,
    /// Peak resident memory in bytes.
    peak: i64,
}

/// Runs the binary in `dir` and reaps it with `wait4`, which reports this child's own peak RSS.
// The child is reaped by wait4, not Child::wait (which cannot report its rusage).
#[allow(clippy::zombie_processes)]
fn run(dir: &Path, code: &str) -> Run {
    let started = Instant::now();
    let mut child = Command::new(BIN)
        .args(["-e", code])
        .current_dir(dir)
        .env("XDG_DATA_HOME", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn headscope");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as libc::pid_t, "wait4 failed: {}", std::io::Error::last_os_error());
    let took = started.elapsed();
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { -libc::WTERMSIG(status) };
    Run { code, stderr: reader.join().expect("stderr reader"), took, peak: usage.ru_maxrss * 1024 }
}

fn fixture(p: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(p)
}

fn gguf_str(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

/// A GGUF v3 header: `kvs` already encoded, then the tensor directory, aligned to 32.
fn gguf(n_kv: u64, kvs: &[u8], tensors: &[(&str, &[u64], u32, u64)]) -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    v.extend_from_slice(&3u32.to_le_bytes());
    v.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    v.extend_from_slice(&n_kv.to_le_bytes());
    v.extend_from_slice(kvs);
    for (name, dims, ty, off) in tensors {
        v.extend(gguf_str(name));
        v.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| v.extend_from_slice(&d.to_le_bytes()));
        v.extend_from_slice(&ty.to_le_bytes());
        v.extend_from_slice(&off.to_le_bytes());
    }
    v.resize(v.len().div_ceil(32) * 32 + 64, 0);
    v
}

fn safetensors(header: &str, data: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.resize(v.len() + data, 0);
    v
}

/// A zip of stored entries, as `torch.save` writes them.
fn zip(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let (mut out, mut cd) = (Vec::new(), Vec::new());
    for (name, data) in entries {
        let offset = out.len() as u32;
        let common = |v: &mut Vec<u8>| {
            v.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // flags, method, time, date, crc
            v.extend_from_slice(&(data.len() as u32).to_le_bytes());
            v.extend_from_slice(&(data.len() as u32).to_le_bytes());
            v.extend_from_slice(&(name.len() as u16).to_le_bytes());
            v.extend_from_slice(&0u16.to_le_bytes()); // extra
        };
        out.extend_from_slice(b"PK\x03\x04\x14\x00");
        common(&mut out);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        cd.extend_from_slice(b"PK\x01\x02\x14\x00\x14\x00");
        common(&mut cd);
        cd.extend_from_slice(&[0; 10]); // comment length, disk, internal and external attributes
        cd.extend_from_slice(&offset.to_le_bytes());
        cd.extend_from_slice(name.as_bytes());
    }
    let cd_off = out.len() as u32;
    out.extend_from_slice(&cd);
    out.extend_from_slice(b"PK\x05\x06\0\0\0\0");
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(cd.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_off.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// A protocol-2 pickle of `{name: _rebuild_tensor_v2(storage(numel floats), 0, (size,), (1,))}`.
fn pickle(name: &str, numel: u64, size: u64) -> Vec<u8> {
    let mut p = vec![0x80, 2];
    let global = |p: &mut Vec<u8>, m: &str, n: &str| p.extend(format!("c{m}\n{n}\n").bytes());
    let text = |p: &mut Vec<u8>, s: &str| {
        p.push(b'X');
        p.extend_from_slice(&(s.len() as u32).to_le_bytes());
        p.extend_from_slice(s.as_bytes());
    };
    let long = |p: &mut Vec<u8>, n: u64| {
        p.extend_from_slice(&[0x8a, 8]); // LONG1 of 8 bytes, two's complement: n < 2^63
        p.extend_from_slice(&n.to_le_bytes());
    };
    global(&mut p, "collections", "OrderedDict");
    p.extend_from_slice(b")R");
    text(&mut p, name);
    global(&mut p, "torch._utils", "_rebuild_tensor_v2");
    p.extend_from_slice(b"((");
    text(&mut p, "storage");
    global(&mut p, "torch", "FloatStorage");
    text(&mut p, "0");
    text(&mut p, "cpu");
    long(&mut p, numel);
    p.extend_from_slice(b"tQ"); // the persistent id, loaded
    p.extend_from_slice(b"K\x00"); // storage offset
    long(&mut p, size);
    p.push(0x85); // size = (size,)
    p.extend_from_slice(b"K\x01\x85"); // stride = (1,)
    p.push(0x89); // requires_grad = False
    global(&mut p, "collections", "OrderedDict");
    p.extend_from_slice(b")RtRs.");
    p
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

#[test]
fn hostile_sizes_fail_fast_without_allocating() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let llama_tok = std::fs::read(fixture("lrp_tiny/llama/tokenizer.json")).unwrap();
    let marian_tok = std::fs::read(fixture("lrp_tiny/marian/tokenizer.json")).unwrap();
    let bert_config = std::fs::read(fixture("lrp_tiny/bert/config.json")).unwrap();
    let tb = TB_ELEMENTS.to_string();

    // GGUF: a 1 TB f32 tensor (GGUF order: 2^18 x 2^20).
    let arch = [gguf_str("general.architecture"), 8u32.to_le_bytes().to_vec(), gguf_str("llama")].concat();
    write(&d.join("gg_tensor"), "model.gguf", &gguf(1, &arch, &[("token_embd.weight", &[1 << 18, 1 << 20], 0, 0)]));
    write(&d.join("gg_tensor"), "tokenizer.json", &llama_tok);
    // GGUF: 2^40 metadata entries.
    write(&d.join("gg_kv"), "model.gguf", &gguf(1 << 40, &[], &[]));
    write(&d.join("gg_kv"), "tokenizer.json", &llama_tok);
    // GGUF: a string array of 2^40 entries.
    let array = [
        gguf_str("tokenizer.ggml.tokens"),
        9u32.to_le_bytes().to_vec(),
        8u32.to_le_bytes().to_vec(),
        (1u64 << 40).to_le_bytes().to_vec(),
    ]
    .concat();
    write(&d.join("gg_array"), "model.gguf", &gguf(1, &array, &[]));
    write(&d.join("gg_array"), "tokenizer.json", &llama_tok);
    // safetensors: a 1 TB tensor whose offsets claim the terabyte; a 2^40-byte header.
    let header = format!(
        r#"{{"embeddings.word_embeddings.weight":{{"dtype":"F32","shape":[262144,1048576],"data_offsets":[0,{}]}}}}"#,
        1u64 << 40
    );
    write(&d.join("st_tensor"), "model.safetensors", &safetensors(&header, 64));
    write(&d.join("st_tensor"), "config.json", &bert_config);
    let mut st = (1u64 << 40).to_le_bytes().to_vec();
    st.extend_from_slice(b"{}");
    write(&d.join("st_header"), "model.safetensors", &st);
    write(&d.join("st_header"), "config.json", &bert_config);
    // pytorch_model.bin: a storage of 2^38 floats (4 bytes stored), and a 2^38-long view of a
    // one-float storage.
    let pt = |numel: u64, size: u64| {
        zip(&[
            ("archive/data.pkl", &pickle("embeddings.word_embeddings.weight", numel, size)),
            ("archive/byteorder", b"little"),
            ("archive/data/0", &[0u8; 4]),
        ])
    };
    write(&d.join("pt_storage"), "pytorch_model.bin", &pt(TB_ELEMENTS, TB_ELEMENTS));
    write(&d.join("pt_storage"), "config.json", &bert_config);
    write(&d.join("pt_shape"), "pytorch_model.bin", &pt(1, TB_ELEMENTS));
    write(&d.join("pt_shape"), "config.json", &bert_config);
    // Marian .bin: 2^40 tensors.
    let mb = [1u64.to_le_bytes(), (1u64 << 40).to_le_bytes(), [0; 8], [0; 8]].concat();
    write(&d.join("mb_count"), "model.x.bin", &mb);
    write(&d.join("mb_count"), "tokenizer.json", &marian_tok);
    // config.json: 2^40 layers over a real two-layer checkpoint (nothing is reserved per layer).
    let mut cfg: serde_json::Value = serde_json::from_slice(&bert_config).unwrap();
    cfg["num_hidden_layers"] = serde_json::json!(1u64 << 40);
    write(&d.join("cfg_layers"), "config.json", cfg.to_string().as_bytes());
    write(
        &d.join("cfg_layers"),
        "model.safetensors",
        &std::fs::read(fixture("lrp_tiny/bert/model.safetensors")).unwrap(),
    );
    write(&d.join("cfg_layers"), "tokenizer.json", &std::fs::read(fixture("lrp_tiny/bert/tokenizer.json")).unwrap());

    let cases: &[(&str, String)] = &[
        ("gg_tensor", format!("gg_tensor/model.gguf: corrupt checkpoint: tensor 'token_embd.weight' declares {tb} elements (1099511627776 bytes) at data offset 0 but the file has 64 bytes after the data offset")),
        ("gg_kv", "gg_kv/model.gguf: corrupt checkpoint: the metadata count: declares 1099511627776 items".into()),
        ("gg_array", "gg_array/model.gguf: corrupt checkpoint: tokenizer.ggml.tokens: declares 1099511627776 items".into()),
        ("st_tensor", format!("st_tensor/model.safetensors: corrupt checkpoint: tensor 'embeddings.word_embeddings.weight': shape [262144, 1048576] declares {tb} elements of 4 bytes, more than the data area of 64 bytes holds")),
        ("st_header", "st_header/model.safetensors: corrupt checkpoint: header length 1099511627776 (bytes 0..8) passes the end of the file".into()),
        ("pt_storage", format!("storage 'archive/data/0' has 4 bytes, not the {tb} elements of Float it declares")),
        ("pt_shape", format!("tensor of size [{tb}], stride [1], offset 0 passes the end of its storage of 1 elements")),
        ("mb_count", "mb_count/model.x.bin: corrupt checkpoint: the tensor count: declares 1099511627776 items".into()),
        ("cfg_layers", "tensor 'encoder.layer.2.".into()),
    ];

    let base = run(d, "1");
    assert_eq!(base.code, 0, "headscope -e '1' failed: {}", base.stderr);
    println!("peak RSS of headscope -e '1': {} MB ({:.2} s)", base.peak / MB, base.took.as_secs_f64());
    let mut failures = vec![];
    for (dir, want) in cases {
        let r = run(d, &format!("load_model(\"{dir}\")"));
        let first = r.stderr.lines().next().unwrap_or_default();
        println!(
            "{dir:>10}: peak {} MB (+{} MB), {:.2} s, exit {}: {first}",
            r.peak / MB,
            (r.peak - base.peak) / MB,
            r.took.as_secs_f64(),
            r.code
        );
        if r.code != 1 || !first.contains(want.as_str()) {
            failures.push(format!(
                "{dir}: exit {} and first line '{first}', expected exit 1 and '{want}'\n{}",
                r.code, r.stderr
            ));
        }
        if r.took > Duration::from_secs(5) {
            failures.push(format!("{dir}: took {:.1} s", r.took.as_secs_f64()));
        }
        if r.peak > base.peak + 100 * MB {
            failures.push(format!(
                "{dir}: peak {} MB, more than 100 MB above the {} MB of -e '1'",
                r.peak / MB,
                base.peak / MB
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
