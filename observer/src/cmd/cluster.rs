//! `observer cluster`: the node pairs of the whole cluster from the
//! observers' series in a Prometheus-compatible store (`store` asks,
//! `model::cluster` judges, `report::cluster` prints).

use std::{
    io,
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};

use crate::{
    cli::ClusterArgs,
    model::cluster::{Options, Queries, Window, pairs},
    report::{
        Format,
        cluster::{Span, write_json, write_table},
        view::timestamp,
    },
    store::{self, Store},
};

/// Runs the command; `Ok(true)` when every pair is healthy.
pub fn run(args: ClusterArgs) -> Result<bool> {
    if !(0.0..1.0).contains(&args.loss_target) {
        bail!(
            "--loss-target {}: give a share between 0 and 1 (0.0005 is 0.05 %)",
            args.loss_target
        );
    }
    let store = Store::new(&store::Options {
        url: args.prometheus.clone(),
        basic_auth_file: args.basic_auth_file.clone(),
        bearer_token_file: args.bearer_token_file.clone(),
        ca_file: args.ca_file.clone(),
        timeout: args.timeout,
    })?;
    let at = args.at.unwrap_or_else(SystemTime::now);
    let unix = at
        .duration_since(UNIX_EPOCH)
        .context("--at is before 1970")?
        .as_secs_f64();
    let queries = Queries::new(args.window);
    let mut window = Window::default();
    store.query(&queries.nodes, unix, |s| window.add_node(&s))?;
    if window.node_names().is_empty() {
        bail!(
            "{} holds no observer_node_info in the {} up to {}: no observer exported its identity \
             there (are the nodes' observer.prom files scraped, by node_exporter's textfile \
             collector or --metrics-listen, and is the observer recent enough to write it?)",
            store.url(),
            humantime::format_duration(args.window),
            timestamp(at)
        );
    }
    store.query(&queries.packets, unix, |s| window.add_packet(&s))?;
    store.query(&queries.drops, unix, |s| window.add_drop(&s))?;
    store.query(&queries.anomalies, unix, |s| window.add_anomaly(&s))?;
    if window.skipped > 0 {
        tracing::warn!(
            series = window.skipped,
            "series without the labels the observer writes were left out"
        );
    }
    let cluster = pairs(
        &window,
        Options {
            min_packets: args.min_packets,
            loss_target: args.loss_target,
        },
    );
    let at_text = timestamp(at);
    let window_text = humantime::format_duration(args.window).to_string();
    let span = Span {
        store: store.url(),
        at: &at_text,
        window: &window_text,
    };
    let mut out = io::stdout().lock();
    match Format::or_default(args.output) {
        Format::Table => write_table(&mut out, &span, &cluster),
        Format::Json => write_json(&mut out, &span, &cluster),
    }
    .context("writing output")?;
    Ok(cluster.healthy())
}
