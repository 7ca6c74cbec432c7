//! `fermata bench churn`: a member holding the cluster secret registers a
//! backend with many GPUs (65,536 by default, the most one registration
//! carries), confirms its models, waits for its `RegisterAck` and leaves with
//! `Unregister`, over and over, against a real scheduler on loopback (with a
//! backend and a frontend of its own). After given numbers of cycles it
//! measures the scheduler's resident memory (VmRSS) and the size of its
//! `/metrics`: the scheduler gives a departed backend's GPU ids and series
//! back, so both stay flat however many cycles run.

use super::procs::{ProcCluster, ProcOpts};
use crate::transport::auth::{dial_std, ClusterKey, Service};
use crate::transport::secure_io::SecureStd;
use crate::wire::{codec, GpuInfo, Msg, Role};
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// The scheduler after a number of cycles.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChurnRow {
    pub cycles: u32,
    /// The scheduler's VmRSS (MB).
    pub rss_mb: f64,
    /// Bytes of its `/metrics` (text format).
    pub metrics_bytes: usize,
    /// Its per-GPU busy-time series (`fermata_gpu_busy_seconds_total`).
    pub gpu_series: usize,
}

/// The whole run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChurnReport {
    /// GPUs the churning member registers each cycle.
    pub gpus: u32,
    /// Before the first cycle, then after each checkpoint.
    pub before: ChurnRow,
    pub rows: Vec<ChurnRow>,
    /// Seconds per cycle (register, confirm, ack, leave), mean.
    pub cycle_s: f64,
}

impl ChurnReport {
    /// The last row's memory and `/metrics` size over the first row's.
    pub fn growth(&self) -> (f64, f64) {
        match (self.rows.first(), self.rows.last()) {
            (Some(a), Some(b)) => (
                b.rss_mb / a.rss_mb,
                b.metrics_bytes as f64 / a.metrics_bytes.max(1) as f64,
            ),
            _ => (f64::NAN, f64::NAN),
        }
    }
}

/// VmRSS of process `pid` in MB (NaN when unreadable).
pub fn rss_mb(pid: u32) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return f64::NAN;
    };
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// The body of `GET /metrics` at `addr`, whatever its size (the client here
/// is ours; the scheduler is what is measured).
pub fn get_metrics(addr: &str) -> Result<String> {
    http_get(addr, "/metrics")
}

/// The body of `GET path` at `addr` (a plain HTTP/1.1 server of ours: the
/// scheduler's or a frontend's listener), an error unless it answers 200.
pub fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut v = Vec::new();
    s.read_to_end(&mut v)?;
    let text = String::from_utf8_lossy(&v).into_owned();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("GET {path}: no answer");
    };
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or(""));
    }
    Ok(body.to_string())
}

/// One cycle: register `gpus` GPUs, confirm every model asked for, wait for
/// the ack, leave.
fn cycle(addr: &str, key: &ClusterKey, gpus: u32) -> Result<()> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    let ch = dial_std(&mut s, key, Service::Control, addr).map_err(|e| anyhow::anyhow!("{e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut s = SecureStd::new(s, ch);
    let send = |s: &mut SecureStd<TcpStream>, m: &Msg| -> Result<()> {
        s.write_all(&codec::encode_to_vec(m))?;
        s.flush()?;
        Ok(())
    };
    let register = Msg::Register {
        role: Role::Backend,
        name: "churn".into(),
        gpus: (0..gpus)
            .map(|local| GpuInfo {
                local,
                name: "emulated".into(),
                mem_bytes: 16 << 30,
                device: crate::wire::DeviceKind::Emulated,
                lanes: 1,
            })
            .collect(),
        ctrl_addr: String::new(),
        region: None,
    };
    send(&mut s, &register)?;
    let mut frames = codec::FrameReader::new();
    let mut buf = vec![0u8; 64 << 10];
    'ack: loop {
        let n = s.read(&mut buf).context("reading the scheduler's answer")?;
        if n == 0 {
            bail!("the scheduler closed the connection before its RegisterAck");
        }
        frames.feed(&buf[..n]);
        while let Some(m) = frames.next_msg() {
            match m.map_err(|e| anyhow::anyhow!("{e}"))? {
                Msg::LoadModel { model } => {
                    let ok = Msg::ModelLoaded {
                        model: model.id,
                        ok: true,
                        error: String::new(),
                        device_bytes: 0,
                    };
                    send(&mut s, &ok)?;
                }
                Msg::RegisterAck { gpu_ids, .. } => {
                    if gpu_ids.len() != gpus as usize {
                        bail!("acked {} GPUs of {gpus}", gpu_ids.len());
                    }
                    break 'ack;
                }
                Msg::Error { message } => bail!("the scheduler refused: {message}"),
                _ => {}
            }
        }
    }
    let bye = Msg::Unregister {
        reason: "churn".into(),
    };
    send(&mut s, &bye)?;
    // The scheduler closes the connection once it removed the backend.
    while s.read(&mut buf).map(|n| n > 0).unwrap_or(false) {}
    Ok(())
}

fn measure(cycles: u32, pid: u32, metrics: &str) -> Result<ChurnRow> {
    let body = get_metrics(metrics)?;
    Ok(ChurnRow {
        cycles,
        rss_mb: rss_mb(pid),
        metrics_bytes: body.len(),
        gpu_series: body
            .lines()
            .filter(|l| l.starts_with("fermata_gpu_busy_seconds_total{"))
            .count(),
    })
}

/// Runs `checkpoints.last()` cycles of a `gpus`-GPU member against a cluster
/// of `exe` (the `fermata` binary; its workload file in `dir`), measuring
/// after each checkpoint's cycle count.
pub fn run(exe: &Path, dir: &Path, gpus: u32, checkpoints: &[u32]) -> Result<ChurnReport> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("churn.toml");
    std::fs::write(&path, super::procs::small_workload("churn", 1))?;
    let mut o = ProcOpts::new(path);
    o.scheduler_args = vec![
        "--max-gpus-per-member".into(),
        gpus.to_string(),
        "--metrics-listen".into(),
        "127.0.0.1:0".into(),
    ];
    let mut c = ProcCluster::start(exe, &o)?;
    let metrics = c.scheduler_metrics_addr()?;
    let (addr, pid) = (c.scheduler_addr.clone(), c.scheduler.child.id());
    let key = c.secret.key.clone();
    // Past the quarantine of the ids and a refresh of the busy series.
    let settle = || std::thread::sleep(Duration::from_millis(2500));
    settle();
    let before = measure(0, pid, &metrics)?;
    let mut rows = Vec::new();
    let (mut done, started) = (0u32, Instant::now());
    for &k in checkpoints {
        while done < k {
            cycle(&addr, &key, gpus).with_context(|| format!("cycle {}", done + 1))?;
            done += 1;
        }
        let t = started.elapsed();
        settle();
        rows.push(measure(done, pid, &metrics)?);
        eprintln!(
            "churn: {done} cycles in {:.1} s; scheduler {:.1} MB, /metrics {} bytes",
            t.as_secs_f64(),
            rows.last().map_or(f64::NAN, |r| r.rss_mb),
            rows.last().map_or(0, |r| r.metrics_bytes)
        );
    }
    // Wall time less the pauses to measure.
    let pauses = 2.5 * checkpoints.len() as f64;
    let cycle_s = (started.elapsed().as_secs_f64() - pauses).max(0.0) / done.max(1) as f64;
    c.stop();
    Ok(ChurnReport {
        gpus,
        before,
        rows,
        cycle_s,
    })
}
