//! `embed_migrations!` reads `migrations/` at compile time: a new or changed migration must
//! rebuild this crate.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../../migrations");
}
