//! AFL target: `headscope::fuzz::run("gguf_model", bytes)` (see src/fuzz.rs).
fn main() {
    afl::fuzz_nohook!(|data: &[u8]| {
        let _ = headscope::fuzz::run("gguf_model", data);
    });
}
