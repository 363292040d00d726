//! What `bench swap` records as it goes (metrics, failures with their reasons, verifications,
//! notes and hung-task reports for the detail) and the two JSON files made of it: the report,
//! with the keys of every suite, every metric `null` until measured, and the ratios the issue
//! asks for; and the detail, with the targets of issue 14.

use super::{Bench, Kind, NBD_VRAM_SEQ_READ_GBPS};
use crate::bench::swap_sys::HungReport;
use serde_json::{json, Map, Value};

/// The fio metrics of one device, without prefix: the issue's, then the extra ones.
const FIO_METRICS: [&str; 16] = [
    "seq_read_GBps",
    "seq_write_GBps",
    "rand4k_read_iops_qd32",
    "rand4k_write_iops_qd32",
    "rand4k_read_lat_us_qd1",
    "rand32k_read_lat_us_qd1",
    "rand4k_read_iops_qd1",
    "rand4k_write_iops_qd1",
    "rand4k_write_lat_us_qd1",
    "rand4k_read_lat_us_qd1_p50",
    "rand4k_read_lat_us_qd1_p99",
    "rand32k_read_lat_us_qd1_p50",
    "rand32k_read_lat_us_qd1_p99",
    "rand32k_read_iops_qd1",
    "seq_write_verify_GBps",
    "rand4k_write_verify_iops_qd32",
];

/// Every key of `metrics`, each `null` until measured.
pub(super) fn metric_keys() -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for kind in [Kind::Vram, Kind::Disk, Kind::Zram] {
        keys.extend(FIO_METRICS.iter().map(|m| format!("{}{m}", kind.prefix())));
    }
    keys.push("giveback_GBps".into());
    keys.push("giveback_s".into());
    for k in ["job_s_vram", "job_s_disk", "job_s_zram", "job3_s_vram", "job3_s_disk"] {
        keys.push(k.into());
    }
    keys.extend(["fio_verify_errors", "hung_tasks", "longest_d_state_s"].map(String::from));
    keys
}

/// `a ÷ b` where both were measured.
fn ratio(metrics: &Map<String, Value>, a: &str, b: &str) -> Value {
    match (metrics.get(a).and_then(Value::as_f64), metrics.get(b).and_then(Value::as_f64)) {
        (Some(x), Some(y)) if y > 0.0 => json!(x / y),
        _ => Value::Null,
    }
}

/// The ratios the issue asks for, from the metrics.
fn ratios(metrics: &Map<String, Value>) -> Value {
    let seq = metrics.get("seq_read_GBps").and_then(Value::as_f64);
    json!({
        "job_vs_disk": ratio(metrics, "job_s_disk", "job_s_vram"),
        "job_vs_zram": ratio(metrics, "job_s_zram", "job_s_vram"),
        "job3_vs_disk": ratio(metrics, "job3_s_disk", "job3_s_vram"),
        "seq_read_vs_nbd_vram": seq.map_or(Value::Null, |s| json!(s / NBD_VRAM_SEQ_READ_GBPS)),
        "seq_read_vs_disk": ratio(metrics, "seq_read_GBps", "disk_seq_read_GBps"),
        "rand32k_lat_vs_disk": ratio(metrics, "rand32k_read_lat_us_qd1", "disk_rand32k_read_lat_us_qd1"),
    })
}

/// The targets of issue 14 (recorded in the detail, as the other suites do).
fn targets() -> Value {
    json!({
        "job_vs_disk": ">= 2",
        "rand32k_read_lat_us_qd1": "<= 50",
        "seq_read_vs_nbd_vram": ">= 3",
        "fio_verify_errors": "= 0",
        "hung_tasks": "= 0",
    })
}

/// What the run has recorded so far; the parts add to it, the report is made of it.
pub(super) struct Record {
    metrics: Map<String, Value>,
    failures: Map<String, Value>,
    detail: Map<String, Value>,
    /// Each verification planned: passed, failed, or never ran (`None`).
    checks: Vec<(String, Option<bool>)>,
    fio_errors: Option<u64>,
    hung: HungReport,
}

impl Record {
    /// Nothing recorded yet: every metric `null`.
    pub(super) fn new() -> Self {
        Record {
            metrics: metric_keys().into_iter().map(|k| (k, Value::Null)).collect(),
            failures: Map::new(),
            detail: Map::new(),
            checks: Vec::new(),
            fio_errors: None,
            hung: HungReport::default(),
        }
    }

    /// The failures so far, by part.
    pub(super) fn failures(&self) -> &Map<String, Value> {
        &self.failures
    }

    pub(super) fn fail(&mut self, what: &str, why: impl Into<String>) {
        let why = why.into();
        eprintln!("bench swap: {what}: FAILED: {why}");
        self.failures.insert(what.to_string(), json!(why));
    }

    pub(super) fn set(&mut self, key: &str, value: f64) {
        self.metrics.insert(key.to_string(), if value.is_finite() { json!(value) } else { Value::Null });
    }

    pub(super) fn check(&mut self, name: String, passed: Option<bool>) {
        self.checks.push((name, passed));
    }

    /// Records a verification: `None` when it did not run (through).
    pub(super) fn record_verify(&mut self, name: &str, errors: Option<u64>) {
        if let Some(e) = errors {
            self.fio_errors = Some(self.fio_errors.unwrap_or(0) + e);
        }
        self.check(name.to_string(), errors.map(|e| e == 0));
    }

    pub(super) fn add_hung(&mut self, report: HungReport, during: &str) {
        eprintln!(
            "bench swap:   hung-task watch ({during}): {} hung, {} in D over 1 s, longest D {:.1} s",
            report.hung_tasks, report.tasks_in_d_over_1s, report.longest_d_s
        );
        self.note(&["hung", during], json!(report));
        self.hung.hung_tasks += report.hung_tasks;
        self.hung.tasks_in_d_over_1s += report.tasks_in_d_over_1s;
        self.hung.longest_d_s = self.hung.longest_d_s.max(report.longest_d_s);
        self.hung.samples += report.samples;
        self.hung.stuck.extend(report.stuck);
        self.set("hung_tasks", self.hung.hung_tasks as f64);
        self.set("longest_d_state_s", self.hung.longest_d_s);
    }

    pub(super) fn verified(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|(_, passed)| *passed == Some(true))
    }

    /// The report and the detail of run `bench` so far.
    pub(super) fn report(&self, bench: &Bench, partial: bool) -> (Value, Value) {
        let mut metrics = self.metrics.clone();
        metrics.insert("fio_verify_errors".into(), self.fio_errors.map_or(Value::Null, |e| json!(e)));
        let ratios = ratios(&metrics);
        let mut report = crate::bench::report(
            "vramswap",
            &bench.commit,
            &bench.date,
            &bench.info,
            Value::Object(metrics),
            ratios,
            self.verified(),
        );
        report["failures"] = Value::Object(self.failures.clone());
        if partial {
            report["partial"] = json!(true);
        }
        let mut detail = self.detail.clone();
        detail.insert("suite".into(), json!("vramswap-detail"));
        detail.insert("commit".into(), json!(bench.commit));
        detail.insert("date".into(), json!(bench.date));
        detail.insert("seconds".into(), json!(bench.elapsed()));
        detail.insert("checks".into(), self.checks.iter().map(|(n, p)| (n.clone(), json!(p))).collect());
        detail.insert("hung_vram".into(), json!(self.hung));
        detail.insert("failures".into(), Value::Object(self.failures.clone()));
        detail.insert("targets".into(), targets());
        (report, Value::Object(detail))
    }

    /// Writes the report and the detail of run `bench` so far.
    pub(super) fn save(&self, bench: &Bench, partial: bool) {
        let (report, detail) = self.report(bench, partial);
        if let Err(e) =
            crate::bench::write_report(&bench.json_dir, "vramswap", &bench.date, &bench.commit, &report, &detail)
        {
            eprintln!("bench swap: {e}");
        }
    }

    pub(super) fn note(&mut self, path: &[&str], value: Value) {
        let mut at = &mut self.detail;
        for key in &path[..path.len() - 1] {
            let entry = at.entry(key.to_string()).or_insert_with(|| json!({}));
            if !entry.is_object() {
                *entry = json!({});
            }
            at = entry.as_object_mut().expect("an object");
        }
        at.insert(path[path.len() - 1].to_string(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{jobs_phase::job_metric, test_bench};
    use super::*;

    #[test]
    fn every_metric_the_issue_names_is_a_key() {
        let keys = metric_keys();
        for p in ["", "disk_", "zram_"] {
            for m in [
                "seq_read_GBps",
                "seq_write_GBps",
                "rand4k_read_iops_qd32",
                "rand4k_write_iops_qd32",
                "rand4k_read_lat_us_qd1",
                "rand32k_read_lat_us_qd1",
            ] {
                assert!(keys.contains(&format!("{p}{m}")), "{p}{m}");
            }
        }
        for k in ["giveback_GBps", "job_s_vram", "job_s_disk", "job_s_zram", "fio_verify_errors", "hung_tasks"] {
            assert!(keys.contains(&k.to_string()), "{k}");
        }
        assert_eq!(job_metric(Kind::Vram, 1), "job_s_vram");
        assert_eq!(job_metric(Kind::Disk, 3), "job3_s_disk");
        assert!(keys.contains(&job_metric(Kind::Disk, 3)) && keys.contains(&job_metric(Kind::Vram, 3)));
    }

    #[test]
    fn ratios_are_null_where_a_side_is_missing() {
        let mut m: Map<String, Value> = metric_keys().into_iter().map(|k| (k, Value::Null)).collect();
        m.insert("job_s_vram".into(), json!(10.0));
        m.insert("job_s_disk".into(), json!(25.0));
        m.insert("seq_read_GBps".into(), json!(8.1));
        let r = ratios(&m);
        assert_eq!(r["job_vs_disk"], json!(2.5));
        assert_eq!(r["job_vs_zram"], Value::Null);
        assert!((r["seq_read_vs_nbd_vram"].as_f64().unwrap() - 3.0).abs() < 1e-9);
        for key in ["job_vs_disk", "job_vs_zram", "seq_read_vs_nbd_vram"] {
            assert!(r.get(key).is_some(), "{key}");
        }
    }

    #[test]
    fn the_report_has_the_suites_keys_and_nulls_with_reasons() {
        let dir = std::env::temp_dir().join(format!("tiermem-swap-report-{}", std::process::id()));
        let bench = test_bench(&dir);
        let mut b = Record::new();
        b.set("seq_read_GBps", 9.0);
        b.set("job_s_vram", 12.0);
        b.set("job_s_disk", 30.0);
        b.fail("job_s_zram", "setting up zram swap: no zram module");
        b.record_verify("fio_verify_vram", Some(0));
        b.check("jobs_vramx1".into(), Some(true));
        b.add_hung(HungReport { hung_tasks: 0, longest_d_s: 0.4, samples: 5, ..Default::default() }, "jobs_vram");
        let (report, detail) = b.report(&bench, true);
        for key in ["suite", "commit", "date", "device", "metrics", "ratios", "verified", "failures"] {
            assert!(report.get(key).is_some(), "{key}: {report}");
        }
        assert_eq!(report["suite"], "vramswap");
        assert_eq!(report["partial"], true);
        assert_eq!(report["metrics"]["job_s_zram"], Value::Null);
        assert_eq!(report["metrics"]["fio_verify_errors"], 0);
        assert_eq!(report["metrics"]["hung_tasks"], 0.0);
        assert_eq!(report["failures"]["job_s_zram"], "setting up zram swap: no zram module");
        assert_eq!(report["ratios"]["job_vs_disk"], 2.5);
        assert_eq!(report["verified"], true);
        assert_eq!(detail["checks"]["fio_verify_vram"], true);
        assert!(detail["targets"]["job_vs_disk"].is_string());
        // A verification that did not run leaves the run unverified.
        b.check("jobs_diskx1".into(), None);
        assert_eq!(b.report(&bench, false).0["verified"], false);
        b.save(&bench, false);
        let written = std::fs::read_to_string(dir.join("vramswap-20261123-0123456.json")).unwrap();
        let back: Value = serde_json::from_str(&written).unwrap();
        assert!(back.get("partial").is_none());
        assert!(dir.join("vramswap-20261123-0123456.detail.json").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn failed_verification_counts_errors() {
        let mut b = Record::new();
        b.record_verify("fio_verify_disk", Some(0));
        b.record_verify("fio_verify_vram", Some(3));
        assert_eq!(b.fio_errors, Some(3));
        assert!(!b.verified());
    }
}
