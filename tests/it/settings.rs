//! The settings are defined once (`crates/base/src/config.rs`, clap's derive): the table of
//! `docs/configuration.md` and `fitorder --help` come from that definition, and this test fails
//! when either differs (`FITORDER_BLESS=1 cargo test --test it settings` writes the table).

use std::path::Path;

use fitorder::config::reference;

#[test]
fn docs_configuration_is_the_settings_table() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = ("<!-- settings: generated -->\n", "<!-- settings: end -->");
    let a = doc.find(begin).expect("the table's start marker") + begin.len();
    let b = doc.find(end).expect("the table's end marker");
    let want = reference::markdown_table(&reference::command());
    if doc[a..b] != want {
        if std::env::var_os("FITORDER_BLESS").is_some() {
            std::fs::write(&path, format!("{}{want}{}", &doc[..a], &doc[b..])).unwrap();
        } else {
            panic!(
                "docs/configuration.md's table differs from the settings' definition; run \
                 FITORDER_BLESS=1 cargo test --test it settings, or write:\n{want}"
            );
        }
    }
}

#[test]
fn fitorder_help_lists_every_setting_with_its_variable_and_flag() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fitorder"))
        .arg("--help")
        .env("FITORDER_JWT_SECRET", "a-secret-that-help-must-never-print-0123456789")
        .env("DATABASE_URL", "postgres://app:pgPASSWORDinHELP@db/x")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let settings = reference::settings(&reference::command());
    assert!(settings.len() > 80, "{}", settings.len());
    for s in &settings {
        assert!(
            help.contains(&format!("[env: {}", s.variable)),
            "--help lacks {}",
            s.variable
        );
        assert!(help.contains(&s.flag), "--help lacks {}", s.flag);
    }
    assert!(
        !help.contains("a-secret-that-help") && !help.contains("pgPASSWORDinHELP"),
        "{help}"
    );
    // The commands are there too.
    for command in [
        "serve",
        "worker",
        "migrate",
        "token",
        "seed",
        "reconcile",
        "alerts",
        "schema",
    ] {
        assert!(help.contains(&format!("  {command} ")), "--help lacks {command}");
    }
}

#[test]
fn a_bad_setting_stops_the_start_naming_its_variable() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fitorder"))
        .args(["token", "--role", "admin", "--sub", "x"])
        .env("FITORDER_OUTBOX_BATCH", "many")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("FITORDER_OUTBOX_BATCH") && err.contains("many"), "{err}");
    // Blank is unset: the token is printed.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fitorder"))
        .args(["token", "--role", "admin", "--sub", "x"])
        .env("FITORDER_OUTBOX_BATCH", " ")
        .env("FITORDER_JWT_SECRET", "3f9a1c7e5b2d4f6a8c0e1b3d5f7a9c2e")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("eyJ"));
}
