//! The head view (src/view) in a real browser: headless Chromium, network off, driven by
//! `fixtures/view_browser.py` over chromedriver's WebDriver API. Each head attends in a known
//! pattern, so the lines the page draws for a head, a layer and a hovered token are checked
//! exactly. Skipped when Chromium or chromedriver is missing (`scripts/setup-test` installs them).

use crate::common;
use headscope::view::{HeadView, ViewKind};
use std::path::{Path, PathBuf};
use std::process::Command;

fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(name)).find(|p| p.is_file())
}

fn browser_available() -> bool {
    let found = which("chromedriver").is_some() && (which("chromium").is_some() || which("chromium-browser").is_some());
    if !found {
        common::skip("chromium", "chromium/chromedriver not installed (scripts/setup-test installs them)");
    }
    found
}

fn tokens(s: &str) -> Vec<String> {
    s.split(' ').map(String::from).collect()
}

/// Layer `l`, head `h`: query `i` gives 0.75 to key `(i + h + l) % T` and 0.25 to itself (1 when
/// they coincide). Layer 1's head 2 is removed (NaN).
fn planted() -> ViewKind {
    let (layers, heads, t) = (2, 3, 5);
    let mut attn = vec![0f32; layers * heads * t * t];
    for l in 0..layers {
        for h in 0..heads {
            for i in 0..t {
                let row = ((l * heads + h) * t + i) * t;
                if (l, h) == (1, 2) {
                    attn[row..row + t].fill(f32::NAN);
                    continue;
                }
                attn[row + (i + h + l) % t] += 0.75;
                attn[row + i] += 0.25;
            }
        }
    }
    ViewKind {
        name: "enc".into(),
        n_layers: layers,
        n_heads: heads,
        query_tokens: tokens("The cat </script><b> on mats"),
        key_tokens: tokens("The cat </script><b> on mats"),
        attn,
        scores: None,
    }
}

/// A cross kind: 4 queries, each attending uniformly to 5 keys.
fn cross() -> ViewKind {
    ViewKind {
        name: "cross".into(),
        n_layers: 2,
        n_heads: 3,
        query_tokens: tokens("O gato em tapetes"),
        key_tokens: tokens("The cat </script><b> on mats"),
        attn: vec![0.2; 2 * 3 * 4 * 5],
        scores: None,
    }
}

fn run_page(view: &HeadView, dir: &Path, args: &[&str]) -> serde_json::Value {
    let page = dir.join("view.html");
    std::fs::write(&page, view.html()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/view_browser.py");
    let out = Command::new("/usr/bin/python3").arg(script).arg(&page).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the browser checks failed (see above)");
    let seen = stdout.lines().find_map(|l| l.strip_prefix("SEEN ")).expect("a SEEN line");
    serde_json::from_str(seen).unwrap()
}

/// The lines seen in one state as (query, key, head, opacity).
fn lines(seen: &serde_json::Value, state: &str) -> Vec<(usize, usize, usize, f64)> {
    let rows = seen[state].as_array().unwrap_or_else(|| panic!("no {state} in {seen}"));
    rows.iter()
        .map(|r| {
            (
                r[0].as_u64().unwrap() as usize,
                r[1].as_u64().unwrap() as usize,
                r[2].as_u64().unwrap() as usize,
                r[3].as_f64().unwrap(),
            )
        })
        .collect()
}

/// The lines head `h` of layer `l` should draw for queries `qs`, sorted as the script sorts.
fn expected(l: usize, h: usize, qs: &[usize]) -> Vec<(usize, usize, usize, f64)> {
    let mut v = Vec::new();
    for &i in qs {
        let j = (i + h + l) % 5;
        if j == i {
            v.push((i, i, h, 1.0));
        } else {
            v.extend([(i, j, h, 0.75), (i, i, h, 0.25)]);
        }
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v
}

#[test]
fn head_view_works_offline_in_a_browser() {
    if !browser_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Coloured by a grid of the encoder's heads (layer 1's head 2 has no value).
    let grid = vec![("enc".to_string(), vec![vec![0.5, -1.0, 0.0], vec![0.25, 2.0, f64::NAN]])];
    let view =
        HeadView::new("planted heads", vec![planted(), cross()]).unwrap().colour_by(&grid, "planted effect").unwrap();
    let seen = run_page(&view, dir.path(), &["--layers", "2", "--heads", "3", "--tokens", "5", "--kinds", "2"]);
    let all = [0, 1, 2, 3, 4];
    assert_eq!(lines(&seen, "layer0_head0"), expected(0, 0, &all));
    assert_eq!(lines(&seen, "layer0_head1"), expected(0, 1, &all));
    assert_eq!(lines(&seen, "layer1_head1"), expected(1, 1, &all));
    assert_eq!(lines(&seen, "all_heads").len(), 5 + 10 + 10);
    assert_eq!(seen["scores_layer0"], serde_json::json!(["0.5", "-1", "0"]), "layer 0's score boxes");
    assert_eq!(
        seen["scores_layer1"],
        serde_json::json!(["0.25", "2", ""]),
        "layer 1's score boxes follow the layer picker"
    );
    // Layer 1, every head (head 2 removed), hovering query 1.
    let mut hover: Vec<_> = [expected(1, 0, &[1]), expected(1, 1, &[1])].concat();
    hover.sort_by(|a, b| a.partial_cmp(b).unwrap());
    assert_eq!(lines(&seen, "hover_left1"), hover);
    assert_eq!((seen["kind1_left"].as_u64(), seen["kind1_right"].as_u64()), (Some(4), Some(5)));
    assert_eq!(lines(&seen, "kind1_lines").len(), 3 * 4 * 5);
}

/// A real model's page, made by the binary as a user makes it: EN->PT's encoder and cross
/// attention on a sentence, 6 + 2 layers of 8 heads; the browser finds the pickers and tokens.
#[test]
fn a_real_models_page_works_offline_in_a_browser() {
    if !browser_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("enpt.html");
    let code = format!(
        r#"let v = load_model("enpt").view("The quick brown fox jumps over the lazy dog."); v.to_html("{}"); print(v);"#,
        page.display()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_headscope")).args(["-e", &code]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    // "enc 6 layers x 8 heads, N tokens; cross ..."
    let n: usize = text
        .split("8 heads, ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("token count in {text}"));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("http://") && !html.contains("https://") && !html.contains("<link"),
        "the page refers to the network"
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/view_browser.py");
    let png = dir.path().join("enpt.png");
    let out = Command::new("/usr/bin/python3")
        .arg(script)
        .arg(&page)
        .args(["--layers", "6", "--heads", "8", "--tokens", &n.to_string(), "--kinds", "2", "--screenshot"])
        .arg(&png)
        .output()
        .unwrap();
    let seen = String::from_utf8_lossy(&out.stdout);
    println!("{seen}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the browser checks failed (see above)");
    assert!(std::fs::metadata(&png).map(|m| m.len() > 10_000).unwrap_or(false), "no screenshot");
}
