//! The `headscope` command line: REPL, `run FILE`, `-e CODE`, `kernel`, `doctor`.

use clap::{Parser, Subcommand};
use headscope::engine::{Session, SessionOptions};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "headscope",
    version,
    about = "Understand and prune the attention heads of Transformer models, in Rhai"
)]
struct Cli {
    /// Evaluate CODE, print its value, and exit.
    #[arg(short = 'e', long = "eval", value_name = "CODE", conflicts_with = "command")]
    eval: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a .rhai script; ARGS are visible to it as the array `ARGS`.
    Run {
        /// Run on slice I of N of every dataset an analysis is given (analyze, ablation_sweep,
        /// lrp, head_importance, bleu) and write each result with its accumulators to the
        /// shard directory; `headscope merge` combines the N runs (docs/methods.md#shards).
        #[arg(long, value_name = "I/N")]
        shard: Option<String>,
        /// Where a sharded run writes its results (NAME.shard-I-of-N.json).
        #[arg(long, value_name = "DIR", default_value = "shards", requires = "shard")]
        shard_dir: PathBuf,
        file: PathBuf,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Merge the results of sharded runs (`run --shard I/N`) into the results one run over
    /// all the data gives: every complete set of shards found in DIR... (directories of
    /// .json files, or files) becomes OUT/NAME.json.
    Merge {
        #[arg(required = true, value_name = "DIR")]
        paths: Vec<PathBuf>,
        /// Where the merged results go.
        #[arg(short = 'o', long = "out", value_name = "OUT", default_value = "merged")]
        out: PathBuf,
    },
    /// Report torch, CUDA, threads and assets.
    Doctor,
    /// Run as a Jupyter kernel (`kernel --connection-file FILE`), or install its kernelspec
    /// (`kernel install [--user | --prefix DIR | --sys-prefix]`).
    Kernel {
        /// The connection file Jupyter wrote for this kernel.
        #[arg(short = 'f', long = "connection-file", value_name = "FILE")]
        connection_file: Option<PathBuf>,
        #[command(subcommand)]
        action: Option<KernelAction>,
    },
}

#[derive(Subcommand)]
enum KernelAction {
    /// Write the kernelspec so that Jupyter lists "headscope (Rhai)".
    Install {
        /// Install for this user (the default).
        #[arg(long, conflicts_with_all = ["prefix", "sys_prefix"])]
        user: bool,
        /// Install under PREFIX/share/jupyter/kernels.
        #[arg(long, value_name = "PREFIX")]
        prefix: Option<PathBuf>,
        /// Install into the active virtualenv or conda env ($VIRTUAL_ENV or $CONDA_PREFIX).
        #[arg(long, conflicts_with = "prefix")]
        sys_prefix: bool,
        /// The kernelspec's name.
        #[arg(long, default_value = "headscope")]
        name: String,
    },
}

fn kernel_command(connection_file: Option<PathBuf>, action: Option<KernelAction>) -> Result<(), String> {
    use headscope::kernel::spec::{install, InstallTarget};
    match (connection_file, action) {
        (Some(file), None) => headscope::kernel::run(&file),
        (None, Some(KernelAction::Install { user: _, prefix, sys_prefix, name })) => {
            let target = if sys_prefix {
                let env = std::env::var_os("VIRTUAL_ENV").or_else(|| std::env::var_os("CONDA_PREFIX"));
                InstallTarget::Prefix(
                    env.map(PathBuf::from).ok_or("--sys-prefix: neither VIRTUAL_ENV nor CONDA_PREFIX is set")?,
                )
            } else if let Some(p) = prefix {
                InstallTarget::Prefix(p)
            } else {
                InstallTarget::User
            };
            let exe = std::env::current_exe().map_err(|e| format!("cannot find the headscope executable: {e}"))?;
            let dir = install(&target, &name, &exe)?;
            println!("installed kernelspec '{name}' in {}", dir.display());
            Ok(())
        }
        (Some(_), Some(_)) => Err("kernel: give either --connection-file or install, not both".into()),
        (None, None) => Err("kernel: needs --connection-file FILE (Jupyter starts it so) or `install`".into()),
    }
}

fn script_session(args: Vec<String>, base_dir: PathBuf) -> Session {
    let s = Session::new(SessionOptions { sink: headscope::repl::terminal_sink(), args, base_dir });
    headscope::install_ctrlc(s.interrupt_handle());
    s
}

/// Large tensors (attention maps of a batch) are allocated and freed over and over; with
/// glibc's dynamic mmap threshold they end up in the heap, which fragments, so peak memory
/// grew with the number of batches. A fixed 16 MiB threshold returns them to the system on
/// free: an analysis pass over 4000 sentences then peaks within 10% of one over 1000
/// (benches/analysis.sh). Freed heap memory is kept up to 256 MiB instead of glibc's default
/// 128 KiB: returning it to the system after every op and faulting it back in on the next cost
/// LRP and the sweeps a fifth of their time in page faults (benches/lrp.rhai).
fn bound_peak_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only tunes the allocator; called once before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 16 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

fn main() -> ExitCode {
    bound_peak_memory();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // `headscope FILE.rhai` (no `run`): say what was meant instead of clap's bare refusal.
            let first = std::env::args().nth(1).unwrap_or_default();
            if e.kind() == clap::error::ErrorKind::InvalidSubcommand && first.ends_with(".rhai") {
                eprintln!("error: '{first}' is a script, not a command: run it with `headscope run {first}` (or open it in a session with `:load {first}`)");
                return ExitCode::from(2);
            }
            e.exit()
        }
    };
    match (cli.eval, cli.command) {
        (Some(code), _) => {
            let mut s = script_session(vec![], std::env::current_dir().unwrap_or_else(|_| ".".into()));
            match s.eval("-e", &code) {
                Ok(Some(out)) => {
                    println!("{}", out.text);
                    ExitCode::SUCCESS
                }
                Ok(None) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(1)
                }
            }
        }
        (None, Some(Command::Merge { paths, out })) => match headscope::engine::merge::merge_files(&paths, &out) {
            Ok(lines) => {
                for l in lines {
                    println!("{l}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("headscope merge: {e}");
                ExitCode::from(1)
            }
        },
        (None, Some(Command::Run { shard, shard_dir, file, args })) => {
            if let Some(s) = shard {
                match s.parse::<headscope::shard::Shard>() {
                    Ok(s) => headscope::shard::set_run(s, shard_dir),
                    Err(e) => {
                        eprintln!("headscope: --shard: {e}");
                        return ExitCode::from(2);
                    }
                }
            }
            let code = match headscope::engine::read_script(&file) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("headscope: {e}");
                    return ExitCode::from(1);
                }
            };
            let base =
                file.parent().filter(|p| !p.as_os_str().is_empty()).map(PathBuf::from).unwrap_or_else(|| ".".into());
            let mut s = script_session(args, base);
            match s.eval(&file.display().to_string(), &code) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(1)
                }
            }
        }
        (None, Some(Command::Kernel { connection_file, action })) => match kernel_command(connection_file, action) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("headscope: {e}");
                ExitCode::from(1)
            }
        },
        (None, Some(Command::Doctor)) => {
            println!("headscope {}", env!("CARGO_PKG_VERSION"));
            println!("{}", headscope::device::torch_info());
            println!("{}", headscope::assets::status_report());
            ExitCode::SUCCESS
        }
        (None, None) => match headscope::repl::run() {
            Ok(false) => ExitCode::SUCCESS,
            Ok(true) => ExitCode::from(1),
            Err(e) => {
                eprintln!("headscope: {e}");
                ExitCode::from(1)
            }
        },
    }
}
