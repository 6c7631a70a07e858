//! Invalid flag values stop start-up: a non-zero exit and one clear line on stderr.

mod common;

use std::time::Duration;

use common::{must, run_to_exit, TempDir};

const LIMIT: Duration = Duration::from_secs(30);

/// Starts the gateway with `args`; it must exit non-zero with exactly one non-empty
/// stderr line mentioning one of `mentions`.
fn refuses(args: &[&str], mentions: &[&str]) {
    let (status, stderr) = must(run_to_exit(args, LIMIT));
    assert!(
        !status.success(),
        "gateway serve {args:?} exited successfully; stderr:\n{stderr}"
    );
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "gateway serve {args:?} should print exactly one line on stderr, printed:\n{stderr}"
    );
    assert!(
        mentions.iter().any(|word| lines[0].contains(word)),
        "the error line for {args:?} should name one of {mentions:?}: {:?}",
        lines[0]
    );
}

#[test]
fn invalid_mm_processor_kwargs_json_is_refused() {
    refuses(
        &["--mm-processor-kwargs", "not json"],
        &["mm-processor-kwargs", "mm_processor_kwargs"],
    );
}

#[test]
fn non_object_media_io_kwargs_is_refused() {
    refuses(
        &["--media-io-kwargs", "[1, 2]"],
        &["media-io-kwargs", "media_io_kwargs"],
    );
}

#[test]
fn active_seqs_above_max_seqs_is_refused() {
    refuses(
        &["--max-num-active-seqs", "8", "--max-num-seqs", "4"],
        &["max-num-active-seqs", "max_num_active_seqs"],
    );
}

#[test]
fn missing_local_media_path_is_refused() {
    let dir = must(TempDir::new("nonexistent"));
    let missing = dir.path.join("does-not-exist");
    let missing = missing.display().to_string();
    refuses(
        &["--allowed-local-media-path", &missing],
        &["allowed-local-media-path", "allowed_local_media_path"],
    );
}

#[test]
fn nonexistent_root_media_path_is_refused() {
    refuses(
        &["--allowed-local-media-path", "/nonexistent"],
        &["allowed-local-media-path", "allowed_local_media_path"],
    );
}

#[test]
fn unreadable_policy_file_is_refused() {
    let dir = must(TempDir::new("policy"));
    let missing = dir.path.join("missing-policy.yaml");
    let missing = missing.display().to_string();
    refuses(
        &["--trusted-client-policy", &missing],
        &["trusted-client-policy", "trusted_client_policy", "policy"],
    );
}

#[test]
fn missing_config_file_is_refused() {
    let dir = must(TempDir::new("config"));
    let missing = dir.path.join("missing.yaml");
    let missing = missing.display().to_string();
    refuses(&["--config", &missing], &["config"]);
}

#[test]
fn config_file_with_a_bad_value_is_refused() {
    let dir = must(TempDir::new("config"));
    let config = must(dir.write("gateway.yaml", "max-num-seqs: 4\nmax-num-active-seqs: 8\n"));
    let config = config.display().to_string();
    refuses(
        &["--config", &config],
        &["max-num-active-seqs", "max_num_active_seqs"],
    );
}

#[test]
fn policy_with_an_invalid_schema_is_refused() {
    let dir = must(TempDir::new("policy"));
    let policy = must(dir.write(
        "policy.yaml",
        "trusted_keys: [\"k\"]\nbounds:\n  video: {type: 5}\n",
    ));
    let policy = policy.display().to_string();
    refuses(&["--trusted-client-policy", &policy], &["video"]);
}

#[test]
fn a_cuda_device_that_cannot_serve_is_refused_naming_why() {
    // No machine has 100 devices: with or without a GPU, the answer names the device.
    refuses(&["--device", "cuda:99"], &["cuda:99"]);
}

#[test]
fn a_gpu_dtype_on_the_cpu_is_refused() {
    refuses(&["--device", "cpu", "--dtype", "bfloat16"], &["--dtype"]);
}

#[test]
fn gpu_memory_utilization_outside_zero_to_one_is_refused() {
    refuses(
        &["--gpu-memory-utilization", "1.5"],
        &["--gpu-memory-utilization"],
    );
}

#[test]
fn zero_connection_limits_are_refused() {
    refuses(&["--header-read-timeout", "0"], &["--header-read-timeout"]);
    refuses(&["--max-connections", "0"], &["--max-connections"]);
}
