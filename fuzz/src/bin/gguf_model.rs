//! AFL target: `headscope_core::fuzz::run("gguf_model", bytes)` (see crates/core/src/fuzz.rs).
fn main() {
    afl::fuzz_nohook!(|data: &[u8]| {
        let _ = headscope_core::fuzz::run("gguf_model", data);
    });
}
