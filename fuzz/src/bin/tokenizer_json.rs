//! AFL target: `headscope::fuzz::run("tokenizer_json", bytes)` (see src/fuzz.rs).
fn main() {
    afl::fuzz_nohook!(|data: &[u8]| {
        let _ = headscope::fuzz::run("tokenizer_json", data);
    });
}
