fn main() {
    // libibverbs loads `libxiw-rdmav34.so`; give the cdylib that soname.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libxiw-rdmav34.so");
}
