//! Jepsen-style histories and checkers for geostate. A run records every client operation
//! as JSON lines (invoke, then ok / fail / info) and the checkers decide from the history
//! alone whether a guarantee held. They never look inside geostate: the history is all
//! they know.

pub mod append;
pub mod availability;
pub mod control;
pub mod counter;
pub mod fencing;
pub mod history;
pub mod lww;
pub mod prometheus;
pub mod register;
pub mod windowed;
