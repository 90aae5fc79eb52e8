//! The visibility filter (`capstan_engine::visibility::Filter`, already type-checked) as a SQL
//! condition, the same on both backends: every value is a bind parameter, every name a fixed
//! column or a bound key, so nothing the client wrote becomes SQL text.

use capstan_engine::visibility::{Field, Filter, Op, Operand};

/// A bind parameter of a compiled filter.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum SqlParam {
    Text(String),
    Number(f64),
}

/// `runs` is the column prefix of the runs table in the caller's query (`r.` or `runs.`);
/// `mark(n)` renders the placeholder of the n-th parameter pushed onto `params` (0-based).
pub(crate) fn compile(filter: &Filter, runs: &str, params: &mut Vec<SqlParam>, mark: &dyn Fn(usize) -> String) -> String {
    let push = |param: SqlParam, params: &mut Vec<SqlParam>| {
        params.push(param);
        mark(params.len() - 1)
    };
    match filter {
        Filter::And(parts) => join(parts, " AND ", runs, params, mark),
        Filter::Or(parts) => join(parts, " OR ", runs, params, mark),
        Filter::Not(inner) => format!("(NOT {})", compile(inner, runs, params, mark)),
        Filter::In { field, values } => {
            let parts: Vec<Filter> = values
                .iter()
                .map(|v| Filter::Compare {
                    field: field.clone(),
                    op: Op::Eq,
                    value: v.clone(),
                })
                .collect();
            join(&parts, " OR ", runs, params, mark)
        }
        // "Not equal" is the negation of "equal" (a run without the attribute matches), so it
        // also means "does not contain" for keyword lists.
        Filter::Compare { field, op: Op::Ne, value } => {
            let equal = Filter::Compare {
                field: field.clone(),
                op: Op::Eq,
                value: value.clone(),
            };
            format!("(NOT {})", compile(&equal, runs, params, mark))
        }
        Filter::Compare {
            field: Field::Column(column),
            op,
            value,
        } => match value {
            Operand::Text(text) => {
                let p = push(SqlParam::Text(text.clone()), params);
                format!("({runs}{column} IS NOT NULL AND {runs}{column} {} {p})", op.sql())
            }
            Operand::Number(number) => {
                let p = push(SqlParam::Number(*number), params);
                format!(
                    "({runs}{column} IS NOT NULL AND CAST({runs}{column} AS DOUBLE PRECISION) {} {p})",
                    op.sql()
                )
            }
        },
        Filter::Compare {
            field: Field::Custom { name, .. },
            op,
            value,
        } => {
            let key = push(SqlParam::Text(name.clone()), params);
            let (column, p) = match value {
                Operand::Text(text) => ("value", push(SqlParam::Text(text.clone()), params)),
                Operand::Number(number) => ("num", push(SqlParam::Number(*number), params)),
            };
            // The runs the attribute index names, not a probe of the index per run: a count or
            // a selective filter then reads the matches, not every run.
            format!(
                "{runs}run_id IN (SELECT s.run_id FROM search_attribute_index s WHERE s.key = {key} AND s.{column} {} {p})",
                op.sql()
            )
        }
    }
}

fn join(parts: &[Filter], separator: &str, runs: &str, params: &mut Vec<SqlParam>, mark: &dyn Fn(usize) -> String) -> String {
    let compiled: Vec<String> = parts.iter().map(|p| compile(p, runs, params, mark)).collect();
    format!("({})", compiled.join(separator))
}
