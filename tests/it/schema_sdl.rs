//! The exported schema is what the server serves, and the playground's documents are the
//! contract's.

#[test]
fn schema_file_matches_the_served_schema() {
    let served = fitorder::graphql::sdl();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schema/schema.graphql");
    if std::env::var("UPDATE_SCHEMA").is_ok() {
        std::fs::write(&path, &served).unwrap();
    }
    let file = std::fs::read_to_string(&path).unwrap();
    assert!(
        file == served,
        "schema/schema.graphql is stale: run `cargo run -- schema > schema/schema.graphql` (or UPDATE_SCHEMA=1 cargo test schema)"
    );
}

#[test]
fn playground_documents_are_the_contracts() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let contract = root.join("../shared/contract/operations");
    if !contract.exists() {
        eprintln!("../shared/contract is not beside this checkout; skipping the copy check");
        return;
    }
    for name in [
        "member.graphql",
        "admin.graphql",
        "ops.graphql",
        "next/member.graphql",
        "next/admin.graphql",
    ] {
        let theirs = std::fs::read_to_string(contract.join(name)).unwrap();
        let ours = std::fs::read_to_string(root.join("playground/operations").join(name)).unwrap();
        assert_eq!(theirs, ours, "playground/operations/{name} differs from the contract");
    }
}
