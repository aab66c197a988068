//! What the settings' one definition gives besides the parsing: the table of
//! `docs/configuration.md` (`tests/it/settings.rs` fails when the file differs), the variable's
//! name in a refusal, and the two ways the environment is read (as it is, and not at all).

use std::ffi::OsStr;

/// The settings' command on its own (no subcommands): what the reference and its test read.
pub fn command() -> clap::Command {
    <super::Settings as clap::CommandFactory>::command()
}

/// `cmd` reading the environment, a variable that is set but blank counting as unset.
pub fn reading_env(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|a| {
        let blank = a
            .get_env()
            .map(|name| std::env::var_os(name).is_some_and(|v| v.to_string_lossy().trim().is_empty()))
            .unwrap_or(false);
        if blank {
            a.env(None::<&'static str>)
        } else {
            a
        }
    })
}

/// `cmd` reading no variable: the defaults only (tests).
pub fn ignoring_env(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|a| a.env(None::<&'static str>))
}

/// A refusal of the settings as the operator reads it: the variable (and its flag) named first.
pub fn explain(e: clap::Error) -> anyhow::Error {
    let cmd = <super::Settings as clap::CommandFactory>::command();
    use clap::error::{ContextKind, ContextValue};
    let named = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => Some(arg.clone()),
        Some(ContextValue::Strings(args)) => args.first().cloned(),
        _ => None,
    };
    let rendered = e.render().to_string();
    let detail = rendered
        .lines()
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .trim();
    let variable = named.and_then(|named| {
        let flag = named
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .trim_start_matches("--")
            .to_string();
        cmd.get_arguments()
            .find(|a| a.get_long() == Some(flag.as_str()))
            .and_then(|a| a.get_env())
            .map(|v| v.to_string_lossy().into_owned())
    });
    match variable {
        Some(v) => anyhow::anyhow!("{v}: {detail}"),
        None => anyhow::anyhow!("{detail}"),
    }
}

/// One setting as the reference lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub variable: String,
    pub flag: String,
    /// The default as written, or `None` (unset).
    pub default: Option<String>,
    pub meaning: String,
    pub secret: bool,
}

/// Every setting of `cmd` (a command holding [`super::Config`]'s arguments), in its order.
pub fn settings(cmd: &clap::Command) -> Vec<Setting> {
    cmd.get_arguments()
        .filter_map(|a| {
            let variable = a.get_env()?.to_string_lossy().into_owned();
            let default: Vec<&OsStr> = a.get_default_values().iter().map(|v| v.as_os_str()).collect();
            let default = match default.as_slice() {
                [] => None,
                [one] if one.is_empty() => None,
                many => Some(many.iter().map(|v| v.to_string_lossy()).collect::<Vec<_>>().join(",")),
            };
            let meaning = a
                .get_long_help()
                .or(a.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default();
            Some(Setting {
                flag: format!("--{}", a.get_long().unwrap_or_default()),
                variable,
                default,
                meaning: meaning.split_whitespace().collect::<Vec<_>>().join(" "),
                secret: a.is_hide_env_values_set(),
            })
        })
        .collect()
}

/// The Markdown table of `docs/configuration.md`.
pub fn markdown_table(cmd: &clap::Command) -> String {
    let mut out = String::from("| variable | flag | default | meaning |\n| --- | --- | --- | --- |\n");
    for s in settings(cmd) {
        let default = match &s.default {
            Some(d) => format!("`{d}`"),
            None => "unset".into(),
        };
        let secret = if s.secret {
            " `--help` and the logs never show its value."
        } else {
            ""
        };
        out.push_str(&format!(
            "| `{}` | `{}` | {default} | {}.{secret} |\n",
            s.variable,
            s.flag,
            s.meaning.replace('|', "\\|")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command() -> clap::Command {
        <super::super::Settings as clap::CommandFactory>::command()
    }

    #[test]
    fn every_setting_has_a_variable_a_flag_and_a_meaning_once() {
        let all = settings(&command());
        assert!(all.len() > 80, "{}", all.len());
        let mut seen = std::collections::HashSet::new();
        for s in &all {
            assert!(seen.insert(s.variable.clone()), "{} twice", s.variable);
            assert!(!s.meaning.is_empty(), "{} says nothing", s.variable);
            assert!(s.flag.len() > 2, "{} has no flag", s.variable);
        }
        for secret in [
            "FITORDER_JWT_SECRET",
            "WECHATPAY_APIV3_KEY",
            "WECHAT_MINIPROGRAM_SECRET",
            "FITORDER_METRICS_TOKEN",
        ] {
            assert!(all.iter().any(|s| s.variable == secret && s.secret), "{secret}");
        }
        // The two the hand-written help had lost.
        for v in ["FITORDER_OUTBOX_WORKERS", "FITORDER_OUTBOX_BATCH"] {
            assert!(all.iter().any(|s| s.variable == v), "{v}");
        }
    }

    #[test]
    fn a_blank_variable_counts_as_unset() {
        // The only test of this crate that sets a variable; the others read none.
        std::env::set_var("FITORDER_ORDER_TIMEOUT", "  ");
        std::env::set_var("FITORDER_SCAN_INTERVAL", "7s");
        let c = super::super::Config::from_env().unwrap();
        std::env::remove_var("FITORDER_ORDER_TIMEOUT");
        std::env::remove_var("FITORDER_SCAN_INTERVAL");
        assert_eq!(c.order_timeout, std::time::Duration::from_secs(900));
        assert_eq!(c.scan_interval, std::time::Duration::from_secs(7));
    }
}
