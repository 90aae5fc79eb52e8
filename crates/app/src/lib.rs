//! The application layer: one function per use case, written once, called by the HTTP server
//! (and its background loops) and by the deterministic simulator, so a simulated seed runs the
//! same policy a request or a duty runs. A use case takes the store and the time it runs at;
//! it neither reads a clock nor speaks HTTP, and it returns what happened for the caller to
//! log, render or check.
//!
//! So far: the clock's deadline pass and the scheduler's pass (`duties`). The request use cases
//! (start, signal, update, query, …) still live in the server's handlers and move here next.

pub mod duties;
