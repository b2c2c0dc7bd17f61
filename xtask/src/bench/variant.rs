//! The agents a run compares (`--compare`): this build, another binary (main's release build,
//! say), or either with flags of its own, measured row by row in one run, under the same
//! generator and load, so a ratio between them is a ratio of one run.

use std::path::PathBuf;

use anyhow::{Result, bail};

/// One agent to measure: its label in the tables, its binary (None: this build's), and flags
/// added to its command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Variant {
    pub label: String,
    pub binary: Option<PathBuf>,
    pub flags: Vec<String>,
}

impl Variant {
    /// This build, as it is.
    pub fn this_build() -> Self {
        Self {
            label: String::new(),
            binary: None,
            flags: Vec::new(),
        }
    }

    /// This variant under `label`, with `flags` added to its command line.
    pub fn with_label_and_flags(self, label: &str, flags: &[&str]) -> Self {
        Self {
            label: label.to_string(),
            flags: self
                .flags
                .into_iter()
                .chain(flags.iter().map(|f| f.to_string()))
                .collect(),
            ..self
        }
    }

    /// `LABEL=BINARY [FLAG...]`, whitespace-separated; BINARY `.` is this build's.
    pub fn parse(text: &str) -> Result<Self> {
        let Some((label, rest)) = text.split_once('=') else {
            bail!("--compare {text:?}: expected LABEL=BINARY [FLAGS], e.g. 'main=/tmp/monitor'");
        };
        let mut words = rest.split_whitespace();
        let Some(binary) = words.next() else {
            bail!("--compare {text:?}: no binary ('.' for this build)");
        };
        if label.is_empty() || label.contains(char::is_whitespace) {
            bail!("--compare {text:?}: the label is one word");
        }
        Ok(Self {
            label: label.to_string(),
            binary: (binary != ".").then(|| PathBuf::from(binary)),
            flags: words.map(str::to_string).collect(),
        })
    }

    /// The variants of a run: those of `--compare`, or this build alone.
    pub fn all(compare: &[String]) -> Result<Vec<Self>> {
        if compare.is_empty() {
            return Ok(vec![Self::this_build()]);
        }
        compare.iter().map(|c| Self::parse(c)).collect()
    }

    /// The run's own flags for this agent (`--flag value` or `--flag`), less those the variant
    /// sets itself, which win: given both, the agent would refuse to start (a flag given
    /// twice), as `--compare 'x=. --first-interval-ms 10'` did in a scale run, which tells
    /// every agent the stream's interval.
    pub fn run_flags<'a>(&self, run: &[&'a str]) -> Vec<&'a str> {
        let own = |flag: &str| {
            self.flags
                .iter()
                .any(|f| f == flag || f.strip_prefix(flag).is_some_and(|v| v.starts_with('=')))
        };
        let mut kept = Vec::new();
        let mut i = 0;
        while i < run.len() {
            let with_value = run.get(i + 1).is_some_and(|v| !v.starts_with("--"));
            let n = if with_value { 2 } else { 1 };
            if !(run[i].starts_with("--") && own(run[i])) {
                kept.extend_from_slice(&run[i..i + n]);
            }
            i += n;
        }
        kept
    }

    /// The label, for a table's cell, after the peer count (empty for this build alone).
    pub fn tag(&self) -> String {
        if self.label.is_empty() {
            String::new()
        } else {
            format!(" {}", self.label)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variants_own_flags_win_over_the_runs() {
        let ten = Variant::parse("ten=. --min-std-ms 2 --first-interval-ms=10").unwrap();
        let run = [
            "--metrics-addr",
            "127.0.0.1:9",
            "--first-interval-ms",
            "100",
            "--persist",
            "--min-std-ms",
            "50",
        ];
        assert_eq!(
            ten.run_flags(&run),
            ["--metrics-addr", "127.0.0.1:9", "--persist"]
        );
        assert_eq!(Variant::this_build().run_flags(&run), run);
    }

    #[test]
    fn a_variant_is_a_label_a_binary_and_flags() {
        let main = Variant::parse("main=/tmp/monitor-main").unwrap();
        assert_eq!(main.binary, Some(PathBuf::from("/tmp/monitor-main")));
        assert!(main.flags.is_empty());
        let fast = Variant::parse("s20=. --sweep-interval 20ms").unwrap();
        assert_eq!((fast.label.as_str(), &fast.binary), ("s20", &None));
        assert_eq!(fast.flags, ["--sweep-interval", "20ms"]);
        assert_eq!(fast.tag(), " s20");
        assert!(Variant::parse("nolabel").is_err());
        assert!(Variant::parse("x=").is_err());
        assert_eq!(Variant::all(&[]).unwrap(), [Variant::this_build()]);
    }
}
