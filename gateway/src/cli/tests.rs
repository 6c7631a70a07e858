//! The flag table against vLLM's own parser dump, and parsing as `vllm serve` spells it.

use super::vllm_args::{command, markdown_table, parse, CliError};
use super::vllm_flags::{Answer, Kind, FLAGS, REMOVED};
use super::{Command, ServeArgs};

const TSV: &str = include_str!("../../tests/data/vllm-serve-args-0.31.0.tsv");

/// The TSV's rows: group, spellings, kind, nargs.
fn tsv_rows() -> Vec<(String, String, String, String)> {
    TSV.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            (
                cols[0].to_string(),
                cols[1].to_string(),
                cols[3].to_string(),
                cols[5].to_string(),
            )
        })
        .collect()
}

fn kind_of(group: &str, kind: &str, nargs: &str) -> Kind {
    match (kind, nargs) {
        _ if group == "positional arguments" => Kind::Positional,
        ("help", _) => Kind::Help,
        ("switch", _) => Kind::Switch,
        ("bool(--x/--no-x)", _) => Kind::Bool,
        ("value", "+") | ("append", _) | ("LoRAParserAction", _) => Kind::Values,
        ("value", "?") => Kind::MaybeValue,
        _ => Kind::Value,
    }
}

fn argv(args: &[&str]) -> Vec<String> {
    ["gateway", "serve"]
        .iter()
        .chain(args)
        .map(|s| s.to_string())
        .collect()
}

fn serve(args: &[&str]) -> Result<(ServeArgs, super::Review), CliError> {
    let parsed = parse(argv(args))?;
    match parsed.cli.command {
        Command::Serve(a) => Ok((*a, parsed.review)),
        _ => panic!("not serve"),
    }
}

fn refusal(args: &[&str]) -> String {
    match serve(args) {
        Err(CliError::Refused(why)) => why,
        Err(CliError::Clap(e)) => panic!("{args:?}: clap refused it, not the table: {e}"),
        Ok(_) => panic!("{args:?} was accepted"),
    }
}

#[test]
fn every_argument_of_vllm_serve_is_in_the_table_as_vllm_spells_it() {
    let rows = tsv_rows();
    assert_eq!(rows.len(), 313, "the dump lists 313 arguments");
    assert_eq!(FLAGS.len(), rows.len(), "one table row per argument");
    for (flag, (group, names, kind, nargs)) in FLAGS.iter().zip(&rows) {
        assert_eq!(flag.names, names, "the table follows the dump's order");
        assert_eq!(flag.group, group, "{names}");
        assert_eq!(flag.kind, kind_of(group, kind, nargs), "{names}");
    }
}

#[test]
fn honoured_flags_are_declared_and_the_others_are_not() {
    let cmd = command();
    let serve = cmd
        .get_subcommands()
        .find(|c| c.get_name() == "serve")
        .expect("serve");
    let own = <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"));
    for flag in FLAGS {
        if matches!(flag.kind, Kind::Positional | Kind::Help) {
            continue;
        }
        let arg = serve
            .get_arguments()
            .find(|a| a.get_long() == Some(flag.long()))
            .unwrap_or_else(|| panic!("--{} is not an argument of serve", flag.long()));
        let declared = own.get_arguments().any(|a| a.get_long() == arg.get_long());
        assert_eq!(
            declared,
            matches!(flag.answer, Answer::Honoured(_)),
            "--{}: honoured rows are ServeArgs fields, the others come from the table",
            flag.long()
        );
    }
    cmd.debug_assert();
}

#[test]
fn help_lists_every_spelling_of_every_argument() {
    let mut cmd = command();
    let serve = cmd.find_subcommand_mut("serve").expect("serve");
    let help = serve.render_long_help().to_string();
    for flag in FLAGS {
        for spelling in flag.spellings() {
            if spelling == "model_tag" {
                assert!(help.contains("[MODEL]"), "the positional model");
                continue;
            }
            assert!(help.contains(spelling), "--help lacks {spelling}");
        }
    }
    assert!(help.contains("Refused: speculative decoding is not built"));
}

/// `gateway serve` with `flag` given `value` (`true` / `false` for booleans).
fn serve_given(
    flag: &super::vllm_flags::Flag,
    value: &str,
) -> Result<(ServeArgs, super::Review), CliError> {
    let args = match (flag.kind, value) {
        (Kind::Bool | Kind::Switch, "true") => vec![format!("--{}", flag.long())],
        (Kind::Bool, "false") => vec![format!("--no-{}", flag.long())],
        _ => vec![format!("--{}", flag.long()), value.to_string()],
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    serve(&args)
}

/// A value that sets the flag: `true` for switches and booleans.
fn some_value(flag: &super::vllm_flags::Flag) -> &'static str {
    match flag.kind {
        Kind::Bool | Kind::Switch => "true",
        _ => "7",
    }
}

#[test]
fn every_unhonoured_argument_is_accepted_warned_or_refused_naming_it() {
    for flag in FLAGS {
        let name = format!("--{}", flag.long());
        let outcome = serve_given(flag, some_value(flag));
        match flag.answer {
            Answer::Honoured(_) => {}
            Answer::NoEffect(_) | Answer::Deprecated(_) => {
                let (_, review) = outcome.unwrap_or_else(|e| panic!("{name}: {e}"));
                let warned = review.warnings().join("\n");
                assert!(warned.contains(&name), "{name} must be named in a warning");
            }
            Answer::Only(allowed, why) => {
                for value in allowed {
                    let (_, review) =
                        serve_given(flag, value).unwrap_or_else(|e| panic!("{name} {value}: {e}"));
                    assert!(review.warnings().is_empty(), "{name} {value}: quietly");
                }
                let other = match flag.kind {
                    Kind::Bool => ["true", "false"].into_iter().find(|v| !allowed.contains(v)),
                    Kind::Switch => None,
                    _ => Some("7"),
                };
                if let Some(other) = other {
                    let Err(CliError::Refused(refused)) = serve_given(flag, other) else {
                        panic!("{name} {other} must be refused by the table");
                    };
                    assert!(
                        refused.contains(flag.long()) && refused.contains(why),
                        "{refused}"
                    );
                }
            }
            Answer::Refused(why) => {
                let Err(CliError::Refused(refused)) = outcome else {
                    panic!("{name} must be refused by the table");
                };
                assert!(
                    refused.contains(&name) && refused.contains(why),
                    "{refused}"
                );
            }
        }
    }
}

#[test]
fn vllm_spellings_parse() {
    let (args, _) = serve(&["--max_num_seqs", "8", "--max-model-len=32K"]).unwrap();
    assert_eq!(args.max_num_seqs, 8);
    assert_eq!(args.max_model_len.and_then(|l| l.0), Some(32_768));
    let (args, _) = serve(&["--no-enable-prefix-caching"]).unwrap();
    assert_eq!(args.enable_prefix_caching, Some(false));
    let (args, _) = serve(&["--enable_prefix_caching"]).unwrap();
    assert_eq!(args.enable_prefix_caching, Some(true));
    let (args, _) = serve(&["--trust-request-mm-kwargs", "--no-trust-request-mm-kwargs"]).unwrap();
    assert!(
        !args.trust_request_mm_kwargs,
        "the last of --x / --no-x wins"
    );
    let (args, _) = serve(&["-tp", "1", "-pp=1", "--seed", "-3", "m.gguf"]).unwrap();
    assert_eq!(args.seed, Some(-3));
    assert_eq!(args.model_arg.as_deref(), Some("m.gguf"));
    let (args, _) = serve(&["--device-memory-utilization", "0.5"]).unwrap();
    assert_eq!(args.gpu_memory_utilization, 0.5);
    let (args, _) = serve(&["--max-num-seqs", "4", "--max-num-seqs", "6"]).unwrap();
    assert_eq!(args.max_num_seqs, 6, "the last value wins, as in argparse");
    let why = refusal(&["-tp", "2"]);
    assert!(why.starts_with("--tensor-parallel-size 2:"), "{why}");
    let why = refusal(&["--tensor_parallel_size=4"]);
    assert!(why.starts_with("--tensor-parallel-size 4:"), "{why}");
}

#[test]
fn unknown_flags_are_still_clap_errors() {
    assert!(matches!(serve(&["--not-a-flag"]), Err(CliError::Clap(_))));
}

#[test]
fn flags_vllm_removed_or_renamed_are_refused_naming_the_replacement() {
    for (name, why) in REMOVED {
        let refused = refusal(&[name, "1"]);
        assert!(
            refused.starts_with(name) && refused.contains(why),
            "{refused}"
        );
    }
    let why = refusal(&["--disable_log_requests"]);
    assert!(why.contains("--enable-log-requests"), "{why}");
    let why = refusal(&["--enable-mamba-fine-grained-prefix-cache"]);
    assert!(
        why.contains("renamed --enable-mamba-shared-prefix-checkpoint"),
        "{why}"
    );
    let why = refusal(&["--tokenizer-mode", "slow"]);
    assert!(
        why.contains("--tokenizer-mode slow") && why.contains("use auto or hf"),
        "{why}"
    );
    let why = refusal(&["--tokenizer-mode", "mistral"]);
    assert!(why.contains("--tokenizer-mode mistral"), "{why}");
    let (_, review) = serve(&["--log-config-file", "log.json"]).unwrap();
    let warned = review.warnings().join("\n");
    assert!(
        warned.contains("--log-config-file: deprecated in vLLM 0.31"),
        "{warned}"
    );
}

#[test]
fn no_effect_flags_share_one_warning_line() {
    let (_, review) = serve(&[
        "--enforce-eager",
        "--compilation-config",
        r#"{"level": 3}"#,
        "--disable-log-stats",
    ])
    .unwrap();
    let lines = review.warnings();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("--enforce-eager, --compilation-config"),
        "{lines:?}"
    );
}

fn config_file(text: &str) -> (std::path::PathBuf, String) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gw-cli-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.yaml");
    std::fs::write(&path, text).unwrap();
    let shown = path.display().to_string();
    (dir, shown)
}

#[test]
fn config_values_come_first_so_flags_win() {
    let (dir, path) = config_file(
        "max_num_seqs: 8\ntrust-request-mm-kwargs: true\nenable_prefix_caching: false\n\
         media-io-kwargs:\n  video:\n    num_frames: 40\nmodel: [a.gguf, b]\n\
         api-key: [k1, k2]\nenforce_eager: true\n",
    );
    let (args, review) = serve(&["--config", &path, "--max-num-seqs", "4"]).unwrap();
    assert_eq!(args.max_num_seqs, 4);
    assert_eq!(args.max_logprobs, 20);
    assert!(args.trust_request_mm_kwargs);
    assert_eq!(args.enable_prefix_caching, Some(false));
    assert_eq!(args.model, vec!["a.gguf".to_string(), "b".to_string()]);
    assert_eq!(args.api_key, vec!["k1".to_string(), "k2".to_string()]);
    let media: serde_json::Value =
        serde_json::from_str(args.media_io_kwargs.as_deref().unwrap()).unwrap();
    assert_eq!(media["video"]["num_frames"], 40);
    assert_eq!(review.no_effect, vec!["--enforce-eager".to_string()]);
    let (args, _) = serve(&["--config", &path, "--enable-prefix-caching"]).unwrap();
    assert_eq!(
        args.enable_prefix_caching,
        Some(true),
        "the command line wins"
    );
    let (args, _) = serve(&["c.gguf", "--config", &path]).unwrap();
    assert_eq!(args.model_arg.as_deref(), Some("c.gguf"));
    assert!(
        args.model.is_empty(),
        "the positional model wins over the file's"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn config_files_get_the_same_answers() {
    let (dir, path) = config_file("tensor_parallel_size: 2\n");
    let why = refusal(&["--config", &path]);
    assert!(why.contains("--tensor-parallel-size 2"), "{why}");
    let (dir2, path2) = config_file("swap-space: 4\n");
    let why = refusal(&["--config", &path2]);
    assert!(
        why.contains("--swap-space") && why.contains("drop it"),
        "{why}"
    );
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(dir2);
}

#[test]
fn activation_precision_defaults_to_q8_and_parses() {
    use engine::model::ActivationMode;
    assert_eq!(
        serve(&[]).unwrap().0.activation_precision,
        ActivationMode::Q8
    );
    let (args, _) = serve(&["--activation-precision", "f32"]).unwrap();
    assert_eq!(args.activation_precision, ActivationMode::F32);
    assert!(serve(&["--activation-precision", "fp16"]).is_err());
}

#[test]
fn kv_cache_dtype_defaults_to_auto_and_refuses_fp8_by_name() {
    use engine::model::KvDtype;
    assert_eq!(serve(&[]).unwrap().0.kv_cache_dtype, KvDtype::Auto);
    let (args, _) = serve(&["--kv-cache-dtype", "bfloat16"]).unwrap();
    assert_eq!(args.kv_cache_dtype, KvDtype::Bfloat16);
    let Err(CliError::Clap(err)) = serve(&["--kv-cache-dtype", "fp8"]) else {
        panic!("fp8 accepted")
    };
    assert!(
        err.to_string().contains("8-bit caches are not built"),
        "{err}"
    );
}

#[test]
fn the_log_level_flags_set_the_filter() {
    assert_eq!(serve(&[]).unwrap().0.log_filter(), "info");
    let (args, _) = serve(&["--uvicorn-log-level", "warning"]).unwrap();
    assert_eq!(args.log_filter(), "warn");
    let (args, _) = serve(&["--uvicorn-log-level", "warning", "--log-level", "DEBUG"]).unwrap();
    assert_eq!(args.log_filter(), "debug");
}

/// The README's table is the table; `GATEWAY_WRITE_README=1` rewrites it.
#[test]
fn the_readme_table_is_the_flag_table() {
    const START: &str = "<!-- vllm-flags:start -->\n";
    const END: &str = "<!-- vllm-flags:end -->";
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
    let readme = std::fs::read_to_string(path).unwrap();
    let (Some(start), Some(end)) = (readme.find(START), readme.find(END)) else {
        panic!("README.md lacks the {START:?} ... {END:?} markers");
    };
    let table = markdown_table();
    let current = &readme[start + START.len()..end];
    if std::env::var_os("GATEWAY_WRITE_README").is_some() && current != table {
        let updated = format!("{}{START}{table}{}", &readme[..start], &readme[end..]);
        std::fs::write(path, updated).unwrap();
        return;
    }
    assert_eq!(
        current, table,
        "README.md's flag table is out of date: run GATEWAY_WRITE_README=1 cargo test -p gateway --lib the_readme_table"
    );
}

#[test]
fn lora_flags_parse_as_vllm_spells_them() {
    let (args, _) = serve(&[
        "--enable-lora",
        "--lora-modules",
        "a=/x",
        r#"{"name": "b", "path": "/y"}"#,
        "--lora-modules",
        "c=/z",
        "--max-loras",
        "2",
        "--max-lora-rank=32",
        "--max-cpu-loras",
        "4",
    ])
    .expect("parses");
    assert!(args.enable_lora);
    assert_eq!(args.lora_modules.len(), 3, "{:?}", args.lora_modules);
    assert_eq!((args.max_loras, args.max_lora_rank), (2, 32));
    assert_eq!(args.max_cpu_loras, Some(4));
    let (off, _) = serve(&["--no-enable-lora"]).expect("parses");
    assert!(!off.enable_lora);
    assert_eq!(
        (off.max_loras, off.max_lora_rank, off.max_cpu_loras),
        (1, 16, None)
    );
}

#[test]
fn lora_flags_come_from_a_config_file_too() {
    let (dir, path) = config_file(
        "enable_lora: true\nlora-modules: [a=/x, b=/y]\nmax_loras: 2\nmax-cpu-loras: 3\n",
    );
    let (args, _) = serve(&["--config", &path]).unwrap();
    assert!(args.enable_lora);
    assert_eq!(
        args.lora_modules,
        vec!["a=/x".to_string(), "b=/y".to_string()]
    );
    assert_eq!((args.max_loras, args.max_cpu_loras), (2, Some(3)));
    let _ = std::fs::remove_dir_all(dir);
}
