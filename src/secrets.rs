//! Secrets in the configuration file: which keys hold one, a warning when the file that
//! holds one is readable by others (and the same for every file a secret is read from),
//! TOML errors that do not echo a secret's line, and a `Debug` of librdkafka options that
//! hides secret values.
//!
//! The values themselves are [`outboxd_connector::Secret`]s where the config has a typed
//! key (`source.password`, `inbox.http.secrets`); librdkafka options stay strings (they
//! are handed to librdkafka as they are), so their `Debug` goes through [`RedactedOptions`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use outboxd_connector::secret::ReadableSecretFile;

/// Whether a config key or librdkafka option name names a secret: `password`,
/// `sasl.password`, `ssl.key.password`, `ssl.keystore.password`,
/// `sasl.oauthbearer.client.secret`, `ssl.key.pem`, a token, …
pub(crate) fn looks_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "secret",
        "token",
        "credential",
        "private",
    ]
    .iter()
    .any(|word| key.contains(word))
        || key.ends_with("key.pem")
        || key == "sasl.oauthbearer.config"
}

/// librdkafka options whose secret values print as `***` in `Debug`.
pub(crate) struct RedactedOptions<'a>(pub(crate) &'a BTreeMap<String, String>);

impl fmt::Debug for RedactedOptions<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (key, value) in self.0 {
            if looks_secret(key) {
                map.entry(key, &"***");
            } else {
                map.entry(key, value);
            }
        }
        map.finish()
    }
}

/// Checks that librdkafka knows every option of `[section]` and takes its value, at load:
/// librdkafka's own error, printed later, quotes the option's value (a misspelled
/// `sasl.pasword` would print the password).
pub(crate) fn check_kafka_options(
    section: &str,
    options: &BTreeMap<String, String>,
) -> Result<(), String> {
    let mut client = rdkafka::ClientConfig::new();
    for (key, value) in options {
        client.set(key, value);
    }
    client
        .create_native_config()
        .map(drop)
        .map_err(|e| format!("{section}: {}", kafka_error_text(&e)))
}

/// A librdkafka error as text without the option value a config error carries.
pub(crate) fn kafka_error_text(error: &rdkafka::error::KafkaError) -> String {
    match error {
        rdkafka::error::KafkaError::ClientConfig(_, description, key, value) => {
            let description = if looks_secret(key) && !value.is_empty() {
                description.replace(value.as_str(), "***")
            } else {
                description.clone()
            };
            format!("option \"{key}\": {description}")
        }
        other => other.to_string(),
    }
}

/// Something about the config file to tell the operator (`check` prints it, `run` logs
/// it), with its fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigWarning {
    /// What is wrong.
    pub message: String,
    /// What to do.
    pub fix: String,
}

/// The secrets of a `*_file` key that holds several, one per line (blank lines ignored);
/// an empty file is an error.
pub(crate) fn read_secret_lines(
    file_key: &str,
    path: &Path,
) -> Result<Vec<outboxd_connector::Secret>, outboxd_connector::SecretError> {
    let text = outboxd_connector::secret::read_file(file_key, path)?;
    let secrets: Vec<outboxd_connector::Secret> = (text.expose().lines())
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(outboxd_connector::Secret::from)
        .collect();
    if secrets.is_empty() {
        return Err(outboxd_connector::SecretError::Empty {
            file_key: file_key.to_owned(),
            path: path.to_path_buf(),
        });
    }
    Ok(secrets)
}

/// The keys of `table` (the config file as parsed) that hold a secret in the file itself.
pub(crate) fn inline_secrets(table: &toml::Table) -> Vec<String> {
    let section = |path: &[&str]| -> Option<&toml::Table> {
        let mut table = table;
        for key in path {
            table = table.get(*key)?.as_table()?;
        }
        Some(table)
    };
    let mut found = Vec::new();
    if let Some(source) = section(&["source"]) {
        found.extend(
            source
                .keys()
                .filter(|k| looks_secret(k) && !k.ends_with("_file"))
                .map(|k| format!("source.{k}")),
        );
    }
    for path in [
        &["kafka", "options"][..],
        &["inbox", "kafka", "options"][..],
    ] {
        if let Some(options) = section(path) {
            let prefix = path.join(".");
            found.extend(
                options
                    .keys()
                    .filter(|k| looks_secret(k))
                    .map(|k| format!("{prefix}.\"{k}\"")),
            );
        }
    }
    if section(&["inbox", "http", "secrets"]).is_some_and(|s| !s.is_empty()) {
        found.push("inbox.http.secrets".into());
    }
    if let Some(endpoints) = section(&["http", "endpoints"]) {
        for (name, endpoint) in endpoints {
            let secrets = endpoint.get("secrets").and_then(|s| s.as_array());
            if secrets.is_some_and(|s| !s.is_empty()) {
                found.push(format!("http.endpoints.{name}.secrets"));
            }
        }
    }
    if section(&["metrics"]).is_some_and(|m| m.contains_key("bearer_token")) {
        found.push("metrics.bearer_token".into());
    }
    found
}

/// A warning when the config file at `path` holds secrets (`keys`) and its mode lets the
/// group or others read it.
pub(crate) fn permission_warning(path: &Path, keys: &[String]) -> Option<ConfigWarning> {
    if keys.is_empty() {
        return None;
    }
    let mode = file_mode(path)?;
    if mode & 0o044 == 0 {
        return None;
    }
    let file = path.display();
    Some(ConfigWarning {
        message: format!(
            "{file} holds secrets ({}) and is readable by {} (mode {:o})",
            keys.join(", "),
            readers(mode),
            mode & 0o777
        ),
        fix: format!(
            "chmod 600 {file}, or move the secrets out of it: source.password_file or \
             OUTBOXD_SOURCE_PASSWORD, kafka.sasl_password_file or OUTBOXD_KAFKA_SASL_PASSWORD, \
             kafka.ssl_key_password_file, inbox.http.secret_files"
        ),
    })
}

/// The warning for a file a secret was read from (`source.password_file`,
/// `kafka.sasl_password_file`, `inbox.http.secret_files.*`, …) that others may read: the
/// secret is as exposed as in a readable config file, so it is said the same way.
pub(crate) fn secret_file_warning(file: &ReadableSecretFile) -> ConfigWarning {
    let path = file.path.display();
    ConfigWarning {
        message: format!(
            "{path} ({}) holds a secret and is readable by {} (mode {:o})",
            file.file_key,
            readers(file.mode),
            file.mode & 0o777
        ),
        fix: format!(
            "chmod 600 {path}, owned by the user outboxd runs as (a Kubernetes secret volume: \
             defaultMode 0440 with the pod's fsGroup)"
        ),
    }
}

/// Who, besides the owner, may read a file of `mode` (group or others readable).
fn readers(mode: u32) -> &'static str {
    if mode & 0o004 != 0 {
        "everyone"
    } else {
        "its group"
    }
}

#[cfg(unix)]
fn file_mode(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).ok().map(|m| m.permissions().mode())
}

#[cfg(not(unix))]
fn file_mode(_path: &Path) -> Option<u32> {
    None
}

/// What to say about a TOML error in `text`. toml's own text quotes the offending line;
/// when that line (or the key whose value it continues, or its table) may hold a secret,
/// or the error is an unknown key (a misspelled `password` is still a password), only the
/// line, column and key path are given. Whatever the error, the value of every key in the
/// file that looks secret is blanked out of the message (serde's type errors quote the
/// value, and on `[source]`, flattened, the error's span is the whole table).
pub(crate) fn parse_error_message(error: &toml::de::Error, text: &str) -> String {
    let lines: Vec<&str> = text.split('\n').collect();
    // (line index, key path, value) of every key that looks secret, by its table too.
    let mut header: Option<String> = None;
    let mut secrets = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            header = Some(
                trimmed
                    .trim_matches(|c| c == '[' || c == ']' || c == ' ')
                    .to_owned(),
            );
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let in_secret_table = header.as_deref().is_some_and(looks_secret);
        if looks_secret(key) || in_secret_table {
            let path = match &header {
                Some(h) => format!("{h}.{}", key.trim()),
                None => key.trim().to_owned(),
            };
            secrets.push((i, path, value_of(value)));
        }
    }
    let mut message = error.message().to_owned();
    let mut named = None;
    for (_, path, value) in &secrets {
        if !value.is_empty() && message.contains(value.as_str()) {
            message = message.replace(value.as_str(), "***");
            named = Some(path.clone());
        }
    }
    let Some(span) = error.span() else {
        return message;
    };
    let start = floor_char_boundary(text, span.start);
    let end = floor_char_boundary(text, span.end.max(span.start));
    let first = text[..start].matches('\n').count().min(lines.len() - 1);
    let last = text[..end]
        .matches('\n')
        .count()
        .clamp(first, lines.len() - 1);
    let column = text[..start]
        .rsplit('\n')
        .next()
        .map_or(0, |l| l.chars().count())
        + 1;
    // The key of the value the error is in: on the span's first line, or, when that
    // line continues a value begun above (a multi-line string), the nearest key above.
    let key_line = (0..=first)
        .rev()
        .find(|&i| lines[i].contains('=') || lines[i].trim_start().starts_with('['))
        .filter(|&i| lines[i].contains('='));
    let risky = named.is_some()
        || secrets
            .iter()
            .any(|(i, _, _)| (first..=last).contains(i) || Some(*i) == key_line)
        || (first..=last).any(|i| looks_secret(lines[i]))
        || message.starts_with("unknown field");
    if !risky {
        return error.to_string();
    }
    let table = lines[..=first]
        .iter()
        .rev()
        .map(|l| l.trim_start())
        .find(|l| l.starts_with('['))
        .map(|l| {
            l.trim_matches(|c| c == '[' || c == ']' || c == ' ')
                .to_owned()
        });
    let key = key_line
        .and_then(|i| lines[i].split('=').next())
        .map(str::trim);
    let path = named.unwrap_or_else(|| match (table, key) {
        (Some(t), Some(k)) => format!("{t}.{k}"),
        (None, Some(k)) => k.to_owned(),
        (Some(t), None) => t,
        (None, None) => String::new(),
    });
    format!(
        "TOML parse error at line {}, column {column}, key `{path}` (the line is not shown: \
         it may hold a secret): {}",
        first + 1,
        message.trim_end()
    )
}

/// The text of a TOML value as written after `=`: inside its quotes for a string
/// (to the end of the line when unterminated), up to a comment otherwise.
fn value_of(raw: &str) -> String {
    let raw = raw.trim();
    for quote in ["\"\"\"", "\'\'\'", "\"", "\'"] {
        if let Some(rest) = raw.strip_prefix(quote) {
            return rest.split(quote).next().unwrap_or(rest).to_owned();
        }
    }
    raw.split('#').next().unwrap_or(raw).trim().to_owned()
}

/// The largest char boundary of `text` at or below `index`.
fn floor_char_boundary(text: &str, index: usize) -> usize {
    let mut index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(text: &str) -> String {
        let error = toml::from_str::<crate::config::Config>(text).unwrap_err();
        parse_error_message(&error, text)
    }

    const HEAD: &str = "[pipeline]\nname = \"p\"\n[kafka]\nbootstrap_servers = \"h:1\"\n";

    #[test]
    fn a_secret_line_is_never_quoted() {
        let secret = "Zq9-topsecret-value";
        for source in [
            // Unterminated string on the password line.
            format!("[source]\nkind = \"postgres\"\nuser = \"u\"\ndatabase = \"d\"\npassword = \"{secret}\n"),
            // A misspelled password key.
            format!("[source]\nkind = \"postgres\"\nuser = \"u\"\ndatabase = \"d\"\npasword = \"{secret}\"\n"),
            // The wrong type.
            format!("[source]\nkind = \"postgres\"\nuser = \"u\"\ndatabase = \"d\"\npassword = {}\n", 987_654_321),
            // A multi-line string that never ends.
            format!("[source]\nkind = \"postgres\"\nuser = \"u\"\ndatabase = \"d\"\npassword = \"\"\"\n{secret}\n"),
        ] {
            let text = format!("{HEAD}{source}");
            let message = error_of(&text);
            assert!(!message.contains(secret), "{message}");
            assert!(!message.contains("987654321"), "{message}");
            assert!(message.contains("line "), "{message}");
        }
        let text = format!(
            "{HEAD}[source]\nkind = \"postgres\"\nuser = \"u\"\ndatabase = \"d\"\n\
             [kafka.options]\n\"sasl.password\" = \"{secret}\nx = 1\n"
        );
        let message = error_of(&text);
        assert!(!message.contains(secret), "{message}");
        assert!(
            message.contains("line 10") && message.contains("sasl.password"),
            "{message}"
        );
    }

    #[test]
    fn other_errors_keep_tomls_text() {
        let text = format!(
            "{HEAD}[source]\nkind = \"postgres\"\nuser = \"u\"\ndatabase = \"d\"\npassword = \"pw\"\n\
             [delivery]\nwriteback_interval = \"soon\"\n"
        );
        let message = error_of(&text);
        assert!(
            message.contains("writeback_interval = \"soon\""),
            "{message}"
        );
        assert!(!message.contains("\"pw\""), "{message}");
    }

    #[test]
    fn inline_secrets_are_found_and_debug_hides_option_values() {
        let table: toml::Table = toml::from_str(
            "[source]\npassword = \"a\"\npassword_file = \"/f\"\n[kafka.options]\n\
             \"sasl.password\" = \"b\"\n\"compression.type\" = \"lz4\"\n\
             [inbox.http.secrets]\ns = [\"c\"]\n",
        )
        .unwrap();
        assert_eq!(
            inline_secrets(&table),
            [
                "source.password",
                "kafka.options.\"sasl.password\"",
                "inbox.http.secrets"
            ]
        );
        let options = BTreeMap::from([
            ("sasl.password".to_owned(), "b-secret".to_owned()),
            ("ssl.key.password".to_owned(), "k-secret".to_owned()),
            ("compression.type".to_owned(), "lz4".to_owned()),
        ]);
        let debug = format!("{:?}", RedactedOptions(&options));
        assert!(
            !debug.contains("-secret") && debug.contains("lz4"),
            "{debug}"
        );
    }

    #[test]
    fn unknown_kafka_options_are_named_without_their_value() {
        let options = BTreeMap::from([("sasl.pasword".to_owned(), "Zq-kafka-secret".to_owned())]);
        let err = check_kafka_options("kafka.options", &options).unwrap_err();
        assert!(err.contains("sasl.pasword"), "{err}");
        assert!(!err.contains("Zq-kafka-secret"), "{err}");
        let options = BTreeMap::from([("sasl.password".to_owned(), "p".to_owned())]);
        check_kafka_options("kafka.options", &options).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_readable_file_with_secrets_gets_a_warning_with_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("outboxd-perm-{}.toml", std::process::id()));
        std::fs::write(&path, "x").unwrap();
        let keys = vec!["source.password".to_owned()];
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let warning = permission_warning(&path, &keys).expect("a warning");
        assert!(warning.message.contains("source.password"), "{warning:?}");
        assert!(warning.fix.contains("chmod 600"), "{warning:?}");
        assert_eq!(permission_warning(&path, &[]), None);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(permission_warning(&path, &keys), None);
        let _ = std::fs::remove_file(&path);
    }
}

/// Secrets from files and the environment, end to end through [`crate::config::Config`].
#[cfg(test)]
mod config_tests {
    use std::path::PathBuf;

    use crate::config::{Config, ConfigError, SourceConfig, ENV_KAFKA_SASL_PASSWORD};

    const BASE: &str = "[pipeline]\nname = \"p\"\n[source]\nkind = \"postgres\"\nuser = \"u\"\n\
                        database = \"d\"\n[kafka]\nbootstrap_servers = \"h:1\"\n";

    fn dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "outboxd-secrets-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn resolved(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let mut config = Config::parse(text)?;
        config.resolve_secrets(|name| {
            env.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn every_secret_can_come_from_a_file_and_debug_hides_them_all() {
        let dir = dir();
        let (pw, sasl, key, hook) = (
            dir.join("pw"),
            dir.join("sasl"),
            dir.join("key"),
            dir.join("hook"),
        );
        std::fs::write(&pw, "pg-Secret-1\n").unwrap();
        std::fs::write(&sasl, "sasl-Secret-2\n").unwrap();
        std::fs::write(&key, "key-Secret-3").unwrap();
        std::fs::write(
            &hook,
            "hook-Secret-4-0123456789\n\nhook-Secret-5-0123456789\n",
        )
        .unwrap();
        let text =
            BASE.replace(
                "database = \"d\"",
                &format!("database = \"d\"\npassword_file = \"{}\"", pw.display()),
            )
            .replace(
                "bootstrap_servers = \"h:1\"",
                &format!(
                    "bootstrap_servers = \"h:1\"\nsasl_password_file = \"{}\"\n\
                     ssl_key_password_file = \"{}\"",
                    sasl.display(),
                    key.display()
                ),
            ) + &format!(
                "[metrics]\n[inbox]\n[inbox.http]\n[inbox.http.secret_files]\nhooks = \"{}\"\n\
                 [inbox.kafka]\ntopics = [\"t\"]\ngroup_id = \"g\"\n\
                 [inbox.kafka.options]\n\"sasl.password\" = \"inbox-Secret-6\"\n",
                hook.display()
            );
        let config = resolved(&text, &[]).unwrap();
        let SourceConfig::Postgres(pg) = &config.source.engine else {
            panic!("postgres")
        };
        assert_eq!(pg.password.as_ref().unwrap().expose(), "pg-Secret-1");
        assert_eq!(config.kafka.options["sasl.password"], "sasl-Secret-2");
        assert_eq!(config.kafka.options["ssl.key.password"], "key-Secret-3");
        let http = config.inbox.as_ref().unwrap().http.as_ref().unwrap();
        assert_eq!(http.secrets["hooks"].len(), 2);
        assert_eq!(
            http.secrets["hooks"][1].expose(),
            "hook-Secret-5-0123456789"
        );
        let debug = format!("{config:?} {config:#?}");
        assert!(!debug.contains("Secret-"), "{debug}");
        // The environment still wins over a file.
        let config = resolved(&text, &[(ENV_KAFKA_SASL_PASSWORD, "from-env")]).unwrap();
        assert_eq!(config.kafka.options["sasl.password"], "from-env");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_value_and_its_file_together_or_an_unreadable_file_are_errors() {
        let missing = "/nonexistent/outboxd/pw";
        for (text, keys) in [
            (
                BASE.replace(
                    "database = \"d\"",
                    &format!(
                        "database = \"d\"\npassword = \"x-Secret\"\npassword_file = \"{missing}\""
                    ),
                ),
                &["source.password", "source.password_file"][..],
            ),
            (
                BASE.replace(
                    "database = \"d\"",
                    &format!("database = \"d\"\npassword_file = \"{missing}\""),
                ),
                &["source.password_file", missing][..],
            ),
            (
                BASE.replace(
                    "bootstrap_servers = \"h:1\"",
                    &format!("bootstrap_servers = \"h:1\"\nsasl_password_file = \"{missing}\""),
                ) + "[kafka.options]\n\"sasl.password\" = \"x-Secret\"\n",
                &[
                    "kafka.options.\"sasl.password\"",
                    "kafka.sasl_password_file",
                ][..],
            ),
            (
                BASE.replace(
                    "bootstrap_servers = \"h:1\"",
                    &format!("bootstrap_servers = \"h:1\"\nssl_key_password_file = \"{missing}\""),
                ),
                &["kafka.ssl_key_password_file", missing][..],
            ),
            (
                format!(
                    "{BASE}[metrics]\n[inbox]\n[inbox.http]\n[inbox.http.secrets]\n\
                     s = [\"x-Secret-0123456789\"]\n[inbox.http.secret_files]\ns = \"{missing}\"\n"
                ),
                &["inbox.http.secrets.s", "inbox.http.secret_files.s"][..],
            ),
        ] {
            let err = resolved(&text, &[]).unwrap_err().to_string();
            for key in keys {
                assert!(err.contains(key), "{key} in {err}");
            }
            assert!(!err.contains("x-Secret"), "{err}");
        }
    }

    /// Every file a secret is read from gets the config file's check: readable by the
    /// group or everyone, a warning naming the key, the file and `chmod 600 <file>`.
    #[cfg(unix)]
    #[test]
    fn a_secret_file_others_may_read_gets_a_warning_with_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = dir().join("modes");
        std::fs::create_dir_all(&dir).unwrap();
        let files = [
            ("source.password_file", dir.join("pw")),
            ("kafka.sasl_password_file", dir.join("sasl")),
            ("kafka.ssl_key_password_file", dir.join("key")),
            ("metrics.bearer_token_file", dir.join("token")),
            ("inbox.http.secret_files.hooks", dir.join("hooks")),
        ];
        for (_, path) in &files {
            std::fs::write(path, "mode-Secret-0123456789\n").unwrap();
        }
        let path = |i: usize| files[i].1.display().to_string();
        let text =
            BASE.replace(
                "database = \"d\"",
                &format!("database = \"d\"\npassword_file = \"{}\"", path(0)),
            )
            .replace(
                "bootstrap_servers = \"h:1\"",
                &format!(
                    "bootstrap_servers = \"h:1\"\nsasl_password_file = \"{}\"\n\
                     ssl_key_password_file = \"{}\"",
                    path(1),
                    path(2)
                ),
            ) + &format!(
                "[metrics]\nbearer_token_file = \"{}\"\n[inbox]\n[inbox.http]\n\
                 [inbox.http.secret_files]\nhooks = \"{}\"\n",
                path(3),
                path(4)
            );
        for (mode, readers) in [(0o644, "everyone"), (0o640, "its group")] {
            for (_, path) in &files {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
            }
            let config = resolved(&text, &[]).unwrap();
            for (key, path) in &files {
                let path = path.display().to_string();
                let warning = config
                    .warnings
                    .iter()
                    .find(|w| w.message.contains(key))
                    .unwrap_or_else(|| panic!("{key} at {mode:o}: {:?}", config.warnings));
                assert!(
                    warning.message.contains(&path)
                        && warning.message.contains(readers)
                        && warning.message.contains(&format!("mode {mode:o}")),
                    "{warning:?}"
                );
                assert!(
                    warning.fix.contains(&format!("chmod 600 {path}")),
                    "{warning:?}"
                );
                assert!(
                    !format!("{warning:?}").contains("mode-Secret"),
                    "{warning:?}"
                );
            }
        }
        for (_, path) in &files {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let config = resolved(&text, &[]).unwrap();
        assert_eq!(config.warnings, [], "0600 files are fine");
        // A file the environment overrides is not read, so not checked either.
        std::fs::set_permissions(&files[1].1, std::fs::Permissions::from_mode(0o644)).unwrap();
        let config = resolved(&text, &[(ENV_KAFKA_SASL_PASSWORD, "from-env")]).unwrap();
        assert_eq!(config.warnings, [], "{:?}", config.warnings);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Secret-looking librdkafka options written in the config file, in `[kafka.options]`
    /// and `[inbox.kafka.options]`, count as secrets the file holds.
    #[cfg(unix)]
    #[test]
    fn secret_kafka_options_in_a_readable_config_file_get_a_warning() {
        use std::os::unix::fs::PermissionsExt;
        let dir = dir().join("options");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("outboxd.toml");
        let text = format!(
            "{BASE}[kafka.options]\n\"sasl.password\" = \"opt-Secret-1\"\n\
             [inbox]\n[inbox.kafka]\ntopics = [\"t\"]\ngroup_id = \"g\"\n\
             [inbox.kafka.options]\n\"ssl.keystore.password\" = \"opt-Secret-2\"\n\
             \"ssl.key.password\" = \"opt-Secret-3\"\n\"sasl.password\" = \"opt-Secret-4\"\n"
        );
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let config = Config::load(&path).unwrap();
        let message = config
            .warnings
            .iter()
            .map(|w| w.message.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        for key in [
            "kafka.options.\"sasl.password\"",
            "inbox.kafka.options.\"ssl.keystore.password\"",
            "inbox.kafka.options.\"ssl.key.password\"",
            "inbox.kafka.options.\"sasl.password\"",
        ] {
            assert!(message.contains(key), "{key} in {message}");
        }
        assert!(!message.contains("opt-Secret"), "{message}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Config::load(&path).unwrap().warnings, []);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
