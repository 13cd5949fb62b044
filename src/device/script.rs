use crate::script::convert::{err, ScriptResult};
use rhai::plugin::*;
use rhai::Engine;

#[export_module]
pub mod api {
    use super::*;

    /// Whether a CUDA GPU can be used.
    ///
    /// ```rhai
    /// let gpu = cuda_available();
    /// assert(gpu == true || gpu == false);
    /// ```
    pub fn cuda_available() -> bool {
        tch::Cuda::is_available()
    }

    /// The device `"auto"` resolves to here: `"cuda:0"` or `"cpu"`.
    ///
    /// ```rhai
    /// let d = default_device();
    /// assert(d == "cpu" || d.starts_with("cuda"));
    /// ```
    pub fn default_device() -> String {
        crate::device::DeviceChoice::Auto.resolve().map(crate::device::device_name).unwrap_or_else(|_| "cpu".into())
    }

    /// Number of CPU threads libtorch uses.
    ///
    /// ```rhai
    /// assert(threads() >= 1);
    /// ```
    pub fn threads() -> i64 {
        tch::get_num_threads() as i64
    }

    /// Sets the number of CPU threads libtorch uses.
    ///
    /// ```rhai
    /// let n = threads();
    /// set_threads(1);
    /// assert(threads() == 1);
    /// set_threads(n);
    /// ```
    #[rhai_fn(return_raw)]
    pub fn set_threads(n: i64) -> ScriptResult<()> {
        if !(1..=1024).contains(&n) {
            return err(format!("set_threads: expected 1..1024 threads, got {n}"));
        }
        tch::set_num_threads(n as i32);
        Ok(())
    }

    /// The memory budget in bytes (docs/methods.md#memory-budget): an allocation whose size a
    /// script chooses (generated tokens, probe counts, lengths, a forward over a long input) is
    /// estimated first and refused above it. Default: three quarters of the machine's memory.
    ///
    /// ```rhai
    /// assert(memory_budget() > 1000000);
    /// ```
    pub fn memory_budget() -> i64 {
        crate::budget::limit().min(i64::MAX as u64) as i64
    }

    /// Sets the memory budget in bytes (0 restores the default).
    ///
    /// ```rhai
    /// let b = memory_budget();
    /// set_memory_budget(2000000000);
    /// assert(memory_budget() == 2000000000);
    /// set_memory_budget(0);
    /// assert(memory_budget() == b);
    /// ```
    #[rhai_fn(return_raw)]
    pub fn set_memory_budget(bytes: i64) -> ScriptResult<()> {
        if bytes < 0 {
            return err(format!("set_memory_budget: expected a number of bytes >= 0, got {bytes}"));
        }
        crate::budget::set_limit(bytes as u64);
        Ok(())
    }

    /// Lets inputs run past a model's positions (`max_position_embeddings`, a GGUF's
    /// `context_length`) where its positions are rotary (docs/methods.md#memory-budget); by
    /// default such an input is refused, naming its length and the limit. A learned position
    /// table cannot run past its rows whatever this says. Returns the previous setting.
    ///
    /// ```rhai
    /// let m = load_model("tests/fixtures/tiny_hf/llama"); // 256 positions
    /// let long = "";
    /// for i in 0..20 { long += "a b c d e f g h i j k l m n o p q r s t u v w x y z "; }
    /// try { m.loss(long); assert(false); } catch (e) { assert(e.contains("positions")); }
    /// let before = allow_past_positions(true);
    /// assert(m.loss(long) > 0.0);
    /// allow_past_positions(before);
    /// ```
    pub fn allow_past_positions(on: bool) -> bool {
        let before = crate::budget::past_positions();
        crate::budget::set_past_positions(Some(on));
        before
    }
}

pub fn register(engine: &mut Engine) {
    engine.register_global_module(exported_module!(api).into());
}
