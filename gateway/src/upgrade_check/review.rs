//! The configuration review: every flag of the deployment's `vllm serve` command line (and its
//! `--config` YAML) judged by the flag table, one row per finding, where `gateway serve` would
//! stop at the first. Removed and renamed flags, refused ones and refused values fail with the
//! reason and the replacement; flags with no effect here and deprecated ones warn.

use std::path::Path;

use crate::cli::vllm_args;
use crate::cli::vllm_flags::{self, Answer, Flag, Kind, REMOVED_VALUES};

use super::rows::{Row, Status};

const SECTION: &str = "config";

/// One option as written: its long name (`-` separators, no dashes, `--no-` kept) and values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Given {
    pub name: String,
    pub values: Vec<String>,
}

/// The deployment's command line as tokens: the flags of its `--config` YAML files (the one
/// given to the check, and one named on the command line) first, then the command line's own
/// (without a leading `vllm serve`), as `vllm serve` reads them: the command line wins.
pub fn tokens(config: Option<&Path>, command_line: &[String]) -> Result<Vec<String>, String> {
    let mut out = match config {
        Some(path) => vllm_args::config_to_args(path)?,
        None => Vec::new(),
    };
    let skip = match command_line {
        [vllm, serve, ..] if vllm.ends_with("vllm") && serve == "serve" => 2,
        [serve, ..] if serve == "serve" => 1,
        _ => 0,
    };
    let mut own = Vec::new();
    let mut rest = command_line.iter().skip(skip);
    while let Some(token) = rest.next() {
        let file = match token.strip_prefix("--config") {
            Some("") => rest.next().cloned(),
            Some(inline) if inline.starts_with('=') => Some(inline[1..].to_string()),
            _ => {
                own.push(token.clone());
                continue;
            }
        };
        let file = file.ok_or("--config needs a file")?;
        out.extend(vllm_args::config_to_args(Path::new(&file))?);
    }
    out.extend(own);
    Ok(out)
}

/// Splits tokens into options and their values, by the table's idea of each flag's arity
/// (unknown flags take the next token when it is not an option). Positional tokens (the
/// model) are left out.
pub fn options(tokens: &[String]) -> Vec<Given> {
    let mut out: Vec<Given> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let token = &tokens[i];
        i += 1;
        let Some(spelled) = token.strip_prefix('-').filter(|t| !t.is_empty()) else {
            continue;
        };
        let (written, inline) = match spelled.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (spelled, None),
        };
        let name = match written.strip_prefix('-') {
            Some(long) => long.replace('_', "-"),
            None => match vllm_flags::find_short(token) {
                Some(flag) => flag.long().to_string(),
                None => written.to_string(),
            },
        };
        let base = name.strip_prefix("no-").unwrap_or(&name);
        let kind = vllm_flags::find(&name)
            .or_else(|| vllm_flags::find(base))
            .map(|f| f.kind);
        let mut values: Vec<String> = inline.into_iter().collect();
        let takes_next = |t: Option<&String>| t.is_some_and(|t| !t.starts_with("--"));
        if values.is_empty() {
            match kind {
                Some(Kind::Switch | Kind::Bool | Kind::Help) => {}
                Some(Kind::Values) => {
                    while takes_next(tokens.get(i)) {
                        values.push(tokens[i].clone());
                        i += 1;
                    }
                }
                _ => {
                    if takes_next(tokens.get(i)) {
                        values.push(tokens[i].clone());
                        i += 1;
                    }
                }
            }
        }
        out.push(Given { name, values });
    }
    out
}

/// The rows of the review: one per finding, then, when nothing failed, whether the whole
/// command line starts `gateway serve` (which also judges values: numbers, JSON).
pub fn review(tokens: &[String]) -> Vec<Row> {
    let own = own_flags();
    let mut rows: Vec<Row> = options(tokens)
        .iter()
        .filter_map(|given| finding(given, &own))
        .collect();
    if tokens.is_empty() {
        rows.push(Row::new(
            SECTION,
            "vllm serve arguments",
            Status::Skip,
            "none given (pass --config FILE or the arguments after --)",
        ));
        return rows;
    }
    if rows.iter().all(|row| row.status != Status::Fail) {
        let argv: Vec<String> = ["gateway", "serve"]
            .into_iter()
            .map(str::to_string)
            .chain(tokens.iter().cloned())
            .collect();
        let outcome = match vllm_args::parse(argv) {
            Ok(_) => Ok(format!(
                "{} tokens accepted by `gateway serve`",
                tokens.len()
            )),
            Err(err) => Err(err.to_string().lines().next().unwrap_or("").to_string()),
        };
        rows.push(Row::judged(SECTION, "the whole command line", outcome));
    }
    rows
}

/// The long names `gateway serve` declares (vLLM's it honours and this server's own).
fn own_flags() -> Vec<String> {
    let command = vllm_args::command();
    command
        .find_subcommand("serve")
        .map(|serve| {
            serve
                .get_arguments()
                .filter_map(|arg| arg.get_long().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The row for one option, or `None` when it is honoured as vLLM documents it.
fn finding(given: &Given, own_flags: &[String]) -> Option<Row> {
    let flag_name = format!("--{}", given.name);
    let base = given.name.strip_prefix("no-").unwrap_or(&given.name);
    let removed =
        vllm_flags::removed(&flag_name).or_else(|| vllm_flags::removed(&format!("--{base}")));
    if let Some(why) = removed {
        return Some(Row::new(SECTION, flag_name, Status::Fail, why));
    }
    let flag = vllm_flags::find(&given.name).or_else(|| vllm_flags::find(base));
    let Some(flag) = flag else {
        if own_flags.iter().any(|own| own == &given.name) {
            return None;
        }
        return Some(Row::new(
            SECTION,
            flag_name,
            Status::Fail,
            "not an option of vllm serve 0.31 nor of this server",
        ));
    };
    for (long, value, why) in REMOVED_VALUES {
        if *long == flag.long() && given.values.iter().any(|v| v == value) {
            return Some(Row::new(
                SECTION,
                format!("--{long} {value}"),
                Status::Fail,
                *why,
            ));
        }
    }
    verdict(flag, given, &flag_name)
}

/// What the table answers for a flag of its own.
fn verdict(flag: &Flag, given: &Given, flag_name: &str) -> Option<Row> {
    match flag.answer {
        Answer::Honoured(_) => None,
        Answer::Only(allowed, why) => {
            let value = match flag.kind {
                Kind::Switch => "true".to_string(),
                Kind::Bool => match (given.name.starts_with("no-"), given.values.last()) {
                    (true, _) => "false".to_string(),
                    (false, Some(v)) => v.trim().to_string(),
                    (false, None) => "true".to_string(),
                },
                _ => given.values.last().map(|v| v.trim().to_string())?,
            };
            (!allowed.contains(&value.as_str())).then(|| {
                Row::new(
                    SECTION,
                    format!("{flag_name} {value}"),
                    Status::Fail,
                    format!("refused: {why}"),
                )
            })
        }
        Answer::NoEffect(why) => Some(Row::new(
            SECTION,
            flag_name,
            Status::Warn,
            format!("accepted with no effect: {why}"),
        )),
        Answer::Refused(why) => Some(Row::new(
            SECTION,
            flag_name,
            Status::Fail,
            format!("refused: {why}"),
        )),
        Answer::Deprecated(why) => Some(Row::new(
            SECTION,
            flag_name,
            Status::Warn,
            format!("deprecated: {why}"),
        )),
    }
}

/// The last value given for the long flag `name` (`true` / `false` for a boolean written
/// `--x` / `--no-x`), as `vllm serve` would take it.
pub fn last_value(tokens: &[String], name: &str) -> Option<String> {
    options(tokens).into_iter().rev().find_map(|given| {
        if given.name == name {
            Some(
                given
                    .values
                    .last()
                    .cloned()
                    .unwrap_or_else(|| "true".into()),
            )
        } else if given.name.strip_prefix("no-") == Some(name) {
            Some("false".into())
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn rows(items: &[&str]) -> Vec<Row> {
        match tokens(None, &strings(items)) {
            Ok(tokens) => review(&tokens),
            Err(why) => panic!("{why}"),
        }
    }

    #[test]
    fn options_follow_each_flags_arity() {
        let given = options(&strings(&[
            "Qwen/Qwen2.5-0.5B-Instruct",
            "--enable-prefix-caching",
            "--max_num_seqs=8",
            "-tp",
            "1",
            "--cudagraph-capture-sizes",
            "1",
            "2",
            "--no-enable-chunked-prefill",
        ]));
        let names: Vec<&str> = given.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "enable-prefix-caching",
                "max-num-seqs",
                "tensor-parallel-size",
                "cudagraph-capture-sizes",
                "no-enable-chunked-prefill"
            ]
        );
        assert_eq!(given[1].values, ["8"]);
        assert_eq!(given[2].values, ["1"]);
        assert_eq!(given[3].values, ["1", "2"]);
    }

    #[test]
    fn every_finding_gets_its_own_row_with_the_replacement() {
        let found = rows(&[
            "--swap-space",
            "4",
            "--enable-mamba-fine-grained-prefix-cache",
            "--tokenizer-mode",
            "slow",
            "--tensor-parallel-size",
            "2",
            "--enforce-eager",
            "--no-such-flag",
        ]);
        let summary: Vec<(&str, Status)> =
            found.iter().map(|r| (r.check.as_str(), r.status)).collect();
        assert_eq!(
            summary,
            [
                ("--swap-space", Status::Fail),
                ("--enable-mamba-fine-grained-prefix-cache", Status::Fail),
                ("--tokenizer-mode slow", Status::Fail),
                ("--tensor-parallel-size 2", Status::Fail),
                ("--enforce-eager", Status::Warn),
                ("--no-such-flag", Status::Fail),
            ]
        );
        assert!(found[1]
            .detail
            .contains("--enable-mamba-shared-prefix-checkpoint"));
        assert!(found[2].detail.contains("use auto or hf"));
    }

    #[test]
    fn a_clean_command_line_gets_one_passing_row_and_bad_values_fail_it() {
        let clean = rows(&[
            "vllm",
            "serve",
            "m.gguf",
            "--max-num-seqs",
            "8",
            "--models-cache",
            "x",
        ]);
        assert_eq!(clean.len(), 1, "{clean:?}");
        assert_eq!(clean[0].status, Status::Pass, "{clean:?}");
        let bad = rows(&["--max-num-seqs", "eight"]);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert_eq!(bad[0].status, Status::Fail);
        assert!(bad[0].detail.contains("eight"), "{bad:?}");
        assert_eq!(rows(&[])[0].status, Status::Skip);
    }

    #[test]
    fn config_files_come_first_and_their_findings_are_listed() {
        let dir = std::env::temp_dir().join(format!("upgrade-review-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let yaml = dir.join("deployment.yaml");
        std::fs::write(
            &yaml,
            "max_num_seqs: 8\nswap_space: 4\ndisable_log_requests: true\n",
        )
        .unwrap();
        let line = strings(&[
            "vllm",
            "serve",
            "--config",
            yaml.to_str().unwrap(),
            "--seed",
            "1",
        ]);
        let tokens = tokens(None, &line).unwrap();
        assert_eq!(
            tokens,
            [
                "--max-num-seqs",
                "8",
                "--swap-space",
                "4",
                "--disable-log-requests",
                "--seed",
                "1"
            ]
        );
        let found = review(&tokens);
        let failed: Vec<&str> = found.iter().map(|r| r.check.as_str()).collect();
        assert_eq!(failed, ["--swap-space", "--disable-log-requests"]);
        assert_eq!(super::tokens(Some(&yaml), &[]).unwrap().len(), 5);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_last_spelling_of_a_boolean_wins() {
        let tokens = strings(&[
            "--trust-request-mm-kwargs",
            "--media-io-kwargs",
            "{\"video\": {}}",
            "--no-trust-request-mm-kwargs",
        ]);
        assert_eq!(
            last_value(&tokens, "trust-request-mm-kwargs").as_deref(),
            Some("false")
        );
        assert_eq!(
            last_value(&tokens, "media-io-kwargs").as_deref(),
            Some("{\"video\": {}}")
        );
        assert_eq!(last_value(&tokens, "load-format"), None);
    }
}
