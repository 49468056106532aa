//! The `[lease]` section (region nodes and the witness): the Raft group's members and
//! timings, the ownership shards and their preferred home regions. Validated once at
//! start-up like the rest of the configuration.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, Setting, invalid, parse_addr, parse_duration};
use crate::crdt::RegionId;
use crate::lease::table::{ShardId, shard_of};

/// One member of the lease group: a region's node, or the witness (no region).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub addr: String,
    pub region: Option<RegionId>,
    /// The region's gRPC API entry addresses, any of its nodes (where forwarded owned
    /// writes go: the first that takes the connection); empty when not configured.
    pub api: Vec<String>,
}

impl Member {
    /// The name its certificate carries (its common name): its region, or `witness`.
    pub fn name(&self) -> &str {
        self.region.as_ref().map_or(WITNESS, RegionId::as_str)
    }
}

/// The name of the member with no region.
pub const WITNESS: &str = "witness";

/// A validated `[lease]` section.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// This process's member id: its own, or (a learner) its region's member's.
    pub member_id: u64,
    /// 0: this process is the member; n > 0: it is learner n of its region's member (one
    /// of the region's further nodes): it applies the table and proposes through the
    /// leader, and votes in nothing.
    pub learner: u32,
    /// Where this process serves Raft traffic (and lease proposals forwarded to it).
    pub listen: SocketAddr,
    pub members: BTreeMap<u64, Member>,
    /// Hash shards of the owned namespaces.
    pub shards: u32,
    /// Explicit prefixes with their home region; prefix `i` is shard `shards + i`.
    pub homes: Vec<(String, RegionId)>,
    /// How long a grant lasts.
    pub duration: Duration,
    /// How often a holder renews (and a region looks for shards to take).
    pub renew_every: Duration,
    pub heartbeat: Duration,
    /// Raft election timeout (lower bound; the upper bound is twice it).
    pub election_timeout: Duration,
    /// How long this region's Kafka may be unreachable before the region lets its leases
    /// go (it cannot write them meanwhile) and stops taking any until it is back.
    pub kafka_down_after: Duration,
    /// A preferred home region takes its shards back once it is up again.
    pub take_back: bool,
    /// An owned write at a region without the lease is forwarded to the holder's API
    /// instead of being refused.
    pub forward_writes: bool,
    /// This region's member joins a group already running (a region added at runtime)
    /// instead of forming one: it asks the members to add it, and votes once the leader
    /// made it a voter.
    pub join: bool,
    /// Certificate names (common names from the CA) that may remove any region from the
    /// group; a member may remove only its own region.
    pub operators: Vec<String>,
}

impl LeaseConfig {
    /// This process's id in the Raft group: the member's, or its learner id.
    pub fn raft_id(&self) -> u64 {
        match self.learner {
            0 => self.member_id,
            n => crate::lease::table::learner_id(self.member_id, n),
        }
    }

    /// Each configured region member's region, by member id. The group's regions are
    /// those of its membership in the Raft log (`lease::raft_store::regions_of`); these
    /// stand in for a membership written by an earlier version, whose nodes name none.
    pub fn configured_regions(&self) -> BTreeMap<u64, RegionId> {
        self.members
            .values()
            .filter_map(|m| Some((m.id, m.region.clone()?)))
            .collect()
    }

    /// The regions of the group, sorted (the witness has none).
    pub fn regions(&self) -> Vec<RegionId> {
        let mut regions: Vec<RegionId> = self
            .members
            .values()
            .filter_map(|m| m.region.clone())
            .collect();
        regions.sort();
        regions
    }

    /// Every shard id: the hash shards, then one per explicit prefix.
    pub fn all_shards(&self) -> std::ops::Range<ShardId> {
        0..self.shards + self.homes.len() as u32
    }

    /// The ownership shard of an owned key: its explicit prefix (the longest that
    /// matches), or its hash.
    pub fn shard_of_key(&self, key: &str) -> ShardId {
        self.homes
            .iter()
            .enumerate()
            .filter(|(_, (prefix, _))| key.starts_with(prefix.as_str()))
            .max_by_key(|(_, (prefix, _))| prefix.len())
            .map_or_else(
                || shard_of(key, self.shards),
                |(i, _)| self.shards + i as u32,
            )
    }

    /// The member whose certificate names `name` ([`Member::name`]).
    pub fn member_named(&self, name: &str) -> Option<&Member> {
        self.members.values().find(|m| m.name() == name)
    }

    /// The gRPC API entry addresses of `region` (empty: not configured).
    pub fn api_of(&self, region: &RegionId) -> &[String] {
        self.members
            .values()
            .find(|m| m.region.as_ref() == Some(region))
            .map_or(&[], |m| &m.api)
    }

    /// The region a shard prefers among the configured regions (see [`Self::home_among`]).
    pub fn home_of(&self, shard: ShardId) -> Option<RegionId> {
        self.home_among(shard, &self.regions())
    }

    /// The region a shard prefers among `regions` (sorted; the group's, as its log has
    /// them): its prefix's home while that region is among them, else the regions in turn.
    pub fn home_among(&self, shard: ShardId, regions: &[RegionId]) -> Option<RegionId> {
        if shard >= self.shards {
            return self
                .homes
                .get((shard - self.shards) as usize)
                .map(|(_, r)| r.clone())
                .filter(|r| regions.contains(r));
        }
        (!regions.is_empty()).then(|| regions[shard as usize % regions.len()].clone())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawLease {
    member_id: u64,
    #[serde(default)]
    learner: u32,
    listen: String,
    #[serde(default = "default_shards")]
    shards: u32,
    #[serde(default = "default_duration")]
    duration: String,
    #[serde(default = "default_renew_every")]
    renew_every: String,
    #[serde(default = "default_heartbeat")]
    heartbeat: String,
    #[serde(default = "default_election_timeout")]
    election_timeout: String,
    #[serde(default = "default_kafka_down_after")]
    kafka_down_after: String,
    #[serde(default = "default_take_back")]
    take_back: bool,
    #[serde(default)]
    forward_writes: bool,
    #[serde(default)]
    join: bool,
    #[serde(default)]
    operators: Vec<String>,
    #[serde(default, rename = "member")]
    members: Vec<RawMember>,
    #[serde(default, rename = "home")]
    homes: Vec<RawHome>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawMember {
    id: u64,
    addr: String,
    region: Option<String>,
    api: Option<Addresses>,
}

/// One address, or several.
#[derive(Deserialize)]
#[serde(untagged)]
enum Addresses {
    One(String),
    Many(Vec<String>),
}

impl Addresses {
    fn into_vec(self) -> Vec<String> {
        match self {
            Addresses::One(a) => vec![a],
            Addresses::Many(all) => all,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawHome {
    prefix: String,
    region: String,
}

/// Operators' certificate names: none empty, none a member's (a member would then remove
/// any region).
fn validate_operators(
    operators: Vec<String>,
    members: &BTreeMap<u64, Member>,
) -> Result<Vec<String>, ConfigError> {
    for name in &operators {
        if name.is_empty() {
            return Err(invalid("lease.operators", "a name is empty"));
        }
        if members.values().any(|m| m.name() == name) {
            return Err(invalid(
                "lease.operators",
                format!("{name} is a member's name; an operator's certificate names no member"),
            ));
        }
    }
    Ok(operators)
}

fn default_shards() -> u32 {
    8
}
fn default_duration() -> String {
    "2s".into()
}
fn default_renew_every() -> String {
    "400ms".into()
}
fn default_heartbeat() -> String {
    "100ms".into()
}
fn default_election_timeout() -> String {
    "250ms".into()
}
fn default_kafka_down_after() -> String {
    "3s".into()
}
fn default_take_back() -> bool {
    true
}

impl RawLease {
    /// Validates the section; `region` is this process's region (`None` for the witness).
    pub(crate) fn validate(
        mut self,
        region: Option<&RegionId>,
        max_clock_offset: Duration,
    ) -> Result<LeaseConfig, ConfigError> {
        let members = validate_members(std::mem::take(&mut self.members), self.forward_writes)?;
        let listen = self.validate_this_process(&members, region)?;
        self.check_group(&members)?;
        let homes = validate_homes(std::mem::take(&mut self.homes), &members)?;
        let operators = validate_operators(std::mem::take(&mut self.operators), &members)?;
        let (duration, renew_every) = self.validate_lease_timings(max_clock_offset)?;
        let config = LeaseConfig {
            member_id: self.member_id,
            learner: self.learner,
            listen,
            members,
            shards: self.shards,
            homes,
            duration,
            renew_every,
            heartbeat: parse_duration("lease.heartbeat", &self.heartbeat)?,
            election_timeout: parse_duration("lease.election-timeout", &self.election_timeout)?,
            kafka_down_after: parse_duration("lease.kafka-down-after", &self.kafka_down_after)?,
            take_back: self.take_back,
            forward_writes: self.forward_writes,
            join: self.join,
            operators,
        };
        if config.kafka_down_after < Duration::from_secs(1) {
            return Err(invalid(
                "lease.kafka-down-after",
                "must be at least 1s: the region's Kafka is asked twice a second",
            ));
        }
        // what the Raft library requires of its timings
        if config.election_timeout.as_millis() <= config.heartbeat.as_millis() {
            return Err(invalid(
                "lease.election-timeout",
                "must be longer than lease.heartbeat (whole milliseconds)",
            ));
        }
        Ok(config)
    }

    /// This process's place in the group: the member it is (of `region`), whether it
    /// joins a running group or is a learner, and the address it listens on.
    fn validate_this_process(
        &self,
        members: &BTreeMap<u64, Member>,
        region: Option<&RegionId>,
    ) -> Result<SocketAddr, ConfigError> {
        let me = members.get(&self.member_id).ok_or_else(|| {
            invalid(
                "lease.member-id",
                format!(
                    "{} is not among the [[lease.member]] entries",
                    self.member_id
                ),
            )
        })?;
        if me.region.as_ref() != region {
            return Err(invalid(
                "lease.member-id",
                format!(
                    "member {} is {:?} but this process is {:?}",
                    self.member_id, me.region, region
                ),
            ));
        }
        if self.join && (self.learner > 0 || region.is_none()) {
            return Err(invalid(
                "lease.join",
                "only a region's member joins a running group (its further nodes join as learners anyway)",
            ));
        }
        if self.learner > 0 && region.is_none() {
            return Err(invalid(
                "lease.learner",
                "only a region's further node is a learner",
            ));
        }
        let listen = parse_addr("lease.listen", &self.listen)?;
        if self.learner > 0 && listen.ip().is_unspecified() {
            return Err(invalid(
                "lease.listen",
                format!(
                    "{listen}: a learner tells the members this address, so it must be one they reach"
                ),
            ));
        }
        Ok(listen)
    }

    /// The group's shape: member ids that leave room for learner ids, enough members
    /// that one can fail, and at least one hash shard.
    fn check_group(&self, members: &BTreeMap<u64, Member>) -> Result<(), ConfigError> {
        if let Some(big) = members
            .keys()
            .find(|&&id| id == 0 || id > u64::from(u32::MAX))
        {
            return Err(invalid(
                "lease.member.id",
                format!(
                    "{big} is not in 1..=4294967295 (a learner's id is its member's id times 2^32 plus its number)"
                ),
            ));
        }
        if members.len() < 3 {
            return Err(invalid(
                "lease.member",
                "at least three members (two regions and a witness) so one can fail",
            ));
        }
        if self.shards == 0 {
            return Err(invalid("lease.shards", "must be at least 1"));
        }
        Ok(())
    }

    /// How long a grant lasts and how often it is renewed: long enough that a holder's
    /// lease never lapses between renewals, and no longer than the lease table takes.
    fn validate_lease_timings(
        &self,
        max_clock_offset: Duration,
    ) -> Result<(Duration, Duration), ConfigError> {
        let duration = parse_duration("lease.duration", &self.duration)?;
        let renew_every = parse_duration("lease.renew-every", &self.renew_every)?;
        if duration < 2 * renew_every + 2 * max_clock_offset {
            return Err(invalid(
                "lease.duration",
                format!(
                    "{duration:?} is too short: at least twice renew-every plus twice \
                     max-clock-offset ({:?}), or a holder's lease lapses between renewals",
                    2 * renew_every + 2 * max_clock_offset
                ),
            ));
        }
        let longest = Duration::from_millis(crate::lease::table::MAX_DURATION_MS);
        if duration > longest {
            return Err(invalid(
                "lease.duration",
                format!("{duration:?} is longer than the lease table takes ({longest:?})"),
            ));
        }
        Ok((duration, renew_every))
    }
}

/// The `[[lease.member]]` entries by id: each region has one member, no API address is
/// empty, with `forward_writes` every region member has one, and no id is listed twice.
fn validate_members(
    raw_members: Vec<RawMember>,
    forward_writes: bool,
) -> Result<BTreeMap<u64, Member>, ConfigError> {
    let mut members = BTreeMap::new();
    for raw in raw_members {
        let region = raw
            .region
            .map(RegionId::new)
            .transpose()
            .map_err(|e| invalid("lease.member.region", e.to_string()))?;
        if members
            .values()
            .any(|m: &Member| m.region.is_some() && m.region == region)
        {
            return Err(invalid(
                "lease.member.region",
                "a region has one member".to_string(),
            ));
        }
        let api = raw.api.map_or_else(Vec::new, Addresses::into_vec);
        if api.iter().any(|a| a.trim().is_empty()) {
            return Err(invalid(
                "lease.member.api",
                format!("an empty address (member {})", raw.id),
            ));
        }
        if forward_writes && region.is_some() && api.is_empty() {
            return Err(invalid(
                "lease.member.api",
                format!(
                    "forward-writes needs every region member's api address (member {})",
                    raw.id
                ),
            ));
        }
        let member = Member {
            id: raw.id,
            addr: raw.addr,
            region,
            api,
        };
        if members.insert(raw.id, member).is_some() {
            return Err(invalid(
                "lease.member.id",
                format!("{} is listed twice", raw.id),
            ));
        }
    }
    Ok(members)
}

/// The `[[lease.home]]` entries, in order: each prefix's home is a region with a member.
fn validate_homes(
    raw_homes: Vec<RawHome>,
    members: &BTreeMap<u64, Member>,
) -> Result<Vec<(String, RegionId)>, ConfigError> {
    let mut homes = Vec::new();
    for raw in raw_homes {
        let home =
            RegionId::new(raw.region).map_err(|e| invalid("lease.home.region", e.to_string()))?;
        if !members.values().any(|m| m.region.as_ref() == Some(&home)) {
            return Err(invalid(
                "lease.home.region",
                format!("{home} has no member in the lease group"),
            ));
        }
        homes.push((raw.prefix, home));
    }
    Ok(homes)
}

/// The witness's configuration: a lease group member with no region, no Kafka, no state.
#[derive(Clone, Debug)]
pub struct WitnessConfig {
    pub data_dir: PathBuf,
    pub max_clock_offset: Duration,
    pub lease: LeaseConfig,
    pub tls: Option<super::TlsConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawWitness {
    data_dir: PathBuf,
    #[serde(default = "default_max_clock_offset")]
    max_clock_offset: String,
    lease: RawLease,
    tls: Option<super::security::RawTls>,
    #[serde(default)]
    allow_plaintext: bool,
}

fn default_max_clock_offset() -> String {
    "500ms".into()
}

impl WitnessConfig {
    /// The file at `path` with `settings` (`--set`) applied, validated.
    pub fn load(path: &Path, settings: &[Setting]) -> Result<Self, ConfigError> {
        let raw: RawWitness = super::settings::read(path, settings)?;
        let max_clock_offset = parse_duration("max-clock-offset", &raw.max_clock_offset)?;
        let lease = raw.lease.validate(None, max_clock_offset)?;
        let tls = raw.tls.map(super::security::RawTls::validate);
        super::security::check_plaintext(
            tls.as_ref(),
            raw.allow_plaintext,
            &[("lease.listen", lease.listen)],
        )?;
        Ok(Self {
            data_dir: raw.data_dir,
            max_clock_offset,
            lease,
            tls,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(extra: &str) -> Result<LeaseConfig, ConfigError> {
        let text = format!(
            r#"
            member-id = 1
            listen = "127.0.0.1:7301"
            {extra}
            [[member]]
            id = 1
            addr = "127.0.0.1:7301"
            region = "us-east-1"
            [[member]]
            id = 2
            addr = "127.0.0.1:7302"
            region = "eu-west-1"
            [[member]]
            id = 3
            addr = "127.0.0.1:7303"
            [[home]]
            prefix = "surge/9q8"
            region = "eu-west-1"
            "#
        );
        let raw: RawLease = toml::from_str(&text).unwrap();
        raw.validate(
            Some(&RegionId::new("us-east-1").unwrap()),
            Duration::from_millis(100),
        )
    }

    #[test]
    fn shards_and_homes() {
        let c = lease("shards = 4").unwrap();
        assert_eq!(c.all_shards(), 0..5);
        assert_eq!(c.shard_of_key("surge/9q8yy"), 4);
        assert_eq!(c.home_of(4).unwrap().as_str(), "eu-west-1");
        // hash shards alternate between the sorted regions
        assert_eq!(c.home_of(0).unwrap().as_str(), "eu-west-1");
        assert_eq!(c.home_of(1).unwrap().as_str(), "us-east-1");
        assert!(c.shard_of_key("surge/dr5ru") < 4);
    }

    #[test]
    fn bad_sections_name_the_field() {
        let err = |extra: &str| lease(extra).unwrap_err().to_string();
        assert!(err("duration = \"300ms\"").contains("lease.duration"));
        assert!(err("heartbeat = \"1s\"").contains("lease.election-timeout"));
        assert!(err("shards = 0").contains("lease.shards"));
        assert!(err("forward-writes = true").contains("lease.member.api"));
    }

    #[test]
    fn a_regions_api_is_one_address_or_several() {
        let text = r#"
            member-id = 1
            listen = "127.0.0.1:7301"
            forward-writes = true
            [[member]]
            id = 1
            addr = "127.0.0.1:7301"
            region = "us-east-1"
            api = "127.0.0.1:50051"
            [[member]]
            id = 2
            addr = "127.0.0.1:7302"
            region = "eu-west-1"
            api = ["127.0.0.1:50061", "127.0.0.1:50062"]
            [[member]]
            id = 3
            addr = "127.0.0.1:7303"
            "#;
        let raw: RawLease = toml::from_str(text).unwrap();
        let us = RegionId::new("us-east-1").unwrap();
        let c = raw.validate(Some(&us), Duration::from_millis(100)).unwrap();
        assert_eq!(c.api_of(&us), ["127.0.0.1:50051"]);
        let eu = RegionId::new("eu-west-1").unwrap();
        assert_eq!(c.api_of(&eu), ["127.0.0.1:50061", "127.0.0.1:50062"]);
        let empty = text.replace(r#"api = "127.0.0.1:50051""#, "api = []");
        let raw: RawLease = toml::from_str(&empty).unwrap();
        let err = raw
            .validate(Some(&us), Duration::from_millis(100))
            .unwrap_err();
        assert!(err.to_string().contains("lease.member.api"), "{err}");
    }
}
