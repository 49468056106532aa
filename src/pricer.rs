//! `geostate pricer`: a region's surge multipliers, computed from windows final in every
//! region and written by the region holding each geohash's lease. It is a client of the
//! regional gRPC API, like any pricing service, one per region.
//!
//! ```text
//!  Watch(demand), Watch(supply) ── a window final ──┐
//!  every sweep-every: Scan(demand) ── every key ────┴─► pending geohashes
//!  per pending geohash whose prices key's shard this region holds:
//!    leaseholder Get(prices/gh) ── the last window priced
//!    ─► BatchGet(demand/gh, supply/gh; the windows after it, up to the latest final)
//!    ─► each window final in both and with demand, oldest first: the formula
//!    ─► CompareAndSet(prices/gh: from the last window's result to this one's)
//! ```
//!
//! One multiplier per (geohash, window): a compare-and-set succeeds only from the previous
//! window's value, at the holder, once it has seen every write an earlier holder
//! acknowledged (the leaseholder read and the compare-and-set both wait for them). A
//! region that lost the lease, a second pricer, or a retry after a lost answer finds the
//! value moved on and reads again. Each accepted write is an output (`output =
//! "register-changes"`) carrying the lease epoch, so the sink writes one row per geohash
//! and window.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context;
use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};
use tonic::Code;
use tonic::transport::Channel;

use crate::config::{LeaseConfig, PricingConfig};
use crate::pb;
use crate::pb::admin_client::AdminClient;
use crate::pb::state_client::StateClient;
use crate::pb::window_selector::Which;
use crate::replication::outputs::WindowResult;
use crate::shutdown::stopped;
use crate::window::Window;

/// The most windows one geohash is priced back over when it has no price yet (or its
/// last one is older).
const LOOKBACK_WINDOWS: u64 = 60;
/// How many geohashes are priced at once (each a few round trips to the node).
const CONCURRENCY: usize = 32;
/// A geohash whose pricing failed (a lease renewing, a node restarting) is tried again
/// this much later.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What a pricer did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Priced {
    /// Multipliers written.
    pub windows: u64,
    /// Compare-and-sets that found the value moved on (read again).
    pub moved_on: u64,
}

/// Something to look at.
enum Wake {
    Geohash(String),
    /// A watch broke: windows may have closed unseen.
    Sweep,
}

/// Runs until `stop`, against the region's API at `addr`.
pub async fn run(
    pricing: PricingConfig,
    lease: LeaseConfig,
    addr: String,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<Priced> {
    let channel = Channel::from_shared(addr.clone())
        .with_context(|| format!("--addr {addr:?}"))?
        .connect_lazy();
    let pricer = Pricer {
        state: StateClient::new(channel.clone()),
        admin: AdminClient::new(channel.clone()),
        pricing: pricing.clone(),
        lease,
    };
    let mut priced = Priced::default();
    let (wake, mut woken) = mpsc::channel(4096);
    for prefix in [pricing.demand.clone(), pricing.supply.clone()] {
        let client = StateClient::new(channel.clone());
        tokio::spawn(watch_final(client, prefix, wake.clone(), stop.clone()));
    }
    let mut pending: BTreeSet<String> = BTreeSet::new();
    let mut sweep = tokio::time::interval(pricing.sweep_every);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // when the geohashes that failed (back in `pending`) are tried again
    let mut retry: Option<tokio::time::Instant> = None;
    loop {
        let retry_at = retry.unwrap_or_else(|| tokio::time::Instant::now() + pricing.sweep_every);
        tokio::select! {
            () = stopped(&mut stop) => return Ok(priced),
            _ = sweep.tick() => pricer.every_geohash(&mut pending).await,
            () = tokio::time::sleep_until(retry_at), if retry.is_some() => retry = None,
            Some(w) = woken.recv() => match w {
                Wake::Geohash(gh) => { pending.insert(gh); }
                Wake::Sweep => pricer.every_geohash(&mut pending).await,
            },
        }
        // whatever else woke meanwhile, then all of it
        while let Ok(w) = woken.try_recv() {
            match w {
                Wake::Geohash(gh) => {
                    pending.insert(gh);
                }
                Wake::Sweep => pricer.every_geohash(&mut pending).await,
            }
        }
        if pending.is_empty() {
            continue;
        }
        let held = match pricer.held().await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!("reading the leases held here: {e}; again in {RETRY_AFTER:?}");
                retry = Some(tokio::time::Instant::now() + RETRY_AFTER);
                continue;
            }
        };
        let batch: Vec<String> = std::mem::take(&mut pending)
            .into_iter()
            .filter(|gh| held.contains(&pricer.shard_of(gh)))
            .collect();
        let mut round = Priced::default();
        let pricer = &pricer;
        let mut runs = futures_util::stream::iter(batch)
            .map(|gh| async move { (pricer.price(&gh).await, gh) })
            .buffer_unordered(CONCURRENCY);
        loop {
            let next = tokio::select! {
                () = stopped(&mut stop) => return Ok(priced),
                next = runs.next() => next,
            };
            let Some((result, gh)) = next else { break };
            match result {
                Ok(p) => {
                    round.windows += p.windows;
                    round.moved_on += p.moved_on;
                }
                Err(e) => {
                    tracing::warn!(geohash = %gh, "pricing: {e:#}; again in {RETRY_AFTER:?}");
                    pending.insert(gh);
                }
            }
        }
        if !pending.is_empty() {
            retry = Some(tokio::time::Instant::now() + RETRY_AFTER);
        }
        priced.windows += round.windows;
        priced.moved_on += round.moved_on;
        if round.windows > 0 {
            tracing::info!(
                written = round.windows,
                total = priced.windows,
                "multipliers written"
            );
        }
    }
}

/// Sends the geohash of every window of `prefix` that `Watch` reports final; on a broken
/// stream, a sweep, and the stream again a second later.
async fn watch_final(
    mut client: StateClient<Channel>,
    prefix: String,
    wake: mpsc::Sender<Wake>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let request = pb::WatchRequest {
            prefix: prefix.clone(),
        };
        let ended = tokio::select! {
            () = stopped(&mut stop) => return,
            ended = async {
                let mut stream = client.watch(request).await?.into_inner();
                while let Some(value) = stream.message().await? {
                    let fin = value.window.as_ref().is_some_and(|w| w.is_final);
                    if let (true, Some(gh)) = (fin, value.key.strip_prefix(&prefix)) {
                        let _ = wake.send(Wake::Geohash(gh.to_owned())).await;
                    }
                }
                Ok::<(), tonic::Status>(())
            } => ended,
        };
        tracing::debug!(%prefix, ?ended, "the watch ended; a sweep, then again");
        let _ = wake.send(Wake::Sweep).await;
        tokio::select! {
            () = stopped(&mut stop) => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

struct Pricer {
    state: StateClient<Channel>,
    admin: AdminClient<Channel>,
    pricing: PricingConfig,
    lease: LeaseConfig,
}

impl Pricer {
    /// Every geohash with demand in the region, into `pending`.
    async fn every_geohash(&self, pending: &mut BTreeSet<String>) {
        let mut state = self.state.clone();
        let mut token = String::new();
        loop {
            let request = pb::ScanRequest {
                prefix: self.pricing.demand.clone(),
                page_token: token,
                limit: 1000,
                window: None,
            };
            let page = match state.scan(request).await {
                Ok(page) => page.into_inner(),
                Err(s) => {
                    tracing::warn!("sweeping {}: {s}", self.pricing.demand);
                    return;
                }
            };
            pending.extend(
                page.values
                    .iter()
                    .filter_map(|v| v.key.strip_prefix(&self.pricing.demand))
                    .map(str::to_owned),
            );
            if page.next_page_token.is_empty() {
                return;
            }
            token = page.next_page_token;
        }
    }

    /// The shards this region holds now.
    async fn held(&self) -> Result<BTreeSet<u32>, tonic::Status> {
        let leases = self
            .admin
            .clone()
            .leases(pb::LeasesRequest::default())
            .await?
            .into_inner();
        Ok(leases
            .shards
            .iter()
            .filter(|s| s.held_here)
            .map(|s| s.shard)
            .collect())
    }

    /// The lease shard of `gh`'s price.
    fn shard_of(&self, gh: &str) -> u32 {
        let key = format!("{}{gh}", self.pricing.prices);
        self.lease.shard_of_key(&key)
    }

    /// Prices every window of `gh` final since its last price. A region that does not
    /// hold it (any more) is refused the reads and writes it needs: nothing is done.
    async fn price(&self, gh: &str) -> anyhow::Result<Priced> {
        let key = format!("{}{gh}", self.pricing.prices);
        let mut priced = Priced::default();
        let mut state = self.state.clone();
        // a compare-and-set that found the value moved on: read again, once
        for _ in 0..2 {
            let Some(mut current) = self.last_price(&key).await? else {
                return Ok(priced);
            };
            let windows = self.final_windows(gh, current.as_ref()).await?;
            let mut moved_on = false;
            for (window, demand, supply) in windows {
                let hundredths = self.pricing.formula.hundredths(demand, supply);
                let result = WindowResult {
                    start_ms: window.start_ms,
                    end_ms: window.end_ms,
                    value: serde_json::Number::from_f64(hundredths as f64 / 100.0)
                        .context("a finite multiplier")?,
                };
                let value = serde_json::to_vec(&result)?;
                let request = pb::UpdateRequest {
                    key: key.clone(),
                    op: Some(pb::update_request::Op::Cas(pb::CompareAndSet {
                        expected: current.as_ref().map(|(bytes, _)| bytes.clone()),
                        value: value.clone(),
                    })),
                    id: String::new(),
                    event_time_ms: 0,
                };
                match state.update(request).await {
                    Ok(_) => {
                        priced.windows += 1;
                        tracing::debug!(%key, start_ms = window.start_ms, demand, supply, hundredths, "priced");
                        current = Some((value, result));
                    }
                    Err(s) if s.code() == Code::FailedPrecondition => {
                        priced.moved_on += 1;
                        moved_on = true;
                        break;
                    }
                    Err(s) => anyhow::bail!("{key} window {}: {s}", window.start_ms),
                }
            }
            if !moved_on {
                break;
            }
        }
        Ok(priced)
    }

    /// The value of `key` at its holder and the result it holds (`Some(None)`: never
    /// set); `None` when another region holds it now.
    #[allow(clippy::type_complexity)]
    async fn last_price(
        &self,
        key: &str,
    ) -> anyhow::Result<Option<Option<(Vec<u8>, WindowResult)>>> {
        let request = pb::GetRequest {
            key: key.to_owned(),
            leaseholder: true,
            window: None,
        };
        match self.state.clone().get(request).await {
            Ok(v) => {
                let Some(pb::value::Value::Register(bytes)) = v.into_inner().value else {
                    anyhow::bail!("{key} is not a register");
                };
                let result = WindowResult::parse(&bytes)
                    .map_err(|e| anyhow::anyhow!("{key} holds no window result: {e}"))?;
                Ok(Some(Some((bytes, result))))
            }
            Err(s) if s.code() == Code::NotFound => Ok(Some(None)),
            // another region holds it now (a renewing or settling holder answers
            // UNAVAILABLE: an error, tried again shortly)
            Err(s) if s.code() == Code::FailedPrecondition => {
                tracing::debug!(%key, "not priced here now: {s}");
                Ok(None)
            }
            Err(s) => Err(s.into()),
        }
    }

    /// The windows of `gh` after `last`, oldest first, up to the first that is not final
    /// in both namespaces: each with demand, and its demand and supply.
    async fn final_windows(
        &self,
        gh: &str,
        last: Option<&(Vec<u8>, WindowResult)>,
    ) -> anyhow::Result<Vec<(Window, i64, i64)>> {
        let (demand, supply) = (
            format!("{}{gh}", self.pricing.demand),
            format!("{}{gh}", self.pricing.supply),
        );
        let spec = self.pricing.window;
        let mut state = self.state.clone();
        let latest = match state
            .get(pb::GetRequest {
                key: demand.clone(),
                leaseholder: false,
                window: Some(pb::WindowSelector {
                    which: Some(Which::LatestFinal(true)),
                }),
            })
            .await
        {
            Ok(v) => v.into_inner().window.map_or(0, |w| w.start_ms),
            // no window final yet
            Err(s) if s.code() == Code::FailedPrecondition => return Ok(Vec::new()),
            Err(s) => return Err(s.into()),
        };
        let lookback = LOOKBACK_WINDOWS
            .min(spec.retention_ms / spec.slide_ms / 2)
            .max(1);
        let earliest = latest.saturating_sub((lookback - 1) * spec.slide_ms);
        let from = match last {
            Some((_, r)) => (r.start_ms + spec.slide_ms).max(earliest),
            None => earliest,
        };
        if from > latest {
            return Ok(Vec::new());
        }
        let values = state
            .batch_get(pb::BatchGetRequest {
                keys: vec![demand.clone(), supply.clone()],
                window: Some(pb::WindowSelector {
                    which: Some(Which::Range(pb::WindowRange {
                        from_ms: from,
                        to_ms: latest + 1,
                    })),
                }),
            })
            .await?
            .into_inner()
            .values;
        Ok(ready(&values, (&demand, &supply), spec.size_ms))
    }
}

/// Of the windows `values` hold for the keys `(demand, supply)`, oldest first, those
/// before the first that is not final for both, each with demand: the window, its
/// demand and its supply.
fn ready(
    values: &[pb::Value],
    (demand, supply): (&str, &str),
    size_ms: u64,
) -> Vec<(Window, i64, i64)> {
    // per window start: (demand, supply), each a count if final
    let mut by_start: BTreeMap<u64, (Option<i64>, Option<i64>)> = BTreeMap::new();
    for v in values {
        let Some(w) = v.window.as_ref() else { continue };
        let count = match v.value {
            Some(pb::value::Value::Counter(n)) if w.is_final => Some(n),
            _ => None,
        };
        let entry = by_start.entry(w.start_ms).or_default();
        if v.key == demand {
            entry.0 = count;
        } else if v.key == supply {
            entry.1 = count;
        }
    }
    let mut out = Vec::new();
    for (start, counts) in by_start {
        let (Some(d), Some(s)) = counts else { break };
        if d > 0 {
            let window = Window {
                start_ms: start,
                end_ms: start + size_ms,
            };
            out.push((window, d, s));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(key: &str, start_ms: u64, n: i64, is_final: bool) -> pb::Value {
        pb::Value {
            key: key.into(),
            value: Some(pb::value::Value::Counter(n)),
            window: Some(pb::WindowInfo {
                start_ms,
                end_ms: start_ms + 60,
                is_final,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn windows_are_priced_in_order_up_to_the_first_not_final_in_both() {
        let keys = ("requests/a", "supply/a");
        let values = [
            value("requests/a", 0, 3, true),
            value("requests/a", 60, 0, true),
            value("requests/a", 120, 5, true),
            value("requests/a", 180, 7, true),
            value("requests/a", 240, 1, true),
            value("supply/a", 0, 1, true),
            value("supply/a", 60, 2, true),
            value("supply/a", 120, 0, true),
            // supply not final yet: neither this window nor any later one
            value("supply/a", 180, 4, false),
            value("supply/a", 240, 4, true),
        ];
        let w = |start_ms| Window {
            start_ms,
            end_ms: start_ms + 60,
        };
        // the window without demand is skipped, not priced
        assert_eq!(ready(&values, keys, 60), [(w(0), 3, 1), (w(120), 5, 0)]);
        // a window one key has no value for stops it too
        assert_eq!(ready(&values[..5], keys, 60), []);
    }
}
