//! The `[[namespace]]` entries: each key prefix's CRDT type, whether one region or any
//! may write it, its windows and what it outputs. No prefix is a prefix of another, so a
//! key has at most one namespace.

use serde::Deserialize;

use super::window::RawWindow;
use super::{ConfigError, invalid};
use crate::crdt::CrdtType;

/// Whether any region may write a namespace, or only the holder of the key's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ownership {
    Shared,
    Owned,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    pub prefix: String,
    pub crdt: CrdtType,
    pub ownership: Ownership,
    /// A windowed counter's windows (`None`: a total since the beginning).
    pub window: Option<crate::window::WindowSpec>,
    /// Each window that becomes final is produced to `kafka.outputs-topic`, in the
    /// shipping round that sees it final (`output = "final-windows"`).
    pub outputs_final_windows: bool,
    /// Each accepted write of this owned register is produced to `kafka.outputs-topic`
    /// with the lease epoch, in the shipping round of the state it wrote (`output =
    /// "register-changes"`); its value must be a window result
    /// ([`geostate_proto::outputs::WindowResult`]).
    pub outputs_register_changes: bool,
}

impl Namespace {
    /// Whether some key under `prefix` can be in this namespace.
    pub fn overlaps(&self, prefix: &str) -> bool {
        self.prefix.starts_with(prefix) || prefix.starts_with(&self.prefix)
    }
}

impl Namespaces {
    /// Whether some namespace is windowed.
    pub fn any_windowed(&self) -> bool {
        self.0.iter().any(|ns| ns.window.is_some())
    }

    /// Whether a stored slice of a windowed key expired, by the lowest watermark over
    /// every region on its partition (the store's retention rule).
    pub fn expiry(&self) -> crate::store::Expiry {
        let namespaces = self.clone();
        std::sync::Arc::new(move |key: &str, slice: u64, lowest: u64| {
            namespaces
                .lookup(key)
                .and_then(|ns| ns.window)
                .is_some_and(|spec| spec.slice_expired(slice, lowest))
        })
    }
}

/// Key namespaces; no prefix is a prefix of another, so a key has at most one namespace.
#[derive(Clone, Debug, Default)]
pub struct Namespaces(Vec<Namespace>);

impl Namespaces {
    pub fn new(mut namespaces: Vec<Namespace>) -> Result<Self, ConfigError> {
        namespaces.sort_by(|a, b| a.prefix.cmp(&b.prefix));
        for ns in &namespaces {
            if ns.prefix.is_empty() {
                return Err(invalid("namespace.prefix", "must not be empty"));
            }
            if ns.prefix.starts_with('\0') {
                // keys starting with NUL are geostate's own records (resume points)
                return Err(invalid(
                    "namespace.prefix",
                    "must not start with a NUL byte",
                ));
            }
        }
        for pair in namespaces.windows(2) {
            // sorted: if any prefix is a prefix of another, it is of its successor
            if pair[1].prefix.starts_with(&pair[0].prefix) {
                return Err(invalid(
                    "namespace.prefix",
                    format!(
                        "namespaces {:?} and {:?} overlap: a key must belong to one namespace",
                        pair[0].prefix, pair[1].prefix
                    ),
                ));
            }
        }
        Ok(Self(namespaces))
    }

    /// The namespace a key belongs to, if any.
    pub fn lookup(&self, key: &str) -> Option<&Namespace> {
        // the last prefix <= key is the only candidate in a prefix-free sorted list
        let i = self.0.partition_point(|ns| ns.prefix.as_str() <= key);
        self.0[..i].last().filter(|ns| key.starts_with(&ns.prefix))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Namespace> {
        self.0.iter()
    }

    /// The `[[namespace]]` entries, each validated in turn, then checked against each
    /// other ([`Self::new`]).
    pub(super) fn validate(raw: Vec<RawNamespace>) -> Result<Self, ConfigError> {
        Self::new(
            raw.into_iter()
                .map(RawNamespace::validate)
                .collect::<Result<_, ConfigError>>()?,
        )
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RawNamespace {
    prefix: String,
    #[serde(rename = "type")]
    crdt: CrdtType,
    ownership: Ownership,
    window: Option<RawWindow>,
    /// `"final-windows"`: every final window of the namespace goes to the outputs topic.
    output: Option<String>,
}

impl RawNamespace {
    /// One namespace: its window fits its type, and what it outputs fits its window,
    /// type and ownership.
    fn validate(self) -> Result<Namespace, ConfigError> {
        let window = self.window.map(|w| w.validate(self.crdt)).transpose()?;
        let (mut outputs_final_windows, mut outputs_register_changes) = (false, false);
        match self.output.as_deref() {
            None => {}
            Some("final-windows") if window.is_some() => outputs_final_windows = true,
            Some("final-windows") => {
                return Err(invalid(
                    "namespace.output",
                    format!(
                        "{:?} has no window: only a windowed namespace outputs final windows",
                        self.prefix
                    ),
                ));
            }
            Some("register-changes")
                if self.crdt == CrdtType::LwwRegister && self.ownership == Ownership::Owned =>
            {
                outputs_register_changes = true
            }
            Some("register-changes") => {
                return Err(invalid(
                    "namespace.output",
                    format!(
                        "{:?} is not an owned lww_register: only an owned register outputs its changes (with the lease epoch)",
                        self.prefix
                    ),
                ));
            }
            Some(other) => {
                return Err(invalid(
                    "namespace.output",
                    format!(
                        "{other:?} is not an output kind (known: \"final-windows\", \"register-changes\")"
                    ),
                ));
            }
        }
        Ok(Namespace {
            window,
            outputs_final_windows,
            outputs_register_changes,
            prefix: self.prefix,
            crdt: self.crdt,
            ownership: self.ownership,
        })
    }
}
