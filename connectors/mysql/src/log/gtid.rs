//! GTID bookkeeping: the set of transactions executed up to a binlog position, in the
//! text forms the servers use, so a checkpoint can be checked against `gtid_purged`
//! (MySQL) or read by an operator.
//!
//! - MySQL: `uuid:1-5:7,uuid2[:tag]:1-3`, a set of intervals per source UUID (and tag,
//!   MySQL 8.3+).
//! - MariaDB: `domain-server-seq` per replication domain, the last GTID of each domain
//!   (`gtid_binlog_pos` form), e.g. `0-1-42,1-2-7`.

use std::collections::BTreeMap;
use std::fmt;

/// One transaction's GTID, as read from its GTID event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Gtid {
    /// MySQL: source UUID (lower-case, hyphenated), optional tag, transaction number.
    MySql {
        uuid: String,
        tag: Option<String>,
        gno: u64,
    },
    /// MariaDB: domain, originating server, sequence number.
    MariaDb { domain: u32, server: u32, seq: u64 },
}

/// The GTID state at a position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum GtidState {
    MySql(MysqlGtidSet),
    MariaDb(MariaDbGtidPos),
}

impl GtidState {
    /// Parses a state in the server flavor's text form.
    pub(crate) fn parse(text: &str, mariadb: bool) -> Option<Self> {
        if mariadb {
            MariaDbGtidPos::parse(text).map(GtidState::MariaDb)
        } else {
            MysqlGtidSet::parse(text).map(GtidState::MySql)
        }
    }

    /// Adds a committed transaction. GTIDs of the other flavor are ignored.
    pub(crate) fn add(&mut self, gtid: &Gtid) {
        match (self, gtid) {
            (GtidState::MySql(set), Gtid::MySql { uuid, tag, gno }) => {
                set.add(uuid, tag.as_deref(), *gno);
            }
            (
                GtidState::MariaDb(pos),
                Gtid::MariaDb {
                    domain,
                    server,
                    seq,
                },
            ) => {
                pos.domains.insert(*domain, (*server, *seq));
            }
            _ => {}
        }
    }
}

impl fmt::Display for GtidState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GtidState::MySql(set) => set.fmt(f),
            GtidState::MariaDb(pos) => pos.fmt(f),
        }
    }
}

/// MySQL's GTID set: per (UUID, tag), sorted disjoint inclusive intervals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct MysqlGtidSet {
    sources: BTreeMap<(String, String), Vec<(u64, u64)>>,
}

impl MysqlGtidSet {
    /// Parses `uuid:1-5:7,uuid2:tag:1-3` (whitespace and newlines, as MySQL prints long
    /// sets, are ignored). The empty string is the empty set.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let mut set = Self::default();
        for part in compact.split(',').filter(|p| !p.is_empty()) {
            let mut fields = part.split(':');
            let uuid = fields.next()?.to_ascii_lowercase();
            if uuid.len() != 36 || !uuid.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
                return None;
            }
            let mut tag = String::new();
            for field in fields {
                if field.starts_with(|c: char| c.is_ascii_digit()) {
                    let (start, end) = match field.split_once('-') {
                        Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
                        None => {
                            let n = field.parse().ok()?;
                            (n, n)
                        }
                    };
                    if start == 0 || end < start {
                        return None;
                    }
                    set.add_interval(&uuid, &tag, start, end);
                } else {
                    tag = field.to_ascii_lowercase();
                }
            }
        }
        Some(set)
    }

    pub(crate) fn add(&mut self, uuid: &str, tag: Option<&str>, gno: u64) {
        self.add_interval(uuid, tag.unwrap_or(""), gno, gno);
    }

    fn add_interval(&mut self, uuid: &str, tag: &str, start: u64, end: u64) {
        let intervals = self
            .sources
            .entry((uuid.to_owned(), tag.to_owned()))
            .or_default();
        // The common case: extends the last interval.
        if let Some(last) = intervals.last_mut() {
            if start >= last.0 && start <= last.1.saturating_add(1) {
                last.1 = last.1.max(end);
                return;
            }
        }
        intervals.push((start, end));
        intervals.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(intervals.len());
        for &(s, e) in intervals.iter() {
            match merged.last_mut() {
                Some(last) if s <= last.1.saturating_add(1) => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        *intervals = merged;
    }
}

impl fmt::Display for MysqlGtidSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut previous_uuid: Option<&str> = None;
        for ((uuid, tag), intervals) in &self.sources {
            if previous_uuid != Some(uuid.as_str()) {
                if previous_uuid.is_some() {
                    f.write_str(",")?;
                }
                f.write_str(uuid)?;
                previous_uuid = Some(uuid);
            }
            if !tag.is_empty() {
                write!(f, ":{tag}")?;
            }
            for (s, e) in intervals {
                if s == e {
                    write!(f, ":{s}")?;
                } else {
                    write!(f, ":{s}-{e}")?;
                }
            }
        }
        Ok(())
    }
}

/// MariaDB's binlog GTID position: the last GTID of each domain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct MariaDbGtidPos {
    /// domain → (server id, sequence number)
    pub(crate) domains: BTreeMap<u32, (u32, u64)>,
}

impl MariaDbGtidPos {
    /// Parses `0-1-42,1-2-7`; the empty string is the empty position.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let mut pos = Self::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut fields = part.split('-');
            let domain = fields.next()?.parse().ok()?;
            let server = fields.next()?.parse().ok()?;
            let seq = fields.next()?.parse().ok()?;
            if fields.next().is_some() {
                return None;
            }
            pos.domains.insert(domain, (server, seq));
        }
        Some(pos)
    }
}

impl fmt::Display for MariaDbGtidPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (domain, (server, seq))) in self.domains.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{domain}-{server}-{seq}")?;
        }
        Ok(())
    }
}

/// A 16-byte SID as MySQL's hyphenated lower-case UUID text.
pub(crate) fn uuid_text(sid: &[u8; 16]) -> String {
    let mut out = String::with_capacity(36);
    for (i, b) in sid.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const U1: &str = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
    const U2: &str = "4d2b1c3a-0000-11e1-9e33-c80aa9429562";

    #[test]
    fn mysql_sets_parse_merge_and_render() {
        let text = format!("{}:1-5:7,\n{U2}:1-3", U1.to_uppercase());
        let mut set = MysqlGtidSet::parse(&text).unwrap();
        assert_eq!(set.to_string(), format!("{U1}:1-5:7,{U2}:1-3"));
        set.add(U1, None, 6);
        assert_eq!(set.to_string(), format!("{U1}:1-7,{U2}:1-3"));
        set.add(U1, None, 9);
        set.add(U2, Some("blue"), 1);
        assert_eq!(
            set.to_string(),
            format!("{U1}:1-7:9,{U2}:1-3:blue:1"),
            "tags follow their uuid's untagged intervals"
        );
        let again = MysqlGtidSet::parse(&set.to_string()).unwrap();
        assert_eq!(again, set);
        assert_eq!(MysqlGtidSet::parse("").unwrap().to_string(), "");
        assert!(MysqlGtidSet::parse("nonsense:1-2").is_none());
        assert!(MysqlGtidSet::parse(&format!("{U1}:5-1")).is_none());
    }

    #[test]
    fn mariadb_positions_keep_the_last_gtid_per_domain() {
        let mut state = GtidState::parse("1-2-7,0-1-42", true).unwrap();
        assert_eq!(state.to_string(), "0-1-42,1-2-7");
        state.add(&Gtid::MariaDb {
            domain: 0,
            server: 1,
            seq: 43,
        });
        state.add(&Gtid::MariaDb {
            domain: 5,
            server: 3,
            seq: 1,
        });
        assert_eq!(state.to_string(), "0-1-43,1-2-7,5-3-1");
        assert!(GtidState::parse("0-1", true).is_none());
        assert_eq!(GtidState::parse("", true).unwrap().to_string(), "");
    }

    #[test]
    fn uuids_render_like_mysql() {
        let sid = [
            0x3e, 0x11, 0xfa, 0x47, 0x71, 0xca, 0x11, 0xe1, 0x9e, 0x33, 0xc8, 0x0a, 0xa9, 0x42,
            0x95, 0x62,
        ];
        assert_eq!(uuid_text(&sid), U1);
    }
}
