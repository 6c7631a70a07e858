//! `gateway contract`: run the contract suite against any OpenAI-compatible deployment and
//! print a pass/fail table (and optionally a JSON report). Exit 0 only when every case passed.

use std::process::ExitCode;

use contract::{ServerMode, SuiteConfig};

use crate::cli::ContractArgs;

pub async fn run(args: ContractArgs) -> ExitCode {
    let mode = match args.mode.as_str() {
        "default" => ServerMode::Default,
        "trusted" => ServerMode::Trusted,
        "profile" => match (args.trusted_key.clone(), args.untrusted_key.clone()) {
            (Some(trusted_key), Some(untrusted_key)) => ServerMode::Profile {
                trusted_key,
                untrusted_key,
            },
            _ => {
                eprintln!("error: --mode profile needs --trusted-key and --untrusted-key");
                return ExitCode::from(2);
            }
        },
        other => {
            eprintln!("error: --mode must be default, trusted or profile, got {other:?}");
            return ExitCode::from(2);
        }
    };
    let mut cfg = SuiteConfig::new(args.base_url.clone());
    cfg.api_key = args.api_key.clone();
    cfg.chat_model = args.model.clone();
    cfg.embedding_model = args.embedding_model.clone();
    cfg.mode = mode;
    let report = contract::run(&cfg).await;
    report.print_table();
    if let Some(path) = &args.json_report {
        let text = serde_json::to_string_pretty(&report.to_json()).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    if report.all_passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
