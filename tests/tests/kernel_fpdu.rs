//! The kernel module's FPDU parser (`kernel-shim/xiw_fpdu.c`), built for
//! user space with `tests/c/xiw_fpdu_frames.c`: frames laid out by hand from
//! RFC 5044, RFC 5041 and RFC 5040 are placed, left for user space or wait
//! for more bytes as they should, each refusal of the region check refuses,
//! and its CRC32c is the standard one, on the wire least significant byte
//! first. (The `kernel_fpdu` fuzz target checks it against the engine.)
//!
//! By hand:
//!
//! ```text
//! gcc -Ikernel-shim -o xiw_fpdu_frames tests/c/xiw_fpdu_frames.c kernel-shim/xiw_fpdu.c
//! ./xiw_fpdu_frames
//! ```

use std::process::Command;

use xiw_tests::cprog::module_program;

#[test]
fn hand_made_frames_are_placed_left_or_waited_for() {
    let bin = module_program("xiw_fpdu_frames", &["xiw_fpdu"]);
    let out = Command::new(&bin)
        .output()
        .expect("running xiw_fpdu_frames");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "xiw_fpdu_frames: {:?}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", text.trim());
}
