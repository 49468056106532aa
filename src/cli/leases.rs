//! The lease group, from an operator: `leases` (who holds each ownership shard),
//! `transfer-lease` (a planned handoff) and `remove-region` (a membership change through
//! the group's log).

use anyhow::Context;

use super::{ConfigArgs, Node, Role};
use crate::pb;

pub(super) async fn leases(node: Node, key: String) -> anyhow::Result<()> {
    let mut client = node.admin().await?;
    let r = client.leases(pb::LeasesRequest { key }).await?.into_inner();
    println!(
        "region {} (lease group leader: member {})",
        r.region, r.leader
    );
    println!(
        "{:>5}  {:<12} {:<12} {:>6} {:>10}  {:<5} prefix",
        "shard", "home", "holder", "epoch", "expires", "here"
    );
    for s in r.shards {
        println!(
            "{:>5}  {:<12} {:<12} {:>6} {:>8}ms  {:<5} {}",
            s.shard, s.home, s.holder, s.epoch, s.expires_in_ms, s.held_here, s.prefix
        );
    }
    Ok(())
}

pub(super) async fn transfer_lease(node: Node, shard: u32, to: String) -> anyhow::Result<()> {
    let mut client = node.admin().await?;
    let request = pb::TransferLeaseRequest {
        shard,
        to_region: to,
    };
    let r = client.transfer_lease(request).await?.into_inner();
    let l = r.lease.unwrap_or_default();
    println!(
        "shard {} now held by {} at epoch {}",
        l.shard, l.holder, l.epoch
    );
    Ok(())
}

pub(super) async fn remove_region(
    region: String,
    config: ConfigArgs,
    role: Role,
) -> anyhow::Result<()> {
    use crate::lease::network::{Channels, GroupChange, change_group_within};
    let ConfigArgs { config: path, set } = config;
    let (lease, tls) = match role {
        Role::Witness => {
            let c = crate::config::WitnessConfig::load(&path, &set)?;
            (c.lease, c.tls)
        }
        Role::Region => {
            let c = crate::config::Config::load_with(&path, &set)?;
            let lease = c
                .lease
                .context("the configuration has no [lease] section")?;
            (lease, c.tls)
        }
    };
    let tls = tls.as_ref().map(crate::security::Tls::load).transpose()?;
    let region = crate::crdt::RegionId::new(region)?;
    let members: Vec<String> = lease.members.values().map(|m| m.addr.clone()).collect();
    let change = GroupChange::RemoveRegion {
        region: region.clone(),
    };
    let wait = std::time::Duration::from_secs(30);
    let index = change_group_within(&Channels::new(tls), &members, &change, wait)
        .await
        .map_err(|e| anyhow::anyhow!("removing {region} from the lease group: {e}"))?;
    println!("{region} is no region of the lease group (log index {index})");
    Ok(())
}
