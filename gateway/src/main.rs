//! `gateway`: the server binary.

use clap::Parser;
use gateway::cli::{expand_config, Cli, Command};

/// mimalloc: a request allocates and frees many small objects (parsed JSON, headers, futures);
/// under glibc's malloc that was about a quarter of the gate path's instructions.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    let argv = match expand_config(argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(argv);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match cli.command {
        Command::Serve(args) => match rt.block_on(gateway::serve::run(*args)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::ExitCode::from(2)
            }
        },
        Command::Contract(args) => rt.block_on(gateway::contract_cmd::run(args)),
    }
}
