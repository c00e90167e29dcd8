//! The config of the inbox `verify --inbox` runs: the operator's file plus the run's
//! source and handlers, written to a new file of mode 0600 (it holds whatever secrets the
//! file holds, and the run's own), deleted when the guard is dropped, whatever ends the
//! run.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};

use crate::config::Config;

/// The child's config file; deleted when dropped.
#[derive(Debug)]
pub(super) struct ChildConfig(PathBuf);

impl ChildConfig {
    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ChildConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The config file with the run's source and handlers added, written to `to` (0600: it
/// holds whatever secrets the file holds).
pub(super) fn write_child_config(
    from: &Path,
    to: &Path,
    source: &str,
    secret: &str,
    prefix: &str,
    types: u32,
    statement: &str,
) -> anyhow::Result<ChildConfig> {
    use toml::{Table, Value};
    let text =
        std::fs::read_to_string(from).with_context(|| format!("cannot read {}", from.display()))?;
    let mut config: Table = text.parse().context("the config file is not TOML")?;
    fn table<'a>(parent: &'a mut Table, key: &str) -> anyhow::Result<&'a mut Table> {
        parent
            .entry(key)
            .or_insert_with(|| Value::Table(Table::new()))
            .as_table_mut()
            .ok_or_else(|| anyhow!("`{key}` in the config file is not a table"))
    }
    let inbox = table(&mut config, "inbox")?;
    let http = table(inbox, "http")?;
    let secrets = table(http, "secrets")?;
    secrets.insert(
        source.into(),
        Value::Array(vec![Value::String(secret.into())]),
    );
    let sources = table(http, "sources")?;
    let mut own = Table::new();
    own.insert("key_field".into(), Value::String("key".into()));
    sources.insert(source.into(), Value::Table(own));
    let handlers = table(inbox, "handlers")?;
    if let Some(taken) = (0..types)
        .map(|n| format!("{prefix}.{n}"))
        .find(|name| handlers.contains_key(name))
    {
        bail!(
            "the config has a handler for `{taken}`, one of verify's message types: pass \
             another --message-type"
        );
    }
    for n in 0..types {
        let mut handler = Table::new();
        handler.insert("kind".into(), Value::String("sql".into()));
        handler.insert("statement".into(), Value::String(statement.into()));
        handler.insert(
            "sources".into(),
            Value::Array(vec![Value::String(source.into())]),
        );
        handlers.insert(format!("{prefix}.{n}"), Value::Table(handler));
    }
    let text = toml::to_string(&config).context("cannot write the child's config")?;
    Config::parse(&text).map_err(|e| anyhow!("the child's config is refused: {e}"))?;
    // A new file only (never one someone else made, with its permissions), 0600.
    let mut options = std::fs::File::options();
    options.write(true).create_new(true);
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(to)
        .with_context(|| format!("cannot create {}", to.display()))?;
    let written = std::io::Write::write_all(&mut file, text.as_bytes());
    let guard = ChildConfig(to.to_owned());
    written.with_context(|| format!("cannot write {}", to.display()))?;
    Ok(guard)
}
