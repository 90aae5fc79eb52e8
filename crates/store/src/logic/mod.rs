//! The store's one transaction logic, written once over [`Tx`](crate::tx::Tx): what a run
//! transition, a start, a claim or an integrity incident reads and writes. The backends open
//! and commit the transaction around it and pick candidates where their SQL differs.

pub(crate) mod actions;
pub(crate) mod admin;
pub(crate) mod audit;
pub(crate) mod batches;
pub(crate) mod catalog;
pub(crate) mod claim;
pub(crate) mod class_heads;
pub(crate) mod credentials;
pub(crate) mod duties;
pub(crate) mod external_payloads;
pub(crate) mod fleet;
pub(crate) mod flow;
pub(crate) mod handoff;
pub(crate) mod imports;
pub(crate) mod integrity;
pub(crate) mod ledger_reads;
pub(crate) mod listing;
pub(crate) mod locate;
pub(crate) mod namespaces;
pub(crate) mod persist;
pub(crate) mod queries;
pub(crate) mod row_lease;
pub(crate) mod run_counts;
pub(crate) mod run_rows;
pub(crate) mod runs;
pub(crate) mod service_calls;
pub(crate) mod sessions;
pub(crate) mod streams;

use crate::StoreResult;
use std::future::Future;
use std::pin::Pin;

/// A boxed step of the shared logic: persisting recurses (a successor, a child, a parent), and
/// a recursive future must be boxed; naming `Send` here lets PostgreSQL's futures stay `Send`.
pub(crate) type BoxedStep<'a, T> = Pin<Box<dyn Future<Output = StoreResult<T>> + Send + 'a>>;
