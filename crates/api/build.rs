//! GraphiQL's browser assets, embedded in the binary so that `GET /graphql` works without the
//! internet. The versions are pinned (with their integrity hashes) by
//! `playground/graphiql/package-lock.json`; the files come from npm, looked for in order:
//!
//! 1. `FITORDER_GRAPHIQL_DIR` (a `node_modules` directory installed from that lock file),
//! 2. `playground/graphiql/node_modules` (after `npm ci --prefix playground/graphiql`),
//! 3. an `npm ci` of that lock file into the build's own directory, tried once per build
//!    directory when `npm` is on PATH (set `FITORDER_NO_NPM=1` to never run it).
//!
//! Without them the build still succeeds: `GET /graphql` then serves a page that says how to
//! get GraphiQL, and the API is unaffected.

use std::path::{Path, PathBuf};
use std::process::Command;

/// (name served under /graphql/assets/, path inside node_modules)
const ASSETS: &[(&str, &str)] = &[
    ("graphiql.min.js", "graphiql/graphiql.min.js"),
    ("graphiql.min.css", "graphiql/graphiql.min.css"),
    ("react.production.min.js", "react/umd/react.production.min.js"),
    (
        "react-dom.production.min.js",
        "react-dom/umd/react-dom.production.min.js",
    ),
    ("graphql-ws.min.js", "graphql-ws/umd/graphql-ws.min.js"),
];

fn complete(dir: &Path) -> bool {
    ASSETS.iter().all(|(_, rel)| dir.join(rel).is_file())
}

fn main() {
    // The workspace's root: this crate is crates/api.
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../..");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let pkg = root.join("playground/graphiql");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../../playground/graphiql/package-lock.json");
    println!("cargo:rerun-if-env-changed=FITORDER_GRAPHIQL_DIR");
    println!("cargo:rerun-if-env-changed=FITORDER_NO_NPM");

    let local = pkg.join("node_modules");
    if !local.exists() {
        // Picks up a later `npm ci --prefix playground/graphiql`.
        println!("cargo:rerun-if-changed=../../playground/graphiql");
    }
    let built = out.join("npm/node_modules");
    let found = std::env::var_os("FITORDER_GRAPHIQL_DIR")
        .map(PathBuf::from)
        .filter(|d| complete(d))
        .or_else(|| complete(&local).then(|| local.clone()))
        .or_else(|| complete(&built).then(|| built.clone()))
        .or_else(|| {
            npm_ci(&pkg, &out.join("npm"))
                .then(|| built.clone())
                .filter(|d| complete(d))
        });

    let mut code = String::from("/// GraphiQL's assets (name, bytes), empty when the build had none.\n");
    code.push_str("pub const GRAPHIQL_ASSETS: &[(&str, &[u8])] = &[\n");
    match &found {
        Some(dir) => {
            for (name, rel) in ASSETS {
                let path = dir.join(rel);
                // Files this script installed itself (under OUT_DIR) are newer than its own start:
                // naming them would make every next build run it, and rebuild the crate, again.
                // Those follow the lock file, which is watched above.
                if !path.starts_with(&out) {
                    println!("cargo:rerun-if-changed={}", path.display());
                }
                code.push_str(&format!(
                    "    ({name:?}, include_bytes!({:?})),\n",
                    path.display().to_string()
                ));
            }
        }
        None => println!(
            "cargo:warning=GraphiQL's assets were not found (npm unavailable or offline): GET /graphql will say how to \
             get them. Run `npm ci --prefix playground/graphiql` (or set FITORDER_GRAPHIQL_DIR) and build again."
        ),
    }
    code.push_str("];\n");
    std::fs::write(out.join("graphiql_assets.rs"), code).unwrap();
}

/// `npm ci` of the pinned lock file into `dir`, once per build directory.
fn npm_ci(pkg: &Path, dir: &Path) -> bool {
    if std::env::var_os("FITORDER_NO_NPM").is_some() {
        return false;
    }
    let marker = dir.join(".attempted");
    if marker.exists() {
        return false;
    }
    let _ = std::fs::create_dir_all(dir);
    let _ = std::fs::write(&marker, b"");
    for f in ["package.json", "package-lock.json"] {
        if std::fs::copy(pkg.join(f), dir.join(f)).is_err() {
            return false;
        }
    }
    let ok = Command::new("npm")
        .args([
            "ci",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            "--fetch-timeout=30000",
            "--fetch-retries=1",
        ])
        .current_dir(dir)
        // npm's chatter must not reach cargo, which reads this script's stdout.
        .stdout(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        println!("cargo:warning=`npm ci` of playground/graphiql failed; GraphiQL is not embedded in this build");
    }
    ok
}
