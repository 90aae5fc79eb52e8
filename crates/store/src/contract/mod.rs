//! The store's contract: ten traits, each declared beside its one implementation, generic over
//! any [`Backend`](crate::backend::Backend). A method hands a unit of the shared transaction
//! logic (`logic/`) to the backend as a read, a write or a one-statement write; the store's
//! backends (`sqlite/`, `shared/`) hold only what their databases do differently.

mod admin;
mod catalog;
mod duties;
mod fleet;
mod ledger;
mod payloads;
mod runs;
mod schedules;
mod streams;
mod tasks;

pub use admin::AdminStore;
pub use catalog::CatalogStore;
pub use duties::DutyStore;
pub use fleet::FleetStore;
pub use ledger::LedgerStore;
pub use payloads::PayloadStore;
pub use runs::RunStore;
pub use schedules::ScheduleStore;
pub use streams::StreamStore;
pub use tasks::TaskStore;
