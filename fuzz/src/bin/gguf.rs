//! AFL target: `headscope::fuzz::run("gguf", bytes)` (see src/fuzz.rs).
fn main() {
    afl::fuzz_nohook!(|data: &[u8]| {
        let _ = headscope::fuzz::run("gguf", data);
    });
}
