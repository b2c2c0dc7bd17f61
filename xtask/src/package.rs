//! `cargo xtask package`: the Debian package, target/debian/heartbeat-monitor_*.deb, and its
//! debug symbols, heartbeat-monitor-dbgsym_*.ddeb (the binary's line tables, for profiling).
//!
//! Builds the release binary, stages what is generated from it under target/debian/staging/
//! (the unit with the package's paths, man pages and shell completions, all written by the
//! binary just built), then runs cargo-deb on monitor/Cargo.toml's `[package.metadata.deb]`,
//! which strips the binary into the package and its debug data into the dbgsym package. The
//! dbgsym package is then given what debhelper gives its own (`debian_dbgsym`).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{build, setup, workspace};

/// Where the package installs the binary; the unit as shipped in packaging/systemd/ expects it
/// under /usr/local/bin (installed by hand).
pub const PACKAGE_BINARY: &str = "/usr/bin/monitor";
const CHECKOUT_BINARY: &str = "/usr/local/bin/monitor";
/// The system account the package creates; its group may query the socket.
pub const ACCOUNT: &str = "heartbeat-monitor";

pub fn run() -> Result<()> {
    setup::ensure()?;
    build::build(true)?;
    let deb = package(Build::Release)?;
    println!("package: {}", deb.display());
    Ok(())
}

/// Which build goes into the package.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// The release build, xz-compressed: what `cargo xtask package` ships.
    Release,
    /// The debug build the tests run, with cargo-deb's fast compression: what
    /// `cargo xtask test` checks. The package's contents, scripts, unit and dbgsym split do not
    /// depend on the profile, and this spares the test command a release build of every
    /// dependency (355 s of its 1028 s here, 445 s on a CI run), and the package step takes
    /// 4-17 s against 37. Only the binary's optimisation differs.
    Test,
}

fn debian_dir() -> PathBuf {
    workspace::root().join("target").join("debian")
}

/// Stages the generated files and runs cargo-deb; the .deb's path.
pub fn package(build: Build) -> Result<PathBuf> {
    let bin = build::monitor_bin(build == Build::Release);
    let out = debian_dir();
    let staging = out.join("staging");
    if staging.exists() {
        fs::remove_dir_all(&staging)?;
    }
    // Old packages (another version) would make the test's choice ambiguous.
    if out.exists() {
        for entry in fs::read_dir(&out)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "deb" || e == "ddeb") {
                fs::remove_file(&path)?;
            }
        }
    }
    stage_unit(&staging.join("systemd"))?;
    stage_man_pages(&bin, &staging.join("man"))?;
    stage_completions(&bin, &staging.join("completions"))?;

    let mut deb = workspace::cargo();
    deb.args(["deb", "--package", "monitor", "--no-build"]);
    if build == Build::Test {
        deb.args(["--profile", "dev", "--fast"]);
    }
    workspace::run(deb.arg("--output").arg(&out))?;
    debian_dbgsym(&only(&out, "ddeb")?, &staging.join("dbgsym"), build)?;
    only(&out, "deb")
}

/// The one file in `dir` whose name ends in `.EXT`.
fn only(dir: &Path, ext: &str) -> Result<PathBuf> {
    let found: Vec<PathBuf> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        other => bail!("expected one .{ext} in {}, found {other:?}", dir.display()),
    }
}

/// Remakes cargo-deb's dbgsym package the way debhelper's dh_strip makes Debian's, which
/// lintian accepts: cargo-deb's has no copyright file and no changelog, and the priority
/// `extra`, which Debian retired (three lintian errors). debhelper's points its
/// documentation directory at the package it carries the symbols of
/// (`usr/share/doc/NAME-dbgsym -> NAME`), which a dependency on that package's exact version
/// makes the dbgsym package's own copyright and changelog; it says `optional`, and names the
/// build ids it holds (`Build-Ids`).
fn debian_dbgsym(ddeb: &Path, root: &Path, build: Build) -> Result<()> {
    if root.exists() {
        fs::remove_dir_all(root)?;
    }
    workspace::run(Command::new("dpkg-deb").arg("-R").arg(ddeb).arg(root))?;
    let control_path = root.join("DEBIAN/control");
    let control = fs::read_to_string(&control_path)
        .with_context(|| format!("reading {}", control_path.display()))?;
    let mut debugs = None;
    let mut lines = Vec::new();
    // One paragraph: an empty line (cargo-deb ends with one) would end it before Build-Ids.
    for line in control.lines().filter(|l| !l.is_empty()) {
        if line.starts_with("Priority: ") {
            lines.push("Priority: optional".to_string());
        } else if let Some(dep) = line.strip_prefix("Recommends: ") {
            debugs = dep.split(' ').next().map(str::to_string);
            lines.push(format!("Depends: {dep}"));
        } else {
            lines.push(line.to_string());
        }
    }
    let Some(debugs) = debugs else {
        bail!(
            "{}: no `Recommends: PACKAGE (= VERSION)` (has cargo-deb changed?)",
            control_path.display()
        );
    };
    let ids = build_ids(&root.join("usr/lib/debug/.build-id"))?;
    if ids.is_empty() {
        bail!("{} holds no debug file", ddeb.display());
    }
    lines.push(format!("Build-Ids: {}", ids.join(" ")));
    fs::write(&control_path, lines.join("\n") + "\n")?;
    let doc = root.join("usr/share/doc");
    fs::create_dir_all(&doc)?;
    std::os::unix::fs::symlink(&debugs, doc.join(format!("{debugs}-dbgsym")))?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    workspace::run(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zxz"])
            // The test build's debug data is 2.5 times the release build's: xz at level 1.
            .args((build == Build::Test).then_some("-z1"))
            .arg(format!("--threads-max={threads}"))
            .arg("--build")
            .arg(root)
            .arg(ddeb),
    )?;
    fs::remove_dir_all(root)?;
    Ok(())
}

/// The build ids of the debug files under a `.build-id` directory (`ab/cdef....debug`).
fn build_ids(dir: &Path) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    for prefix in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let prefix = prefix?;
        for file in fs::read_dir(prefix.path())? {
            let name = file?.file_name().to_string_lossy().into_owned();
            if let Some(rest) = name.strip_suffix(".debug") {
                ids.push(format!("{}{rest}", prefix.file_name().to_string_lossy()));
            }
        }
    }
    ids.sort();
    Ok(ids)
}

/// packaging/systemd/heartbeat-monitor.service with the package's binary, and the package's
/// account as a supplementary group so that `socket-group = "heartbeat-monitor"` (the
/// packaged monitor.toml) hands it the socket without CAP_CHOWN.
fn stage_unit(dir: &Path) -> Result<()> {
    let source = workspace::root().join("packaging/systemd/heartbeat-monitor.service");
    let unit =
        fs::read_to_string(&source).with_context(|| format!("reading {}", source.display()))?;
    let exec = format!("ExecStart={CHECKOUT_BINARY} ");
    if unit.matches(&exec).count() != 1 {
        bail!("{} should start {CHECKOUT_BINARY} once", source.display());
    }
    let anchor = "NoNewPrivileges=yes\n";
    if unit.matches(anchor).count() != 1 {
        bail!("{} should set {anchor:?} once", source.display());
    }
    let unit = unit
        .replace(&exec, &format!("ExecStart={PACKAGE_BINARY} "))
        .replace(
            "Install steps: packaging/systemd/README.md.",
            "Installed by the heartbeat-monitor package.",
        )
        .replace(
            anchor,
            &format!(
                "{anchor}# The package's account: the packaged monitor.toml sets socket-group = \
                 \"{ACCOUNT}\",\n# which the agent may then hand the socket to without \
                 CAP_CHOWN.\nSupplementaryGroups={ACCOUNT}\n"
            ),
        );
    fs::create_dir_all(dir)?;
    fs::write(dir.join("heartbeat-monitor.service"), unit)?;
    Ok(())
}

/// `monitor manpage --out`, each page gzipped (Debian policy 12.1).
fn stage_man_pages(bin: &Path, dir: &Path) -> Result<()> {
    workspace::run(Command::new(bin).arg("manpage").arg("--out").arg(dir))?;
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "1") {
            // -n: no name or time stamp, so the same pages give the same bytes.
            workspace::run(Command::new("gzip").args(["-9", "-n", "-f"]).arg(&path))?;
        }
    }
    Ok(())
}

/// `monitor completions SHELL` for bash, zsh and fish, named as each shell looks for them.
fn stage_completions(bin: &Path, dir: &Path) -> Result<()> {
    fs::create_dir_all(dir)?;
    for (shell, name) in [
        ("bash", "monitor"),
        ("zsh", "_monitor"),
        ("fish", "monitor.fish"),
    ] {
        let script = workspace::output(Command::new(bin).args(["completions", shell]))?;
        fs::write(dir.join(name), script)?;
    }
    Ok(())
}
