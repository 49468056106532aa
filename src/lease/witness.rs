//! The witness: a lease group member with no region (`geostate run --role witness`). It
//! stores the Raft log and votes, so two regions and a witness at a third site form a
//! majority that survives the loss of any one of them; it never holds a lease.

use std::future::Future;
use std::sync::Arc;

use super::member::{Member, MemberError};
use crate::clock::SystemClock;
use crate::config::WitnessConfig;
use crate::security::Tls;

/// Runs the witness until `shutdown` completes.
pub async fn run(
    config: WitnessConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), MemberError> {
    let tls = config.tls.as_ref().map(Tls::load).transpose();
    let tls = tls.map_err(|e| MemberError::Tls(e.to_string()))?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    if let Some(tls) = &tls {
        tokio::spawn(tls.clone().watch(stopped));
    }
    let member = Member::start(
        &config.lease,
        &config.data_dir,
        config.max_clock_offset.as_millis() as u64,
        Arc::new(SystemClock),
        tls,
    )
    .await?;
    tracing::info!(
        member = config.lease.member_id,
        listen = %config.lease.listen,
        members = config.lease.members.len(),
        "witness started"
    );
    shutdown.await;
    tracing::info!("witness stopping");
    member.stop().await;
    let _ = stop.send(true);
    Ok(())
}
