//! The benchmark driver's quick version (`scripts/bench.sh all --quick`), run against the
//! debug build: it checks the driver and what the mount did in every scenario, not the
//! speed (timings are for `scripts/bench.sh` on a quiet machine).

mod common;

use std::process::Command;

use serde_json::Value;

#[test]
fn the_quick_benchmark_matrix_runs_and_every_mount_did_its_job() {
    let dir = tempfile::tempdir().unwrap();
    let md = dir.path().join("table.md");
    let out = Command::new(common::python())
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench.py"))
        .args([
            "all",
            "--quick",
            "--shardfs",
            env!("CARGO_BIN_EXE_shardfs"),
            "--dir",
        ])
        .arg(dir.path())
        .arg("--markdown")
        .arg(&md)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench.py all --quick failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &json["results"];
    // S1-S4 for both clients: each array is one shard here (4x4x4 chunks of 32^3, or 8x8x8
    // of 16^3 in S3), written once, with no merge; a peak RSS measured.
    let scenarios = r["scenarios"].as_object().unwrap();
    assert_eq!(scenarios.len(), 10, "{scenarios:?}");
    for (name, row) in scenarios {
        assert_eq!(row["merges"], serde_json::json!([0]), "{name}: {row}");
        assert_eq!(row["shard_writes"], serde_json::json!([1]), "{name}: {row}");
        assert!(
            row["daemon_peak_rss_mib"].as_f64().unwrap() > 0.0,
            "{name}: {row}"
        );
        assert!(
            row["native_sharded_s"].as_f64().unwrap() > 0.0,
            "{name}: {row}"
        );
        // The kernel's requests, counted by the daemon: every chunk file is at least
        // created (or looked up) and written.
        let per_chunk = &row["requests_by_kind_per_chunk"];
        assert!(per_chunk["write"].as_f64().unwrap() >= 1.0, "{name}: {row}");
        assert!(
            row["requests_per_chunk"].as_f64().unwrap() >= 2.0,
            "{name}: {row}"
        );
        if name.contains("tensorstore") {
            // It fsyncs every chunk it writes.
            assert!(per_chunk["fsync"].as_f64().unwrap() >= 1.0, "{name}: {row}");
        }
        for cpu in ["native_cpu_s", "writer_cpu_s"] {
            assert!(row[cpu].as_f64().unwrap() > 0.0, "{name}: {cpu}: {row}");
        }
        // In clock ticks (10 ms): a small run may round to none.
        assert!(
            row["daemon_cpu_s"].as_f64().unwrap() >= 0.0,
            "{name}: {row}"
        );
    }
    // Two chunk sizes, two clients.
    assert_eq!(r["read_s1"].as_object().unwrap().len(), 4);
    for (name, row) in r["per_shard"].as_object().unwrap() {
        let cps = row["chunks_per_shard"].as_u64().unwrap();
        // 8x8x8 chunks: 512 / cps shards, each written once.
        assert_eq!(
            row["shard_writes"][0].as_u64().unwrap(),
            512 / cps,
            "{name}: {row}"
        );
        assert_eq!(row["merges"], serde_json::json!([0]), "{name}: {row}");
    }
    let arrays = r["per_array"].as_object().unwrap();
    assert_eq!(arrays.len(), 2);
    for (name, row) in arrays {
        assert_eq!(
            row["chunks"].as_u64().unwrap(),
            4 * row["shards"].as_u64().unwrap(),
            "{name}"
        );
        for field in [
            "native_sharded_open_read_ms",
            "zarr_open_read_chunk_ms",
            "native_zarr_open_read_chunk_ms",
        ] {
            assert!(row[field].as_f64().unwrap() > 0.0, "{name}: {field}");
        }
    }
    let table = std::fs::read_to_string(&md).unwrap();
    assert!(table.contains("| S3 tensorstore |"), "{table}");
    assert!(table.contains("| 1000 | 4000 |"), "{table}");
}
