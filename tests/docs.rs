//! The documentation: `README.md` (the front page) and `docs/*.md`, checked without any
//! server, in a second.
//!
//! - Every relative link resolves to a file of the repository, and a `#anchor` into a
//!   Markdown file to one of its headings, by GitHub's slug rule (lower-case, spaces to
//!   `-`, punctuation but `-` and `_` dropped, `-1`, `-2`, … for repeated headings).
//! - `docs/configuration.md` lists every key outboxd accepts, and only those. The keys come
//!   from the config types themselves: they are `#[serde(deny_unknown_fields)]`, so
//!   `Config::parse` of a config with `zz_unknown = 1` in a section fails with serde's
//!   "unknown field `zz_unknown`, expected one of `a`, `b`, …", which lists the section's
//!   keys. The documented keys are the first cells of the rows of the tables headed
//!   `| key | default | meaning |`, one key a row, written as its dotted path; a name the
//!   user chooses is written `<name>` (`kafka.options.<option>`,
//!   `inbox.handlers.<message_type>.url`).
//! - Every ` ```toml ` fence parses as a configuration: whole when it has `[source]` and a
//!   half to run (`[kafka]`, `[outbox]` or `[inbox]`), else merged into `examples/outboxd.toml` (a fragment). A
//!   snippet that is not meant to parse would be fenced ` ```toml-fragment `, which this
//!   test does not read (there is none today).
//! - Every command shown in full (a ` ```sh ` block's lines, a `$ ` line in any block)
//!   parses: `outboxd …` is run with a config path that does not exist and must fail at
//!   reading it, not at its arguments; `scripts/bench` flags and scenarios are the bench's;
//!   a shell block runs nothing else but Docker, kubectl and psql. Every command the prose
//!   names in code (`outboxd status --inbox`, `janitor --archive-table`) names a subcommand
//!   and flags `outboxd <subcommand> --help` lists.
//! - The front page stays one: at most 250 lines, opening with `scripts/demo` and
//!   `scripts/test`; no text points into `../shared/` or names an issue of the internal
//!   tracker.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use outboxd::config::Config;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `README.md` and every `docs/*.md`, as (path relative to the root, text).
fn pages() -> Vec<(PathBuf, String)> {
    let mut paths = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| PathBuf::from("docs").join(p.file_name().expect("a file name")))
        .collect();
    docs.sort();
    assert!(docs.len() >= 10, "docs/ holds the pages: {docs:?}");
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(root().join(&p))
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, text)
        })
        .collect()
}

/// The lines outside fenced code blocks, with their line numbers (from 1).
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push((i + 1, line));
        }
    }
    lines
}

/// The fenced code blocks whose info string is exactly `info`, with their first line.
fn fences<'a>(text: &'a str, info: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, bool, Vec<&'a str>)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        match open.as_mut() {
            None if trimmed.starts_with("```") => {
                open = Some((i + 2, trimmed[3..].trim() == info, Vec::new()));
            }
            None => {}
            Some(_) if trimmed.starts_with("```") => {
                let (start, wanted, body) = open.take().expect("an open fence");
                if wanted {
                    blocks.push((start, body.join("\n")));
                }
            }
            Some((_, _, body)) => body.push(line),
        }
    }
    assert!(open.is_none(), "a code fence is not closed");
    blocks
}

/// GitHub's anchor of a heading's text.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text's headings, repeated ones numbered as GitHub does.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in prose(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading);
        let count = seen.entry(base.clone()).or_insert(0);
        anchors.insert(match *count {
            0 => base.clone(),
            n => format!("{base}-{n}"),
        });
        *count += 1;
    }
    anchors
}

/// The targets of the inline links `[text](target)` of a line, inline code left out.
fn link_targets(line: &str) -> Vec<String> {
    // Inline code (between backticks) is not a link.
    let text: String = line
        .split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 0)
        .map(|(_, part)| part)
        .collect::<Vec<_>>()
        .join(" ");
    let mut targets = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("](") {
        let tail = &rest[at + 2..];
        let end = tail.find(')').unwrap_or(tail.len());
        targets.push(tail[..end].trim().to_owned());
        rest = &tail[end..];
    }
    targets
}

#[test]
fn every_relative_link_resolves_to_a_file_and_an_anchor() {
    let mut checked = 0;
    let mut broken = Vec::new();
    for (page, text) in pages() {
        let dir = page.parent().unwrap_or(Path::new("")).to_path_buf();
        for (number, line) in prose(&text) {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let file = if path.is_empty() {
                    page.clone()
                } else {
                    dir.join(path)
                };
                let where_ = format!("{}:{number}: ({target})", page.display());
                let full = root().join(&file);
                if !full.exists() {
                    broken.push(format!("{where_}: no file {}", file.display()));
                    continue;
                }
                if anchor.is_empty() {
                    continue;
                }
                if full.extension().is_none_or(|e| e != "md") {
                    broken.push(format!(
                        "{where_}: an anchor into a file that is not Markdown"
                    ));
                    continue;
                }
                let target_text = std::fs::read_to_string(&full).expect("a Markdown file");
                let known = anchors(&target_text);
                if !known.contains(anchor) {
                    broken.push(format!(
                        "{where_}: no heading `#{anchor}` in {} (it has: {})",
                        file.display(),
                        known.into_iter().collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
    }
    assert!(checked > 50, "links found: {checked}");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_slug_rule_is_githubs() {
    assert_eq!(
        slug(" Operating: status, retry, park, resolve, janitor"),
        "operating-status-retry-park-resolve-janitor"
    );
    assert_eq!(slug(" `outboxd check` & TLS_1.3"), "outboxd-check--tls_13");
    let text = "# A\n## A\n```\n# not a heading\n```\n## A\n";
    let expected: BTreeSet<String> = ["a", "a-1", "a-2"].map(String::from).into();
    assert_eq!(anchors(text), expected);
}

/// `examples/outboxd.toml` as a TOML table: the base every key probe and fragment starts from.
fn example() -> toml::Table {
    let text = std::fs::read_to_string(root().join("examples/outboxd.toml")).expect("example");
    text.parse().expect("examples/outboxd.toml is TOML")
}

/// The table at `path` in `table`, created (empty) where missing.
fn table_at<'a>(table: &'a mut toml::Table, path: &[&str]) -> &'a mut toml::Table {
    let mut here = table;
    for part in path {
        here = here
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .unwrap_or_else(|| panic!("`{part}` is a table"));
    }
    here
}

/// The keys outboxd accepts in the section at `path` of the example config, with `fill`
/// set there first (what a variant needs to be chosen; a `kind` other than the example's
/// replaces the section), from serde's unknown-field error.
fn accepted_keys(path: &[&str], fill: &[(&str, toml::Value)]) -> Vec<String> {
    let mut config = example();
    let section = table_at(&mut config, path);
    // A variant other than the example's starts from an empty section.
    if fill
        .iter()
        .any(|(k, v)| *k == "kind" && section.get("kind").is_some_and(|w| w != v))
    {
        section.clear();
    }
    for (key, value) in fill {
        section.insert(key.to_string(), value.clone());
    }
    section.insert("zz_unknown".into(), toml::Value::Integer(1));
    let text = toml::to_string(&config).expect("TOML text");
    let error = match Config::parse(&text) {
        Ok(_) => panic!("[{}] took an unknown key:\n{text}", path.join(".")),
        Err(e) => e.to_string(),
    };
    let marker = "unknown field `zz_unknown`";
    let at = error
        .find(marker)
        .unwrap_or_else(|| panic!("[{}]: not an unknown-field error: {error}", path.join(".")));
    let listed: Vec<String> = error[at + marker.len()..]
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert!(
        !listed.is_empty() || error.contains("there are no fields"),
        "[{}]: {error}",
        path.join(".")
    );
    listed
}

/// A section to probe: its path, and what it needs to be read as the variant meant.
type Probe<'a> = (Vec<&'a str>, Vec<(&'a str, toml::Value)>);

/// Every key outboxd accepts, as dotted paths; `<name>` where the user names the key.
fn keys_outboxd_accepts() -> BTreeSet<String> {
    let text = |s: &str| toml::Value::String(s.into());
    let sections: Vec<Probe> = vec![
        (vec![], vec![]),
        (vec!["pipeline"], vec![]),
        // `[source]` is the engine's keys (an enum tagged by `kind`), one list per engine.
        (vec!["source"], vec![("kind", text("postgres"))]),
        (
            vec!["source"],
            vec![
                ("kind", text("mysql")),
                ("user", text("outboxd")),
                ("database", text("app")),
                ("server_id", toml::Value::Integer(1)),
            ],
        ),
        (vec!["outbox"], vec![]),
        (vec!["outbox", "columns"], vec![]),
        (vec!["kafka"], vec![]),
        (vec!["kafka", "cloudevents"], vec![]),
        (vec!["http"], vec![]),
        (
            vec!["http", "endpoints", "<name>"],
            vec![("url", text("http://127.0.0.1:1/"))],
        ),
        (vec!["delivery"], vec![]),
        (vec!["retry"], vec![]),
        (vec!["poll"], vec![]),
        (vec!["metrics"], vec![]),
        (vec!["otlp"], vec![]),
        (vec!["canary"], vec![]),
        (vec!["console"], vec![]),
        (vec!["inbox"], vec![]),
        (
            vec!["inbox", "kafka"],
            vec![
                ("topics", toml::Value::Array(vec![text("t")])),
                ("group_id", text("g")),
            ],
        ),
        (vec!["inbox", "http"], vec![]),
        (vec!["inbox", "http", "sources", "<source>"], vec![]),
        // `[inbox.handlers.<message_type>]` is an enum tagged by `kind`: each kind's keys.
        (
            vec!["inbox", "handlers", "<message_type>"],
            vec![
                ("kind", text("webhook")),
                ("url", text("http://127.0.0.1:1/")),
            ],
        ),
        (
            vec!["inbox", "handlers", "<message_type>"],
            vec![("kind", text("sql")), ("statement", text("SELECT 1"))],
        ),
    ];
    // Maps whose keys the user names: documented as `<section>.<name>`.
    let maps = [
        "kafka.options",
        "inbox.kafka.options",
        "inbox.http.secrets",
        "inbox.http.secret_files",
    ];
    let paths: Vec<String> = sections.iter().map(|(p, _)| p.join(".")).collect();
    let mut keys = BTreeSet::new();
    for (path, fill) in &sections {
        for key in accepted_keys(path, fill) {
            let full = match path.is_empty() {
                true => key,
                false => format!("{}.{key}", path.join(".")),
            };
            // A section read above, or a map of sections (`inbox.handlers`): its keys count.
            if paths
                .iter()
                .any(|p| p == &full || p.starts_with(&format!("{full}.")))
            {
                continue;
            }
            match maps.contains(&full.as_str()) {
                true => keys.insert(format!("{full}.<name>")),
                false => keys.insert(full),
            };
        }
    }
    // The tags of the two tagged enums, which serde's list does not name (it lists the
    // chosen variant's fields), and `source.mode` (deprecated, still read), which sits
    // beside the engine's keys (`#[serde(flatten)]`) where the engine's list does not
    // show it.
    for key in [
        "source.kind",
        "source.mode",
        "inbox.handlers.<message_type>.kind",
    ] {
        keys.insert(key.to_owned());
    }
    keys
}

/// `<whatever>` → `<name>`: placeholders match whatever they are called.
fn normalize(key: &str) -> String {
    key.split('.')
        .map(|part| match part.starts_with('<') && part.ends_with('>') {
            true => "<name>",
            false => part,
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The keys `docs/configuration.md` documents: the first cell of each row of its
/// `| key | default | meaning |` tables.
fn documented_keys() -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join("docs/configuration.md")).expect("page");
    let mut keys = BTreeSet::new();
    let mut in_key_table = false;
    for (number, line) in prose(&text) {
        if !line.starts_with('|') {
            in_key_table = false;
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.get(1..4) == Some(&["key", "default", "meaning"][..]) {
            in_key_table = true;
            continue;
        }
        if !in_key_table || cells[1].starts_with("---") {
            continue;
        }
        let cell = cells[1];
        let key = cell
            .strip_prefix('`')
            .and_then(|c| c.strip_suffix('`'))
            .filter(|k| !k.contains('`') && !k.contains(' ') && !k.contains(','))
            .unwrap_or_else(|| {
                panic!("docs/configuration.md:{number}: one key a row, as `section.key`: {cell}")
            });
        assert!(
            keys.insert(normalize(key)),
            "docs/configuration.md:{number}: `{key}` twice"
        );
    }
    keys
}

#[test]
fn the_configuration_page_documents_every_key_and_only_real_ones() {
    let accepted: BTreeSet<String> = keys_outboxd_accepts()
        .iter()
        .map(|k| normalize(k))
        .collect();
    let documented = documented_keys();
    // Sanity: the enumeration found the sections' keys.
    for key in [
        "pipeline.name",
        "source.slot",
        "source.server_id",
        "outbox.columns.trace",
        "kafka.cloudevents.mode",
        "kafka.options.<name>",
        "inbox.http.sources.<name>.key_field",
        "inbox.handlers.<name>.statement",
        "inbox.handlers.<name>.forward_headers",
        "otlp.endpoint",
    ] {
        assert!(accepted.contains(key), "{key} not found in {accepted:?}");
    }
    let missing: Vec<_> = accepted.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/configuration.md lacks {missing:?}; it lists keys outboxd does not accept: \
         {unknown:?}"
    );
}

/// `patch` merged into `base`: tables key by key, any other value replaced.
fn merge(base: &mut toml::Table, patch: toml::Table) {
    for (key, value) in patch {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(here)), toml::Value::Table(there)) => merge(here, there),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

#[test]
fn every_toml_snippet_is_a_config_or_a_section_of_one() {
    let mut checked = 0;
    for (page, text) in pages() {
        for (line, snippet) in fences(&text, "toml") {
            let where_ = format!("{}:{line}", page.display());
            let table: toml::Table = snippet
                .parse()
                .unwrap_or_else(|e| panic!("{where_}: not TOML: {e}\n{snippet}"));
            // Whole: the database and a half to run (an inbox-only process has no
            // [pipeline] or [kafka]).
            let whole = table.contains_key("source")
                && ["kafka", "outbox", "inbox"]
                    .iter()
                    .any(|s| table.contains_key(*s));
            let config = match whole {
                true => snippet.clone(),
                false => {
                    let mut config = example();
                    merge(&mut config, table);
                    toml::to_string(&config).expect("TOML text")
                }
            };
            if let Err(e) = Config::parse(&config) {
                panic!("{where_}: not a config (whole: {whole}): {e}\n{snippet}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 5, "toml snippets found: {checked}");
}

#[test]
fn the_front_page_is_short_and_opens_with_the_two_commands() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines: move detail into docs/"
    );
    let (_, first) = fences(&readme, "sh")
        .into_iter()
        .next()
        .expect("a sh block");
    for script in ["scripts/demo", "scripts/test"] {
        assert!(first.contains(script), "README opens with {script}");
        assert!(root().join(script).is_file(), "{script} exists");
    }
    let opening = readme.find("```sh").expect("the commands");
    assert!(
        readme[..opening].lines().count() <= 2,
        "README opens with the commands"
    );
}

#[test]
fn no_page_points_into_shared_or_names_an_internal_issue() {
    for (page, text) in pages() {
        for (number, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            assert!(
                !lower.contains("../shared") && !lower.contains("shared/design"),
                "{}:{}: points into ../shared/: {line}",
                page.display(),
                number + 1
            );
            let mut rest = lower.as_str();
            while let Some(at) = rest.find("issue ") {
                let after = &rest[at + "issue ".len()..];
                assert!(
                    !after.starts_with(|c: char| c.is_ascii_digit()),
                    "{}:{}: names an issue of the internal tracker: {line}",
                    page.display(),
                    number + 1
                );
                rest = after;
            }
        }
    }
}

/// The commands the pages show in full, as words (quotes taken off, `"customer deleted"`
/// one word; comments cut): every line of a ` ```sh ` block (continuation lines joined),
/// and each `$ `-prompted line of any other block. With where each starts.
fn documented_command_lines() -> Vec<(String, Vec<String>)> {
    let mut lines = Vec::new();
    for (page, text) in pages() {
        let mut fence: Option<String> = None;
        let mut pending: Option<(usize, String)> = None;
        for (i, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            if let Some(info) = trimmed.strip_prefix("```") {
                fence = match fence {
                    None => Some(info.trim().to_owned()),
                    Some(_) => None,
                };
                continue;
            }
            let command = match fence.as_deref() {
                Some("sh") => Some(line),
                Some(_) => line.strip_prefix("$ "),
                None => None,
            };
            let Some(command) = command else { continue };
            let (start, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
            match command.strip_suffix('\\') {
                Some(part) => {
                    joined.push_str(part);
                    pending = Some((start, joined));
                }
                None => {
                    joined.push_str(command);
                    let words = shell_words(&joined);
                    if !words.is_empty() {
                        lines.push((format!("{}:{start}", page.display()), words));
                    }
                }
            }
        }
    }
    lines
}

/// A line's words as a POSIX shell splits them, up to an unquoted `#` (enough for the
/// pages: no escapes inside quotes, no expansions).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, '#') if word.is_none() => break,
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

#[test]
fn shell_words_split_as_a_shell_does() {
    assert_eq!(
        shell_words(r#"outboxd park --id 42 --reason "customer deleted"  # a comment"#),
        [
            "outboxd",
            "park",
            "--id",
            "42",
            "--reason",
            "customer deleted"
        ]
    );
    assert_eq!(shell_words("a 'b c'd #e"), ["a", "b cd"]);
    assert!(shell_words("# only a comment").is_empty());
}

/// outboxd's subcommands.
const SUBCOMMANDS: &[&str] = &[
    "init", "schema", "check", "run", "recover", "status", "retry", "park", "resolve", "janitor",
    "verify",
];

/// The tools a shell block may run besides outboxd and the scripts: their commands are
/// the user's (Docker, Kubernetes, psql), not checked here.
const OTHER_TOOLS: &[&str] = &["docker", "kubectl", "psql"];

/// What `outboxd …` with `args` wrote on stderr.
fn outboxd_stderr(args: &[String]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(args)
        .output()
        .expect("run outboxd");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Every command the pages show in full parses as the binary reads it: `outboxd …`
/// (optional parts in `[…]` included) fails only at reading its config file, which does
/// not exist; `scripts/bench` takes the flags and scenarios shown; nothing else runs in a
/// shell block but the scripts and the tools of [`OTHER_TOOLS`].
#[test]
fn every_documented_command_parses() {
    let missing = std::env::temp_dir().join("outboxd-docs-no-such-dir/config.toml");
    let bench_args = std::fs::read_to_string(root().join("bench/src/args.rs")).expect("args.rs");
    // The bench's list of scenarios, as written: `KNOWN_SCENARIOS: &[&str] = &[ … ];`.
    let known_scenarios = bench_args
        .split_once("const KNOWN_SCENARIOS")
        .and_then(|(_, rest)| rest.split_once("];"))
        .map(|(list, _)| list)
        .expect("KNOWN_SCENARIOS in bench/src/args.rs");
    let mut outboxd_commands = 0;
    for (at, words) in documented_command_lines() {
        match words[0].as_str() {
            "outboxd" => {
                let mut args: Vec<String> = (words[1..].iter())
                    .map(|w| w.trim_start_matches('[').trim_end_matches(']').to_owned())
                    .filter(|w| w != "…")
                    .collect();
                let config = args.iter().position(|a| a == "--config");
                let config = config.unwrap_or_else(|| panic!("{at}: no --config: {words:?}"));
                args[config + 1] = missing.display().to_string();
                let stderr = outboxd_stderr(&args);
                assert!(
                    stderr.contains("cannot read config file") && !stderr.contains("Usage:"),
                    "{at}: `outboxd {}` does not parse: {stderr}",
                    args.join(" ")
                );
                outboxd_commands += 1;
            }
            "scripts/bench" => {
                let mut words = words[1..].iter();
                while let Some(word) = words.next() {
                    let Some(flag) = word.strip_prefix("--") else {
                        continue;
                    };
                    let field = format!("pub(crate) {}:", flag.replace('-', "_"));
                    assert!(
                        flag == "help" || bench_args.contains(&field),
                        "{at}: scripts/bench has no flag --{flag}"
                    );
                    if flag == "scenarios" {
                        let names = words.next().expect("--scenarios takes names");
                        for name in names.split(',') {
                            assert!(
                                known_scenarios.contains(&format!("\"{name}\"")),
                                "{at}: scripts/bench has no scenario {name}"
                            );
                        }
                    }
                }
            }
            "scripts/demo" | "scripts/test" => {
                assert!(root().join(&words[0]).is_file(), "{at}: {}", words[0]);
            }
            tool => assert!(
                OTHER_TOOLS.contains(&tool),
                "{at}: a shell block runs `{tool}`, which this test does not check: check it \
                 here, or add it to OTHER_TOOLS if it is not outboxd's"
            ),
        }
    }
    assert!(
        outboxd_commands >= 15,
        "{outboxd_commands} outboxd commands found"
    );
}

/// `flag` stands in `help` as a whole flag (`--archive` is not `--archive-table`).
fn names_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(at, _)| {
        let next = help[at + flag.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

/// Every command the prose names in code, `outboxd <subcommand> …` or `<subcommand>
/// --flag …` (`janitor --archive-table`), names a subcommand that exists and only flags of
/// it; `status|retry|park` names each.
#[test]
fn every_command_named_in_prose_exists_with_its_flags() {
    let mut helps: BTreeMap<String, String> = BTreeMap::new();
    let mut checked = 0;
    for (page, text) in pages() {
        for (number, line) in prose(&text) {
            // Inline code: the odd pieces between backticks.
            for span in line.split('`').skip(1).step_by(2) {
                let mut words = shell_words(span);
                let named = words.first().is_some_and(|w| w == "outboxd");
                if named {
                    words.remove(0);
                }
                let flags: Vec<String> = (words.iter().skip(1))
                    .map(|w| w.trim_start_matches('[').trim_end_matches(']'))
                    .filter(|w| w.starts_with("--"))
                    .map(|w| w.split('=').next().unwrap_or(w).to_owned())
                    .collect();
                let Some(first) = words.first() else { continue };
                let subcommands: Vec<&str> = first.split('|').collect();
                let known = subcommands.iter().all(|s| SUBCOMMANDS.contains(s));
                if !(named || (known && !flags.is_empty())) {
                    continue;
                }
                let at = format!("{}:{number}", page.display());
                for sub in subcommands {
                    assert!(known, "{at}: `{span}`: outboxd has no subcommand {sub}");
                    let help = helps.entry(sub.to_owned()).or_insert_with(|| {
                        let out = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
                            .args([sub, "--help"])
                            .output()
                            .expect("run outboxd");
                        assert!(out.status.success(), "outboxd {sub} --help");
                        String::from_utf8_lossy(&out.stdout).into_owned()
                    });
                    for flag in &flags {
                        assert!(
                            names_flag(help, flag),
                            "{at}: `{span}`: `outboxd {sub}` has no flag {flag}"
                        );
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 50, "{checked} commands named in prose");
}
