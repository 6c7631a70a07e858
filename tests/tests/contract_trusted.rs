//! The contract suite against `--trust-request-mm-kwargs` (vLLM's meaning: everyone is
//! trusted, no bounds).

mod common;

use common::{assert_report, must, Gateway};
use contract::{ServerMode, SuiteConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_deployment_meets_the_contract() {
    let gateway = must(Gateway::start(&["--trust-request-mm-kwargs"]).await);
    let mut cfg = SuiteConfig::new(&gateway.base_url);
    cfg.mode = ServerMode::Trusted;
    let report = contract::run(&cfg).await;
    assert!(
        report
            .cases
            .iter()
            .any(|case| case.name.starts_with("gate[trusted]")),
        "the trusted gate matrix did not run"
    );
    assert_report(&report, "trusted");
}
