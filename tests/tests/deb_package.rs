//! The Debian package that `cargo xtask package` builds (and `cargo xtask test` builds before
//! the tests, of the debug build with fast compression, passing its path in
//! HEARTBEAT_MONITOR_DEB; xtask/src/package.rs says why), checked with the real tools: lintian
//! reports no error (in the dbgsym package either), `dpkg-deb --contents` lists exactly what
//! README.md says is installed (its conffiles too), the binary is stripped and its line tables
//! are in the dbgsym package, and the unit inside passes `systemd-analyze verify` without a
//! diagnostic. Nothing is installed.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use integration_tests::agent_process::TempDir;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The .deb under test; a missing one fails (never skips): build it with `cargo xtask package`.
fn deb() -> PathBuf {
    if let Some(path) = std::env::var_os("HEARTBEAT_MONITOR_DEB") {
        return path.into();
    }
    let dir = workspace().join("target/debian");
    let debs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|e| e == "deb"))
                .collect()
        })
        .unwrap_or_default();
    match debs.as_slice() {
        [deb] => deb.clone(),
        other => panic!(
            "want one .deb in {}, found {other:?}: `cargo xtask test` builds it (or `cargo xtask package`)",
            dir.display()
        ),
    }
}

/// The dbgsym package beside it.
fn ddeb() -> PathBuf {
    let deb = deb();
    let name = deb.file_name().unwrap().to_string_lossy().into_owned();
    let ddeb = deb.with_file_name(
        name.replacen("heartbeat-monitor_", "heartbeat-monitor-dbgsym_", 1)
            .replace(".deb", ".ddeb"),
    );
    assert!(ddeb.is_file(), "{} missing", ddeb.display());
    ddeb
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e} (cargo xtask setup installs it)"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The package unpacked (`dpkg-deb -x`, data; `-e`, control) in a directory of its own.
fn unpacked(deb: &Path) -> (TempDir, PathBuf, PathBuf) {
    let dir = TempDir::new("hbmdeb");
    let (root, control) = (dir.0.join("root"), dir.0.join("DEBIAN"));
    run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&root));
    run(Command::new("dpkg-deb").arg("-e").arg(deb).arg(&control));
    (dir, root, control)
}

#[test]
fn lintian_reports_no_error() {
    // The dbgsym package too: made as debhelper makes Debian's (xtask/src/package.rs).
    for package in [deb(), ddeb()] {
        let out = Command::new("lintian")
            .args(["--info", "--display-info"])
            .arg(&package)
            .output()
            .expect("lintian (cargo xtask setup installs it)");
        let said = text(&out.stdout);
        println!(
            "lintian {}:\n{said}{}",
            package.display(),
            text(&out.stderr)
        );
        let errors: Vec<&str> = said.lines().filter(|l| l.starts_with("E: ")).collect();
        assert!(errors.is_empty(), "lintian errors: {errors:#?}");
        // lintian exits 2 when it could not check the package at all.
        assert_ne!(out.status.code(), Some(2), "lintian failed to run");
        assert!(
            said.lines().all(|l| !l.starts_with("E:")),
            "lintian errors in {said}"
        );
    }
}

/// README.md's list: the fenced block after "The package installs"; each line a path (`*`
/// matches within a name) and what it is, "conffile" among it for conffiles.
fn readme_list() -> Vec<(String, bool)> {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let mut lines = readme
        .lines()
        .skip_while(|l| !l.starts_with("The package installs"))
        .skip(1)
        .skip_while(|l| !l.starts_with("```"))
        .skip(1);
    let list: Vec<(String, bool)> = lines
        .by_ref()
        .take_while(|l| !l.starts_with("```"))
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut words = l.split_whitespace();
            let path = words.next().unwrap().to_string();
            (
                path,
                words.any(|w| w.trim_matches(|c: char| !c.is_alphanumeric()) == "conffile"),
            )
        })
        .collect();
    assert!(
        list.len() > 5,
        "README.md's package list is missing: {list:?}"
    );
    list
}

/// `pattern` with `*` matching any run of characters but `/`.
fn matches(pattern: &str, path: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], s) || (!s.is_empty() && s[0] != b'/' && go(p, &s[1..])),
            (Some(a), Some(b)) if a == b => go(&p[1..], &s[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), path.as_bytes())
}

#[test]
fn the_contents_are_what_readme_lists() {
    let out = run(Command::new("dpkg-deb").arg("--contents").arg(deb()));
    // `drwxr-xr-x 0/0 0 2026-01-01 00:00 ./usr/bin/`: every file (not directory), absolute.
    let files: Vec<String> = text(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('d'))
        .map(|l| {
            let path = l.split_whitespace().nth(5).expect("a path");
            path.trim_start_matches('.').to_string()
        })
        .collect();
    let listed = readme_list();
    for file in &files {
        let hits: Vec<_> = listed.iter().filter(|(p, _)| matches(p, file)).collect();
        assert_eq!(
            hits.len(),
            1,
            "{file} is in the package but README.md lists it {} times",
            hits.len()
        );
    }
    for (pattern, _) in &listed {
        assert!(
            files.iter().any(|f| matches(pattern, f)),
            "README.md lists {pattern}, not in the package: {files:#?}"
        );
    }
    // A man page for each one `monitor manpage --out` writes (the run page among them).
    for page in [
        "monitor.1.gz",
        "monitor-run.1.gz",
        "monitor-query-peers.1.gz",
    ] {
        assert!(
            files.contains(&format!("/usr/share/man/man1/{page}")),
            "{page} missing"
        );
    }

    let (_dir, root, control) = unpacked(&deb());
    let conffiles: Vec<String> = std::fs::read_to_string(control.join("conffiles"))
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let mut want: Vec<String> = listed
        .iter()
        .filter(|(_, conf)| *conf)
        .map(|(p, _)| p.clone())
        .collect();
    let mut got = conffiles.clone();
    want.sort();
    got.sort();
    assert_eq!(got, want, "conffiles against README.md's");

    // The shipped settings are valid: `--print-config` parses them through every flag's parser.
    let bin = root.join("usr/bin/monitor");
    let printed = run(Command::new(&bin)
        .args(["run", "--iface", "lo", "--print-config", "--config"])
        .arg(root.join("etc/heartbeat-monitor/monitor.toml")));
    assert!(
        text(&printed.stdout).contains("socket-group = \"heartbeat-monitor\""),
        "{}",
        text(&printed.stdout)
    );
    let default = std::fs::read_to_string(root.join("etc/default/heartbeat-monitor")).unwrap();
    assert!(
        default.contains("MONITOR_ARGS=--config /etc/heartbeat-monitor/monitor.toml"),
        "{default}"
    );

    // The maintainer scripts parse; postinst creates the account and keeps cargo-deb's systemd
    // snippet (its token replaced).
    for script in ["postinst", "prerm", "postrm"] {
        let path = control.join(script);
        if path.exists() {
            run(Command::new("sh").arg("-n").arg(&path));
            let body = std::fs::read_to_string(&path).unwrap();
            assert!(!body.contains("#DEBHELPER#"), "{script}: token left");
        }
    }
    let postinst = std::fs::read_to_string(control.join("postinst")).unwrap();
    assert!(
        postinst.contains("adduser --system --group") && postinst.contains("heartbeat-monitor"),
        "{postinst}"
    );
}

/// The ELF section names of `file` (`readelf -S`).
fn sections(file: &Path) -> String {
    text(&run(Command::new("readelf").arg("-SW").arg(file)).stdout)
}

#[test]
fn the_binary_is_stripped_and_its_line_tables_are_in_the_dbgsym_package() {
    let (_dir, root, _) = unpacked(&deb());
    let bin = root.join("usr/bin/monitor");
    let size = std::fs::metadata(&bin).unwrap().len();
    let shipped = sections(&bin);
    assert!(!shipped.contains(".debug_line"), "not stripped: {shipped}");
    assert!(
        shipped.contains(".gnu_debuglink"),
        "no debug link: {shipped}"
    );
    // It still runs (the XDP program is embedded, not a separate file).
    run(Command::new(&bin).arg("--version"));

    let (_ddir, droot, _) = unpacked(&ddeb());
    let build_id = droot.join("usr/lib/debug/.build-id");
    let debug: Vec<PathBuf> = std::fs::read_dir(&build_id)
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|f| f.unwrap().path())
        .collect();
    assert_eq!(debug.len(), 1, "{debug:?}");
    assert!(
        sections(&debug[0]).contains(".debug_line"),
        "no line tables"
    );
    println!(
        "binary {} MB stripped, debug file {} MB",
        size >> 20,
        std::fs::metadata(&debug[0]).unwrap().len() >> 20
    );
    // The binary's build id names the debug file.
    let notes = text(&run(Command::new("readelf").arg("-n").arg(&bin)).stdout);
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("a build id");
    assert!(
        debug[0].ends_with(format!("{}/{}.debug", &id[..2], &id[2..])),
        "{debug:?} against {id}"
    );
}

#[test]
fn the_unit_inside_verifies_without_a_diagnostic() {
    let (dir, root, _) = unpacked(&deb());
    let unit_path = root.join("usr/lib/systemd/system/heartbeat-monitor.service");
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    let exec = "ExecStart=/usr/bin/monitor ";
    assert_eq!(
        unit.matches(exec).count(),
        1,
        "the unit should start /usr/bin/monitor"
    );
    assert!(unit.contains("SupplementaryGroups=heartbeat-monitor\n"));
    // verify checks that ExecStart's binary exists: point it at the unpacked one, the one
    // change made. man: pages of Documentation= are looked up in the package's pages.
    let testable = unit.replace(
        exec,
        &format!("ExecStart={} ", root.join("usr/bin/monitor").display()),
    );
    let units = dir.0.join("units");
    std::fs::create_dir_all(&units).unwrap();
    let path = units.join("heartbeat-monitor.service");
    std::fs::write(&path, testable).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .env("MANPATH", root.join("usr/share/man"))
        .output()
        .expect("systemd-analyze");
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    println!("systemd-analyze verify: {}, said {said:?}", out.status);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed: {said}"
    );
    assert!(said.is_empty(), "systemd-analyze verify reported: {said}");
}
