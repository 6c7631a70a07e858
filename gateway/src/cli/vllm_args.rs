//! The command line as `vllm serve` reads it, built from the flag table
//! ([`super::vllm_flags`]): spelling (`_` or `-`, `--no-x`, short aliases such as `-tp`), the
//! `--config` YAML file, the clap arguments of every flag the table does not hand to
//! [`super::ServeArgs`], the review of what was given (refusals, the no-effect warning) and
//! the README's table.

use std::ops::Range;
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, ArgMatches, Command, CommandFactory, FromArgMatches};
use thiserror::Error;

use super::vllm_flags::{self, Answer, Flag, Kind, FLAGS, REMOVED, REMOVED_VALUES};
use super::Cli;

/// The help heading of this server's own flags (those vLLM does not have).
const OWN_HEADING: &str = "This server's own options";

/// Why the command line cannot start the server.
#[derive(Debug, Error)]
pub enum CliError {
    /// clap's own answer: `--help`, `--version`, or a malformed command line.
    #[error(transparent)]
    Clap(#[from] clap::Error),
    /// A vLLM flag this server refuses, or a bad `--config` file: one line.
    #[error("{0}")]
    Refused(String),
}

/// What the review found that does not stop the start.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Review {
    /// Flags accepted without effect (`--enforce-eager`), for one start-up warning.
    pub no_effect: Vec<String>,
    /// A warning line per deprecated flag given.
    pub deprecated: Vec<String>,
}

impl Review {
    /// The start-up warnings, one line each.
    pub fn warnings(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.no_effect.is_empty() {
            lines.push(format!(
                "accepted with no effect on this server (they tune vLLM's own internals; \
                 `gateway serve --help` says why for each): {}",
                self.no_effect.join(", ")
            ));
        }
        lines.extend(self.deprecated.iter().cloned());
        lines
    }
}

/// A parsed command line and its review.
#[derive(Debug)]
pub struct Parsed {
    pub cli: Cli,
    pub review: Review,
}

/// The whole command, with `serve` carrying every vLLM flag.
pub fn command() -> Command {
    Cli::command().mut_subcommand("serve", serve_command)
}

/// Parse `argv` as `vllm serve` would read it (and the other subcommands as they are).
pub fn parse(argv: Vec<String>) -> Result<Parsed, CliError> {
    if argv.get(1).map(String::as_str) != Some("serve") {
        let matches = command().try_get_matches_from(argv)?;
        return Ok(Parsed {
            cli: Cli::from_arg_matches(&matches)?,
            review: Review::default(),
        });
    }
    let argv = normalise(argv)?;
    let (argv, from_config) = expand_config(argv).map_err(CliError::Refused)?;
    let matches = command().try_get_matches_from(argv)?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    let Some(serve) = matches.subcommand_matches("serve") else {
        return Ok(Parsed {
            cli,
            review: Review::default(),
        });
    };
    let review = review(serve)?;
    if let super::Command::Serve(args) = &mut cli.command {
        // The positional model on the command line wins over a `model:` in the file.
        if args.model_arg.is_some() {
            if let Some(indices) = serve.indices_of("model") {
                let keep: Vec<bool> = indices.map(|i| !from_config.contains(&i)).collect();
                let mut keep = keep.into_iter();
                args.model.retain(|_| keep.next().unwrap_or(true));
            }
        }
    }
    Ok(Parsed { cli, review })
}

/// `serve` with a heading per vLLM group for the flags `ServeArgs` declares, and an argument
/// for every other row of the table.
fn serve_command(cmd: Command) -> Command {
    let mut cmd = cmd
        .args_override_self(true)
        .allow_negative_numbers(true)
        .after_long_help(
            "Every `vllm serve` 0.31 flag is accepted here: honoured, accepted with no effect \
             (named in one start-up warning), or refused with the reason. `_` and `-` are \
             interchangeable in names, `--x=value` works, and `--no-x` turns a flag off.",
        );
    let declared: Vec<(clap::Id, Option<&'static Flag>)> = cmd
        .get_arguments()
        .map(|arg| {
            let long = arg.get_long().or_else(|| {
                // The positional model is vLLM's `model_tag`.
                arg.is_positional().then_some("model_tag")
            });
            (arg.get_id().clone(), long.and_then(vllm_flags::find))
        })
        .collect();
    for (id, flag) in declared {
        cmd = cmd.mut_arg(id, |arg| match flag {
            None => arg.help_heading(OWN_HEADING),
            Some(flag) => {
                let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                let help = format!("{help}{}", spelling_note(flag));
                arg.help_heading(flag.group).help(help)
            }
        });
    }
    for flag in FLAGS {
        if !matches!(flag.answer, Answer::Honoured(_)) {
            cmd = cmd.arg(table_arg(flag));
        }
    }
    cmd
}

/// The clap argument of a row `ServeArgs` does not declare: it takes its values as text, for
/// the review to judge.
fn table_arg(flag: &'static Flag) -> Arg {
    let arg = Arg::new(flag.long())
        .long(flag.long())
        .help_heading(flag.group)
        .help(help_text(flag))
        .value_name(flag.long().to_ascii_uppercase().replace('-', "_"));
    match flag.kind {
        Kind::Switch => arg.action(ArgAction::SetTrue),
        Kind::Bool => arg
            .action(ArgAction::Append)
            .num_args(0..=1)
            .require_equals(true)
            .default_missing_value("true")
            .value_name("BOOL"),
        Kind::MaybeValue => arg
            .action(ArgAction::Append)
            .num_args(0..=1)
            .default_missing_value(""),
        Kind::Values => arg.action(ArgAction::Append).num_args(1..),
        Kind::Value | Kind::Positional | Kind::Help => arg.action(ArgAction::Append).num_args(1),
    }
}

/// What `--help` says of a row: its answer and its other spellings.
pub fn help_text(flag: &Flag) -> String {
    format!("{}{}", answer_text(flag), spelling_note(flag))
}

/// What the README says of a row (its table lists the spellings).
fn answer_text(flag: &Flag) -> String {
    match flag.answer {
        Answer::Honoured(what) => format!("Honoured: {what}."),
        // Every value it can take is accepted.
        Answer::Only(values, why)
            if flag.kind == Kind::Switch || (flag.kind == Kind::Bool && values.len() == 2) =>
        {
            format!("Accepted: {why}.")
        }
        Answer::Only(values, why) => {
            let shown: Vec<String> = values
                .iter()
                .map(|v| format!("`{}`", shown(flag, v)))
                .collect();
            format!(
                "Accepted as {}; anything else is refused: {why}.",
                shown.join(" or ")
            )
        }
        Answer::NoEffect(why) => format!("No effect here: {why}."),
        Answer::Refused(why) => format!("Refused: {why}."),
        Answer::Deprecated(why) => format!("Deprecated: {why}."),
    }
}

/// The other spellings of a row (`--no-x`, `-tp`), for its help.
fn spelling_note(flag: &Flag) -> String {
    let others: Vec<String> = flag.spellings().skip(1).map(|s| format!("`{s}`")).collect();
    if others.is_empty() {
        String::new()
    } else {
        format!(" (also {})", others.join(", "))
    }
}

/// How a value of `flag` is written on a command line (`--no-x` for a `false` boolean).
fn shown(flag: &Flag, value: &str) -> String {
    match (flag.kind, value) {
        (Kind::Bool | Kind::Switch, "true") => format!("--{}", flag.long()),
        (Kind::Bool, "false") => format!("--no-{}", flag.long()),
        (_, "") => format!("--{} ''", flag.long()),
        _ => format!("--{} {value}", flag.long()),
    }
}

/// vLLM's spelling turned into clap's: `_` to `-` in option names, short aliases to their long
/// names, `--no-x` to `--x=false`; a flag vLLM removed is refused here, naming its
/// replacement. Values, and everything after `--`, are left as they are.
fn normalise(argv: Vec<String>) -> Result<Vec<String>, CliError> {
    let mut out = Vec::with_capacity(argv.len());
    let mut rest = argv.into_iter();
    out.extend(rest.by_ref().take(2));
    while let Some(token) = rest.next() {
        if token == "--" {
            out.push(token);
            out.extend(rest);
            break;
        }
        let Some(option) = option_name(&token) else {
            out.push(token);
            continue;
        };
        let (written, value) = match option.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (option, None),
        };
        let name = if token.starts_with("--") {
            written.replace('_', "-")
        } else {
            match vllm_flags::find_short(&format!("-{written}")) {
                Some(flag) => flag.long().to_string(),
                None => {
                    out.push(token);
                    continue;
                }
            }
        };
        let negated = name.strip_prefix("no-");
        let removed = vllm_flags::removed(&format!("--{name}"))
            .or_else(|| negated.and_then(|base| vllm_flags::removed(&format!("--{base}"))));
        if let Some(why) = removed {
            return Err(CliError::Refused(format!("--{name}: {why}")));
        }
        if let Some(base) = negated {
            if vllm_flags::find(base).is_some_and(|f| f.kind == Kind::Bool) {
                if value.is_some() {
                    return Err(CliError::Refused(format!("--{name} takes no value")));
                }
                out.push(format!("--{base}=false"));
                continue;
            }
        }
        out.push(match value {
            Some(value) => format!("--{name}={value}"),
            None => format!("--{name}"),
        });
    }
    Ok(out)
}

/// The option name (and `=value`) a token spells without its dashes; `None` for values,
/// negative numbers and `-h`.
fn option_name(token: &str) -> Option<&str> {
    if let Some(long) = token.strip_prefix("--") {
        return (!long.is_empty()).then_some(long);
    }
    let short = token.strip_prefix('-')?;
    let numeric = short
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c == '.');
    (!short.is_empty() && !numeric && short != "h").then_some(short)
}

/// Turn a `--config` YAML file into flags: keys are long names without the dashes (either
/// separator); `true` is the flag, `false` its `--no-` form, a list is several values, a
/// mapping is passed on as JSON.
pub fn config_to_args(path: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read --config {}: {e}", path.display()))?;
    let doc: serde_yaml::Value = serde_yaml::from_str(&text)
        .map_err(|e| format!("--config {} is not valid YAML: {e}", path.display()))?;
    let serde_yaml::Value::Mapping(map) = doc else {
        return Err(format!(
            "--config {} must be a mapping of flag names to values",
            path.display()
        ));
    };
    let mut out = Vec::new();
    for (k, v) in map {
        let Some(key) = k.as_str() else {
            return Err(format!("--config {}: keys must be strings", path.display()));
        };
        let long = key.replace('_', "-");
        if long == "config" {
            return Err("--config files cannot include another --config".into());
        }
        let flag = format!("--{long}");
        let kind = vllm_flags::find(&long).map(|f| f.kind);
        match v {
            serde_yaml::Value::Bool(true) => out.push(flag),
            serde_yaml::Value::Bool(false) => {
                if kind == Some(Kind::Bool) {
                    out.push(format!("--no-{long}"));
                }
            }
            serde_yaml::Value::Null => {}
            serde_yaml::Value::Sequence(items) if kind == Some(Kind::Values) => {
                out.push(flag);
                for item in &items {
                    out.push(yaml_scalar(item, key)?);
                }
            }
            serde_yaml::Value::Sequence(items) => {
                for item in &items {
                    out.push(flag.clone());
                    out.push(yaml_scalar(item, key)?);
                }
            }
            other => {
                out.push(flag);
                out.push(yaml_scalar(&other, key)?);
            }
        }
    }
    Ok(out)
}

fn yaml_scalar(v: &serde_yaml::Value, key: &str) -> Result<String, String> {
    match v {
        serde_yaml::Value::String(s) => Ok(s.clone()),
        serde_yaml::Value::Number(n) => Ok(n.to_string()),
        serde_yaml::Value::Bool(b) => Ok(b.to_string()),
        // Objects (e.g. media-io-kwargs, compilation-config) are passed on as JSON.
        serde_yaml::Value::Mapping(_) => {
            let json: serde_json::Value = serde_yaml::from_value(v.clone())
                .map_err(|e| format!("--config key {key}: {e}"))?;
            Ok(json.to_string())
        }
        _ => Err(format!("--config key {key}: unsupported value")),
    }
}

/// The long name of a normalised option token (`--x=false` -> `x`).
fn family(token: &str) -> Option<&str> {
    let name = token.strip_prefix("--")?;
    Some(name.split('=').next().unwrap_or(name))
}

/// argv with the `--config` file's flags spliced in after the subcommand, less those the
/// command line gives itself (the command line wins); and where the file's tokens sit.
fn expand_config(argv: Vec<String>) -> Result<(Vec<String>, Range<usize>), String> {
    let mut path: Option<PathBuf> = None;
    for (i, token) in argv.iter().enumerate() {
        if token == "--config" {
            path = argv.get(i + 1).map(PathBuf::from);
            break;
        }
        if let Some(p) = token.strip_prefix("--config=") {
            path = Some(PathBuf::from(p));
            break;
        }
    }
    let Some(path) = path else {
        return Ok((argv, 0..0));
    };
    let given: std::collections::HashSet<&str> = argv.iter().filter_map(|t| family(t)).collect();
    let from_file = normalise(
        ["gateway".to_string(), "serve".to_string()]
            .into_iter()
            .chain(config_to_args(&path)?)
            .collect(),
    )
    .map_err(|e| format!("--config {}: {e}", path.display()))?;
    let mut extra = Vec::new();
    let mut keep = false;
    for token in from_file.into_iter().skip(2) {
        if let Some(name) = family(&token) {
            keep = !given.contains(name);
        }
        if keep {
            extra.push(token);
        }
    }
    let split = 2.min(argv.len());
    let span = split..split + extra.len();
    let mut out = argv[..split].to_vec();
    out.extend(extra);
    out.extend_from_slice(&argv[split..]);
    Ok((out, span))
}

/// Judge the flags the table answers and `ServeArgs` does not: a refused one stops the start;
/// no-effect and deprecated ones are collected for the warnings.
fn review(matches: &ArgMatches) -> Result<Review, CliError> {
    let mut review = Review::default();
    for flag in FLAGS {
        let id = flag.long();
        for (long, value, why) in REMOVED_VALUES {
            if *long == id && given_values(matches, flag).iter().any(|v| v == value) {
                return Err(CliError::Refused(format!("--{long} {value}: {why}")));
            }
        }
        if matches!(flag.answer, Answer::Honoured(_)) {
            continue;
        }
        let values = given_values(matches, flag);
        if values.is_empty() {
            continue;
        }
        match flag.answer {
            Answer::Honoured(_) => {}
            Answer::Only(allowed, why) => {
                let judged: &[String] = match flag.kind {
                    // The last of `--x` / `--no-x` wins, as in vLLM.
                    Kind::Bool | Kind::Switch | Kind::Value => &values[values.len() - 1..],
                    _ => &values,
                };
                if let Some(bad) = judged.iter().find(|v| !allowed.contains(&v.trim())) {
                    return Err(CliError::Refused(format!(
                        "{}: {why}",
                        shown(flag, bad.trim())
                    )));
                }
            }
            Answer::NoEffect(_) => review.no_effect.push(format!("--{id}")),
            Answer::Refused(why) => {
                return Err(CliError::Refused(format!("--{id}: {why}")));
            }
            Answer::Deprecated(why) => review.deprecated.push(format!("--{id}: {why}")),
        }
    }
    Ok(review)
}

/// The values given for a row `ServeArgs` does not declare, as text (`true` / `false` for
/// switches and booleans); empty when it was not given.
fn given_values(matches: &ArgMatches, flag: &Flag) -> Vec<String> {
    let id = flag.long();
    if matches!(flag.answer, Answer::Honoured(_)) {
        return Vec::new();
    }
    if flag.kind == Kind::Switch {
        return if matches.get_flag(id) {
            vec!["true".into()]
        } else {
            Vec::new()
        };
    }
    matches
        .get_many::<String>(id)
        .map(|values| values.cloned().collect())
        .unwrap_or_default()
}

/// The README's table: every argument and what this server does with it, then the flags vLLM
/// removed.
pub fn markdown_table() -> String {
    let mut out = String::from("| group | flag | here |\n|---|---|---|\n");
    for flag in FLAGS {
        let names: Vec<String> = flag.spellings().map(|s| format!("`{s}`")).collect();
        let text = answer_text(flag).replace('|', "\\|");
        out.push_str(&format!(
            "| {} | {} | {text} |\n",
            flag.group,
            names.join(", ")
        ));
    }
    out.push_str("\n| removed from vLLM | refused with |\n|---|---|\n");
    for (name, why) in REMOVED {
        out.push_str(&format!("| `{name}` | {} |\n", why.replace('|', "\\|")));
    }
    for (long, value, why) in REMOVED_VALUES {
        out.push_str(&format!("| `--{long} {value}` | {why} |\n"));
    }
    out
}
