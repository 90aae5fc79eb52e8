//! Deterministic simulation of Capstan: the real engine and the real SQLite store, driven by
//! one seed through a simulated clock, simulated workers and clients, and injected faults.
//!
//! A seed picks a workload (workflows made of activities, declared consequential actions,
//! timers, signal waits, child workflows and continue-as-new; updates and queries sent by
//! clients; interval schedules with every overlap policy, paused and resumed) and, step by
//! step, what happens next: a worker polls and completes at once, late, twice or never (it
//! crashed); an activity succeeds, fails, hangs past its timeout or reports after its lease
//! expired; reports are reordered and duplicated; a client retries an update with the same
//! request id; the clock jumps; the server restarts from its database file; an operator
//! resolves an `outcome_unknown` entry. After every step the touched run is checked against
//! the guarantees (see `checks`), and after the faults stop every workflow, child, continued
//! run, update and schedule must finish (liveness).
//!
//! Clients and workers act through the application layer (`capstan_app`), the same use cases
//! the HTTP handlers call, so a seed covers the policy a request goes through, not only the
//! store. Everything that varies comes from the seed: the workload, the fault choices, and the
//! ids minted (a `SeededIds` mint and a `ManualClock` are the sources of the store and the use
//! cases). A failing seed replays exactly with `capstan-sim --seed N`.
//!
//! The rooms, each the owner of its state:
//! - `world`: the clock, the disk and its power cuts, the server (restarts, its nodes' duties),
//!   the services the use cases run on, the counters and what was acknowledged;
//! - `clients`: what clients do and know (starts, signals, updates, queries, cancellations,
//!   schedules, operator resolutions, uploads, redrives, imports, standalone activities, messages);
//! - `workers`: polls, replays, held reports and their delivery, worker registration;
//! - `program`: the workflow programs and how a worker replays them;
//! - `checks`: the guarantees; `driver`: the run loop; `report`: what a seed tells;
//!   `workload`: the fixed names and the seed's [`Config`].

mod checks;
mod clients;
mod driver;
mod program;
mod report;
mod workers;
mod workload;
mod world;

pub use driver::{run, run_caught};
pub use report::{Counters, Failure, Report, Totals};
pub use workload::Config;
