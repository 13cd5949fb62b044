//! The memory budget (docs/methods.md#memory-budget): an allocation whose size a user chooses
//! (sequences to generate, probe counts, lengths, the activations of a forward over a long
//! input) is estimated before it is made and refused above the budget, naming what would take
//! the memory and how much, so that a mistyped size ends in a one-line error instead of an
//! allocator failure or the OOM killer. Default: three quarters of the machine's memory
//! (`HEADSCOPE_MEMORY_BUDGET`, in bytes, overrides it); `set_memory_budget` in a script.

use std::cell::Cell;

thread_local! {
    /// The budget set by a script (`0`: the default), per thread: a session evaluates on one
    /// thread, so sessions on other threads (the kernel's, parallel tests) keep their own.
    static LIMIT: Cell<u64> = const { Cell::new(0) };
    /// Whether inputs may run past a rotary model's `max_position_embeddings` (this thread;
    /// `None`: the default).
    static PAST_POSITIONS: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Whether this thread lets inputs run past a model's positions where the family can
/// (rotary positions; a learned table cannot): `allow_past_positions(true)` in a script; by
/// default no, or yes when `HEADSCOPE_PAST_POSITIONS=1`.
pub fn past_positions() -> bool {
    PAST_POSITIONS.with(Cell::get).unwrap_or_else(|| std::env::var("HEADSCOPE_PAST_POSITIONS").is_ok_and(|v| v == "1"))
}

/// Sets [`past_positions`] for this thread (`None`: back to the default).
pub fn set_past_positions(on: Option<bool>) {
    PAST_POSITIONS.with(|p| p.set(on));
}

/// The machine's memory in bytes (Linux `MemTotal`), when known.
pub fn total_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// The budget when none is set: `HEADSCOPE_MEMORY_BUDGET` (bytes), else three quarters of the
/// machine's memory, else 16 GiB.
pub fn default_limit() -> u64 {
    if let Some(b) = std::env::var("HEADSCOPE_MEMORY_BUDGET").ok().and_then(|v| v.trim().parse::<u64>().ok()) {
        return b.max(1);
    }
    total_memory().map_or(16 << 30, |t| t / 4 * 3)
}

/// The budget in bytes.
pub fn limit() -> u64 {
    match LIMIT.with(Cell::get) {
        0 => default_limit(),
        l => l,
    }
}

/// Sets the budget of this thread (`0` restores the default).
pub fn set_limit(bytes: u64) {
    LIMIT.with(|l| l.set(bytes));
}

/// Bytes for people: `512 B`, `3.4 MB`, `2.30 TB` (powers of 1000).
pub fn human(bytes: f64) -> String {
    if !bytes.is_finite() {
        return "an unbounded amount".into();
    }
    let units = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let mut v = bytes.max(0.0);
    let mut i = 0;
    while v >= 1000.0 && i + 1 < units.len() {
        v /= 1000.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

/// `Ok` when `bytes` (an estimate, possibly huge or not finite) fits the budget, else an error
/// naming `what` would take them.
pub fn check(what: &str, bytes: f64) -> Result<(), String> {
    let l = limit();
    if bytes.is_finite() && bytes <= l as f64 {
        return Ok(());
    }
    Err(format!(
        "{what} would take {} of memory, over the budget of {} (set_memory_budget(bytes) raises it; docs/methods.md#memory-budget)",
        human(bytes),
        human(l as f64)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_over_the_budget_are_refused_with_the_bytes() {
        assert!(check("x", 1e3).is_ok());
        let e = check("1000000000 probe sequences", 3.2e11).unwrap_err();
        assert!(e.starts_with("1000000000 probe sequences would take 320.0 GB of memory, over the budget of"), "{e}");
        assert!(check("y", f64::INFINITY).is_err() && check("y", f64::NAN).is_err());
        assert_eq!(human(999.0), "999 B");
        assert_eq!(human(1.5e9), "1.5 GB");
    }
}
