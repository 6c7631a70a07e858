//! The OpenAI Python SDK against the binary: tool calls for a named and a required
//! `tool_choice`, whole and streamed, come out of the SDK's own parsing and stream assembly
//! with arguments that validate (`scripts/sdk_tool_calls.py`; `make sdk` installs the SDK).

mod common;

use common::{must, workspace_root, Gateway};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_assembles_tool_calls() {
    let root = workspace_root();
    let python = root.join("models-cache/sdk-venv/bin/python");
    assert!(
        python.exists(),
        "the OpenAI SDK is not installed: run `make sdk` (scripts/fetch-sdk.sh)"
    );
    let gateway = must(Gateway::start(&[]).await);
    let script = root.join("scripts/sdk_tool_calls.py");
    let base = gateway.base_url.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&python)
            .arg(script)
            .arg(base)
            .arg("HuggingFaceTB/SmolLM2-135M-Instruct")
            .output()
    })
    .await
    .unwrap_or_else(|e| panic!("join: {e}"))
    .unwrap_or_else(|e| panic!("running the SDK script: {e}"));
    assert!(
        out.status.success(),
        "the SDK check failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}
