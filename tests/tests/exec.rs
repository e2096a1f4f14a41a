//! `xiw exec` on the host: a user without privileges brings up a device of
//! their own (`xiw up --root DIR`, no device nodes in /dev) and runs
//! unmodified perftest and `ibv_rc_pingpong` pairs through `xiw exec`, which
//! gives each program a user and mount namespace with the tree's device
//! nodes and a seccomp filter that hides RDMA netlink; the rest of the
//! system (and every program outside `xiw exec`) sees nothing of it. Root's
//! `xiw exec` on a tree whose nodes are in /dev needs no namespace. The
//! kernel here has no RDMA core; the guest test (`tests/vm/guest/exec.sh`,
//! booted by `vm_exec.rs`) runs the same with ib_core loaded.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use xiw_tests::harness::{
    as_user, check_perftest, check_pingpong, device_at, device_down, run_tool_pair, serial, Device,
};

/// The unprivileged user the tests run as (nobody).
const USER: u32 = 65534;
const TIMEOUT: Duration = Duration::from_secs(120);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `argv`, as `uid` if given; its output.
fn run(uid: Option<u32>, argv: &[&str]) -> Output {
    let mut words: Vec<std::ffi::OsString> = uid.map(as_user).unwrap_or_default();
    words.extend(argv.iter().map(Into::into));
    Command::new(&words[0])
        .args(&words[1..])
        .env_remove("SYSFS_PATH")
        .env_remove("RDMAV_DRIVERS")
        .output()
        .unwrap_or_else(|e| panic!("running {words:?}: {e}"))
}

/// `argv` succeeded; its standard output.
fn ok(uid: Option<u32>, argv: &[&str]) -> String {
    let out = run(uid, argv);
    assert!(
        out.status.success(),
        "{argv:?} as {uid:?}: {:?}\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// A directory `uid` owns, made afresh.
fn user_dir(name: &str, uid: u32) -> PathBuf {
    let dir = PathBuf::from(format!("/tmp/xiw-tests-exec/{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("making the user's directory");
    let parent = dir.parent().unwrap();
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let st = Command::new("chown")
        .arg(format!("{uid}:{uid}"))
        .arg(&dir)
        .status()
        .expect("chown");
    assert!(st.success());
    dir
}

/// What /dev/infiniband holds on the host, to see that nothing changed it.
fn dev_infiniband() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev/infiniband")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The name of the one uverbs entry of the tree at `sysfs`.
fn uverbs_entry(sysfs: &Path) -> String {
    let names: Vec<String> = std::fs::read_dir(sysfs.join("class/infiniband_verbs"))
        .expect("the tree's uverbs entries")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "abi_version")
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    names[0].clone()
}

/// A user's device on `lo`: `xiw up` as that user says to use `xiw exec`,
/// prints no SYSFS_PATH, and makes no node.
fn user_device(uid: u32) -> Device {
    let home = user_dir("user", uid);
    let tree = home.join("tree");
    let tree_s = tree.to_str().unwrap();
    let before = dev_infiniband();
    let out = run(
        Some(uid),
        &["xiw", "up", "--netdev", "lo", "--root", tree_s],
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "xiw up as {uid}: {err}");
    assert!(
        out.stdout.is_empty(),
        "xiw up printed to stdout without nodes: {}",
        text(&out.stdout)
    );
    assert!(
        err.contains(&format!("xiw exec --root {tree_s} -- PROGRAM")),
        "xiw up does not say how to proceed:\n{err}"
    );
    assert_eq!(
        dev_infiniband(),
        before,
        "xiw up of a user changed /dev/infiniband"
    );
    let links = std::fs::read_dir(tree.join("provider"))
        .expect("the tree's provider links")
        .count();
    assert_eq!(links, 5, "one provider link per private ABI");
    Device {
        sysfs: tree,
        netns: None,
        addr: "127.0.0.1".into(),
        exec: Some(Some(uid)),
    }
}

/// An unprivileged user's `xiw exec`: perftest (`ib_write_lat`,
/// `ib_read_bw`) and `ibv_rc_pingpong` between two such processes, with
/// every message checked; inside, the program runs as that same user
/// (uid, no capabilities), under the seccomp filter, with no_new_privs, and
/// with the tree's node in a /dev/infiniband of its own (a character device
/// 1:7, which the user could not have made), while /dev outside stays
/// untouched and programs outside `xiw exec` list no xiw device.
#[test]
fn an_unprivileged_user_runs_perftest_and_pingpong_through_xiw_exec() {
    let _g = serial();
    let dev = user_device(USER);
    let root = dev.sysfs.to_str().unwrap().to_owned();

    let inside = ok(
        Some(USER),
        &[
            "xiw",
            "exec",
            "--root",
            &root,
            "--",
            "sh",
            "-c",
            "id -u; id -g; grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status; \
             readlink /proc/self/ns/user; \
             stat -c '%F %t:%T' /dev/infiniband/uverbs*; ls /dev/infiniband; \
             echo SYSFS_PATH=$SYSFS_PATH; echo RDMAV_DRIVERS=$RDMAV_DRIVERS; \
             test -c /dev/null && test -d /dev/shm && echo dev-kept",
        ],
    );
    for want in [
        &format!("{USER}\n{USER}\n"),
        "Seccomp:\t2\n",
        "NoNewPrivs:\t1\n",
        "CapEff:\t0000000000000000\n",
        "character special file 1:7\n",
        &format!("SYSFS_PATH={root}\n"),
        &format!("RDMAV_DRIVERS={root}/provider/libxiw\n"),
        "dev-kept\n",
    ] {
        assert!(
            inside.contains(want),
            "inside xiw exec, no {want:?}:\n{inside}"
        );
    }
    // A user namespace of its own, and a /dev/infiniband holding the tree's
    // node alone.
    let ours = std::fs::read_link("/proc/self/ns/user").expect("our user namespace");
    assert!(
        !inside.contains(&format!("{}\n", ours.display())),
        "no user namespace of its own:\n{inside}"
    );
    let node = uverbs_entry(&dev.sysfs);
    assert!(
        inside.contains(&format!("\n{node}\nSYSFS_PATH")),
        "/dev/infiniband inside does not hold {node} alone:\n{inside}"
    );
    let listed = ok(
        Some(USER),
        &["xiw", "exec", "--root", &root, "--", "ibv_devices"],
    );
    assert!(listed.contains("xiw0"), "ibv_devices inside: {listed}");
    // Outside there is no device at all here (the kernel has none, and
    // libibverbs is not pointed at the tree): ibv_devices lists none, or
    // fails for want of any.
    let outside = run(Some(USER), &["ibv_devices"]);
    assert!(
        !text(&outside.stdout).contains("xiw0"),
        "ibv_devices outside: {}",
        text(&outside.stdout)
    );

    for (tool, args, size, iters) in [
        ("ib_write_lat", &["-s", "2", "-n", "2000"][..], 2, 2000),
        (
            "ib_read_bw",
            &["-s", "65536", "-n", "1000"][..],
            65536,
            1000,
        ),
        (
            "ibv_rc_pingpong",
            &["-n", "500", "-s", "4096", "-c"][..],
            4096,
            500,
        ),
    ] {
        let pair = run_tool_pair(tool, &dev, &dev, args, TIMEOUT);
        let checked = if tool.starts_with("ibv_") {
            check_pingpong(&pair, size, iters)
        } else {
            check_perftest(tool, &pair, &[size], iters)
        };
        if let Err(e) = checked {
            panic!("{tool} through xiw exec as {USER}: {e}\n{}", pair.dump());
        }
    }
    ok(Some(USER), &["xiw", "down", "--root", &root]);
    assert!(!dev.sysfs.exists(), "xiw down left the tree");
}

/// Root's `xiw exec` on a tree whose nodes `xiw up` made in /dev (a kernel
/// without RDMA netlink): the program runs in the mount namespace it was
/// started in (no namespace is needed), under the filter but free of
/// no_new_privs, so set-user-ID programs keep working.
#[test]
fn root_runs_through_xiw_exec_without_a_namespace_where_the_nodes_exist() {
    let _g = serial();
    let tree = Path::new("/run/xiw/tests-exec-root");
    let dev = device_at(tree, "lo", "127.0.0.1");
    let root = dev.sysfs.to_str().unwrap().to_owned();
    let inside = ok(
        None,
        &[
            "xiw",
            "exec",
            "--root",
            &root,
            "--",
            "sh",
            "-c",
            "readlink /proc/self/ns/mnt; grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status",
        ],
    );
    let ours = std::fs::read_link("/proc/self/ns/mnt").expect("our mount namespace");
    assert!(
        inside.starts_with(&format!("{}\n", ours.display())),
        "xiw exec made a mount namespace although the nodes exist:\n{inside}"
    );
    assert!(
        inside.contains("Seccomp:\t2\n") && inside.contains("NoNewPrivs:\t0\n"),
        "{inside}"
    );
    let exec_dev = Device {
        exec: Some(None),
        ..dev.clone()
    };
    let pair = run_tool_pair(
        "ibv_rc_pingpong",
        &exec_dev,
        &exec_dev,
        &["-n", "200", "-s", "1024", "-c"],
        TIMEOUT,
    );
    if let Err(e) = check_pingpong(&pair, 1024, 200) {
        panic!(
            "ibv_rc_pingpong through xiw exec as root: {e}\n{}",
            pair.dump()
        );
    }
    device_down(tree);
}

/// `xiw exec`'s own failures, each one line on stderr: no tree (1), a
/// program that does not exist (127, as env(1)); a program's exit status
/// and signal come back as its own.
#[test]
fn xiw_exec_says_what_is_wrong_and_passes_exit_status_through() {
    let _g = serial();
    let out = run(
        Some(USER),
        &["xiw", "exec", "--root", "/nonexistent/tree", "--", "true"],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("xiw exec: no xiw devices at /nonexistent/tree (create them with `xiw up"),
        "{err}"
    );

    let dev = user_device(USER);
    let root = dev.sysfs.to_str().unwrap().to_owned();
    let out = run(
        Some(USER),
        &["xiw", "exec", "--root", &root, "--", "/no/such/program"],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert!(
        err.starts_with("xiw exec: /no/such/program: No such file or directory"),
        "{err}"
    );
    let out = run(
        Some(USER),
        &["xiw", "exec", "--root", &root, "--", "sh", "-c", "exit 3"],
    );
    assert_eq!(out.status.code(), Some(3));
    let out = run(
        Some(USER),
        &[
            "xiw",
            "exec",
            "--root",
            &root,
            "--",
            "sh",
            "-c",
            "kill -TERM $$",
        ],
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGTERM));
    // Arguments that look like options are the program's.
    let out = ok(
        Some(USER),
        &["xiw", "exec", "--root", &root, "--", "echo", "--root", "-x"],
    );
    assert_eq!(out, "--root -x\n");
    let out = run(Some(USER), &["xiw", "exec", "--root", &root]);
    assert_eq!(out.status.code(), Some(2), "no program: a usage error");
    ok(Some(USER), &["xiw", "down", "--root", &root]);
}

/// Where the kernel lets unprivileged users make no user namespace
/// (`user.max_user_namespaces=0`, set in a user namespace of the test's own
/// that maps every uid onto itself, so nothing outside it changes), a user's
/// `xiw exec` that needs one fails with one line that names the settings
/// and how to proceed, and the program never runs.
#[test]
fn xiw_exec_without_user_namespaces_says_so() {
    let _g = serial();
    let dev = user_device(USER);
    let root = dev.sysfs.to_str().unwrap().to_owned();
    let marker = dev.sysfs.parent().unwrap().join("ran");
    // The inner shell waits for its uid and gid maps (every id onto
    // itself), which the outer one, root, writes once it has unshared, then
    // runs the rest afresh: root in its namespace, with the capabilities
    // that gives.
    let then = dev.sysfs.parent().unwrap().join("then.sh");
    std::fs::write(
        &then,
        format!(
            "echo 0 >/proc/sys/user/max_user_namespaces && exec setpriv --reuid={USER} \
             --regid={USER} --clear-groups -- xiw exec --root {root} -- touch {}\n",
            marker.display()
        ),
    )
    .unwrap();
    let inner = format!(
        "while [ -z \"$(cat /proc/self/uid_map)\" ]; do sleep 0.02; done; exec sh {}",
        then.display()
    );
    let outer = format!(
        "unshare --user sh -c '{inner}' & p=$!; \
         while [ \"$(readlink /proc/$p/ns/user)\" = \"$(readlink /proc/self/ns/user)\" ]; do \
         sleep 0.02; done; \
         echo '0 0 65536' >/proc/$p/uid_map && echo '0 0 65536' >/proc/$p/gid_map; wait $p"
    );
    let out = run(None, &["sh", "-c", &outer]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("xiw exec: cannot make a user namespace (")
            && err.contains("user.max_user_namespaces")
            && err.contains("run `xiw exec` as root"),
        "{err}"
    );
    assert!(!marker.exists(), "the program ran");
    ok(Some(USER), &["xiw", "down", "--root", &root]);
}
