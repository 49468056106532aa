//! The lease group on real parts: three openraft members (two regions and a witness), each
//! with its own RocksDB storage, talking gRPC over loopback. A lease granted through the
//! leader is applied everywhere; with the leader's member stopped, the remaining majority
//! elects a new leader and keeps granting (a new holder, a higher epoch); the stopped
//! member restarts from its own disk and catches up. A third region's member joins the
//! running group and leaves it again, each a membership change through the log.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use common::now_ms;
use common::pki::Pki;
use geostate::clock::SystemClock;
use geostate::config::{LeaseConfig, Member as MemberConfig};
use geostate::crdt::RegionId;
use geostate::lease::member::Member;
use geostate::lease::network::{Channels, GroupChange, change_group, change_group_within};
use geostate::lease::raft_store::{Proposal, Reply};
use geostate::lease::table::{Command, Outcome, Refusal};
use geostate::pb;
use geostate::pb::lease_raft_client::LeaseRaftClient;
use geostate::security::{Tls, tls};
use openraft::Vote;
use openraft::error::{ClientWriteError, RaftError};
use openraft::raft::AppendEntriesRequest;

/// Member `id` of the group on `ports` (us-east-1, eu-west-1, the witness, then
/// ap-southeast-1), with fast Raft timings.
fn config(id: u64, ports: &[u16]) -> LeaseConfig {
    let members = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let id = i as u64 + 1;
            // the table takes commands for the group's regions only
            let region = [
                Some("us-east-1"),
                Some("eu-west-1"),
                None,
                Some("ap-southeast-1"),
            ]
            .get(i)
            .copied()
            .flatten()
            .map(RegionId::new);
            let member = MemberConfig {
                id,
                addr: format!("127.0.0.1:{port}"),
                region: region.transpose().expect("a region name"),
                api: Vec::new(),
            };
            (id, member)
        })
        .collect();
    LeaseConfig {
        member_id: id,
        learner: 0,
        listen: format!("127.0.0.1:{}", ports[id as usize - 1])
            .parse()
            .expect("an address"),
        members,
        shards: 8,
        homes: Vec::new(),
        duration: Duration::from_millis(2000),
        renew_every: Duration::from_millis(100),
        heartbeat: Duration::from_millis(100),
        election_timeout: Duration::from_millis(400),
        kafka_down_after: Duration::from_secs(3),
        take_back: false,
        forward_writes: false,
        join: false,
        operators: vec!["operator".to_owned()],
    }
}

/// A plaintext member with the test's clock offset bound (100 ms), storing in `dir`.
async fn start(config: &LeaseConfig, dir: &std::path::Path) -> anyhow::Result<Member> {
    Ok(Member::start(config, dir, 100, Arc::new(SystemClock), None).await?)
}

/// The voters as `member`'s membership has them.
fn voters(member: &Member) -> Vec<u64> {
    let membership = member.raft.metrics().borrow().membership_config.clone();
    membership.membership().voter_ids().collect()
}

async fn leader(members: &BTreeMap<u64, Member>) -> anyhow::Result<u64> {
    let any = members.values().next().context("no member")?;
    let metrics = any
        .raft
        .wait(Some(Duration::from_secs(10)))
        .metrics(
            |m| m.current_leader.is_some_and(|l| members.contains_key(&l)),
            "a live leader",
        )
        .await?;
    metrics.current_leader.context("no leader")
}

async fn acquire(
    members: &BTreeMap<u64, Member>,
    region: &str,
    duration_ms: u64,
) -> anyhow::Result<Outcome> {
    // a member's view of the leader can be a term behind while the group (re-)elects:
    // the member it names then answers "forward to the leader"; ask again
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let leader = leader(members).await?;
        let written = members[&leader]
            .raft
            .client_write(Proposal(vec![Command::Acquire {
                shard: 7,
                region: RegionId::new(region)?,
                now_ms: now_ms(),
                duration_ms,
            }]))
            .await;
        match written {
            Ok(written) => {
                let reply: Reply = written.data;
                return reply.0.into_iter().next().context("no outcome");
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_)))
                if std::time::Instant::now() < until =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn applied_everywhere(members: &BTreeMap<u64, Member>, epoch: u64) -> anyhow::Result<()> {
    for (id, m) in members {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while m.view.lease(7).map(|l| l.epoch) != Some(epoch) {
            anyhow::ensure!(
                std::time::Instant::now() < until,
                "member {id} did not apply epoch {epoch}: {:?}",
                m.view.lease(7)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_granted_by_the_majority_after_the_leader_stops() -> anyhow::Result<()> {
    let dirs: Vec<tempfile::TempDir> = (0..3)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let ports: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
    let mut members = BTreeMap::new();
    // every member forms the group with the same first membership on its first start
    for (i, dir) in dirs.iter().enumerate() {
        let id = i as u64 + 1;
        members.insert(id, start(&config(id, &ports), dir.path()).await?);
    }

    // a grant through the leader reaches every member's table
    let Outcome::Granted(first) = acquire(&members, "us-east-1", 2000).await? else {
        anyhow::bail!("the first acquire was refused");
    };
    assert_eq!((first.holder.as_str(), first.epoch), ("us-east-1", 1));
    applied_everywhere(&members, 1).await?;
    // held elsewhere: refused while in force
    assert!(matches!(
        acquire(&members, "eu-west-1", 500).await?,
        Outcome::Refused { .. }
    ));

    // the leader's member stops; the other two elect a leader and keep granting
    let old_leader = leader(&members).await?;
    let stopped_at = std::time::Instant::now();
    members.remove(&old_leader).context("leader")?.stop().await;
    // the first lease ends at its recorded expiry (the proposer's wall clock is ours)
    tokio::time::sleep(Duration::from_millis(
        first.expires_at_ms.saturating_sub(now_ms()),
    ))
    .await;
    let Outcome::Granted(second) = acquire(&members, "eu-west-1", 500).await? else {
        anyhow::bail!("the majority did not grant the expired shard");
    };
    println!(
        "new grant {} ms after the first lease's expiry, {:.0} ms after the leader stopped",
        now_ms().saturating_sub(first.expires_at_ms),
        stopped_at.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!((second.holder.as_str(), second.epoch), ("eu-west-1", 2));
    applied_everywhere(&members, 2).await?;

    // the stopped member comes back from its own disk and catches up
    let back = start(
        &config(old_leader, &ports),
        dirs[old_leader as usize - 1].path(),
    )
    .await?;
    members.insert(old_leader, back);
    applied_everywhere(&members, 2).await?;
    for (_, m) in members {
        m.stop().await;
    }
    Ok(())
}

/// Waits until every member's table counts exactly `regions` as the group's.
async fn regions_everywhere(
    members: &BTreeMap<u64, Member>,
    regions: &[&str],
) -> anyhow::Result<()> {
    for (id, m) in members {
        let until = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let now: Vec<String> = m.view.regions().into_keys().map(String::from).collect();
            if now == regions {
                break;
            }
            anyhow::ensure!(
                std::time::Instant::now() < until,
                "member {id} counts {now:?}, not {regions:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// A region added at runtime: its member (`lease.join`) asks the running group to add it,
/// and from the membership entry that makes it a voter the table takes its commands and
/// counts it among the shards' homes; `remove-region` takes it out again, after which its
/// commands are refused and its lease passes to another region at a higher epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_joins_the_running_group_and_leaves_it() -> anyhow::Result<()> {
    let dirs: Vec<tempfile::TempDir> = (0..4)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let ports: Vec<u16> = (0..4).map(|_| common::free_port()).collect();
    let mut members = BTreeMap::new();
    // the group forms of the first three, which know nothing of the fourth
    for id in 1..=3 {
        let member = start(&config(id, &ports[..3]), dirs[id as usize - 1].path()).await?;
        members.insert(id, member);
    }
    regions_everywhere(&members, &["eu-west-1", "us-east-1"]).await?;
    assert!(
        matches!(
            acquire(&members, "ap-southeast-1", 2000).await?,
            Outcome::Refused {
                reason: Refusal::Impossible,
                ..
            }
        ),
        "a region outside the group is refused"
    );

    // the fourth region's member joins the running group, and votes
    let joining = LeaseConfig {
        join: true,
        ..config(4, &ports)
    };
    let fourth = start(&joining, dirs[3].path()).await?;
    assert!(
        fourth.caught_up(Duration::from_secs(20)).await,
        "the new member caught up"
    );
    members.insert(4, fourth);
    regions_everywhere(&members, &["ap-southeast-1", "eu-west-1", "us-east-1"]).await?;
    let leader_id = leader(&members).await?;
    assert_eq!(voters(&members[&leader_id]), [1, 2, 3, 4]);
    let Outcome::Granted(held) = acquire(&members, "ap-southeast-1", 2000).await? else {
        anyhow::bail!("the joined region's acquire was refused");
    };
    assert_eq!((held.holder.as_str(), held.epoch), ("ap-southeast-1", 1));
    applied_everywhere(&members, 1).await?;
    // the homes now go round three regions, in every member's count
    let sorted: Vec<RegionId> = members[&1].view.regions().into_keys().collect();
    let homes: Vec<String> = (0..3)
        .filter_map(|shard| joining.home_among(shard, &sorted).map(String::from))
        .collect();
    assert_eq!(homes, ["ap-southeast-1", "eu-west-1", "us-east-1"]);

    // taken out again: through any member, by another region's configuration
    let addrs: Vec<String> = ports[..3]
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let remove = GroupChange::RemoveRegion {
        region: RegionId::new("ap-southeast-1")?,
    };
    change_group(
        &Channels::new(None),
        &addrs,
        &remove,
        Duration::from_secs(20),
    )
    .await
    .map_err(anyhow::Error::msg)?;
    members.remove(&4).context("the fourth")?.stop().await;
    regions_everywhere(&members, &["eu-west-1", "us-east-1"]).await?;
    assert!(matches!(
        acquire(&members, "ap-southeast-1", 2000).await?,
        Outcome::Refused {
            reason: Refusal::Impossible,
            ..
        }
    ));
    // its lease lapses, and another region takes the shard at a higher epoch
    tokio::time::sleep(Duration::from_millis(
        held.expires_at_ms.saturating_sub(now_ms()),
    ))
    .await;
    let Outcome::Granted(taken) = acquire(&members, "eu-west-1", 2000).await? else {
        anyhow::bail!("the left region's shard was not granted to another");
    };
    assert_eq!((taken.holder.as_str(), taken.epoch), ("eu-west-1", 2));
    for (_, m) in members {
        m.stop().await;
    }
    Ok(())
}

/// A `LeaseRaft` client of the member at `port` over TLS with `client`.
async fn raft_client(
    port: u16,
    client: Arc<rustls::ClientConfig>,
) -> Result<LeaseRaftClient<tonic::transport::Channel>, tonic::transport::Error> {
    let addr = format!("127.0.0.1:{port}");
    let channel = tls::connect_with(&addr, client, Duration::from_secs(2)).await?;
    Ok(LeaseRaftClient::new(channel))
}

fn message<T: serde::Serialize>(value: &T) -> pb::RaftMessage {
    pb::RaftMessage {
        json: serde_json::to_vec(value).expect("json"),
    }
}

/// Over TLS, the group runs as before, and takes calls only from its members'
/// certificates (signed by its CA, not expired), each for its own region: a region's
/// certificate cannot propose for another, nor send a Raft message as another member, nor
/// remove another region (an operator's may); a stranger's certificate sends nothing;
/// and the table refuses impossible commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_group_takes_its_members_only_each_for_its_own_region() -> anyhow::Result<()> {
    let dirs: Vec<tempfile::TempDir> = (0..4)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let certs = dirs[3].path();
    let pki = Pki::new(certs, "group")?;
    let other = Pki::new(certs, "other")?;
    let ports: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
    let mut members = BTreeMap::new();
    for (i, name) in ["us-east-1", "eu-west-1", "witness"].iter().enumerate() {
        let id = i as u64 + 1;
        let tls = Tls::load(&pki.tls(name)?)?;
        let member = Member::start(
            &config(id, &ports),
            dirs[i].path(),
            100,
            Arc::new(SystemClock),
            Some(tls),
        )
        .await?;
        members.insert(id, member);
    }
    // the group elects and grants over TLS
    let Outcome::Granted(first) = acquire(&members, "us-east-1", 2000).await? else {
        anyhow::bail!("the first acquire was refused");
    };
    applied_everywhere(&members, first.epoch).await?;
    let leader_port = ports[leader(&members).await? as usize - 1];

    let eu = pki.issue("eu-west-1")?;
    let mut as_eu = raft_client(leader_port, pki.client(Some(&eu))?).await?;
    let acquire_for = |region: &str, shard| {
        Proposal(vec![Command::Acquire {
            shard,
            region: RegionId::new(region).expect("a region"),
            now_ms: now_ms(),
            duration_ms: 2000,
        }])
    };
    // a region proposes for itself only
    let stolen = as_eu.propose(message(&acquire_for("us-east-1", 7))).await;
    let refused = stolen.expect_err("eu-west-1 proposed for us-east-1");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let own = as_eu.propose(message(&acquire_for("eu-west-1", 6))).await?;
    let own: Result<Reply, String> = serde_json::from_slice(&own.into_inner().json)?;
    assert!(
        matches!(own.as_ref().map(|r| &r.0[..]), Ok([Outcome::Granted(_)])),
        "{own:?}"
    );
    // ... and the table refuses what no member proposes, whoever sends it
    let impossible = as_eu
        .propose(message(&acquire_for("eu-west-1", 99)))
        .await?;
    let impossible: Result<Reply, String> = serde_json::from_slice(&impossible.into_inner().json)?;
    assert!(
        matches!(
            impossible.as_ref().map(|r| &r.0[..]),
            Ok([Outcome::Refused {
                reason: Refusal::Impossible,
                ..
            }])
        ),
        "{impossible:?}"
    );

    // a Raft message sent as another member, or by a certificate naming no member
    let forged = |leader: u64| AppendEntriesRequest::<geostate::lease::raft_store::LeaseRaft> {
        vote: Vote::new_committed(99, leader),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    let as_other = as_eu.append_entries(message(&forged(1))).await;
    let refused = as_other.expect_err("eu-west-1 sent a message as member 1");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let mallory = pki.issue("mallory")?;
    let mut as_mallory = raft_client(leader_port, pki.client(Some(&mallory))?).await?;
    let refused = (as_mallory.append_entries(message(&forged(3))).await)
        .expect_err("a stranger's message was taken");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    // (asking a member to stand for election would depose the leader)
    let stand = |leader, term| pb::StandRequest { leader, term };
    let refused =
        (as_mallory.stand(stand(3, 0)).await).expect_err("a stranger made a member stand");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    // only the leader, at its term, asks a voter to stand: not a member's certificate in
    // another member's name, nor a member that does not lead at the term it names
    let leading = leader(&members).await?;
    let term = members[&leading].raft.metrics().borrow().current_term;
    let follower = (1..=3).find(|&id| id != leading).expect("a follower");
    let mut at_follower = raft_client(ports[follower as usize - 1], pki.client(Some(&eu))?).await?;
    let as_other = (at_follower.stand(stand(1, term)).await)
        .expect_err("eu-west-1 made a member stand in member 1's name");
    assert_eq!(
        as_other.code(),
        tonic::Code::PermissionDenied,
        "{as_other:?}"
    );
    let stale = (at_follower.stand(stand(2, term + 7)).await)
        .expect_err("eu-west-1 made a member stand at a term nobody leads");
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition, "{stale:?}");
    let now = leader(&members).await?;
    let now = (now, members[&now].raft.metrics().borrow().current_term);
    assert_eq!(now, (leading, term), "the lead moved");

    // no certificate, another CA's, an expired one: no connection at all
    let expired = pki.expired("eu-west-1", "eu-west-1-expired")?;
    let foreign = other.issue("eu-west-1")?;
    let refusals = [
        ("no certificate", pki.client(None)?),
        ("another CA's", pki.client(Some(&foreign))?),
        ("an expired one", pki.client(Some(&expired))?),
    ];
    for (what, client) in refusals {
        let call = async {
            let mut client = raft_client(leader_port, client).await?;
            client
                .propose(message(&acquire_for("eu-west-1", 5)))
                .await?;
            anyhow::Ok(())
        };
        assert!(call.await.is_err(), "a client with {what} was served");
    }
    // the group never moved shard 7 (still us-east-1's first grant)
    let leading = leader(&members).await?;
    assert_eq!(
        members[&leading].view.lease(7).map(|l| l.holder),
        Some(first.holder)
    );

    // a region is removed by itself or an operator only: not by another region, not by
    // the witness
    let remove = |region: &str| {
        message(&GroupChange::RemoveRegion {
            region: RegionId::new(region).expect("a region"),
        })
    };
    let leader_port = ports[leading as usize - 1];
    for name in ["eu-west-1", "witness"] {
        let cert = pki.issue(name)?;
        let mut client = raft_client(leader_port, pki.client(Some(&cert))?).await?;
        let refused = (client.learner(remove("us-east-1")).await)
            .expect_err("a member removed another region");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    }
    let as_operator = Channels::new(Some(Tls::load(&pki.tls("operator")?)?));
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let removal = GroupChange::RemoveRegion {
        region: RegionId::new("eu-west-1")?,
    };
    let wait = Duration::from_secs(20);
    change_group_within(&as_operator, &addrs, &removal, wait)
        .await
        .map_err(|e| anyhow::anyhow!("the operator's removal: {e}"))?;
    let until = std::time::Instant::now() + wait;
    while voters(&members[&1]).contains(&2) {
        assert!(std::time::Instant::now() < until, "eu-west-1 still votes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (_, m) in members {
        m.stop().await;
    }
    Ok(())
}
