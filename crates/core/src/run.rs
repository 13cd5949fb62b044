//! The run context: what a long computation may ask of whoever runs it, whether to stop
//! (an interrupt) and where to report progress. A leaf module: the numeric core and the
//! script layer both use it, and it depends on nothing in the crate, so module imports stay
//! a DAG (`tests/scripting/module_graph.rs`). The engine installs a context for each evaluation
//! ([`enter`]); outside one, nothing is interrupted and progress goes nowhere.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Stops a running evaluation (Ctrl-C, a kernel's interrupt_request); cheap to clone and
/// safe to trigger from a signal handler thread.
#[derive(Clone, Default, Debug)]
pub struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    pub fn trigger(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn reset(&self) {
        self.0.store(false, Ordering::SeqCst);
    }
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Receives `(label, done, total)` progress reports.
pub type ProgressFn = Rc<dyn Fn(&str, usize, usize)>;

/// The context of the run on this thread.
#[derive(Clone)]
pub struct Context {
    pub interrupt: Interrupt,
    pub progress: ProgressFn,
    /// Receives warnings (a loaded config's ignored key) for the frontend to show.
    pub warn: WarnFn,
}

/// Receives one warning, without its `warning: ` prefix.
pub type WarnFn = Rc<dyn Fn(&str)>;

thread_local! {
    static CURRENT: RefCell<Option<Context>> = const { RefCell::new(None) };
}

/// Restores the previous context when dropped.
pub struct Entered(Option<Context>);

impl Drop for Entered {
    fn drop(&mut self) {
        let prev = self.0.take();
        CURRENT.with(|c| *c.borrow_mut() = prev);
    }
}

/// Makes `ctx` the context of this thread until the returned guard is dropped.
#[must_use = "the context is left when the guard is dropped"]
pub fn enter(ctx: Context) -> Entered {
    Entered(CURRENT.with(|c| c.borrow_mut().replace(ctx)))
}

/// Whether the run on this thread was interrupted (Ctrl-C, a kernel's interrupt_request).
/// Long native computations poll this between batches, and the forward before every layer
/// (`model::check_interrupt`).
pub fn interrupted() -> bool {
    CURRENT.with(|c| c.borrow().as_ref().is_some_and(|ctx| ctx.interrupt.is_set()))
}

/// Reports progress of a long computation to the run's frontend (nothing outside a run).
pub fn progress(label: &str, done: usize, total: usize) {
    let f = CURRENT.with(|c| c.borrow().as_ref().map(|ctx| ctx.progress.clone()));
    if let Some(f) = f {
        f(label, done, total);
    }
}

/// Shows a warning through the run's frontend (as a printed line `warning: ...`); outside a
/// run, on standard error.
pub fn warn(msg: &str) {
    let f = CURRENT.with(|c| c.borrow().as_ref().map(|ctx| ctx.warn.clone()));
    match f {
        Some(f) => f(msg),
        None => eprintln!("warning: {msg}"),
    }
}

/// The rate and time left of a computation's progress, measured from its first report: none
/// until a second has passed and the count has moved since that report (the first report's
/// count says nothing of the rate: a first batch that came back at once, or work resumed).
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    start: std::time::Instant,
    from: usize,
}

impl Pace {
    /// Pace from a first report of `done` items, now.
    pub fn new(done: usize) -> Pace {
        Pace { start: std::time::Instant::now(), from: done }
    }

    /// Items per second and seconds left at `done` of `total`, `elapsed` after the first report.
    pub fn at(&self, done: usize, total: usize, elapsed: std::time::Duration) -> Option<(f64, u64)> {
        let secs = elapsed.as_secs_f64();
        if secs < 1.0 || done <= self.from {
            return None;
        }
        let rate = (done - self.from) as f64 / secs;
        Some((rate, (total.saturating_sub(done) as f64 / rate).round() as u64))
    }

    /// `", 2.5/s, ETA 1:04"` once measured, else empty.
    pub fn describe(&self, done: usize, total: usize) -> String {
        self.describe_at(done, total, self.start.elapsed())
    }

    pub fn describe_at(&self, done: usize, total: usize, elapsed: std::time::Duration) -> String {
        match self.at(done, total, elapsed) {
            Some((rate, left)) => format!(", {rate:.1}/s, ETA {}:{:02}", left / 60, left % 60),
            None => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pace_is_measured_from_the_first_report() {
        use std::time::Duration;
        // A first batch of 40 came back at once: no rate yet, and none from that count.
        let p = Pace::new(40);
        assert_eq!(p.describe_at(40, 1000, Duration::from_millis(5)), "");
        assert_eq!(p.describe_at(60, 1000, Duration::from_millis(500)), "", "under a second: not measured");
        assert_eq!(p.describe_at(40, 1000, Duration::from_secs(3)), "", "nothing done since the first report");
        // 20 more in 2 s: 10/s, 940 left: 94 s.
        assert_eq!(p.describe_at(60, 1000, Duration::from_secs(2)), ", 10.0/s, ETA 1:34");
    }
    use std::cell::Cell;

    #[test]
    fn context_is_scoped_and_restored() {
        assert!(!interrupted());
        let seen = Rc::new(Cell::new(0));
        let s = seen.clone();
        let i = Interrupt::default();
        {
            let _g = enter(Context {
                interrupt: i.clone(),
                progress: Rc::new(move |_, d, _| s.set(d)),
                warn: Rc::new(|_| {}),
            });
            progress("x", 7, 9);
            assert_eq!(seen.get(), 7);
            i.trigger();
            assert!(interrupted());
        }
        assert!(!interrupted(), "leaving the context forgets its interrupt");
        progress("x", 3, 9);
        assert_eq!(seen.get(), 7, "no progress sink outside a run");
    }
}
