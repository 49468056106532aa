//! Every metric name in one place, and the Prometheus endpoint.
//!
//! Metrics are recorded with the `metrics` crate; [`serve`] renders them as Prometheus
//! text on the node's metrics address (`/metrics`; `/health` answers `ok`).

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Calls of a user function sidecar, labels `function` and `outcome` (`ok`, `timeout`,
/// `unavailable`, `refused`, `invalid`) (counter).
pub const FUNCTION_CALLS: &str = "geostate_function_calls_total";
/// Inputs sent to a user function, label `function` (counter).
pub const FUNCTION_INPUTS: &str = "geostate_function_inputs_total";
/// How long a user function call took, label `function` (histogram).
pub const FUNCTION_CALL_SECONDS: &str = "geostate_function_call_seconds";
/// Whether the node's last health check of a user function sidecar got an answer, label
/// `function` (gauge).
pub const FUNCTION_UP: &str = "geostate_function_up";
/// Geohashes with final windows not priced yet, waiting for a retry (gauge).
pub const PRICER_PENDING: &str = "geostate_pricer_pending_geohashes";
/// Own deltas merged into a partition's copy, label `by`: `take` (the catch-up before
/// the node owns it), `standby` (a warm standby's refresh) or `join` (the catch-up of
/// every copy before the node joins its region's group); with label `region`, a remote
/// region's deltas a standby's refresh merged (counter).
pub const CATCH_UP_DELTAS: &str = "geostate_catch_up_deltas_total";
/// Nodes of the region this node removed from the group because their port refused
/// connections ([`crate::peers`]) (counter).
pub const NODES_EVICTED: &str = "geostate_nodes_evicted_total";
/// Partitions this node took again after another node fenced it out of them while the
/// group still assigned them here ([`crate::keeper`]) (counter).
pub const PARTITIONS_RETAKEN: &str = "geostate_partitions_retaken_total";
/// Partitions this node keeps a warm standby copy of (gauge).
pub const STANDBY_PARTITIONS: &str = "geostate_standby_partitions";
/// The offset of the region's own deltas topic up to which this node's copy of a
/// partition holds every delta, label `partition` (gauge).
pub const COPY_THROUGH: &str = "geostate_copy_through";
/// Update records applied to state (counter).
pub const EVENTS_APPLIED: &str = "geostate_events_applied_total";
/// Records skipped because their idempotency id was already applied (counter).
pub const EVENTS_DUPLICATE: &str = "geostate_events_duplicate_total";
/// Records on another partition than their key's (their producer does
/// not partition like the Java client) (counter).
pub const EVENTS_MISROUTED: &str = "geostate_events_misrouted_total";
/// Records sent to the dead-letter topic, label `reason` (counter).
pub const EVENTS_DEAD_LETTERED: &str = "geostate_events_dead_lettered_total";
/// Windowed records refused because their window had closed in this region, kept in the
/// late topic (counter).
pub const EVENTS_LATE: &str = "geostate_events_late_total";
/// Late events shipped to the late topic (counter).
pub const LATE_SHIPPED: &str = "geostate_late_shipped_total";
/// Final windows produced to the outputs topic (counter).
pub const OUTPUTS_PRODUCED: &str = "geostate_outputs_produced_total";
/// Refused records the dead-letter topic itself refused (logged with their source
/// position, which still holds them), label `reason` (counter).
pub const DEAD_LETTERS_PARKED: &str = "geostate_dead_letters_parked_total";
/// A background task (merger, lease manager, checkpointer, metrics server) that ended while
/// the node ran, which then stops, label `task` (counter).
pub const TASK_FAILURES: &str = "geostate_task_failures_total";
/// `Watch` streams cut off because their client left too many values unread (counter).
pub const WATCHERS_DROPPED: &str = "geostate_watchers_dropped_total";
/// Keys waiting in the outbox to be shipped, as ingest or the shipper last saw it (gauge).
pub const OUTBOX_KEYS: &str = "geostate_outbox_keys";
/// Bytes of state (values and idempotency ids, window slices included) this node's
/// RocksDB holds in live SST files and memtables; expired slices leave it as compactions
/// drop them (gauge).
pub const STATE_BYTES: &str = "geostate_state_bytes";
/// Deltas this region shipped to its deltas topic (counter).
pub const DELTAS_SHIPPED: &str = "geostate_deltas_shipped_total";
/// Bytes of deltas shipped (counter).
pub const DELTA_BYTES_SHIPPED: &str = "geostate_delta_bytes_shipped_total";
/// Remote deltas merged, label `region` (counter).
pub const DELTAS_MERGED: &str = "geostate_deltas_merged_total";
/// Remote deltas of window slices past their retention, not merged, label `region`
/// (counter).
pub const DELTAS_EXPIRED: &str = "geostate_deltas_expired_total";
/// Remote deltas refused, labels `region`, `reason` (counter).
pub const DELTAS_REFUSED: &str = "geostate_deltas_refused_total";
/// Times a remote partition was held at a delta stamped too far ahead, to be read again
/// once the local clock allows, labels `region`, `reason` (counter).
pub const DELTAS_HELD: &str = "geostate_deltas_held_total";
/// Since the oldest of a remote region's newest heartbeats over its partitions, on this
/// node's clock against the remote's (heartbeats come every second; a stopped mirror or a
/// cut-off region makes it grow), label `region` (gauge).
pub const REMOTE_SILENCE_SECONDS: &str = "geostate_remote_silence_seconds";
/// From a remote region's apply to ours, label `region` (histogram).
pub const REPLICATION_LAG_SECONDS: &str = "geostate_replication_lag_seconds";
/// Seconds to apply and commit one batch of one partition (histogram).
pub const BATCH_APPLY_SECONDS: &str = "geostate_batch_apply_seconds";
/// Where an `Update`'s time goes, label `stage` (histogram, seconds), in order:
/// `produce` (the API's record queued until the broker acknowledged it), `fetch` (from the
/// record's timestamp, taken when the API made it, until ingest received it: a batch's
/// first record, milliseconds apart), `batch` (received until its batch is applied: the
/// outbox bound, the state lock, a lease-group question), `apply`, `commit` (dead letters
/// and the RocksDB write), and `applied` (the API's wait from the broker's ack until
/// ingest said its record was applied: `fetch` to `commit` as this request saw them).
pub const WRITE_STAGE_SECONDS: &str = "geostate_write_stage_seconds";
/// Events per applied batch of one partition (histogram).
pub const BATCH_EVENTS: &str = "geostate_batch_events";
/// Records appended to an input partition but not applied yet, label `partition` (gauge).
pub const CONSUMER_LAG: &str = "geostate_consumer_lag";
/// Consume errors after which a new Kafka client took over, at the stored positions,
/// label `consumer` (ingest, merge) (counter).
pub const CONSUMER_RESTARTS: &str = "geostate_consumer_restarts_total";
/// gRPC handling time, label `method` (histogram).
pub const GRPC_SECONDS: &str = "geostate_grpc_seconds";
/// gRPC requests answered with an error, labels `method`, `code` (counter).
pub const GRPC_ERRORS: &str = "geostate_grpc_errors_total";
/// Checkpoints written (counter).
pub const CHECKPOINTS: &str = "geostate_checkpoints_total";
/// Checkpoints that failed; the newest good one stays (counter).
pub const CHECKPOINT_FAILURES: &str = "geostate_checkpoint_failures_total";
/// Seconds from the start of a checkpoint to its manifest (histogram).
pub const CHECKPOINT_SECONDS: &str = "geostate_checkpoint_seconds";
/// Bytes uploaded by checkpoints (counter).
pub const CHECKPOINT_BYTES_UPLOADED: &str = "geostate_checkpoint_bytes_uploaded_total";
/// When the newest checkpoint was written, Unix seconds (gauge).
pub const CHECKPOINT_LAST: &str = "geostate_checkpoint_last_unix_seconds";
/// Ownership shards this region holds a valid lease on (gauge).
pub const LEASES_HELD: &str = "geostate_lease_shards_held";
/// From sending a lease renewal (or acquisition) to its applied outcome (histogram).
pub const LEASE_RENEW_SECONDS: &str = "geostate_lease_renew_seconds";
/// Raft log entries this region proposed for its leases: one per round, holding every
/// command of the round (counter).
pub const LEASE_ENTRIES: &str = "geostate_lease_log_entries_total";
/// Lease commands proposed, label `outcome` (granted, refused, failed) (counter).
pub const LEASE_PROPOSALS: &str = "geostate_lease_proposals_total";
/// Pre-votes this lease group member held after hearing from no leader for an election
/// timeout, label `outcome`: `won` (a majority would vote for it: it stood for election)
/// or `lost` (no election) ([`crate::lease::election`]) (counter).
pub const LEASE_PRE_VOTES: &str = "geostate_lease_pre_votes_total";
/// This lease group member's last round trip to another voter, label `member`
/// (gauge, seconds): where the leader should be ([`crate::lease::placement`]).
pub const LEASE_ROUND_TRIP: &str = "geostate_lease_round_trip_seconds";
/// Times this member, leading, handed the lead to a voter better placed, label `outcome`:
/// `moved` (another member leads) or `failed` (it still leads) ([`crate::lease::placement`])
/// (counter).
pub const LEASE_HANDOVERS: &str = "geostate_lease_handovers_total";
/// When this process's own TLS certificate expires, Unix seconds (gauge): alert well
/// before it (the files are reloaded without a restart).
pub const TLS_CERT_EXPIRES: &str = "geostate_tls_certificate_expires_unix_seconds";
/// Reloads of the TLS files after a change or SIGHUP, label `outcome` (loaded, failed:
/// the current certificates stay) (counter).
pub const TLS_RELOADS: &str = "geostate_tls_reloads_total";
/// TLS handshakes a listener refused (bad, expired or missing client certificate, wrong
/// CA, timeout), label `listener` (api, lease, metrics) (counter).
pub const TLS_REFUSED: &str = "geostate_tls_handshakes_refused_total";
/// Calls refused before any handler ran (no credentials, a role too low, not a lease
/// group member), label `code` (counter).
pub const CALLS_REFUSED: &str = "geostate_calls_refused_total";
/// Calls refused `RESOURCE_EXHAUSTED` because their caller was over its limits
/// (`api.limits`), labels `caller` (`cert:NAME` for a certificate; `token` and `ip` for
/// the callers by token and by address, all of each in one series) and `limit` (`rate`,
/// `concurrency`) (counter).
pub const CALLS_LIMITED: &str = "geostate_calls_limited_total";
/// Owned-key writes refused because this region holds no valid lease (counter).
pub const OWNED_WRITES_REFUSED: &str = "geostate_owned_writes_refused_total";
/// Owned-key events or deltas refused for an epoch below the shard's highest applied,
/// label `path` (ingest, merge) (counter).
pub const FENCED: &str = "geostate_fenced_total";
/// Leaseholder reads and compare-and-sets a new holder answered UNAVAILABLE because an
/// earlier holder's writes had not all arrived (counter).
pub const NOT_SETTLED: &str = "geostate_linearizable_not_settled_total";
/// Another lease group member's wall clock minus this one's, label `member` (gauge,
/// seconds).
pub const CLOCK_OFFSET: &str = "geostate_clock_offset_seconds";
/// 1 while this region's clock is off from most members beyond 80 % of
/// `max-clock-offset` (it then proposes no lease command and writes no owned key) (gauge).
pub const CLOCK_OFF: &str = "geostate_clock_off";
/// 1 while this node reaches its region's Kafka, 0 once it has not answered for
/// `lease.kafka-down-after` (the region's leases are then let go) (gauge).
pub const KAFKA_REACHABLE: &str = "geostate_kafka_reachable";
/// Compare-and-set writes whose comparison failed when applied (counter).
pub const CAS_FAILED: &str = "geostate_cas_failed_total";

/// Replication lag's buckets: fine enough up to 2 s to place a p99 against a 300 ms goal,
/// and up to a minute, so that a quantile can pass the alert's 5 s (a quantile in the
/// +Inf bucket reads as the highest finite bound).
pub const LAG_BUCKETS: [f64; 21] = [
    0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.0, 5.0, 10.0, 30.0, 60.0,
];

/// Records `took` as write stage `stage` ([`WRITE_STAGE_SECONDS`]).
pub fn write_stage(stage: &'static str, took: Duration) {
    metrics::histogram!(WRITE_STAGE_SECONDS, "stage" => stage).record(took.as_secs_f64());
}

/// The write stages' buckets: fine enough between 1 ms and 50 ms to place a p99.
pub const STAGE_BUCKETS: [f64; 18] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.003, 0.005, 0.007_5, 0.01, 0.015, 0.02, 0.03, 0.04,
    0.05, 0.075, 0.1, 0.25, 1.0,
];

/// Installs the process-wide recorder (once; later calls get `None`), with the dead-letter
/// counter registered at 0 for each of `dead_letter_reasons`.
pub fn install(dead_letter_reasons: &[&'static str]) -> Option<PrometheusHandle> {
    let buckets = [
        0.000_1, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    ];
    let sizes = [1.0, 10.0, 100.0, 1_000.0, 10_000.0];
    let handle = PrometheusBuilder::new()
        .set_buckets(&buckets)
        .ok()?
        .set_buckets_for_metric(Matcher::Full(BATCH_EVENTS.into()), &sizes)
        .ok()?
        .set_buckets_for_metric(Matcher::Full(WRITE_STAGE_SECONDS.into()), &STAGE_BUCKETS)
        .ok()?
        .set_buckets_for_metric(Matcher::Full(REPLICATION_LAG_SECONDS.into()), &LAG_BUCKETS)
        .ok()?
        .install_recorder()
        .ok()?;
    zero_counters(dead_letter_reasons);
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Some(handle)
}

/// Registers at 0 the counters the alerting rules watch (`deploy/prometheus/rules.yml`):
/// `increase()` sees a series' first increment only if the series existed before it.
fn zero_counters(dead_letter_reasons: &[&'static str]) {
    for &reason in dead_letter_reasons {
        metrics::counter!(EVENTS_DEAD_LETTERED, "reason" => reason).absolute(0);
    }
    for path in ["ingest", "merge"] {
        metrics::counter!(FENCED, "path" => path).absolute(0);
    }
    for consumer in ["ingest", "merge", "standby"] {
        metrics::counter!(CONSUMER_RESTARTS, "consumer" => consumer).absolute(0);
    }
    for name in [CHECKPOINT_FAILURES, OWNED_WRITES_REFUSED, EVENTS_LATE] {
        metrics::counter!(name).absolute(0);
    }
}

/// Serves the metrics as Prometheus text over HTTP/1.1 (hyper) on the connections of a
/// listener (TLS when the node has it): `GET /metrics` the metrics, `GET /health` `ok`,
/// any other path 404 and any other method 405.
pub async fn serve<C>(
    mut connections: impl tokio_stream::Stream<Item = std::io::Result<C>> + Unpin,
    handle: Option<PrometheusHandle>,
) where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tokio_stream::StreamExt;
    while let Some(accepted) = connections.next().await {
        let Ok(socket) = accepted else {
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let answer = service_fn(move |request: Request<Incoming>| {
                let response = respond(&request, handle.as_ref());
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            // a client that sends no request head within 5 s is dropped
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5))
                .serve_connection(TokioIo::new(socket), answer)
                .await;
        });
    }
}

fn respond(
    request: &Request<Incoming>,
    handle: Option<&PrometheusHandle>,
) -> Response<Full<Bytes>> {
    let (status, body) = match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            handle.map(PrometheusHandle::render).unwrap_or_default(),
        ),
        (&Method::GET, "/health") => (StatusCode::OK, "ok\n".to_string()),
        (&Method::GET, path) => (
            StatusCode::NOT_FOUND,
            format!("no {path} here: /metrics or /health\n"),
        ),
        (method, _) => (
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not served: GET only\n"),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}
