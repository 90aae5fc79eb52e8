//! The shared statements (written once, in PostgreSQL's spelling) in MySQL's and MariaDB's:
//! `$n` placeholders become positional `?` (a parameter used twice is bound twice), casts
//! name MySQL's types, `FOR UPDATE OF t` loses the table list MariaDB does not take, `key`
//! (reserved there) is quoted, and upserts become `ON DUPLICATE KEY UPDATE`. `ON CONFLICT DO
//! NOTHING` becomes a plain insert whose duplicate-key refusal the connection reads as "no row
//! inserted" (MySQL rolls back only the failed statement, so the transaction goes on). Quoted
//! text is never touched.

/// A statement as MySQL runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Translated {
    pub sql: String,
    /// For each `?`, in order, the index of the argument it binds.
    pub order: Vec<usize>,
    /// A duplicate key refusal means "nothing inserted" (`ON CONFLICT DO NOTHING`).
    pub ignore_duplicates: bool,
}

/// Translates one statement; a conditional upsert (`ON CONFLICT … DO UPDATE … WHERE`) has no
/// MySQL spelling and is refused.
pub(crate) fn translate(sql: &str) -> Result<Translated, String> {
    let (words, order) = words_and_placeholders(sql);
    let (sql, ignore_duplicates) = upsert(&words)?;
    Ok(Translated {
        sql,
        order,
        ignore_duplicates,
    })
}

/// Whether MySQL commits the open transaction before running `sql` (DDL, table locks,
/// transaction control, administrative statements): such a statement would break the
/// atomicity of whatever runs inside Capstan's transaction.
pub(crate) fn commits_implicitly(sql: &str) -> bool {
    const COMMITTING: [&str; 20] = [
        "ALTER", "CREATE", "DROP", "RENAME", "TRUNCATE", "LOCK", "UNLOCK", "GRANT", "REVOKE", "BEGIN", "START", "COMMIT", "LOAD",
        "ANALYZE", "OPTIMIZE", "REPAIR", "FLUSH", "RESET", "CACHE", "INSTALL",
    ];
    let first = sql
        .trim_start()
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or_default()
        .to_ascii_uppercase();
    let set_autocommit = first == "SET" && sql.to_ascii_uppercase().contains("AUTOCOMMIT");
    COMMITTING.contains(&first.as_str()) || set_autocommit
}

/// Placeholders, casts, lock clauses and reserved words; the argument order of the `?`s.
fn words_and_placeholders(sql: &str) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(sql.len());
    let mut order = Vec::new();
    let mut chars = sql.char_indices().peekable();
    let mut quoted = false;
    while let Some((at, c)) = chars.next() {
        if c == '\'' {
            quoted = !quoted;
            out.push(c);
            continue;
        }
        if quoted {
            out.push(c);
            continue;
        }
        if c == '$' && chars.peek().is_some_and(|(_, next)| next.is_ascii_digit()) {
            let mut number = 0usize;
            while let Some((_, digit)) = chars.peek().copied().filter(|(_, d)| d.is_ascii_digit()) {
                number = number * 10 + digit.to_digit(10).unwrap_or(0) as usize;
                chars.next();
            }
            order.push(number.saturating_sub(1));
            out.push('?');
            continue;
        }
        if c.is_ascii_alphabetic() && !sql[..at].ends_with(|p: char| p.is_ascii_alphanumeric() || p == '_' || p == '.') {
            let word_end = sql[at..]
                .find(|w: char| !(w.is_ascii_alphanumeric() || w == '_'))
                .map_or(sql.len(), |len| at + len);
            let word = &sql[at..word_end];
            if let Some(replacement) = rewrite_word(sql, at, word_end, word) {
                out.push_str(&replacement.text);
                // Skip what the rewrite consumed.
                while chars.peek().is_some_and(|(next, _)| *next < replacement.end) {
                    chars.next();
                }
                continue;
            }
            out.push_str(word);
            while chars.peek().is_some_and(|(next, _)| *next < word_end) {
                chars.next();
            }
            continue;
        }
        out.push(c);
    }
    (out, order)
}

struct Rewrite {
    text: String,
    /// Byte offset in the statement after what was rewritten.
    end: usize,
}

/// The words MySQL spells differently: casts' type names, `FOR UPDATE OF t`, the reserved
/// `key`.
fn rewrite_word(sql: &str, start: usize, end: usize, word: &str) -> Option<Rewrite> {
    let upper = word.to_ascii_uppercase();
    let rest = &sql[end..];
    match upper.as_str() {
        "KEY" => Some(Rewrite { text: "`key`".into(), end }),
        "AS" => {
            // Only inside CAST(… AS type), whatever the cast's operand nests: the type names
            // MySQL knows.
            if !inside_cast(&sql[..start]) {
                return None;
            }
            let trimmed = rest.trim_start();
            let skipped = rest.len() - trimmed.len();
            for (postgres, mysql) in [("TEXT", "CHAR"), ("BIGINT", "SIGNED"), ("DOUBLE PRECISION", "DOUBLE")] {
                if trimmed.len() >= postgres.len() && trimmed[..postgres.len()].eq_ignore_ascii_case(postgres) {
                    return Some(Rewrite {
                        text: format!("AS {mysql}"),
                        end: end + skipped + postgres.len(),
                    });
                }
            }
            None
        }
        "OF" if sql[..start].trim_end().to_ascii_uppercase().ends_with("FOR UPDATE") => {
            // `OF alias`: MariaDB locks the rows of every table the query reads instead.
            let trimmed = rest.trim_start();
            let alias_len = trimmed
                .find(|w: char| !(w.is_ascii_alphanumeric() || w == '_'))
                .unwrap_or(trimmed.len());
            Some(Rewrite {
                text: String::new(),
                end: end + (rest.len() - trimmed.len()) + alias_len,
            })
        }
        _ => None,
    }
}

/// `INSERT … ON CONFLICT …` as MySQL's upsert; whether a duplicate is to be read as "nothing
/// inserted". Statements without `ON CONFLICT` come back as they are.
fn upsert(sql: &str) -> Result<(String, bool), String> {
    let Some(at) = find_outside_quotes(sql, "ON CONFLICT") else {
        return Ok((sql.to_string(), false));
    };
    let head = sql[..at].trim_end();
    let tail = &sql[at + "ON CONFLICT".len()..];
    let action = match find_outside_quotes(tail, "DO ") {
        Some(position) => tail[position + 3..].trim_start(),
        None => return Ok((sql.to_string(), false)),
    };
    if action.to_ascii_uppercase().starts_with("NOTHING") {
        return Ok((head.to_string(), true));
    }
    let Some(assignments) = action.strip_prefix("UPDATE SET").or_else(|| action.strip_prefix("update set")) else {
        return Ok((sql.to_string(), false));
    };
    if find_outside_quotes(assignments, " WHERE ").is_some() {
        return Err("a conditional upsert has no MySQL spelling: write it as a locked read and an insert or update".into());
    }
    Ok((
        format!("{head} ON DUPLICATE KEY UPDATE {}", excluded_as_values(assignments.trim())),
        false,
    ))
}

/// `excluded.c` (the row that was to be inserted) as MySQL's `VALUES(c)`.
fn excluded_as_values(assignments: &str) -> String {
    let mut out = String::with_capacity(assignments.len());
    let mut rest = assignments;
    while let Some(at) = find_outside_quotes(rest, "excluded.").or_else(|| find_outside_quotes(rest, "EXCLUDED.")) {
        out.push_str(&rest[..at]);
        let column_start = at + "excluded.".len();
        let column_len = rest[column_start..]
            .find(|w: char| !(w.is_ascii_alphanumeric() || w == '_'))
            .unwrap_or(rest.len() - column_start);
        out.push_str(&format!("VALUES({})", &rest[column_start..column_start + column_len]));
        rest = &rest[column_start + column_len..];
    }
    out.push_str(rest);
    out
}

/// Whether the innermost parenthesis still open at the end of `before` is a `CAST(`.
fn inside_cast(before: &str) -> bool {
    let mut depth = 0usize;
    for (at, byte) in before.bytes().enumerate().rev() {
        match byte {
            b')' => depth += 1,
            b'(' if depth == 0 => return before[..at].to_ascii_uppercase().ends_with("CAST"),
            b'(' => depth -= 1,
            _ => {}
        }
    }
    false
}

/// The byte offset of `needle` (ASCII, matched case-insensitively) outside quoted text.
fn find_outside_quotes(haystack: &str, needle: &str) -> Option<usize> {
    let mut quoted = false;
    let bytes = haystack.as_bytes();
    for (at, byte) in bytes.iter().enumerate() {
        if *byte == b'\'' {
            quoted = !quoted;
        }
        if !quoted && bytes.len() - at >= needle.len() && haystack[at..at + needle.len()].eq_ignore_ascii_case(needle) {
            return Some(at);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(sql: &str) -> Translated {
        translate(sql).unwrap()
    }

    #[test]
    fn placeholders_become_positional_and_repeated_ones_bind_again() {
        let t = ok("SELECT a FROM t WHERE x = $2 AND (y = $1 OR z = $2) AND w = '$3'");
        assert_eq!(t.sql, "SELECT a FROM t WHERE x = ? AND (y = ? OR z = ?) AND w = '$3'");
        assert_eq!(t.order, vec![1, 0, 1]);
        assert!(!t.ignore_duplicates);
        assert_eq!(ok("SELECT $10, $1").order, vec![9, 0]);
    }

    #[test]
    fn casts_name_mysql_types() {
        let t = ok(
            "SELECT 1 WHERE (CAST($2 AS TEXT) IS NULL OR s = $2) AND (CAST($4 AS BIGINT) IS NULL) AND CAST(r.n AS DOUBLE PRECISION) > $1 AND CAST(SUM(n) AS BIGINT) > 0",
        );
        assert_eq!(
            t.sql,
            "SELECT 1 WHERE (CAST(? AS CHAR) IS NULL OR s = ?) AND (CAST(? AS SIGNED) IS NULL) AND CAST(r.n AS DOUBLE) > ? AND CAST(SUM(n) AS SIGNED) > 0"
        );
    }

    #[test]
    fn row_locks_lose_their_table_list() {
        let t = ok("SELECT r.state FROM runs r JOIN tasks t ON t.run_id = r.run_id WHERE r.run_id = $1 FOR UPDATE OF r SKIP LOCKED");
        assert!(t.sql.ends_with("FOR UPDATE  SKIP LOCKED"), "{}", t.sql);
        let t = ok("SELECT 1 FROM workflow_instances i WHERE i.workflow_id = $1 FOR UPDATE OF i");
        assert!(t.sql.trim_end().ends_with("FOR UPDATE"), "{}", t.sql);
    }

    #[test]
    fn the_reserved_key_column_is_quoted_but_not_other_words() {
        let t = ok("SELECT run_id FROM search_attribute_index WHERE key = $1 AND value = $2 AND monkey = 'key'");
        assert_eq!(
            t.sql,
            "SELECT run_id FROM search_attribute_index WHERE `key` = ? AND value = ? AND monkey = 'key'"
        );
        let t = ok("SELECT idempotency_key, s.key FROM x s");
        assert_eq!(t.sql, "SELECT idempotency_key, s.key FROM x s");
    }

    #[test]
    fn upserts_become_on_duplicate_key_update() {
        let t = ok("INSERT INTO poll_requests (namespace, task_id, fence) VALUES ($1, $2, $3)
     ON CONFLICT (namespace, task_id)
     DO UPDATE SET task_id = excluded.task_id, fence = excluded.fence");
        assert_eq!(
            t.sql,
            "INSERT INTO poll_requests (namespace, task_id, fence) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE task_id = VALUES(task_id), fence = VALUES(fence)"
        );
        assert!(!t.ignore_duplicates);
        let t = ok("INSERT INTO health_probe (id, probed_at) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET probed_at = EXCLUDED.probed_at");
        assert!(
            t.sql.ends_with("ON DUPLICATE KEY UPDATE probed_at = VALUES(probed_at)"),
            "{}",
            t.sql
        );
    }

    #[test]
    fn do_nothing_becomes_an_insert_whose_duplicate_is_no_row() {
        for sql in [
            "INSERT INTO namespaces (name, description, created_at, doc) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            "INSERT INTO workflow_streams (run_id, stream_name) VALUES ($1, $2) ON CONFLICT (run_id, stream_name) DO NOTHING",
        ] {
            let t = ok(sql);
            assert!(t.ignore_duplicates);
            assert!(
                t.sql.ends_with("VALUES (?, ?, ?, ?)") || t.sql.ends_with("VALUES (?, ?)"),
                "{}",
                t.sql
            );
        }
    }

    #[test]
    fn a_conditional_upsert_is_refused() {
        let refused = translate("INSERT INTO t (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v WHERE t.v < excluded.v");
        assert!(refused.unwrap_err().contains("conditional upsert"));
    }

    #[test]
    fn statements_that_commit_implicitly_are_recognised() {
        for sql in [
            "CREATE TABLE t (a INT)",
            "  drop table t",
            "LOCK TABLES t WRITE",
            "SET autocommit = 1",
            "START TRANSACTION",
            "TRUNCATE t",
        ] {
            assert!(commits_implicitly(sql), "{sql}");
        }
        for sql in [
            "INSERT INTO t VALUES (1)",
            "SELECT created FROM t",
            "UPDATE t SET a = 1",
            "SET @x = 1",
            "SAVEPOINT s",
        ] {
            assert!(!commits_implicitly(sql), "{sql}");
        }
    }
}
