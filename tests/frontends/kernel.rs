//! The Jupyter kernel, driven by the real Python client: `jupyter_client` and `nbclient` (from
//! .venv, installed by scripts/setup) run the cases of tests/fixtures/kernel_client.py against
//! the built `headscope kernel`. Each case asserts on the Python side and prints what it saw.

use crate::common;

fn case(name: &str) {
    let (ok, text) = common::run_fixture_script("kernel_client.py", &[name]);
    assert!(ok, "kernel case '{name}' failed:\n{text}");
}

#[test]
fn notebook_with_table_plot_stream_error_and_state() {
    case("notebook");
}

#[test]
fn errors_reply_with_status_error_and_locations() {
    case("errors");
}

#[test]
fn interrupt_stops_a_running_cell_and_keeps_state() {
    case("interrupt");
}

#[test]
fn complete_inspect_and_is_complete() {
    case("introspection");
}

#[test]
fn heartbeat_and_kernel_info_with_busy_idle() {
    case("protocol");
}

#[test]
fn forged_signature_is_dropped_and_logged() {
    case("forged");
}

#[test]
fn shutdown_within_two_seconds_even_while_busy() {
    case("shutdown");
}

#[test]
fn kernel_exits_when_its_parent_dies() {
    case("parent_death");
}

#[test]
fn thousand_cells_back_to_back_nothing_lost_or_reordered() {
    case("load");
}

#[test]
fn completion_and_inspection_know_the_session_values() {
    case("typed_introspection");
}

#[test]
fn long_analysis_shows_progress_in_place() {
    case("progress");
}

#[test]
fn head_view_renders_in_a_notebook() {
    case("head_view");
}

#[test]
fn ten_reruns_of_a_model_loading_cell_peak_as_one_and_keep_one_variable() {
    case("rerun");
}
