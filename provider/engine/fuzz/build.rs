//! Builds the kernel module's FPDU parser (kernel-shim/xiw_fpdu.c) for user
//! space, for the `kernel_fpdu` target. Under cargo fuzz it is built with
//! clang, libFuzzer's coverage and the sanitizer the Rust code has, so the
//! fuzzer sees its branches and its memory accesses are checked.

use std::env;

fn main() {
    let dir = "../../../kernel-shim";
    println!("cargo:rerun-if-changed={dir}/xiw_fpdu.c");
    println!("cargo:rerun-if-changed={dir}/xiw_fpdu.h");
    let mut b = cc::Build::new();
    b.file(format!("{dir}/xiw_fpdu.c"))
        .flag("-std=gnu11")
        .warnings_into_errors(true);
    // cc passes the Rust code's sanitizer on to clang by itself.
    if env::var_os("CARGO_CFG_FUZZING").is_some() {
        b.compiler("clang").flag("-fsanitize=fuzzer-no-link");
    }
    b.compile("xiw_fpdu");
}
