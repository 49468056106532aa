//! `pricer`: surge multipliers from final windows until SIGTERM, with its metrics
//! endpoint when asked (the work is `crate::pricer`'s).

use anyhow::Context;

use super::ConfigArgs;
use super::serve::shutdown_signal;

pub(super) async fn run(
    config: ConfigArgs,
    addr: Option<String>,
    metrics_listen: Option<std::net::SocketAddr>,
) -> anyhow::Result<()> {
    let config = crate::config::Config::load_with(&config.config, &config.set)?;
    if let Some(listen) = metrics_listen {
        let recorder = crate::metrics::install(&crate::ingest::event::Rejection::DEAD_LETTER_CODES);
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("--metrics-listen {listen}"))?;
        let connections =
            crate::security::tls::incoming(listener, None, crate::security::tls::Listener::Metrics);
        tokio::spawn(crate::metrics::serve(connections, recorder));
    }
    let pricing = config
        .pricing
        .context("the region file has no [pricing] section")?;
    let lease = config
        .lease
        .context("the region file has no [lease] section: no region can hold a price")?;
    let addr = addr.unwrap_or_else(|| {
        let own = config.api.advertise.clone();
        format!(
            "http://{}",
            own.unwrap_or_else(|| config.api.grpc_listen.to_string())
        )
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    });
    let function = pricing.function.as_ref().map(|f| f.addr.clone());
    // the binary's target, as when this lived in main.rs: the log line reads as before
    tracing::info!(target: "geostate", %addr, demand = %pricing.demand, supply = %pricing.supply, prices = %pricing.prices, function = function.as_deref().unwrap_or("the built-in formula"), "pricing");
    let priced = crate::pricer::run(pricing, lease, addr, stopped).await?;
    println!(
        "wrote {} multipliers ({} compare-and-sets found the value moved on)",
        priced.windows, priced.moved_on
    );
    Ok(())
}
