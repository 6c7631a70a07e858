//! The contract suite against a trusted-client profile (CONTRACT section 8): an API key
//! for everyone, one key the policy trusts; untrusted keys keep the default refusal.

mod common;

use common::{assert_report, must, Gateway, TempDir};
use contract::{ServerMode, SuiteConfig};

const UNTRUSTED_KEY: &str = "contract-untrusted-key";
const TRUSTED_KEY: &str = "contract-trusted-key";

/// The policy: one trusted key, bounds the suite's benign values satisfy.
fn policy() -> String {
    format!(
        r#"trusted_keys:
  - "{TRUSTED_KEY}"
bounds:
  video:
    type: object
    properties:
      num_frames: {{type: integer, minimum: 1, maximum: 64}}
      fps: {{type: number, exclusiveMinimum: 0, maximum: 30}}
  image:
    type: object
    properties:
      image_mode: {{enum: ["RGB", "RGBA", "L"]}}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_deployment_meets_the_contract() {
    let dir = must(TempDir::new("profile"));
    let policy_path = must(dir.write("policy.yaml", &policy()));
    let policy_arg = policy_path.display().to_string();
    let gateway = must(
        Gateway::start(&[
            "--api-key",
            UNTRUSTED_KEY,
            "--api-key",
            TRUSTED_KEY,
            "--trusted-client-policy",
            &policy_arg,
        ])
        .await,
    );
    let mut cfg = SuiteConfig::new(&gateway.base_url);
    cfg.mode = ServerMode::Profile {
        trusted_key: TRUSTED_KEY.into(),
        untrusted_key: UNTRUSTED_KEY.into(),
    };
    let report = contract::run(&cfg).await;
    for label in ["gate[trusted-key]", "gate[untrusted-key]", "auth "] {
        assert!(
            report.cases.iter().any(|case| case.name.starts_with(label)),
            "no {label} cases ran"
        );
    }
    assert_report(&report, "trusted-client profile");
}
