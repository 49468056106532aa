//! Serving: `run` (a region node, or the lease group's witness, until SIGTERM or
//! Ctrl-C), `check-config` (what a configuration would run, contacting nothing), `probe`
//! (the liveness and readiness check of a running node), and the stop signal the
//! long-running commands wait for.

use anyhow::Context;

use super::{ConfigArgs, Node, Role};
use crate::pb;
use crate::pb::admin_client::AdminClient;

pub(super) async fn run(config: ConfigArgs, role: Role) -> anyhow::Result<()> {
    let ConfigArgs { config, set } = config;
    if role == Role::Witness {
        let config = crate::config::WitnessConfig::load(&config, &set)?;
        crate::lease::witness::run(config, shutdown_signal()).await?;
        return Ok(());
    }
    let config = crate::config::Config::load_with(&config, &set)?;
    let listeners = crate::node::Listeners::bind(&config)
        .await
        .context("binding the gRPC and metrics addresses")?;
    crate::node::run(config, listeners, shutdown_signal()).await?;
    Ok(())
}

pub(super) fn check_config(config: ConfigArgs, role: Role) -> anyhow::Result<()> {
    let ConfigArgs { config: path, set } = config;
    let described = match role {
        Role::Witness => crate::config::WitnessConfig::load(&path, &set)?.describe(),
        Role::Region => crate::config::Config::load_with(&path, &set)?.describe(),
    };
    println!("{}: valid", path.display());
    print!("{described}");
    Ok(())
}

pub(super) async fn probe(node: Node, ready: bool, timeout: String) -> anyhow::Result<()> {
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    let timeout = crate::config::parse_duration("--timeout", &timeout)?;
    let check = async {
        let channel = node.channel().await?;
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
        let service = "geostate.v1.State".to_owned();
        let answer = health.check(HealthCheckRequest { service }).await?;
        let status = answer.into_inner().status();
        anyhow::ensure!(status == ServingStatus::Serving, "not serving ({status:?})");
        if !ready {
            return Ok(());
        }
        let s = AdminClient::new(channel)
            .status(pb::StatusRequest {})
            .await?
            .into_inner();
        let behind: Vec<&str> = s
            .remotes
            .iter()
            .filter(|r| !r.caught_up)
            .map(|r| r.region.as_str())
            .collect();
        anyhow::ensure!(
            behind.is_empty(),
            "has not yet read the deltas of {} to their end",
            behind.join(", ")
        );
        Ok(())
    };
    match tokio::time::timeout(timeout, check).await {
        // the address first: a probe's output is all a pod's events show
        Ok(done) => done.map_err(|e| anyhow::anyhow!("{}: {e:#}", node.addr)),
        Err(_) => anyhow::bail!("{}: no answer within {timeout:?}", node.addr),
    }
}

/// Ctrl-C, or (on Unix) SIGTERM: when a long-running command stops.
pub(super) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
