//! A region node with `[tls]` and `[api.auth]`, on the test cluster's Kafka: every call
//! comes over TLS, and what a caller may do follows its role. A client with no
//! credentials is unauthenticated; a read token reads, and neither writes nor calls Admin;
//! a certificate named as admin does everything; certificates of another CA, expired
//! ones and plaintext clients get no connection. A CA added to the node's CA file is
//! trusted without a restart, and no secret reaches the node's log.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pki::Pki;
use common::{Node, Secure, Topics, add, cluster};
use geostate::pb;
use geostate::pb::admin_client::AdminClient;
use geostate::pb::state_client::StateClient;
use geostate::security::tls;
use tonic::Code;
use tonic::transport::Channel;

const READ_TOKEN: &str = "read-7f3a9c1e-token";
const ADMIN_TOKEN: &str = "admin-52d8b6e4-token";

fn get(key: &str) -> pb::GetRequest {
    pb::GetRequest {
        key: key.into(),
        ..Default::default()
    }
}

fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        let header = format!("Bearer {token}").parse().expect("ASCII");
        request.metadata_mut().insert("authorization", header);
    }
    request
}

async fn connect(node: &Node, client: Arc<rustls::ClientConfig>) -> anyhow::Result<Channel> {
    Ok(tls::connect_with(&node.grpc, client, Duration::from_secs(2)).await?)
}

/// The code of a call's error (`Ok`: served).
fn code<T>(answer: Result<T, tonic::Status>) -> Result<(), Code> {
    answer.map(drop).map_err(|s| s.code())
}

/// `GET /metrics` over TLS (HTTP/1.1) from `addr`: the body.
async fn https_get(addr: &str, client: Arc<rustls::ClientConfig>) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut client = Arc::unwrap_or_clone(client);
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let mut stream = connector.connect(name, tcp).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: node\r\nconnection: close\r\n\r\n")
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response)
}

fn toml_path(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secure_node_serves_each_caller_what_its_role_allows() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let region = &cluster.regions["us-east-1"];
    let topics = Topics::create(&region.kafka, "secure", 2).await?;
    let dir = tempfile::tempdir()?;
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs)?;
    let pki = Pki::new(&certs, "region")?;
    let other = Pki::new(&certs, "other")?;
    let node_tls = pki.tls("us-east-1")?;
    let (read_tokens, admin_tokens) = (certs.join("read.tokens"), certs.join("admin.tokens"));
    std::fs::write(
        &read_tokens,
        format!("# pricing dashboards\n{READ_TOKEN}\n"),
    )?;
    std::fs::write(&admin_tokens, format!("{ADMIN_TOKEN}\n"))?;

    let mut node = Node::configure(dir.path(), &region.kafka, &topics)?;
    node.set("checkpoint.interval", "\"0s\"");
    node.set(
        "tls",
        &format!(
            "{{ cert = {}, key = {}, ca = {} }}",
            toml_path(&node_tls.cert),
            toml_path(&node_tls.key),
            toml_path(&node_tls.ca)
        ),
    );
    node.set(
        "api.auth",
        &format!(
            "{{ anonymous = \"none\", identities = {{ ops = \"admin\" }}, token-files = {{ read = {}, admin = {} }} }}",
            toml_path(&read_tokens),
            toml_path(&admin_tokens)
        ),
    );
    node.secure = Some(Secure {
        client: pki.client(None)?,
        admin_token: ADMIN_TOKEN.to_owned(),
    });
    node.start().await?;

    // no credentials: unauthenticated, whatever the call
    let anonymous = connect(&node, pki.client(None)?).await?;
    let mut state = StateClient::new(anonymous.clone());
    let mut admin = AdminClient::new(anonymous);
    assert_eq!(
        code(state.get(with_token(get("trips/a"), None)).await),
        Err(Code::Unauthenticated)
    );
    assert_eq!(
        code(admin.checkpoint(pb::CheckpointRequest {}).await),
        Err(Code::Unauthenticated)
    );
    // a token nobody issued is not anonymous
    let forged = with_token(get("trips/a"), Some("read-0000"));
    assert_eq!(code(state.get(forged).await), Err(Code::Unauthenticated));

    // the read token reads, and neither writes nor administers
    let read = Some(READ_TOKEN);
    assert_eq!(
        code(state.get(with_token(get("trips/a"), read)).await),
        Ok(())
    );
    let written = state.update(with_token(add("trips/a", 1), read)).await;
    assert_eq!(code(written), Err(Code::PermissionDenied));
    let transfer = pb::TransferLeaseRequest {
        shard: 0,
        to_region: "eu-west-1".into(),
    };
    let transferred = admin.transfer_lease(with_token(transfer, read)).await;
    assert_eq!(code(transferred), Err(Code::PermissionDenied));
    let savepoint = admin
        .savepoint(with_token(pb::SavepointRequest::default(), read))
        .await;
    assert_eq!(code(savepoint), Err(Code::PermissionDenied));

    // the certificate named admin writes and administers, no token needed
    let ops = pki.issue("ops")?;
    let as_ops = connect(&node, pki.client(Some(&ops))?).await?;
    let mut ops_state = StateClient::new(as_ops.clone());
    ops_state.update(add("trips/a", 5)).await?;
    let value = ops_state.get(get("trips/a")).await?.into_inner();
    assert_eq!(common::counter(&value), 5);
    AdminClient::new(as_ops)
        .status(pb::StatusRequest {})
        .await?;

    // the metrics come over TLS too, with this certificate's expiry (a day from now)
    let metrics = https_get(&node.metrics, pki.client(None)?).await?;
    let expires: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("geostate_tls_certificate_expires_unix_seconds "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no expiry metric in {metrics}"))?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let left = expires - now.as_secs_f64();
    assert!((80_000.0..=86_400.0).contains(&left), "expires in {left} s");

    // another CA's certificate, an expired one, plaintext: no connection
    let foreign = other.issue("ops")?;
    let expired = pki.expired("ops", "ops-expired")?;
    for (what, client) in [
        ("another CA's certificate", pki.client(Some(&foreign))?),
        ("an expired certificate", pki.client(Some(&expired))?),
    ] {
        let served = async {
            let mut state = StateClient::new(connect(&node, client).await?);
            state.get(get("trips/a")).await?;
            anyhow::Ok(())
        };
        assert!(served.await.is_err(), "a client with {what} was served");
    }
    let plaintext = async {
        let mut state = StateClient::connect(node.grpc.clone()).await?;
        state
            .get(with_token(get("trips/a"), Some(ADMIN_TOKEN)))
            .await?;
        anyhow::Ok(())
    };
    assert!(plaintext.await.is_err(), "a plaintext client was served");

    // a CA added to the node's CA file is trusted from then on, without a restart
    let both = format!(
        "{}{}",
        std::fs::read_to_string(&pki.ca)?,
        std::fs::read_to_string(&other.ca)?
    );
    std::fs::write(&node_tls.ca, both)?;
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let served = async {
            let mut admin = AdminClient::new(connect(&node, pki.client(Some(&foreign))?).await?);
            admin.status(pb::StatusRequest {}).await?;
            anyhow::Ok(())
        };
        match served.await {
            Ok(()) => break,
            Err(e) if Instant::now() > until => {
                anyhow::bail!("the added CA was not trusted within 20 s: {e:#}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }

    node.terminate(Duration::from_secs(30)).await?;
    // no secret in the log: neither token nor any private key
    let log = std::fs::read_to_string(&node.log)?;
    for secret in [READ_TOKEN, ADMIN_TOKEN, "PRIVATE KEY"] {
        assert!(!log.contains(secret), "the node's log holds {secret}");
    }
    for key in [&node_tls.key, &ops.1] {
        let pem = std::fs::read_to_string(key)?;
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        assert!(
            !log.contains(&body[..40]),
            "the node's log holds a private key"
        );
    }
    Ok(())
}

/// `cluster.py secure-kafka`'s broker: SASL_SSL only.
#[derive(serde::Deserialize)]
struct SecureKafka {
    bootstrap: String,
    ca: String,
    username: String,
    password_file: String,
}

/// On a broker that takes SASL_SSL only, a node with `[kafka.security]` ingests, answers
/// and ships (consumer, idempotent producer, transactional shipping, all over TLS with
/// SCRAM-SHA-512); with a wrong password it stops at start-up, and neither password is in
/// its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reaches_kafka_over_sasl_ssl_with_its_credentials() -> anyhow::Result<()> {
    common::cluster_script(&["secure-kafka", "start"])?;
    let info = common::run_dir()?.join("secure-kafka/secure.json");
    let kafka: SecureKafka = serde_json::from_slice(&std::fs::read(&info)?)?;
    let password = std::fs::read_to_string(&kafka.password_file)?
        .trim()
        .to_owned();
    let properties = [
        ("security.protocol", "sasl_ssl".to_owned()),
        ("sasl.mechanisms", "SCRAM-SHA-512".to_owned()),
        ("sasl.username", kafka.username.clone()),
        ("sasl.password", password.clone()),
        ("ssl.ca.location", kafka.ca.clone()),
    ];
    let topics = Topics::create_with(&kafka.bootstrap, &properties, "sasl", 2).await?;
    let security = |password_file: &str| {
        format!(
            "{{ protocol = \"sasl_ssl\", mechanism = \"SCRAM-SHA-512\", username = {:?}, password-file = {password_file:?}, ca = {:?} }}",
            kafka.username, kafka.ca
        )
    };

    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka.bootstrap, &topics)?;
    node.set("checkpoint.interval", "\"0s\"");
    node.set("kafka.security", &security(&kafka.password_file));
    node.start().await?;
    let mut state = StateClient::connect(node.grpc.clone()).await?;
    state.update(add("trips/sasl", 3)).await?;
    state.update(add("trips/sasl", 4)).await?;
    let value = state.get(get("trips/sasl")).await?.into_inner();
    assert_eq!(common::counter(&value), 7);
    // its deltas were shipped: a committed transaction on the secure broker
    let mut consumer = rdkafka::ClientConfig::new();
    consumer
        .set("bootstrap.servers", &kafka.bootstrap)
        .set("group.id", common::unique("sasl-reader"))
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed");
    for (k, v) in &properties {
        consumer.set(*k, v);
    }
    let consumer: rdkafka::consumer::StreamConsumer = consumer.create()?;
    rdkafka::consumer::Consumer::subscribe(&consumer, &[topics.deltas.as_str()])?;
    let shipped = tokio::time::timeout(Duration::from_secs(30), consumer.recv()).await;
    shipped.map_err(|_| anyhow::anyhow!("no delta shipped within 30 s"))??;
    node.terminate(Duration::from_secs(30)).await?;

    let wrong = dir.path().join("wrong.password");
    let wrong_password = "not-the-password-31337";
    std::fs::write(&wrong, wrong_password)?;
    let other = tempfile::tempdir()?;
    let mut refused = Node::configure(other.path(), &kafka.bootstrap, &topics)?;
    refused.set("kafka.security", &security(&wrong.display().to_string()));
    let started = refused.start().await;
    let error = started.expect_err("a node with a wrong Kafka password started");
    println!("refused: {error:#}");
    for log in [&node.log, &refused.log] {
        let text = std::fs::read_to_string(log)?;
        for secret in [password.as_str(), wrong_password] {
            assert!(!text.contains(secret), "{} holds a password", log.display());
        }
    }
    Ok(())
}

/// `make up SECURE=1`'s secrets (`run/kafka-security.json`): the Kafka passwords.
#[derive(serde::Deserialize)]
struct ClusterSecurity {
    password_file: String,
    admin_password: String,
}

/// On a secure cluster, no process's log (brokers, MirrorMaker 2, nodes, witness, sinks,
/// pricers), after whatever ran before this test, holds a Kafka password or a private key;
/// a plaintext cluster has none to leak, and this test says so.
#[test]
fn no_log_of_a_secure_cluster_holds_a_secret() -> anyhow::Result<()> {
    let run = common::run_dir()?;
    let Ok(text) = std::fs::read(run.join("kafka-security.json")) else {
        println!("a plaintext cluster: no secret to look for");
        return Ok(());
    };
    let security: ClusterSecurity = serde_json::from_slice(&text)?;
    let password = std::fs::read_to_string(&security.password_file)?;
    let secrets = [
        password.trim(),
        security.admin_password.as_str(),
        "PRIVATE KEY",
    ];
    let mut read = 0;
    for entry in std::fs::read_dir(run.join("logs"))? {
        let path = entry?.path();
        let log = String::from_utf8_lossy(&std::fs::read(&path)?).into_owned();
        for secret in secrets {
            assert!(!log.contains(secret), "{} holds a secret", path.display());
        }
        read += 1;
    }
    assert!(read >= 6, "only {read} logs");
    println!("{read} logs of the secure cluster, no secret in any");
    Ok(())
}

/// One caller flooding `Update` is held to its role's rate (`api.limits`): served its
/// burst and its rate, no more, and refused `RESOURCE_EXHAUSTED` with the delay after
/// which a call would be taken, counted; another caller's calls, meanwhile, are all
/// served. The callers are told apart by address (an open API: no certificates, no
/// tokens, every caller admin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_caller_is_held_to_its_limits_while_another_is_served() -> anyhow::Result<()> {
    use tonic_types::StatusExt;
    const RATE: u32 = 50;
    const FLOOD: Duration = Duration::from_secs(2);
    let cluster = cluster()?;
    let region = &cluster.regions["us-east-1"];
    let topics = Topics::create(&region.kafka, "limits", 2).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &region.kafka, &topics)?;
    node.set("checkpoint.interval", "\"0s\"");
    node.set(
        "api.limits",
        &format!("{{ admin = {{ rate = {RATE}, burst = {RATE} }} }}"),
    );
    node.start().await?;
    // ready for writes (its partitions taken): the flood then runs at the node's pace,
    // not the first writes' wait for the group
    let mut victim = node.state().await?;
    victim.update(add("trips/victim", 1)).await?;

    let flooder = tonic::transport::Endpoint::from_shared(node.grpc.clone())?
        .local_address(Some("127.0.0.2".parse()?))
        .connect()
        .await?;
    let until = Instant::now() + FLOOD;
    let flood = (0..8).map(|i| {
        let mut state = StateClient::new(flooder.clone());
        tokio::spawn(async move {
            let (mut served, mut limited, mut retry) = (0u32, 0u32, Duration::ZERO);
            while Instant::now() < until {
                match state.update(add(&format!("trips/flood-{i}"), 1)).await {
                    Ok(_) => served += 1,
                    Err(s) if s.code() == Code::ResourceExhausted => {
                        limited += 1;
                        let delay = s.get_details_retry_info().and_then(|r| r.retry_delay);
                        retry = retry.max(delay.expect("a retry delay in the status"));
                    }
                    Err(s) => panic!("the flooder got {s:?}"),
                }
            }
            (served, limited, retry)
        })
    });
    let flood: Vec<_> = flood.collect();
    let mut victims = 0;
    while Instant::now() < until {
        victim.update(add("trips/victim", 1)).await?;
        victims += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (mut served, mut limited, mut retry) = (0, 0, Duration::ZERO);
    for task in flood {
        let (s, l, r) = task.await?;
        (served, limited, retry) = (served + s, limited + l, retry.max(r));
    }
    assert!(victims > 0, "the other caller made no call");
    assert!(
        limited > 0,
        "the flooder was never limited ({served} served)"
    );
    // its burst and its rate over the flood, and a little for the clock
    let most = RATE * (1 + FLOOD.as_secs() as u32) + RATE / 2;
    assert!(
        (RATE..=most).contains(&served),
        "the flooder got {served} calls, not {RATE}..={most}"
    );
    assert!(
        retry > Duration::ZERO && retry <= Duration::from_secs(1),
        "{retry:?}"
    );
    let counted = common::metric(
        &node.metrics,
        "geostate_calls_limited_total{caller=\"ip\",limit=\"rate\"}",
    )?;
    assert!(counted.is_some_and(|n| n > 0.0), "{counted:?}");
    node.terminate(Duration::from_secs(10)).await?;
    Ok(())
}
