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
}

pub fn register(engine: &mut Engine) {
    engine.register_global_module(exported_module!(api).into());
}
