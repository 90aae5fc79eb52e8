//! What an acknowledged change's survival rests on, as the database server reports it, and
//! the settings that put it at risk on either database.

/// The server's settings an acknowledged change's survival rests on, as `(name, value)` the
/// way the database prints them. PostgreSQL: `fsync` (WAL flushed at all), `full_page_writes`
/// (no torn pages after a power cut), `synchronous_commit` (COMMIT waits for the flush; the
/// store's sessions ask for `on`). MySQL and MariaDB: `innodb_flush_log_at_trx_commit` (the
/// redo log flushed at each commit: `1`), `log_bin` and `sync_binlog` (a binary log, where
/// there is one, synced at each commit), `innodb_doublewrite` (no torn pages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Durability {
    pub settings: Vec<(String, String)>,
}

impl Durability {
    /// The value of one setting, if the database reported it.
    pub fn setting(&self, name: &str) -> Option<&str> {
        self.settings.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Each setting that lets a power cut lose or corrupt an acknowledged change, with why.
    pub fn risks(&self) -> Vec<String> {
        let on = |value: &str| matches!(value.to_ascii_lowercase().as_str(), "on" | "1" | "true");
        let mut risks = Vec::new();
        for (name, value) in &self.settings {
            let risk = match name.as_str() {
                "fsync" if !on(value) => "the database does not flush its WAL; a power cut can lose or corrupt acknowledged changes",
                "full_page_writes" if !on(value) => "a power cut mid-write can leave torn pages",
                "synchronous_commit" if !matches!(value.as_str(), "on" | "remote_write" | "remote_apply") => {
                    "a COMMIT returns before its WAL is flushed; a crash can lose acknowledged changes"
                }
                "innodb_flush_log_at_trx_commit" if value != "1" => {
                    "a COMMIT returns before its redo log is flushed; a crash can lose acknowledged changes"
                }
                "sync_binlog" if value != "1" && self.setting("log_bin").is_some_and(on) => {
                    "the binary log is not synced at each commit; a crash can leave replicas and recovery out of step"
                }
                "innodb_doublewrite" if !on(value) => "a power cut mid-write can leave torn pages",
                _ => continue,
            };
            risks.push(format!("{name} = {value}: {risk}"));
        }
        risks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(settings: &[(&str, &str)]) -> Durability {
        Durability {
            settings: settings.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
        }
    }

    #[test]
    fn safe_settings_carry_no_risk_on_either_database() {
        assert!(
            of(&[("fsync", "on"), ("full_page_writes", "on"), ("synchronous_commit", "remote_apply")])
                .risks()
                .is_empty()
        );
        let mysql = [
            ("innodb_flush_log_at_trx_commit", "1"),
            ("log_bin", "0"),
            ("sync_binlog", "0"),
            ("innodb_doublewrite", "1"),
        ];
        assert!(of(&mysql).risks().is_empty(), "no binary log: its sync does not matter");
    }

    #[test]
    fn each_risky_setting_is_named_with_its_value() {
        let risks = of(&[("fsync", "off"), ("full_page_writes", "off"), ("synchronous_commit", "local")]).risks();
        assert_eq!(risks.len(), 3, "{risks:?}");
        assert!(risks[2].starts_with("synchronous_commit = local: "), "{risks:?}");
        let risks = of(&[
            ("innodb_flush_log_at_trx_commit", "2"),
            ("log_bin", "1"),
            ("sync_binlog", "0"),
            ("innodb_doublewrite", "OFF"),
        ])
        .risks();
        assert_eq!(risks.len(), 3, "{risks:?}");
        assert!(risks[0].starts_with("innodb_flush_log_at_trx_commit = 2: "), "{risks:?}");
    }
}
