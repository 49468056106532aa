//! Transport security and authorization: TLS on every listener and client ([`tls`]),
//! who may call what ([`auth`]), and certificates ([`certs`]). The threat model is in
//! ARCHITECTURE.md.

pub mod auth;
pub mod certs;
pub mod limits;
pub mod tls;

pub use auth::{ApiPolicy, Guard, MemberPolicy};
pub use tls::{Caller, Listener, Tls, TlsError};
