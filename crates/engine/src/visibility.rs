//! Search attributes and the visibility query language, as pure functions: the attribute types,
//! which names are system or reserved, whether a value fits its type, and the list-filter
//! grammar parsed and type-checked into a [`Filter`] the store compiles to SQL.
//!
//! Grammar (keywords case-insensitive):
//! ```text
//! expr      := and_expr ( OR and_expr )*
//! and_expr  := unary ( AND unary )*
//! unary     := NOT unary | '(' expr ')' | predicate
//! predicate := Name op literal | Name IN '(' literal ( ',' literal )* ')'
//! op        := = | != | < | <= | > | >=
//! literal   := "text" | 'text' | number | true | false
//! ```
//! A keyword list matches `=` when any element equals the literal (membership). Comparing an
//! attribute with a literal of another type is an error, never an empty result.

use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttributeType {
    Keyword,
    Text,
    Int,
    Double,
    Bool,
    Datetime,
    KeywordList,
}

impl AttributeType {
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "keyword" => Self::Keyword,
            "text" | "string" => Self::Text,
            "int" => Self::Int,
            "double" => Self::Double,
            "bool" => Self::Bool,
            "datetime" => Self::Datetime,
            "keyword_list" => Self::KeywordList,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Keyword => "keyword",
            Self::Text => "text",
            Self::Int => "int",
            Self::Double => "double",
            Self::Bool => "bool",
            Self::Datetime => "datetime",
            Self::KeywordList => "keyword_list",
        }
    }

    /// Whether `value` is a value of this type (datetimes are RFC 3339 strings).
    pub fn accepts(self, value: &Value) -> bool {
        match (self, value) {
            (_, Value::Null) => true,
            (Self::Keyword | Self::Text, Value::String(_)) => true,
            (Self::Int, Value::Number(n)) => n.is_i64() || n.is_u64(),
            (Self::Double, Value::Number(_)) => true,
            (Self::Bool, Value::Bool(_)) => true,
            (Self::Datetime, Value::String(s)) => parse_datetime(s).is_some(),
            (Self::KeywordList, Value::Array(items)) => items.iter().all(Value::is_string),
            (Self::KeywordList, Value::String(_)) => true,
            _ => false,
        }
    }
}

/// Milliseconds since the epoch of an RFC 3339 time.
pub fn parse_datetime(text: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(text.trim()).ok().map(|t| t.timestamp_millis())
}

/// The attributes every run has, with the run column each reads.
pub const SYSTEM_ATTRIBUTES: &[(&str, AttributeType)] = &[
    ("WorkflowId", AttributeType::Keyword),
    ("WorkflowType", AttributeType::Keyword),
    ("RunId", AttributeType::Keyword),
    ("BusinessKey", AttributeType::Keyword),
    ("ExecutionStatus", AttributeType::Keyword),
    ("TaskQueue", AttributeType::Keyword),
    ("StartTime", AttributeType::Datetime),
    ("CloseTime", AttributeType::Datetime),
];

pub fn system_attribute(name: &str) -> Option<AttributeType> {
    SYSTEM_ATTRIBUTES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, t)| *t)
}

/// Why a custom attribute name is refused, if it is.
pub fn invalid_attribute_name(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    if name.is_empty() || name.len() > 128 {
        Some("A search attribute name is 1 to 128 characters.")
    } else if !name.as_bytes()[0].is_ascii_alphabetic() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        Some("A search attribute name starts with a letter and has only letters, digits and '_'.")
    } else if system_attribute(name).is_some() {
        Some("This is a system attribute name.")
    } else if ["wf_", "dw_", "capstan", "temporal", "system"].iter().any(|p| lower.starts_with(p)) {
        Some("Names starting with wf_, dw_, capstan, temporal or system are reserved.")
    } else {
        None
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Literal {
    Text(String),
    Int(i64),
    Double(f64),
    Bool(bool),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Op {
    pub fn sql(self) -> &'static str {
        match self {
            Op::Eq => "=",
            Op::Ne => "<>",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
    }
}

/// What a comparison reads: a run column (system attribute) or the search-attribute index.
#[derive(Clone, Debug, PartialEq)]
pub enum Field {
    /// `workflow_id`, `workflow_type`, `run_id`, `business_key`, `status`, `task_queue`,
    /// `started_at`, `closed_at`.
    Column(&'static str),
    Custom {
        name: String,
        kind: AttributeType,
    },
}

/// A comparison value, already in the form the store compares: text, or a number (ints,
/// doubles, datetimes as epoch ms, bools as 0/1).
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    Text(String),
    Number(f64),
}

/// A type-checked filter.
#[derive(Clone, Debug, PartialEq)]
pub enum Filter {
    And(Vec<Filter>),
    Or(Vec<Filter>),
    Not(Box<Filter>),
    Compare { field: Field, op: Op, value: Operand },
    In { field: Field, values: Vec<Operand> },
}

impl Filter {
    /// Whether every run this filter selects has a row in the search-attribute index that one
    /// of its comparisons names: then the index's matches can drive the search instead of a
    /// walk over every run. `!=` and `NOT` match runs without the attribute, so they do not.
    pub fn requires_attribute(&self) -> bool {
        match self {
            Filter::And(parts) => parts.iter().any(Filter::requires_attribute),
            Filter::Or(parts) => !parts.is_empty() && parts.iter().all(Filter::requires_attribute),
            Filter::Not(_) => false,
            Filter::Compare { field, op, .. } => matches!(field, Field::Custom { .. }) && *op != Op::Ne,
            Filter::In { field, .. } => matches!(field, Field::Custom { .. }),
        }
    }
}

/// A query the grammar or the schema refuses: `reason` is the DW-style error reason.
#[derive(Clone, Debug, PartialEq)]
pub struct QueryError {
    pub reason: crate::Reason,
    pub message: String,
}

fn error(reason: crate::Reason, message: impl Into<String>) -> QueryError {
    QueryError {
        reason,
        message: message.into(),
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Name(String),
    Lit(Literal),
    Op(Op),
    Open,
    Close,
    Comma,
}

fn tokenize(text: &str) -> Result<Vec<Token>, QueryError> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '(' => {
                tokens.push(Token::Open);
                i += 1;
            }
            ')' => {
                tokens.push(Token::Close);
                i += 1;
            }
            ',' => {
                tokens.push(Token::Comma);
                i += 1;
            }
            '=' => {
                tokens.push(Token::Op(Op::Eq));
                i += 1;
            }
            '!' if chars.get(i + 1) == Some(&'=') => {
                tokens.push(Token::Op(Op::Ne));
                i += 2;
            }
            '<' | '>' => {
                let eq = chars.get(i + 1) == Some(&'=');
                let ne = c == '<' && chars.get(i + 1) == Some(&'>');
                tokens.push(Token::Op(match (c, eq, ne) {
                    (_, _, true) => Op::Ne,
                    ('<', true, _) => Op::Le,
                    ('<', false, _) => Op::Lt,
                    (_, true, _) => Op::Ge,
                    _ => Op::Gt,
                }));
                i += if eq || ne { 2 } else { 1 };
            }
            '"' | '\'' => {
                let quote = c;
                let mut value = String::new();
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err(error(crate::Reason::InvalidVisibilityQuery, "A quoted value is not closed.")),
                        Some('\\') => {
                            value.push(
                                *chars
                                    .get(i + 1)
                                    .ok_or_else(|| error(crate::Reason::InvalidVisibilityQuery, "A dangling escape."))?,
                            );
                            i += 2;
                        }
                        Some(&q) if q == quote => {
                            i += 1;
                            break;
                        }
                        Some(&other) => {
                            value.push(other);
                            i += 1;
                        }
                    }
                }
                tokens.push(Token::Lit(Literal::Text(value)));
            }
            c if c.is_ascii_digit() || c == '-' || c == '.' => {
                let start = i;
                i += 1;
                while i < chars.len() && (chars[i].is_ascii_digit() || matches!(chars[i], '.' | 'e' | 'E' | '+' | '-')) {
                    i += 1;
                }
                let text: String = chars[start..i].iter().collect();
                let literal = if let Ok(n) = text.parse::<i64>() {
                    Literal::Int(n)
                } else if let Ok(x) = text.parse::<f64>() {
                    Literal::Double(x)
                } else {
                    return Err(error(crate::Reason::InvalidVisibilityQuery, format!("{text:?} is not a number.")));
                };
                tokens.push(Token::Lit(literal));
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                tokens.push(match word.to_ascii_lowercase().as_str() {
                    "true" => Token::Lit(Literal::Bool(true)),
                    "false" => Token::Lit(Literal::Bool(false)),
                    _ => Token::Name(word),
                });
            }
            other => {
                return Err(error(
                    crate::Reason::InvalidVisibilityQuery,
                    format!("Unexpected character {other:?}."),
                ))
            }
        }
    }
    Ok(tokens)
}

struct Parser<'a> {
    tokens: Vec<Token>,
    at: usize,
    schema: &'a BTreeMap<String, AttributeType>,
    depth: usize,
}

const MAX_DEPTH: usize = 32;

impl Parser<'_> {
    fn peek_word(&self, word: &str) -> bool {
        matches!(self.tokens.get(self.at), Some(Token::Name(w)) if w.eq_ignore_ascii_case(word))
    }

    fn expr(&mut self) -> Result<Filter, QueryError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(error(crate::Reason::InvalidVisibilityQuery, "The query nests too deeply."));
        }
        let mut parts = vec![self.and_expr()?];
        while self.peek_word("or") {
            self.at += 1;
            parts.push(self.and_expr()?);
        }
        self.depth -= 1;
        Ok(if parts.len() == 1 {
            parts.pop().expect("one")
        } else {
            Filter::Or(parts)
        })
    }

    fn and_expr(&mut self) -> Result<Filter, QueryError> {
        let mut parts = vec![self.unary()?];
        while self.peek_word("and") {
            self.at += 1;
            parts.push(self.unary()?);
        }
        Ok(if parts.len() == 1 {
            parts.pop().expect("one")
        } else {
            Filter::And(parts)
        })
    }

    fn unary(&mut self) -> Result<Filter, QueryError> {
        if self.peek_word("not") {
            self.at += 1;
            self.depth += 1;
            if self.depth > MAX_DEPTH {
                return Err(error(crate::Reason::InvalidVisibilityQuery, "The query nests too deeply."));
            }
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(Filter::Not(Box::new(inner)));
        }
        if self.tokens.get(self.at) == Some(&Token::Open) {
            self.at += 1;
            let inner = self.expr()?;
            if self.tokens.get(self.at) != Some(&Token::Close) {
                return Err(error(crate::Reason::InvalidVisibilityQuery, "A '(' is not closed."));
            }
            self.at += 1;
            return Ok(inner);
        }
        self.predicate()
    }

    fn predicate(&mut self) -> Result<Filter, QueryError> {
        let Some(Token::Name(name)) = self.tokens.get(self.at).cloned() else {
            return Err(error(crate::Reason::InvalidVisibilityQuery, "Expected an attribute name."));
        };
        self.at += 1;
        let (field, kind) = self.field(&name)?;
        if self.peek_word("in") {
            self.at += 1;
            if self.tokens.get(self.at) != Some(&Token::Open) {
                return Err(error(crate::Reason::InvalidVisibilityQuery, "IN takes a parenthesised list."));
            }
            self.at += 1;
            let mut values = Vec::new();
            loop {
                let Some(Token::Lit(literal)) = self.tokens.get(self.at).cloned() else {
                    return Err(error(crate::Reason::InvalidVisibilityQuery, "Expected a value in the IN list."));
                };
                self.at += 1;
                values.push(operand(&name, kind, &literal)?);
                match self.tokens.get(self.at) {
                    Some(Token::Comma) => self.at += 1,
                    Some(Token::Close) => {
                        self.at += 1;
                        break;
                    }
                    _ => return Err(error(crate::Reason::InvalidVisibilityQuery, "An IN list is not closed.")),
                }
            }
            return Ok(Filter::In { field, values });
        }
        let Some(Token::Op(op)) = self.tokens.get(self.at).cloned() else {
            return Err(error(
                crate::Reason::InvalidVisibilityQuery,
                format!("Expected an operator after {name}."),
            ));
        };
        self.at += 1;
        let Some(Token::Lit(literal)) = self.tokens.get(self.at).cloned() else {
            return Err(error(
                crate::Reason::InvalidVisibilityQuery,
                format!("Expected a value after {name} {}.", op.sql()),
            ));
        };
        self.at += 1;
        let ordered = matches!(op, Op::Lt | Op::Le | Op::Gt | Op::Ge);
        if ordered && matches!(kind, AttributeType::Bool | AttributeType::KeywordList | AttributeType::Text) {
            return Err(error(
                crate::Reason::InvalidVisibilityQuery,
                format!("{name} is a {} attribute: it has no order (use = or !=).", kind.as_str()),
            ));
        }
        Ok(Filter::Compare {
            field,
            op,
            value: operand(&name, kind, &literal)?,
        })
    }

    fn field(&self, name: &str) -> Result<(Field, AttributeType), QueryError> {
        let column = match name.to_ascii_lowercase().as_str() {
            "workflowid" => Some("workflow_id"),
            "workflowtype" => Some("workflow_type"),
            "runid" => Some("run_id"),
            "businesskey" => Some("business_key"),
            "executionstatus" => Some("status"),
            "taskqueue" => Some("task_queue"),
            "starttime" => Some("started_at"),
            "closetime" => Some("closed_at"),
            _ => None,
        };
        if let Some(column) = column {
            return Ok((Field::Column(column), system_attribute(name).expect("listed")));
        }
        match self.schema.get(name) {
            Some(kind) => Ok((
                Field::Custom {
                    name: name.to_string(),
                    kind: *kind,
                },
                *kind,
            )),
            None => Err(error(
                crate::Reason::UnknownSearchAttribute,
                format!("{name} is not a search attribute of this namespace (define it with POST /api/search-attributes)."),
            )),
        }
    }
}

fn operand(name: &str, kind: AttributeType, literal: &Literal) -> Result<Operand, QueryError> {
    let wrong = || {
        error(
            crate::Reason::InvalidVisibilityQuery,
            format!("{name} is a {} attribute; {literal:?} is not a value of that type.", kind.as_str()),
        )
    };
    Ok(match (kind, literal) {
        (AttributeType::Keyword | AttributeType::Text | AttributeType::KeywordList, Literal::Text(s)) => Operand::Text(s.clone()),
        (AttributeType::Int, Literal::Int(n)) => Operand::Number(*n as f64),
        (AttributeType::Double, Literal::Int(n)) => Operand::Number(*n as f64),
        (AttributeType::Double, Literal::Double(x)) => Operand::Number(*x),
        (AttributeType::Bool, Literal::Bool(b)) => Operand::Number(if *b { 1.0 } else { 0.0 }),
        (AttributeType::Datetime, Literal::Text(s)) => Operand::Number(parse_datetime(s).ok_or_else(wrong)? as f64),
        _ => return Err(wrong()),
    })
}

/// Whether `text` is meant as a filter at all: free text without an operator is a substring
/// search over ids and types, as in DW.
pub fn looks_like_filter(text: &str) -> bool {
    text.contains(['=', '<', '>', '!', '('])
}

/// Parses and type-checks a filter against the system attributes and `schema` (the namespace's
/// custom attributes).
pub fn parse_filter(text: &str, schema: &BTreeMap<String, AttributeType>) -> Result<Filter, QueryError> {
    if text.len() > 4096 {
        return Err(error(
            crate::Reason::InvalidVisibilityQuery,
            "The query is longer than 4096 characters.",
        ));
    }
    let tokens = tokenize(text)?;
    if tokens.is_empty() {
        return Err(error(crate::Reason::InvalidVisibilityQuery, "The query is empty."));
    }
    let mut parser = Parser {
        tokens,
        at: 0,
        schema,
        depth: 0,
    };
    let filter = parser.expr()?;
    if parser.at != parser.tokens.len() {
        return Err(error(
            crate::Reason::InvalidVisibilityQuery,
            "Unexpected text after the end of the query.",
        ));
    }
    Ok(filter)
}

/// The number an index row carries for range comparisons, if its value has one.
pub fn numeric_value(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        Value::String(s) => parse_datetime(s).map(|ms| ms as f64),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> BTreeMap<String, AttributeType> {
        [
            ("Tier", AttributeType::Keyword),
            ("Amount", AttributeType::Int),
            ("Score", AttributeType::Double),
            ("Vip", AttributeType::Bool),
            ("DueAt", AttributeType::Datetime),
            ("Tags", AttributeType::KeywordList),
        ]
        .into_iter()
        .map(|(n, t)| (n.to_string(), t))
        .collect()
    }

    fn custom(name: &str, kind: AttributeType) -> Field {
        Field::Custom { name: name.into(), kind }
    }

    #[test]
    fn precedence_is_not_then_and_then_or() {
        let parsed = parse_filter(r#"Tier = "gold" OR NOT Vip = true AND Amount >= 10"#, &schema()).unwrap();
        assert_eq!(
            parsed,
            Filter::Or(vec![
                Filter::Compare {
                    field: custom("Tier", AttributeType::Keyword),
                    op: Op::Eq,
                    value: Operand::Text("gold".into())
                },
                Filter::And(vec![
                    Filter::Not(Box::new(Filter::Compare {
                        field: custom("Vip", AttributeType::Bool),
                        op: Op::Eq,
                        value: Operand::Number(1.0)
                    })),
                    Filter::Compare {
                        field: custom("Amount", AttributeType::Int),
                        op: Op::Ge,
                        value: Operand::Number(10.0)
                    },
                ]),
            ])
        );
        let grouped = parse_filter(r#"(Tier = 'a' OR Tier = 'b') AND WorkflowType = "t""#, &schema()).unwrap();
        assert!(matches!(grouped, Filter::And(ref parts) if matches!(parts[0], Filter::Or(_))));
    }

    #[test]
    fn only_filters_every_match_of_which_is_indexed_require_an_attribute() {
        let requires = |q: &str| parse_filter(q, &schema()).unwrap().requires_attribute();
        assert!(requires(r#"Tier = "gold""#));
        assert!(requires(r#"Amount >= 10 AND WorkflowType = "t""#));
        assert!(requires(r#"Tier = "a" OR Amount > 3"#));
        assert!(requires(r#"Tier IN ("a", "b")"#));
        assert!(!requires(r#"Tier != "gold""#), "a run without Tier matches");
        assert!(!requires(r#"NOT Tier = "gold""#));
        assert!(
            !requires(r#"Tier = "a" OR WorkflowType = "t""#),
            "a run matching the type needs no Tier"
        );
        assert!(!requires(r#"WorkflowType = "t""#));
    }

    #[test]
    fn literals_must_match_the_attribute_type() {
        let refused = |q: &str| parse_filter(q, &schema()).unwrap_err();
        assert_eq!(refused(r#"Amount = "ten""#).reason, crate::Reason::InvalidVisibilityQuery);
        assert_eq!(refused("Vip = 1").reason, crate::Reason::InvalidVisibilityQuery);
        assert_eq!(refused(r#"DueAt > "yesterday""#).reason, crate::Reason::InvalidVisibilityQuery);
        assert_eq!(refused("Vip > true").reason, crate::Reason::InvalidVisibilityQuery);
        assert_eq!(refused(r#"Nope = "x""#).reason, crate::Reason::UnknownSearchAttribute);
        assert!(parse_filter("Score > 1", &schema()).is_ok(), "an int literal is a double");
        assert!(parse_filter(
            r#"DueAt < "2026-01-01T00:00:00Z" AND StartTime >= "2025-01-01T00:00:00Z""#,
            &schema()
        )
        .is_ok());
        assert!(parse_filter(r#"Tags = "red" AND Tier IN ("a", "b")"#, &schema()).is_ok());
    }

    #[test]
    fn injection_and_malformed_text_are_syntax_errors() {
        for q in [
            r#"Tier = "gold" OR 1=1"#,
            r#"Tier = "gold" -- comment"#,
            r#"Tier = "gold"; DROP TABLE runs"#,
            r#"Tier = "gold" && rm -rf /"#,
            r#"Tier = "unterminated"#,
            "Tier =",
            "(Tier = 'a'",
            "Tier = 'a' AND",
            "",
        ] {
            let error = parse_filter(q, &schema()).unwrap_err();
            assert!(
                matches!(
                    error.reason,
                    crate::Reason::InvalidVisibilityQuery | crate::Reason::UnknownSearchAttribute
                ),
                "{q}: {error:?}"
            );
        }
        let deep = format!("{}Tier = 'a'{}", "(".repeat(100), ")".repeat(100));
        assert_eq!(
            parse_filter(&deep, &schema()).unwrap_err().reason,
            crate::Reason::InvalidVisibilityQuery
        );
    }

    #[test]
    fn names_and_values_are_checked() {
        assert!(invalid_attribute_name("CustomerTier").is_none());
        for bad in [
            "",
            "9lives",
            "has-dash",
            "WorkflowId",
            "wf_id",
            "__internal",
            "Temporal_x",
            "x".repeat(129).as_str(),
        ] {
            assert!(invalid_attribute_name(bad).is_some(), "{bad}");
        }
        assert!(AttributeType::Int.accepts(&json!(5)) && !AttributeType::Int.accepts(&json!(5.5)));
        assert!(AttributeType::Datetime.accepts(&json!("2026-01-01T00:00:00Z")) && !AttributeType::Datetime.accepts(&json!("soon")));
        assert!(AttributeType::KeywordList.accepts(&json!(["a", "b"])) && !AttributeType::KeywordList.accepts(&json!([1])));
        assert!(!AttributeType::Bool.accepts(&json!("true")));
        assert_eq!(numeric_value(&json!("1970-01-01T00:00:01Z")), Some(1000.0));
    }
}
