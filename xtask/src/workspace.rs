//! Where things are, and how to run commands so they find the project's own tools.

use std::{
    env,
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// The project's own tool prefix (bpf-linker and the LLVM it links against).
pub fn tools_dir() -> PathBuf {
    root().join("target").join("tools")
}

/// PATH with the project's tools first.
pub fn path_with_tools() -> OsString {
    let mut paths = vec![tools_dir().join("bin")];
    if let Some(path) = env::var_os("PATH") {
        paths.extend(env::split_paths(&path));
    }
    env::join_paths(paths).expect("PATH entries contain no separator")
}

/// A command run from the workspace root with the project's tools on PATH.
pub fn command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(root()).env("PATH", path_with_tools());
    cmd
}

pub fn cargo() -> Command {
    command(&env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Runs `cmd`, failing with the command line if it fails.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Runs `cmd` and returns its stdout.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn is_root() -> bool {
    // `id -u` avoids a libc dependency for one call.
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

pub fn require_root(task: &str) -> Result<()> {
    if !is_root() {
        bail!(
            "`cargo xtask {task}` loads XDP programs and creates network namespaces: run it as \
             root (e.g. `sudo -E cargo xtask {task}`)"
        );
    }
    Ok(())
}
