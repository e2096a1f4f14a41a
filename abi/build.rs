//! Generates the public `ibv_*` types from the installed rdma-core headers.

use std::env;
use std::path::PathBuf;

fn main() {
    let header =
        env::var("XIW_VERBS_H").unwrap_or_else(|_| "/usr/include/infiniband/verbs.h".into());
    println!("cargo:rerun-if-changed={header}");
    println!("cargo:rerun-if-env-changed=XIW_VERBS_H");

    let bindings = bindgen::Builder::default()
        .header(&header)
        .allowlist_type("ibv_.*")
        .allowlist_type("verbs_context")
        .allowlist_type("verbs_ex_private")
        .allowlist_var("IBV_.*")
        .allowlist_var("IB_.*")
        .blocklist_function(".*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(true)
        .generate_comments(false)
        .generate()
        .expect("bindgen over infiniband/verbs.h (apt-get install libibverbs-dev libclang-dev)");

    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("verbs.rs");
    bindings.write_to_file(out).expect("write bindings");
}
