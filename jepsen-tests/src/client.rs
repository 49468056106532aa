//! The clients: one per process, each running the workload through the public gRPC API
//! and recording every operation (invoke, then ok / fail / info) in the run's history.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use geostate_jepsen::control;
use geostate_jepsen::history::{Event, EventType, Function, Stamp};
use geostate_proto::pb;
use geostate_proto::pb::state_client::StateClient;
use geostate_proto::workload::Rng;
use tokio::sync::Mutex;
use tonic::Code;
use tonic::transport::Channel;

use crate::{WINDOW_MS, Workload};

pub(crate) struct Run {
    pub(crate) started: Instant,
    pub(crate) history: Mutex<Vec<Event>>,
    /// Windowed workload: the event time of the run's start (the wall clock then); event
    /// times follow the run's own clock from there, never ahead of the wall clock.
    pub(crate) event_base_ms: u64,
}

impl Run {
    pub(crate) fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    pub(crate) fn event_time_now(&self) -> u64 {
        self.event_base_ms + self.started.elapsed().as_millis() as u64
    }

    pub(crate) async fn record(&self, event: Event) {
        self.history.lock().await.push(event);
    }
}

pub(crate) struct Client {
    pub(crate) run: Arc<Run>,
    pub(crate) region: String,
    /// The region's nodes: the client uses one, and moves on to the next when a
    /// connection to it is refused (that node is down; any node routes to the owner),
    /// with the nodes `cluster` (cluster.json) lists then.
    pub(crate) addrs: Vec<String>,
    pub(crate) cluster: std::path::PathBuf,
    pub(crate) at: usize,
    /// Set when a call's connection was refused.
    pub(crate) refused: AtomicBool,
    pub(crate) keys: Vec<String>,
    pub(crate) workload: Workload,
    /// Each key's ownership shard (`None`: not owned).
    pub(crate) shards: Arc<BTreeMap<String, Option<u32>>>,
    /// Added to the process id after an indeterminate operation (that process may still
    /// have it in flight; Jepsen's rule: a process does one operation at a time).
    pub(crate) stride: u64,
    pub(crate) rng: Rng,
    /// The value this client last read per key, which its compare-and-sets expect.
    pub(crate) last_read: BTreeMap<String, i64>,
}

impl Client {
    pub(crate) fn connect(&self) -> Option<StateClient<Channel>> {
        control::state_client(&self.addrs[self.at]).ok()
    }

    /// The region's node after the one refusing, among those the cluster lists now (a
    /// node may have been added since).
    fn next_node(&mut self) {
        let refusing = self.addrs[self.at].clone();
        if let Ok(cluster) = control::read_cluster(&self.cluster)
            && let Some(region) = cluster.regions.get(&self.region)
            && let Ok(addrs) = control::node_grpcs(region)
        {
            self.addrs = addrs;
        }
        let at = self.addrs.iter().position(|a| *a == refusing);
        self.at = at.map_or(0, |at| (at + 1) % self.addrs.len());
    }

    /// Notes a failed call: one whose connection was refused was never sent (certainly
    /// not applied), and the next call goes to the region's next node.
    fn failed(&self, s: &tonic::Status) -> bool {
        let never_sent = geostate_proto::never_sent(s);
        if never_sent {
            self.refused.store(true, Ordering::Relaxed);
        }
        never_sent
    }

    pub(crate) fn event(
        &self,
        process: u64,
        kind: EventType,
        f: Function,
        key: &str,
        value: Option<i64>,
    ) -> Event {
        Event {
            process,
            kind,
            f,
            key: key.to_string(),
            value,
            region: self.region.clone(),
            time_ns: self.run.now_ns(),
            shard: self.shards.get(key).copied().flatten(),
            epoch: None,
            expected: None,
            list: None,
            stamp: None,
            event_time: None,
            window: None,
            is_final: None,
        }
    }

    pub(crate) async fn run(
        mut self,
        mut process: u64,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let Some(mut client) = self.connect() else {
            bail!("bad address {}", self.addrs[self.at]);
        };
        let mut n = 0u64;
        while !*stop.borrow() {
            n += 1;
            let key = self.keys[self.rng.below(self.keys.len() as u64) as usize].clone();
            // unique per operation
            let unique = (process * 1_000_000 + n) as i64;
            let dice = self.rng.below(6);
            let indeterminate = match self.workload {
                Workload::PnCounter | Workload::GCounter => {
                    let v = self.rng.below(5) as i64 + 1;
                    let negative = self.workload == Workload::PnCounter && dice < 2;
                    let v = if negative { -v } else { v };
                    self.add(&mut client, process, &key, v, n, None).await
                }
                Workload::WindowedCounter if dice < 5 => {
                    let v = self.rng.below(5) as i64 + 1;
                    let early = if self.rng.below(10) == 0 {
                        80_000
                    } else {
                        2_000
                    };
                    let t = self
                        .run
                        .event_time_now()
                        .saturating_sub(self.rng.below(early));
                    self.add(&mut client, process, &key, v, n, Some(t)).await
                }
                Workload::WindowedCounter => {
                    let back = self.rng.below(4) * WINDOW_MS;
                    let t = self.run.event_time_now().saturating_sub(back);
                    self.read_window(&mut client, process, &key, t - t % WINDOW_MS)
                        .await;
                    false
                }
                Workload::SharedRegister if dice < 3 => {
                    self.write(&mut client, process, &key, unique, None).await
                }
                Workload::OwnedRegister if dice < 2 => {
                    self.write(&mut client, process, &key, unique, None).await
                }
                Workload::OwnedRegister if dice < 4 && self.last_read.contains_key(&key) => {
                    let expected = self.last_read.get(&key).copied();
                    self.write(&mut client, process, &key, unique, expected)
                        .await
                }
                Workload::SharedRegister | Workload::OwnedRegister => {
                    if let Some(Some(v)) = self.read(&mut client, process, &key).await {
                        self.last_read.insert(key.clone(), v);
                    }
                    false
                }
                Workload::OwnedAppend if dice < 2 => {
                    self.read_list(&mut client, process, &key).await;
                    false
                }
                Workload::OwnedAppend => self.append(&mut client, process, &key, unique).await,
            };
            if indeterminate {
                process += self.stride;
            }
            if self.refused.swap(false, Ordering::Relaxed) {
                self.next_node();
                let Some(next) = self.connect() else {
                    bail!("bad address {}", self.addrs[self.at]);
                };
                client = next;
            }
            tokio::time::sleep(Duration::from_millis(10 + self.rng.below(20))).await;
        }
        Ok(())
    }

    /// Records the completion of an update; true if indeterminate.
    pub(crate) async fn complete(
        &self,
        mut done: Event,
        result: Result<pb::UpdateResponse, tonic::Status>,
    ) -> bool {
        let (kind, stamp) = match &result {
            Ok(r) => (EventType::Ok, r.stamp.as_ref().map(stamp)),
            // certainly not applied
            Err(s)
                if self.failed(s)
                    || matches!(
                        s.code(),
                        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange
                    ) =>
            {
                (EventType::Fail, None)
            }
            Err(_) => (EventType::Info, None),
        };
        done.kind = kind;
        done.epoch = stamp
            .as_ref()
            .map(|s| s.epoch)
            .filter(|_| self.workload.owned());
        done.stamp = stamp;
        done.time_ns = self.run.now_ns();
        self.run.record(done).await;
        kind == EventType::Info
    }

    pub(crate) async fn add(
        &self,
        client: &mut StateClient<Channel>,
        p: u64,
        key: &str,
        v: i64,
        n: u64,
        event_time: Option<u64>,
    ) -> bool {
        let mut invoke = self.event(p, EventType::Invoke, Function::Add, key, Some(v));
        invoke.event_time = event_time;
        self.run.record(invoke.clone()).await;
        let result = client
            .update(pb::UpdateRequest {
                key: key.into(),
                op: Some(pb::update_request::Op::Add(v)),
                id: format!("{}-{p}-{n}", self.region),
                event_time_ms: event_time.unwrap_or(0),
            })
            .await
            .map(|r| r.into_inner());
        self.complete(invoke, result).await
    }

    /// A read of the window starting at `start` (windowed workload): its value and
    /// whether it was final.
    pub(crate) async fn read_window(
        &self,
        client: &mut StateClient<Channel>,
        p: u64,
        key: &str,
        start: u64,
    ) {
        let mut e = self.event(p, EventType::Invoke, Function::Read, key, None);
        e.window = Some(start);
        self.run.record(e.clone()).await;
        let result = client
            .get(pb::GetRequest {
                key: key.into(),
                leaseholder: false,
                window: Some(pb::WindowSelector {
                    which: Some(pb::window_selector::Which::StartMs(start)),
                }),
            })
            .await;
        e.time_ns = self.run.now_ns();
        match result {
            Ok(v) => {
                let v = v.into_inner();
                e.kind = EventType::Ok;
                e.value = match v.value {
                    Some(pb::value::Value::Counter(n)) => Some(n),
                    _ => None,
                };
                e.is_final = v.window.map(|w| w.is_final);
            }
            Err(s) => {
                self.failed(&s);
                e.kind = EventType::Fail;
            }
        }
        self.run.record(e).await;
    }

    /// A write of `v`, or with `expected` a compare-and-set; true if indeterminate.
    pub(crate) async fn write(
        &self,
        client: &mut StateClient<Channel>,
        p: u64,
        key: &str,
        v: i64,
        expected: Option<i64>,
    ) -> bool {
        let f = if expected.is_some() {
            Function::Cas
        } else {
            Function::Write
        };
        let mut invoke = self.event(p, EventType::Invoke, f, key, Some(v));
        invoke.expected = expected;
        self.run.record(invoke.clone()).await;
        let value = v.to_string().into_bytes();
        let op = match expected {
            Some(e) => pb::update_request::Op::Cas(pb::CompareAndSet {
                expected: Some(e.to_string().into_bytes()),
                value,
            }),
            None => pb::update_request::Op::Set(value),
        };
        let result = client
            .update(pb::UpdateRequest {
                key: key.into(),
                op: Some(op),
                id: String::new(),
                event_time_ms: 0,
            })
            .await
            .map(|r| r.into_inner());
        self.complete(invoke, result).await
    }

    /// A read (at the lease holder for owned keys); the register's value if it answered.
    pub(crate) async fn get(
        &self,
        client: &mut StateClient<Channel>,
        e: &mut Event,
    ) -> Option<pb::Value> {
        self.run.record(e.clone()).await;
        let result = client
            .get(pb::GetRequest {
                key: e.key.clone(),
                leaseholder: self.workload.owned(),
                window: None,
            })
            .await;
        e.time_ns = self.run.now_ns();
        match result {
            Ok(v) => {
                let v = v.into_inner();
                e.kind = EventType::Ok;
                e.stamp = v.stamp.as_ref().map(stamp);
                e.epoch = e.stamp.as_ref().map(|s| s.epoch);
                Some(v)
            }
            Err(s) if s.code() == Code::NotFound => {
                e.kind = EventType::Ok;
                None
            }
            // a read changes nothing: a failed one is simply not an observation
            Err(s) => {
                self.failed(&s);
                e.kind = EventType::Fail;
                None
            }
        }
    }

    /// Reads a register; `Some(value)` if the read succeeded.
    pub(crate) async fn read(
        &self,
        client: &mut StateClient<Channel>,
        p: u64,
        key: &str,
    ) -> Option<Option<i64>> {
        let mut e = self.event(p, EventType::Invoke, Function::Read, key, None);
        let v = self.get(client, &mut e).await;
        e.value = v.as_ref().and_then(register_value);
        let seen = (e.kind == EventType::Ok).then_some(e.value);
        self.run.record(e).await;
        seen
    }

    pub(crate) async fn read_list(&self, client: &mut StateClient<Channel>, p: u64, key: &str) {
        let mut e = self.event(p, EventType::Invoke, Function::Read, key, None);
        let v = self.get(client, &mut e).await;
        if e.kind == EventType::Ok {
            e.list = Some(v.as_ref().map(list_value).unwrap_or_default());
        }
        self.run.record(e).await;
    }

    /// Appends `x`: a leaseholder read, then a compare-and-set of the list one longer;
    /// true if indeterminate.
    pub(crate) async fn append(
        &self,
        client: &mut StateClient<Channel>,
        p: u64,
        key: &str,
        x: i64,
    ) -> bool {
        let invoke = self.event(p, EventType::Invoke, Function::Append, key, Some(x));
        self.run.record(invoke.clone()).await;
        let read = client
            .get(pb::GetRequest {
                key: key.into(),
                leaseholder: true,
                window: None,
            })
            .await;
        let current = match read {
            Ok(v) => v.into_inner().value.and_then(|v| match v {
                pb::value::Value::Register(b) => Some(b),
                pb::value::Value::Counter(_) => None,
            }),
            Err(s) if s.code() == Code::NotFound => None,
            // the read failed, so nothing was written
            Err(s) => {
                self.failed(&s);
                let nothing = tonic::Status::failed_precondition(s.message());
                return self.complete(invoke, Err(nothing)).await;
            }
        };
        let mut next = current.clone().unwrap_or_default();
        if !next.is_empty() {
            next.push(b' ');
        }
        next.extend_from_slice(x.to_string().as_bytes());
        let result = client
            .update(pb::UpdateRequest {
                key: key.into(),
                op: Some(pb::update_request::Op::Cas(pb::CompareAndSet {
                    expected: current,
                    value: next,
                })),
                id: String::new(),
                event_time_ms: 0,
            })
            .await
            .map(|r| r.into_inner());
        self.complete(invoke, result).await
    }
}

pub(crate) fn stamp(s: &pb::OrderStamp) -> Stamp {
    let hlc = s.hlc.unwrap_or_default();
    Stamp {
        epoch: s.epoch,
        wall_nanos: hlc.wall_nanos,
        logical: hlc.logical,
        origin: s.origin.clone(),
    }
}

/// An owned list as stored: elements separated by spaces.
pub(crate) fn list_value(v: &pb::Value) -> Vec<i64> {
    match &v.value {
        Some(pb::value::Value::Register(b)) => String::from_utf8_lossy(b)
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect(),
        _ => Vec::new(),
    }
}

pub(crate) fn register_value(v: &pb::Value) -> Option<i64> {
    match &v.value {
        Some(pb::value::Value::Register(b)) => String::from_utf8_lossy(b).parse().ok(),
        _ => None,
    }
}
