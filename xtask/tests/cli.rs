//! The `cargo xtask` command line: the tasks it names when given none, and the
//! architecture names `build-kernels` refuses before it compiles or writes
//! anything. (This test is also why the workspace's one test build produces
//! `target/debug/xtask`, with the workspace's features, which scripts/test.sh
//! then runs to build the kernels.)

use std::process::Command;

fn xtask() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
}

#[test]
fn without_a_task_it_names_the_tasks_and_fails() {
    let out = xtask().output().expect("xtask runs");
    assert!(!out.status.success(), "xtask without a task succeeded");
    let usage = String::from_utf8_lossy(&out.stderr);
    for task in ["build-kernels", "codegen", "gpu-bundle"] {
        assert!(usage.contains(task), "the usage does not name `{task}`:\n{usage}");
    }
}

#[test]
fn build_kernels_refuses_an_architecture_nvcc_cannot_take_before_writing() {
    let out_dir = tempfile::tempdir().expect("a temporary folder");
    for bad in ["ampere", "sm_9", "compute_90", "sm_90ab", ""] {
        let out =
            xtask().args(["build-kernels", "--arch", bad, "--out"]).arg(out_dir.path()).output().expect("xtask runs");
        assert!(!out.status.success(), "--arch '{bad}' was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("invalid architecture `{bad}`")), "--arch '{bad}':\n{err}");
        let written = std::fs::read_dir(out_dir.path()).expect("the folder is there").count();
        assert_eq!(written, 0, "--arch '{bad}' wrote into the output folder");
    }
}
