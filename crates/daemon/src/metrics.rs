//! Prometheus metrics at `GET /metrics` (OpenMetrics text, `prometheus-client`), served by a
//! minimal HTTP/1 server (`hyper`) on the address the config's `metrics` gives.
//!
//! Each scrape encodes a fresh snapshot of the registry (pools, shares, tenants, transfer
//! counters as the tenants last reported them), so a tenant that left leaves no stale series.
//! What must outlive a snapshot (how long cuts took to be met, bytes given back, budgets
//! sent) lives in [`Metrics`] and is carried into each snapshot.

use crate::log;
use crate::registry::Registry;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use std::time::Instant;
use tiermem_protocol::{LenderStatus, Tier};

type Labels = Vec<(&'static str, String)>;

/// What outlives one scrape.
#[derive(Clone)]
pub struct Metrics {
    /// Seconds from a cut being sent to the tenant saying it is met.
    reclaim_seconds: Histogram,
    reclaimed_bytes: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            reclaim_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            reclaimed_bytes: Counter::default(),
        }
    }
}

/// Registers a family of gauges and returns it to be filled.
fn gauges(registry: &mut prometheus_client::registry::Registry, name: &str, help: &str) -> Family<Labels, Gauge> {
    let family = Family::<Labels, Gauge>::default();
    registry.register(name, help, family.clone());
    family
}

fn counters(registry: &mut prometheus_client::registry::Registry, name: &str, help: &str) -> Family<Labels, Counter> {
    let family = Family::<Labels, Counter>::default();
    registry.register(name, help, family.clone());
    family
}

fn set(family: &Family<Labels, Gauge>, labels: Labels, value: u64) {
    family.get_or_create(&labels).set(i64::try_from(value).unwrap_or(i64::MAX));
}

impl Metrics {
    /// The OpenMetrics text of `registry` and of the `lenders` (lending.rs) now.
    pub fn render(&self, registry: &mut Registry, lenders: &[LenderStatus]) -> String {
        for (bytes, took) in registry.take_reclaims() {
            self.reclaim_seconds.observe(took.as_secs_f64());
            self.reclaimed_bytes.inc_by(bytes);
        }
        let status = registry.status(0, None, Instant::now());
        let mut out = prometheus_client::registry::Registry::with_prefix("tiermem");
        let tenants = Family::<Labels, Gauge>::default();
        out.register("tenants", "Connected tenants, by configured name", tenants.clone());
        let state = gauges(
            &mut out,
            "tenant_state",
            "1 while a tenant is late (a cut not met in time), idle (lending its HBM), ramping up (keeping its whole part), waiting (for its working set's turn) or held (launching nothing until its turn)",
        );
        for t in &status.tenants {
            tenants.get_or_create(&vec![("name", t.name.clone())]).inc();
            for (name, on) in
                [("late", t.late), ("idle", t.idle), ("ramping", t.ramping), ("waiting", t.waiting), ("held", t.held)]
            {
                let labels =
                    vec![("tenant", t.tenant.to_string()), ("name", t.name.clone()), ("state", name.to_owned())];
                set(&state, labels, u64::from(on));
            }
        }
        let capacity =
            gauges(&mut out, "pool_capacity_bytes", "Bytes a pool (tier of a GPU or of the node) shares out");
        let budgeted = gauges(&mut out, "pool_budgeted_bytes", "Bytes of a pool handed out as budgets");
        let used = gauges(&mut out, "tenant_used_bytes", "Bytes a tenant holds in a tier");
        let acquired = gauges(&mut out, "tenant_acquired_bytes", "Bytes a tenant holds acquired (its floor)");
        let demand = gauges(&mut out, "tenant_demand_bytes", "Bytes a tenant would hold if it could");
        let budget = gauges(&mut out, "tenant_budget_bytes", "A tenant's budget in force");
        let target = gauges(&mut out, "tenant_target_bytes", "The budget a tenant is moving to");
        let lent = gauges(&mut out, "tenant_lent_bytes", "Of a tenant's own part, lent to others");
        let borrowed = gauges(&mut out, "tenant_borrowed_bytes", "Borrowed from others' idle parts");
        let reserved = gauges(
            &mut out,
            "tenant_reserved_bytes",
            "Bytes a tenant holds in a tier beyond its use, ready (host memory pinned ahead for evictions)",
        );
        let driver_used =
            gauges(&mut out, "gpu_driver_used_bytes", "A GPU's memory in use, as its driver counts it (NVML)");
        let others =
            gauges(&mut out, "gpu_other_processes_bytes", "A GPU's memory held by processes that are not tenants");
        let overhead = gauges(
            &mut out,
            "gpu_tenant_overhead_bytes",
            "A GPU's memory held by tenant processes beyond their chunks (contexts, libraries)",
        );
        let in_turns = gauges(
            &mut out,
            "gpu_in_turns",
            "1 while a GPU's tenants take turns with their whole working sets (hbm_sharing), 0 while they share it fairly",
        );
        for pool in &status.pools {
            let gpu = pool.gpu.map_or_else(|| "node".to_owned(), |g| g.to_string());
            if pool.tier == Tier::Hbm && pool.gpu.is_some() {
                set(&in_turns, vec![("gpu", gpu.clone())], u64::from(pool.in_turns));
            }
            let place = vec![("tier", pool.tier.name().to_owned()), ("gpu", gpu)];
            set(&capacity, place.clone(), pool.capacity);
            set(&budgeted, place.clone(), pool.budgeted);
            if let Some(d) = &pool.driver {
                set(&driver_used, place.clone(), d.used);
                set(&others, place.clone(), d.others);
                set(&overhead, place.clone(), d.overhead);
            }
            for share in &pool.shares {
                let name = status.tenants.iter().find(|t| t.tenant == share.tenant).map_or("?", |t| t.name.as_str());
                let mut labels = place.clone();
                labels.extend([("tenant", share.tenant.to_string()), ("name", name.to_owned())]);
                set(&used, labels.clone(), share.used);
                set(&acquired, labels.clone(), share.acquired);
                set(&demand, labels.clone(), share.demand);
                set(&budget, labels.clone(), share.budget);
                set(&target, labels.clone(), share.target);
                set(&lent, labels.clone(), share.lent);
                set(&reserved, labels.clone(), share.reserved);
                set(&borrowed, labels, share.borrowed);
            }
        }
        let bytes_in = counters(&mut out, "tenant_page_in_bytes", "Bytes a tenant copied into HBM");
        let bytes_out = counters(&mut out, "tenant_page_out_bytes", "Bytes a tenant copied out of HBM");
        let evictions = counters(&mut out, "tenant_evictions", "Chunks a tenant's policy evicted");
        let stall =
            counters(&mut out, "tenant_stall_microseconds", "Device time a tenant's streams waited on demand copies");
        let launches = counters(&mut out, "tenant_launches", "Kernel launches of a program under tiermem run");
        let all_in_hbm = counters(
            &mut out,
            "tenant_launches_all_in_hbm",
            "Kernel launches of a program under tiermem run whose pointer arguments were all in HBM",
        );
        for (id, transfers) in registry.transfers() {
            let name = status.tenants.iter().find(|t| t.tenant == id).map_or("?", |t| t.name.as_str());
            let labels = vec![("tenant", id.to_string()), ("name", name.to_owned())];
            bytes_in.get_or_create(&labels).inc_by(transfers.bytes_in);
            bytes_out.get_or_create(&labels).inc_by(transfers.bytes_out);
            evictions.get_or_create(&labels).inc_by(transfers.evictions);
            stall.get_or_create(&labels).inc_by(transfers.stall_us);
            launches.get_or_create(&labels).inc_by(transfers.launches);
            all_in_hbm.get_or_create(&labels).inc_by(transfers.launches_all_in_hbm);
        }
        let offer =
            gauges(&mut out, "lender_offer_bytes", "HBM a lender (tiermem lend) offers to tenants on other GPUs");
        let lender_lent = gauges(&mut out, "lender_lent_bytes", "A lender's HBM that a tenant maps now");
        let returning = gauges(&mut out, "lender_returning_bytes", "A lender's HBM asked back and not yet returned");
        for l in lenders {
            let place = vec![("gpu", l.gpu.to_string()), ("lender", l.lender.to_string()), ("pid", l.pid.to_string())];
            set(&offer, place.clone(), l.offer);
            set(&returning, place.clone(), l.returning);
            for &(tenant, bytes) in &l.lent {
                let name = status.tenants.iter().find(|t| t.tenant == tenant).map_or("?", |t| t.name.as_str());
                let mut labels = place.clone();
                labels.extend([("tenant", tenant.to_string()), ("name", name.to_owned())]);
                set(&lender_lent, labels, bytes);
            }
        }
        out.register("reclaim_seconds", "From a smaller budget sent to its being met", self.reclaim_seconds.clone());
        out.register("reclaimed_bytes", "Bytes given back to meet smaller budgets", self.reclaimed_bytes.clone());
        let mut text = String::new();
        if let Err(e) = encode(&mut text, &out) {
            log(&format!("metrics: encoding failed: {e}"));
        }
        text
    }
}

/// Serves `GET /metrics` on `listener`, each answer from `render`.
pub async fn serve_http(listener: tokio::net::TcpListener, render: std::sync::Arc<dyn Fn() -> String + Send + Sync>) {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::{Response, StatusCode};
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let render = std::sync::Arc::clone(&render);
        let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let response = if request.uri().path() == "/metrics" {
                Response::builder()
                    .header("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
                    .body(Full::new(Bytes::from(render())))
            } else {
                Response::builder().status(StatusCode::NOT_FOUND).body(Full::new(Bytes::from("try /metrics\n")))
            };
            async move { response }
        });
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn lenders_show_what_they_offer_lend_to_whom_and_have_asked_back() {
        let mut registry = Registry::new(Config::default(), Instant::now(), 0);
        let lender =
            LenderStatus { lender: 2, pid: 77, gpu: 1, offer: 8 << 30, lent: vec![(5, 3 << 30)], returning: 1 << 30 };
        let text = Metrics::default().render(&mut registry, &[lender]);
        for expected in [
            r#"tiermem_lender_offer_bytes{gpu="1",lender="2",pid="77"} 8589934592"#,
            r#"tiermem_lender_lent_bytes{gpu="1",lender="2",pid="77",tenant="5",name="?"} 3221225472"#,
            r#"tiermem_lender_returning_bytes{gpu="1",lender="2",pid="77"} 1073741824"#,
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }
}
