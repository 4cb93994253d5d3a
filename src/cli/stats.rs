//! `shardfs stats`: JSON for programs, a short human view on a terminal, and `--watch`.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::core::stats::StatsReport;

/// Prints the stats of the mount at `mountpoint` once, or every `interval` with `watch`.
pub fn run(mountpoint: &Path, json: bool, watch: bool, interval: f64) -> ExitCode {
    let human = !json && std::io::stdout().is_terminal();
    let interval = Duration::from_secs_f64(interval.max(0.1));
    let mut last: Option<(StatsReport, Instant)> = None;
    loop {
        let report = match crate::daemon::stats_report(mountpoint) {
            Ok(r) => r,
            Err(e) => {
                say!("shardfs: {e}");
                return ExitCode::from(2);
            }
        };
        if !human {
            println!(
                "{}",
                serde_json::to_string_pretty(&report).unwrap_or_default()
            );
        } else {
            if watch {
                print!("\x1b[H\x1b[2J"); // home, clear: one screen per refresh
            }
            println!("{}", human_view(mountpoint, &report, last.as_ref()));
        }
        if !watch {
            return ExitCode::SUCCESS;
        }
        last = Some((report, Instant::now()));
        std::thread::sleep(interval);
    }
}

/// A few lines a person reads at a glance; with `last`, the rate since then.
pub fn human_view(
    mountpoint: &Path,
    r: &StatsReport,
    last: Option<&(StatsReport, Instant)>,
) -> String {
    let mut lines = vec![format!("shardfs mount {}", mountpoint.display())];
    lines.push(format!(
        "pending   {} shards, {} chunks, {} in memory, {} files held",
        r.pending_shards,
        r.pending_chunks,
        bytes(r.pending_bytes),
        r.temp_files
    ));
    let mut written = format!(
        "written   {} shards ({} partial, {} merges, {} conflicts), {}",
        r.shards_written,
        r.partial_writes,
        r.merges,
        r.write_conflicts,
        bytes(r.bytes_written)
    );
    if let Some((before, at)) = last {
        let secs = at.elapsed().as_secs_f64().max(1e-3);
        let rate = r.bytes_written.saturating_sub(before.bytes_written) as f64 / secs;
        written.push_str(&format!(", {}/s now", bytes(rate as u64)));
    }
    lines.push(written);
    lines.push(format!(
        "journal   {}, {} records live",
        bytes(r.journal.journal_bytes),
        r.journal.live_records
    ));
    if let Some(requests) = &r.store_requests {
        let parts: Vec<String> = requests.iter().map(|(k, n)| format!("{k} {n}")).collect();
        lines.push(format!("store     {}", parts.join(", ")));
    }
    if !r.fuse_requests.is_empty() {
        lines.push(requests_line(&r.fuse_requests));
    }
    if !r.passthrough.is_empty() {
        lines.push(format!("plain     files passthrough {}", r.passthrough));
    }
    if r.refusals > 0 {
        lines.push(format!(
            "refused   {} requests (each logged with its rule and fix)",
            r.refusals
        ));
    }
    if r.write_errors > 0 || !r.failed.is_empty() {
        lines.push(format!("errors    {} shard writes failed", r.write_errors));
        lines.extend(r.failed.iter().map(|f| format!("  not written: {f}")));
    }
    lines.join("\n")
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The kernel's requests: the total, then the most frequent kinds.
fn requests_line(
    requests: &std::collections::BTreeMap<String, crate::core::stats::RequestCount>,
) -> String {
    let total: u64 = requests.values().map(|c| c.count).sum();
    let mut kinds: Vec<_> = requests.iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1.count));
    let parts: Vec<String> = kinds
        .iter()
        .take(6)
        .map(|(k, c)| format!("{k} {}", c.count))
        .collect();
    format!("requests  {total} from the kernel: {}", parts.join(", "))
}
