//! The run recorded in the doc: `docs/benchmarks.md` keeps, between markers, one block of
//! results per set of scenarios (`default`, `soak`, …): when, on which commit and machine,
//! the exact command, and the table. A run rewrites its own block and moves the one it
//! replaces to the top of `docs/benchmarks-history.md`, so the page shows the latest
//! figures of each kind of run and the history keeps every earlier one, newest first.
//!
//! ```text
//! <!-- bench-results default -->
//! ### …
//! <!-- /bench-results default -->
//! …
//! <!-- bench-results-new -->     a set of scenarios with no block yet gets one here
//! ```
//!
//! The history file starts with its own text, then `<!-- bench-history -->`; the entries
//! follow it.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::report::Report;

/// Where a set of scenarios without a block gets one.
const NEW_BLOCKS: &str = "<!-- bench-results-new -->";
/// Where the history's entries start.
const HISTORY: &str = "<!-- bench-history -->";

/// What the block says about the run, above its table.
pub(crate) struct Run {
    date: String,
    commit: String,
    machine: String,
    command: String,
    duration: Duration,
}

impl Run {
    /// `commit`: [`commit`] when the run started.
    pub(crate) fn describe(report: &Report, duration: Duration, commit: String) -> Self {
        let m = &report.machine;
        let field = |k: &str| m[k].as_str().unwrap_or_default().trim().to_owned();
        let memory_gib = field("memory")
            .split_whitespace()
            .next()
            .and_then(|kib| kib.parse::<f64>().ok())
            .map_or(String::new(), |kib| {
                format!("{:.1} GiB RAM", kib / 1048576.0)
            });
        let machine = format!(
            "{} CPUs ({}), {memory_gib}, {}, Linux {}; PostgreSQL {}",
            m["cpus"],
            field("cpu_model"),
            field("os"),
            field("kernel"),
            field("postgresql")
        );
        let command = std::env::var("OUTBOXD_BENCH_COMMAND").unwrap_or_else(|_| {
            let argv: Vec<String> = std::env::args().collect();
            argv.join(" ")
        });
        Self {
            date: output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default(),
            commit,
            machine,
            command,
            duration,
        }
    }

    /// The block's text (without its markers).
    fn block(&self, title: &str, table: &str) -> String {
        let minutes = self.duration.as_secs() / 60;
        let seconds = self.duration.as_secs() % 60;
        format!(
            "### {title}\n\n\
             - Run: {}, {minutes} min {seconds} s\n\
             - Commit: {}\n\
             - Machine: {}\n\
             - Command: `{}`\n\n\
             ```text\n{}\n```\n",
            self.date,
            self.commit,
            self.machine,
            self.command,
            table.trim_matches('\n')
        )
    }
}

/// `git rev-parse --short HEAD`, and whether the working tree differs from it.
pub(crate) fn commit() -> String {
    let Some(head) = output("git", &["rev-parse", "--short", "HEAD"]) else {
        return "unknown (not a git checkout)".to_owned();
    };
    let dirty = output("git", &["status", "--porcelain", "--untracked-files=no"])
        .is_some_and(|s| !s.is_empty());
    match dirty {
        true => format!("{head}, with uncommitted changes in the working tree"),
        false => head,
    }
}

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The heading of a set of scenarios' block.
fn title(set: &str) -> String {
    match set {
        "default" => "Default scenarios (`scripts/bench`)".to_owned(),
        "soak" => "Soak: faults at random (`--scenarios soak`)".to_owned(),
        "http" => "HTTP sink (`--scenarios http`)".to_owned(),
        _ => format!("Scenarios {set}"),
    }
}

/// Writes `run`'s block for `set` into `doc`, and the block it replaces into `history`.
pub(crate) fn record(
    doc: &Path,
    history: &Path,
    set: &str,
    run: &Run,
    table: &str,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(doc)
        .map_err(|e| anyhow::anyhow!("{}: {e} (or pass --no-doc)", doc.display()))?;
    let block = run.block(&title(set), table);
    let (text, replaced) = replace_block(&text, set, &block)?;
    if let Some(old) = replaced {
        let past = std::fs::read_to_string(history).unwrap_or_else(|_| {
            format!(
                "# Benchmark history\n\nEarlier results of `scripts/bench`, newest first: each \
                 run moves the block of [benchmarks.md](benchmarks.md) it replaces here.\n\n\
                 {HISTORY}\n"
            )
        });
        std::fs::write(history, add_to_history(&past, &old)?)?;
    }
    std::fs::write(doc, text)?;
    Ok(())
}

fn markers(set: &str) -> (String, String) {
    (
        format!("<!-- bench-results {set} -->"),
        format!("<!-- /bench-results {set} -->"),
    )
}

/// `text` with `set`'s block replaced by `block` (or added before [`NEW_BLOCKS`]), and
/// the block it replaced.
fn replace_block(text: &str, set: &str, block: &str) -> anyhow::Result<(String, Option<String>)> {
    let (begin, end) = markers(set);
    let fresh = format!("{begin}\n{block}{end}\n");
    if let Some(at) = text.find(&begin) {
        let stop = text[at..]
            .find(&end)
            .map(|i| at + i)
            .ok_or_else(|| anyhow::anyhow!("`{begin}` has no `{end}`"))?;
        let old = text[at + begin.len()..stop].trim_matches('\n').to_owned();
        let after = text[stop + end.len()..].trim_start_matches('\n');
        let out = format!("{}{fresh}\n{after}", &text[..at]);
        return Ok((out, (!old.is_empty()).then_some(old)));
    }
    let at = text
        .find(NEW_BLOCKS)
        .ok_or_else(|| anyhow::anyhow!("no `{NEW_BLOCKS}` marker for a new block of results"))?;
    Ok((format!("{}{fresh}\n{}", &text[..at], &text[at..]), None))
}

/// `history` with `old` (a block: its `###` heading demoted one level) first after the
/// [`HISTORY`] marker.
fn add_to_history(history: &str, old: &str) -> anyhow::Result<String> {
    let at = history
        .find(HISTORY)
        .ok_or_else(|| anyhow::anyhow!("no `{HISTORY}` marker in the history"))?
        + HISTORY.len();
    let entry = old
        .strip_prefix("### ")
        .map_or(old.to_owned(), |rest| format!("## {rest}"));
    let rest = history[at..].trim_start_matches('\n');
    let gap = if rest.is_empty() { "" } else { "\n" };
    Ok(format!(
        "{}\n\n{}\n{gap}{rest}",
        &history[..at],
        entry.trim_end()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "# B\n\n## Results\n\n<!-- bench-results default -->\n### Old\n\nold table\n<!-- /bench-results default -->\n\n<!-- bench-results-new -->\n\n## Method\n";

    #[test]
    fn a_run_replaces_its_block_and_hands_the_old_one_over() {
        let (text, old) = replace_block(DOC, "default", "### New\n\nnew table\n").unwrap();
        assert_eq!(old.as_deref(), Some("### Old\n\nold table"));
        assert!(text.contains("<!-- bench-results default -->\n### New\n\nnew table\n<!-- /bench-results default -->\n\n<!-- bench-results-new -->"));
        assert!(!text.contains("old table"));
        assert!(text.ends_with("## Method\n"));
        // Again: the block is replaced, nothing else moves.
        let (again, _) = replace_block(&text, "default", "### New\n\nnew table\n").unwrap();
        assert_eq!(again, text);
    }

    #[test]
    fn a_new_set_of_scenarios_gets_a_block_of_its_own() {
        let (text, old) = replace_block(DOC, "soak", "### Soak\n").unwrap();
        assert!(old.is_none());
        let soak = text.find("<!-- bench-results soak -->").unwrap();
        assert!(text.find("<!-- /bench-results default -->").unwrap() < soak);
        assert!(soak < text.find(NEW_BLOCKS).unwrap());
    }

    #[test]
    fn the_history_puts_the_newest_first() {
        let history = format!("# H\n\nintro\n\n{HISTORY}\n\n## 1\n\nfirst\n");
        let once = add_to_history(&history, "### 2\n\nsecond").unwrap();
        assert_eq!(
            once,
            format!("# H\n\nintro\n\n{HISTORY}\n\n## 2\n\nsecond\n\n## 1\n\nfirst\n")
        );
    }
}
