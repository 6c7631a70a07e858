//! The contract suite against a default deployment (no trust flags), with a counting
//! media server the gateway may reach: refused kwargs must never cause a fetch.

mod common;

use common::{assert_report, must, Gateway, MediaServer};
use contract::{ServerMode, SuiteConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_deployment_meets_the_contract() {
    let media = must(MediaServer::start().await);
    let gateway = must(Gateway::start(&["--allowed-media-domains", "127.0.0.1"]).await);
    let mut cfg = SuiteConfig::new(&gateway.base_url);
    cfg.mode = ServerMode::Default;
    cfg.media_base_url = Some(media.base_url.clone());
    let report = contract::run(&cfg).await;
    assert!(
        report
            .cases
            .iter()
            .any(|case| case.name.starts_with("media[")),
        "the media cases did not run"
    );
    assert_eq!(
        media.hits(),
        0,
        "the media server was fetched although every media request carried refused kwargs"
    );
    assert_report(&report, "default");
}
