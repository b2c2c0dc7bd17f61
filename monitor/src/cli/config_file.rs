//! `monitor run --config FILE`: a TOML file with one key per long flag of `monitor run`,
//! spelled the same (`metrics-addr = "127.0.0.1:9464"`, `levels = [1, 3, 8]`,
//! `iface = "eth0"`). The file's settings become arguments placed before the command line's, and
//! a flag given on the command line replaces the file's setting of it, so clap parses and
//! validates one argument list and there is one definition of every setting. Each value is
//! checked with the flag's own parser here first, so an error names the file, the line and
//! the key. `--print-config` prints the effective settings in the same form.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

use clap::{Arg, ArgAction, ArgMatches, Command, parser::ValueSource};

use toml::{Spanned, Value};

/// Flags that only make sense on the command line.
const COMMAND_LINE_ONLY: [&str; 4] = ["config", "print-config", "help", "version"];

/// A setting in the file that cannot be used, with where it is (line 0: the whole file).
#[derive(Debug)]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            0 => write!(f, "{}: {}", self.file, self.message),
            line => write!(f, "{}:{line}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The command line after `run` as clap reads it, every flag optional: what it sets and where
/// from (`ArgMatches::value_source`). None if it does not parse; the whole command line's parse
/// then says why, and no file is read.
pub fn command_line(cmd: &Command, args: &[OsString]) -> Option<ArgMatches> {
    cmd.clone()
        .mut_args(|a| a.required(false))
        .try_get_matches_from(std::iter::once(OsString::from("run")).chain(args.iter().cloned()))
        .ok()
}

/// The path given with `--config` on the command line read by [`command_line`].
pub fn config_path(command_line: &ArgMatches) -> Option<PathBuf> {
    command_line.get_one::<PathBuf>("config").cloned()
}

/// The arguments the file at `path` stands for, for the `run` command `cmd`, leaving out every
/// setting that `command_line` (the arguments after `run`) gives itself.
pub fn file_args(
    path: &Path,
    cmd: &Command,
    command_line: &ArgMatches,
) -> Result<Vec<OsString>, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: file.clone(),
        line: 0,
        message: format!("cannot read it: {e}"),
    })?;
    settings(&text, &file, cmd, command_line)
}

fn settings(
    text: &str,
    file: &str,
    cmd: &Command,
    command_line: &ArgMatches,
) -> Result<Vec<OsString>, ConfigError> {
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let error = |offset: usize, message: String| ConfigError {
        file: file.to_string(),
        line: line_of(offset),
        message,
    };
    // Keys with their spans, to say where each is.
    let table: std::collections::BTreeMap<Spanned<String>, Spanned<Value>> = toml::from_str(text)
        .map_err(|e| {
        let offset = e.span().map_or(0, |s| s.start);
        error(offset, format!("not valid TOML: {}", e.message()))
    })?;
    let mut args = Vec::new();
    for (key, value) in &table {
        let at = key.span().start;
        let name = key.get_ref().as_str();
        let key_error = |message: String| error(at, format!("key `{name}`: {message}"));
        if COMMAND_LINE_ONLY.contains(&name) {
            return Err(key_error("only on the command line".into()));
        }
        let Some(arg) = cmd.get_arguments().find(|a| a.get_long() == Some(name)) else {
            let hint = closest(name, cmd)
                .map(|c| format!("; did you mean `{c}`?"))
                .unwrap_or_default();
            return Err(error(
                at,
                format!("unknown key `{name}`: not a flag of `monitor run`{hint}"),
            ));
        };
        let text = as_text(value.get_ref(), arg).map_err(&key_error)?;
        if command_line.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine) {
            continue;
        }
        match text {
            Setting::Flag(false) => {}
            Setting::Flag(true) => args.push(OsString::from(format!("--{name}"))),
            Setting::Value(v) => {
                // The flag's own parser decides, through clap itself: the file cannot
                // accept what the command line would refuse, and the reason is clap's.
                let flag = OsString::from(format!("--{name}={v}"));
                cmd.clone()
                    .mut_args(|a| a.required(false))
                    .try_get_matches_from([OsString::from("run"), flag.clone()])
                    .map_err(|e| key_error(clap_message(&e)))?;
                args.push(flag);
            }
        }
    }
    Ok(args)
}

enum Setting {
    Flag(bool),
    Value(String),
}

/// A TOML value as the text the flag takes.
fn as_text(value: &Value, arg: &Arg) -> Result<Setting, String> {
    let is_flag = matches!(arg.get_action(), ArgAction::SetTrue);
    let scalar = |v: &Value| -> Result<String, String> {
        match v {
            Value::String(s) => Ok(s.clone()),
            Value::Integer(i) => Ok(i.to_string()),
            Value::Float(f) => Ok(f.to_string()),
            Value::Boolean(_) => Err("expects a value, not true or false".into()),
            Value::Array(_) => Err("an array inside an array".into()),
            Value::Table(_) => Err("expects a value, not a table".into()),
            Value::Datetime(_) => Err("expects a value, not a date".into()),
        }
    };
    match value {
        Value::Boolean(b) if is_flag => Ok(Setting::Flag(*b)),
        _ if is_flag => Err("a switch: true or false".into()),
        Value::Array(items) => {
            // A list: the flag's own delimiter joins it (levels and ranges use commas).
            let joined = items
                .iter()
                .map(scalar)
                .collect::<Result<Vec<_>, _>>()?
                .join(",");
            Ok(Setting::Value(joined))
        }
        v => scalar(v).map(Setting::Value),
    }
}

/// The first line of a clap error, without its `error: ` prefix.
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("invalid value");
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

/// The flag whose name is nearest `name` (at most two edits away), for the error.
fn closest<'a>(name: &str, cmd: &'a Command) -> Option<&'a str> {
    cmd.get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|l| !COMMAND_LINE_ONLY.contains(l))
        .map(|l| (strsim::levenshtein(name, l), l))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, l)| l)
}

/// The effective settings of `run` (file, command line, defaults) as TOML that `--config`
/// accepts, in the order `monitor run --help` lists them. What was set is a key; defaults and
/// unset options are comments, so the file pins only what was chosen (a newer binary's
/// defaults still apply) and keys that exclude one another (`detector` and `model`) never
/// meet.
pub fn print(cmd: &Command, matches: &ArgMatches) -> String {
    let mut out = String::from(
        "# monitor run: effective configuration (command line over --config file over defaults)\n",
    );
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if COMMAND_LINE_ONLY.contains(&long) {
            continue;
        }
        let id = arg.get_id().as_str();
        let source = matches.value_source(id);
        let Some(raw) = matches.get_raw(id) else {
            out.push_str(&format!("# {long} = (not set)\n"));
            continue;
        };
        let values: Vec<String> = raw.map(|v| v.to_string_lossy().into_owned()).collect();
        let value = if matches!(arg.get_action(), ArgAction::SetTrue) {
            values
                .first()
                .map_or("false".into(), |v| (v == "true").to_string())
        } else {
            toml_value(&values)
        };
        match source {
            Some(ValueSource::DefaultValue) => {
                out.push_str(&format!("# {long} = {value}   (default)\n"))
            }
            _ => out.push_str(&format!("{long} = {value}\n")),
        }
    }
    out
}

/// Values as a TOML value: numbers bare, text quoted, several (or a comma list of numbers,
/// like `levels`) as an array.
fn toml_value(values: &[String]) -> String {
    let one = |v: &str| -> String {
        if v.parse::<i64>().is_ok() || v.parse::<f64>().is_ok_and(f64::is_finite) {
            v.to_string()
        } else {
            Value::String(v.to_string()).to_string()
        }
    };
    if let [single] = values {
        let parts: Vec<&str> = single.split(',').collect();
        if parts.len() > 1
            && parts
                .iter()
                .all(|p| p.parse::<f64>().is_ok_and(f64::is_finite))
        {
            return format!("[{}]", parts.join(", "));
        }
        return one(single);
    }
    format!(
        "[{}]",
        values.iter().map(|v| one(v)).collect::<Vec<_>>().join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn run_cmd() -> Command {
        super::super::Cli::command()
            .find_subcommand("run")
            .expect("run")
            .clone()
    }

    fn parse(text: &str, command_line: &[&str]) -> Result<Vec<String>, ConfigError> {
        let command_line: Vec<OsString> = command_line.iter().map(OsString::from).collect();
        let matches = super::command_line(&run_cmd(), &command_line).expect("a valid command line");
        settings(text, "monitor.toml", &run_cmd(), &matches).map(|args| {
            args.into_iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        })
    }

    #[test]
    fn keys_become_flags_and_the_command_line_wins() {
        let args = parse(
            "iface = \"eth0\"\nport = 7999\nlevels = [1, 3, 8]\npass-heartbeats = true\n\
             no-auto-admit = false\nadmit-from = [\"10.0.0.0/8\", \"fd00::/8\"]\n",
            &["--port", "8000"],
        )
        .unwrap();
        assert_eq!(
            args,
            [
                "--admit-from=10.0.0.0/8,fd00::/8",
                "--iface=eth0",
                "--levels=1,3,8",
                "--pass-heartbeats",
            ]
        );
        // -i is --iface.
        assert!(
            !parse("iface = \"eth0\"\n", &["-i", "veth1"])
                .unwrap()
                .iter()
                .any(|a| a == "eth0")
        );
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_key() {
        let e = parse("iface = \"eth0\"\n\nprot = 18498\n", &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "monitor.toml:3: unknown key `prot`: not a flag of `monitor run`; did you mean `port`?"
        );
        let e = parse("iface = \"eth0\"\nport = \"seven\"\n", &[]).unwrap_err();
        assert_eq!((e.line, e.file.as_str()), (2, "monitor.toml"));
        assert!(
            e.message.starts_with("key `port`: invalid value 'seven'"),
            "{e}"
        );
        let e = parse("port = 99999\n", &[]).unwrap_err();
        assert!(e.message.starts_with("key `port`"), "{e}");
        let e = parse("levels = [3, 1]\n", &[]).unwrap_err();
        assert!(e.message.contains("levels"), "{e}");
        let e = parse("pass-heartbeats = \"yes\"\n", &[]).unwrap_err();
        assert_eq!(e.message, "key `pass-heartbeats`: a switch: true or false");
        let e = parse("config = \"other.toml\"\n", &[]).unwrap_err();
        assert_eq!(e.message, "key `config`: only on the command line");
        let e = parse("port = \n", &[]).unwrap_err();
        assert!(e.message.starts_with("not valid TOML"), "{e}");
        let e = parse("[detector]\nmodel = \"normal\"\n", &[]).unwrap_err();
        assert!(
            e.message.contains("unknown key `detector`") || e.message.contains("table"),
            "{e}"
        );
    }

    #[test]
    fn printed_configuration_reads_back_the_same() {
        let cmd = super::super::Cli::command();
        let argv = [
            "monitor",
            "run",
            "--iface",
            "eth0",
            "--levels",
            "1,3,8",
            "--admit-from",
            "10.0.0.0/8,fd00::/8",
            "--metrics-addr",
            "127.0.0.1:9464",
            "--pass-heartbeats",
        ];
        let matches = cmd.clone().try_get_matches_from(argv).unwrap();
        let run = matches.subcommand_matches("run").unwrap();
        let printed = print(&run_cmd(), run);
        assert!(printed.contains("iface = \"eth0\"\n"), "{printed}");
        assert!(printed.contains("levels = [1, 3, 8]\n"), "{printed}");
        assert!(
            printed.contains("admit-from = [\"10.0.0.0/8\", \"fd00::/8\"]\n"),
            "{printed}"
        );
        assert!(printed.contains("pass-heartbeats = true\n"), "{printed}");
        assert!(
            printed.contains("# port = 18498   (default)\n"),
            "{printed}"
        );
        assert!(
            printed.contains("# auth-key-file = (not set)\n"),
            "{printed}"
        );
        // Read back through --config, it gives the same effective settings.
        let args = parse(&printed, &[]).unwrap();
        let mut again: Vec<String> = vec!["monitor".into(), "run".into()];
        again.extend(args);
        let matches2 = cmd.try_get_matches_from(&again).unwrap();
        let run2 = matches2.subcommand_matches("run").unwrap();
        assert_eq!(print(&run_cmd(), run2), printed);
    }

    #[test]
    fn config_path_on_the_command_line() {
        let path = |a: &[&str]| {
            let a: Vec<OsString> = a.iter().map(OsString::from).collect();
            command_line(&run_cmd(), &a).map(|m| config_path(&m))
        };
        assert_eq!(
            path(&["--iface", "x", "--config", "/etc/m.toml"]),
            Some(Some(PathBuf::from("/etc/m.toml")))
        );
        assert_eq!(
            path(&["--config=/etc/m.toml"]),
            Some(Some(PathBuf::from("/etc/m.toml")))
        );
        assert_eq!(path(&["--iface", "x"]), Some(None));
        // Not a command line: clap's own parse of the whole says why.
        assert_eq!(path(&["--config"]), None);
        assert_eq!(path(&["--config", "a", "--config", "b"]), None);
    }

    /// `-pVALUE`, `-p VALUE` and `--long=VALUE` are read by clap itself: what the command line
    /// sets overrides the file, and nothing else does.
    #[test]
    fn the_command_line_is_read_as_clap_reads_it() {
        let file = "port = 7999\nsocket = \"/run/a.sock\"\niface = \"eth0\"\n";
        for command_line in [&["-p8000"][..], &["-p", "8000"], &["--port=8000"]] {
            let args = parse(file, command_line).unwrap();
            assert_eq!(
                args,
                ["--iface=eth0", "--socket=/run/a.sock"],
                "{command_line:?}"
            );
        }
        let args = parse(file, &["-s", "/run/b.sock", "-ieth1"]).unwrap();
        assert_eq!(args, ["--port=7999"]);
    }
}
