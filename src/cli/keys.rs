//! Keys: `get`, `update` and `scan` through the `State` service, `route` (where a key
//! lives), and `decode-delta` (one replicated delta record from stdin, offline).

use std::io::Read;

use anyhow::Context;

use super::Node;
use crate::pb;

pub(super) fn decode_delta() -> anyhow::Result<()> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .context("reading stdin")?;
    let delta = crate::crdt::Delta::decode(&bytes).context("decoding delta")?;
    println!("{delta:#?}");
    Ok(())
}

pub(super) async fn get(node: Node, key: String) -> anyhow::Result<()> {
    let mut client = node.state().await?;
    let request = pb::GetRequest {
        key,
        ..Default::default()
    };
    let value = client.get(request).await?.into_inner();
    println!("{}", show(&value));
    Ok(())
}

pub(super) async fn update(
    node: Node,
    key: String,
    add: Option<i64>,
    set: Option<String>,
    id: Option<String>,
) -> anyhow::Result<()> {
    let op = match (add, set) {
        (Some(n), None) => pb::update_request::Op::Add(n),
        (None, Some(v)) => pb::update_request::Op::Set(v.into_bytes()),
        _ => anyhow::bail!("give exactly one of --add or --set"),
    };
    let mut client = node.state().await?;
    let request = pb::UpdateRequest {
        key,
        op: Some(op),
        id: id.unwrap_or_default(),
        event_time_ms: 0,
    };
    let reply = client.update(request).await?.into_inner();
    let at = reply.position.unwrap_or_default();
    println!("applied at partition {} offset {}", at.partition, at.offset);
    Ok(())
}

pub(super) async fn scan(node: Node, prefix: String, limit: u32) -> anyhow::Result<()> {
    let mut client = node.state().await?;
    let mut page_token = String::new();
    loop {
        let request = pb::ScanRequest {
            prefix: prefix.clone(),
            page_token,
            limit,
            window: None,
        };
        let page = client.scan(request).await?.into_inner();
        for value in &page.values {
            println!("{}", show(value));
        }
        if page.next_page_token.is_empty() {
            return Ok(());
        }
        page_token = page.next_page_token;
    }
}

pub(super) async fn route(node: Node, key: String) -> anyhow::Result<()> {
    let mut client = node.admin().await?;
    let r = client.route(pb::RouteRequest { key }).await?.into_inner();
    println!(
        "{}: partition {} of {}, served in {} by {}",
        r.key, r.partition, r.partitions, r.region, r.node
    );
    Ok(())
}

/// One value as a line: `key = value`.
fn show(v: &pb::Value) -> String {
    match &v.value {
        Some(pb::value::Value::Counter(n)) => format!("{} = {n}", v.key),
        Some(pb::value::Value::Register(bytes)) => {
            format!("{} = {:?}", v.key, String::from_utf8_lossy(bytes))
        }
        None => format!("{} (no value)", v.key),
    }
}
