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
//!    ─► each window final in both and with demand, oldest first
//!  every window read this round ─► the multipliers: the formula, or one call per batch
//!    to a user function sidecar (`[pricing] function`, [`crate::function`])
//!  per geohash ─► CompareAndSet(prices/gh: from the last window's result to each next)
//! ```
//!
//! One multiplier per (geohash, window): a compare-and-set succeeds only from the previous
//! window's value, at the holder, once it has seen every write an earlier holder
//! acknowledged (the leaseholder read and the compare-and-set both wait for them). A
//! region that lost the lease, a second pricer, or a retry after a lost answer finds the
//! value moved on and reads again. Each accepted write is an output (`output =
//! "register-changes"`) carrying the lease epoch, so the sink writes one row per geohash
//! and window.
//!
//! A sidecar that is slow, down or answers garbage prices nothing of its batch: those
//! geohashes stay pending and are tried again after a backoff (1 s, doubling up to 30 s),
//! counted in `geostate_function_calls_total` and `geostate_pricer_pending_geohashes`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context;
use futures_util::StreamExt;
use geostate_proto::outputs::WindowResult;
use tokio::sync::{mpsc, watch};
use tonic::Code;
use tonic::transport::Channel;

use crate::config::{LeaseConfig, PricingConfig};
use crate::function::{FunctionError, MAX_BATCH, Sidecar};
use crate::metrics as m;
use crate::pb;
use crate::pb::admin_client::AdminClient;
use crate::pb::state_client::StateClient;
use crate::pb::window_selector::Which;
use crate::shutdown::stopped;
use crate::window::Window;

/// The most windows one geohash is priced back over when it has no price yet (or its
/// last one is older).
const LOOKBACK_WINDOWS: u64 = 60;
/// How many geohashes are priced at once (each a few round trips to the node).
const CONCURRENCY: usize = 32;
/// A geohash whose pricing failed (a lease renewing, a node restarting, a function
/// sidecar failing) is tried again this much later, doubled for each round in a row whose
/// function calls failed, up to [`MAX_BACKOFF`].
const RETRY_AFTER: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

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
    let sidecar = match &pricing.function {
        Some(f) => Some(Sidecar::new(SURGE, &f.addr, f.timeout)?),
        None => None,
    };
    let pricer = Pricer {
        state: StateClient::new(channel.clone()),
        admin: AdminClient::new(channel.clone()),
        pricing: pricing.clone(),
        lease,
        sidecar,
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
    // rounds in a row whose function calls failed
    let mut function_failures = 0u32;
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
        // what woke meanwhile waits out a failing function's backoff with the rest
        let backing_off = retry.is_some_and(|at| at > tokio::time::Instant::now());
        if pending.is_empty() || (backing_off && function_failures > 0) {
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
        let outcome = tokio::select! {
            () = stopped(&mut stop) => return Ok(priced),
            outcome = pricer.round(batch) => outcome,
        };
        pending.extend(outcome.again);
        function_failures = match outcome.function_failed {
            true => function_failures + 1,
            false => 0,
        };
        metrics::gauge!(m::PRICER_PENDING).set(pending.len() as f64);
        if !pending.is_empty() {
            let doublings = function_failures.saturating_sub(1).min(5);
            let backoff = RETRY_AFTER.saturating_mul(1 << doublings).min(MAX_BACKOFF);
            retry = Some(tokio::time::Instant::now() + backoff);
        }
        priced.windows += outcome.priced.windows;
        priced.moved_on += outcome.priced.moved_on;
        if outcome.priced.windows > 0 {
            tracing::info!(
                written = outcome.priced.windows,
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
    /// The user function computing the multipliers, if not the built-in formula.
    sidecar: Option<Sidecar>,
}

/// The name of the pricing function a sidecar must serve.
pub const SURGE: &str = "surge";

/// What one round did.
#[derive(Default)]
struct Round {
    priced: Priced,
    /// Geohashes to try again: a read, function call or write failed, or a
    /// compare-and-set found the value moved on.
    again: Vec<String>,
    /// A function call failed (the backoff grows).
    function_failed: bool,
}

/// One geohash's windows to price: its price key, the value it holds, and the windows
/// final since, oldest first, with their demand and supply.
struct ToPrice {
    gh: String,
    key: String,
    current: Option<(Vec<u8>, WindowResult)>,
    windows: Vec<(Window, i64, i64)>,
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

    /// Prices the windows of `batch` final since their last price: reads them, computes
    /// every multiplier (one function call per [`MAX_BATCH`] windows), writes them.
    async fn round(&self, batch: Vec<String>) -> Round {
        let mut round = Round::default();
        let reads: Vec<(String, anyhow::Result<Option<ToPrice>>)> =
            futures_util::stream::iter(batch)
                .map(|gh| async move { (gh.clone(), self.read(gh).await) })
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
        let mut ready = Vec::new();
        for (gh, read) in reads {
            match read {
                Ok(Some(p)) if !p.windows.is_empty() => ready.push(p),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(geohash = %gh, "pricing: {e:#}; again in {RETRY_AFTER:?}");
                    round.again.push(gh);
                }
            }
        }
        let mut computed = Vec::new();
        for chunk in chunks(ready, MAX_BATCH) {
            match self.multipliers(&chunk).await {
                Ok(values) => computed.extend(chunk.into_iter().zip(values)),
                Err(e) => {
                    tracing::warn!(
                        geohashes = chunk.len(),
                        "pricing: {e}; those geohashes stay pending"
                    );
                    round.function_failed = true;
                    round.again.extend(chunk.into_iter().map(|p| p.gh));
                }
            }
        }
        let writes: Vec<(String, anyhow::Result<Priced>)> = futures_util::stream::iter(computed)
            .map(|(p, values)| async move { (p.gh.clone(), self.write(p, values).await) })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        for (gh, written) in writes {
            match written {
                Ok(p) => {
                    round.priced.windows += p.windows;
                    round.priced.moved_on += p.moved_on;
                    if p.moved_on > 0 {
                        round.again.push(gh);
                    }
                }
                Err(e) => {
                    tracing::warn!(geohash = %gh, "pricing: {e:#}; again in {RETRY_AFTER:?}");
                    round.again.push(gh);
                }
            }
        }
        round
    }

    /// What `gh` has to price; `None` when this region does not hold its price (any more).
    async fn read(&self, gh: String) -> anyhow::Result<Option<ToPrice>> {
        let key = format!("{}{gh}", self.pricing.prices);
        let Some(current) = self.last_price(&key).await? else {
            return Ok(None);
        };
        let windows = self.final_windows(&gh, current.as_ref()).await?;
        Ok(Some(ToPrice {
            gh,
            key,
            current,
            windows,
        }))
    }

    /// The multipliers (hundredths) of every window of `batch`, in order: the formula's,
    /// or the sidecar's in one call.
    async fn multipliers(&self, batch: &[ToPrice]) -> Result<Vec<Vec<i64>>, FunctionError> {
        let formula = self.pricing.formula;
        let Some(sidecar) = &self.sidecar else {
            return Ok(batch
                .iter()
                .map(|p| {
                    let each = p.windows.iter();
                    each.map(|&(_, d, s)| formula.hundredths(d, s)).collect()
                })
                .collect());
        };
        let inputs = batch
            .iter()
            .flat_map(|p| {
                p.windows
                    .iter()
                    .map(|(w, demand, supply)| pb::FunctionInput {
                        key: p.gh.clone(),
                        window_start_ms: w.start_ms,
                        window_end_ms: w.end_ms,
                        values: [("demand".into(), *demand), ("supply".into(), *supply)].into(),
                    })
            })
            .collect();
        let mut values = sidecar
            .compute(&formula.params(), inputs, |h| formula.in_range(h))
            .await?
            .into_iter();
        Ok(batch
            .iter()
            .map(|p| values.by_ref().take(p.windows.len()).collect())
            .collect())
    }

    /// Writes `values` (one per window of `p`, in order) with a compare-and-set each
    /// from the one before; stops at one that found the value moved on.
    async fn write(&self, p: ToPrice, values: Vec<i64>) -> anyhow::Result<Priced> {
        let mut priced = Priced::default();
        let mut state = self.state.clone();
        let mut current = p.current;
        for ((window, demand, supply), hundredths) in p.windows.into_iter().zip(values) {
            let result = WindowResult {
                start_ms: window.start_ms,
                end_ms: window.end_ms,
                value: serde_json::Number::from_f64(hundredths as f64 / 100.0)
                    .context("a finite multiplier")?,
            };
            let value = serde_json::to_vec(&result)?;
            let request = pb::UpdateRequest {
                key: p.key.clone(),
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
                    tracing::debug!(key = %p.key, start_ms = window.start_ms, demand, supply, hundredths, "priced");
                    current = Some((value, result));
                }
                Err(s) if s.code() == Code::FailedPrecondition => {
                    priced.moved_on += 1;
                    break;
                }
                Err(s) => anyhow::bail!("{} window {}: {s}", p.key, window.start_ms),
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

/// `items` in order, split into runs of at most `max` windows (a geohash with more is a
/// run of its own): a geohash's windows go to the function in one call.
fn chunks(items: Vec<ToPrice>, max: usize) -> Vec<Vec<ToPrice>> {
    let mut out: Vec<Vec<ToPrice>> = Vec::new();
    let mut size = 0;
    for item in items {
        let n = item.windows.len();
        match out.last_mut() {
            Some(last) if size + n <= max => last.push(item),
            _ => {
                out.push(vec![item]);
                size = 0;
            }
        }
        size += n;
    }
    out
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
    fn a_batch_keeps_each_geohash_s_windows_together_and_under_the_limit() {
        let item = |gh: &str, n: u64| ToPrice {
            gh: gh.into(),
            key: format!("prices/{gh}"),
            current: None,
            windows: (0..n)
                .map(|i| {
                    let w = Window {
                        start_ms: i * 60,
                        end_ms: i * 60 + 60,
                    };
                    (w, 1, 1)
                })
                .collect(),
        };
        let items = vec![item("a", 3), item("b", 2), item("c", 6), item("d", 1)];
        let sizes: Vec<Vec<(String, usize)>> = chunks(items, 5)
            .into_iter()
            .map(|c| c.into_iter().map(|p| (p.gh, p.windows.len())).collect())
            .collect();
        let run = |v: &[(&str, usize)]| {
            v.iter()
                .map(|(g, n)| (g.to_string(), *n))
                .collect::<Vec<_>>()
        };
        // "c" alone is over the limit: a call of its own
        assert_eq!(
            sizes,
            vec![
                run(&[("a", 3), ("b", 2)]),
                run(&[("c", 6)]),
                run(&[("d", 1)])
            ]
        );
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
