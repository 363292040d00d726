//! `include/tiermem.h` is what cbindgen makes of `src/` today: C users and the preload
//! library get the header from the repository, and it cannot drift from the Rust functions.

use std::path::Path;

#[test]
fn the_committed_header_matches_the_source() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("read cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen could not generate the header from src/")
        .write(&mut generated);
    let path = dir.join("include/tiermem.h");
    let committed = std::fs::read(&path).unwrap_or_default();
    if generated == committed {
        return;
    }
    if std::env::var_os("TIERMEM_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/tiermem.h");
        return;
    }
    panic!(
        "crates/capi/include/tiermem.h is not what cbindgen makes of src/: regenerate it with \
         `TIERMEM_BLESS=1 cargo test -p tiermem-capi --test header` and commit it"
    );
}
