//! The kernel against hostile clients: tests/fixtures/kernel_hostile.py (pyzmq, raw frames and
//! raw TCP) sends more than 10,000 hostile messages over shell, control, stdin, heartbeat and
//! iopub — bad and missing signatures, replays, broken framing, invalid JSON, wrong JSON
//! types, unknown message types, huge payloads and frame headers, bursts — between signed
//! `n += 1` cells. It asserts that every signed cell completes in order, that n counts exactly
//! the signed cells (every hostile message carrying code also increments n and writes a marker
//! file, which must not exist), that attackers get nothing but status-"error" replies, that an
//! iopub subscriber that never reads does not stall the signed client's output, that the
//! heartbeat echoes, and that the kernel stays alive with a bounded RSS and shuts down cleanly.

use crate::common;
use std::time::Instant;

#[test]
fn ten_thousand_hostile_messages_run_nothing_and_signed_cells_all_complete() {
    let t0 = Instant::now();
    let (ok, text) = common::run_fixture_script("kernel_hostile.py", &[]);
    assert!(ok, "hostile-client case failed after {:.1} s:\n{text}", t0.elapsed().as_secs_f64());
    assert!(text.contains("total hostile: "), "the fixture printed no summary:\n{text}");
}
