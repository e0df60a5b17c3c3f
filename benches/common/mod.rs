//! What the CUDA benches share: the GPU check, deterministic random bytes, and the
//! timing of back-to-back launches with CUDA events behind a backlog.
//!
//! The backlog: a launch whose GPU time is a few microseconds can take longer than
//! that to enqueue on the host (planning, allocation, the driver call), so timing
//! launches as they are enqueued would measure the host. Each timed group is
//! therefore queued behind device-to-device copies that keep the GPU busy for
//! longer than the host takes to enqueue the group; the start event sits between
//! the copies and the group, so the events see only the launches, back to back.

#![allow(dead_code)] // each bench uses part of it

use std::cell::RefCell;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use kernel_runtime::cuda::{self, EventTimer};
use kernel_runtime::{ops, DType, Device, Tensor};

pub const GPU: Device = Device::Cuda(0);

/// One benchmarked launch and what it moves or computes.
pub struct Case {
    pub name: String,
    /// Bytes the launch must move (the bandwidth figure's numerator).
    pub bytes: u64,
    /// Floating-point operations of the launch (0 where bandwidth is the figure).
    pub flops: u64,
    pub run: Box<dyn Fn() -> kernel_runtime::Result<()>>,
}

/// Whether a CUDA device is present; prints the skip line when not.
pub fn gpu_present() -> bool {
    match cuda::device_count() {
        Ok(n) if n > 0 => true,
        Ok(_) => {
            println!("skipped: no CUDA device");
            false
        }
        Err(e) => {
            println!("skipped: {e}");
            false
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift64*), never all zeros.
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        out.extend_from_slice(&s.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// Random bf16 values in about [-1, 1] (random bytes would hold NaNs and huge
/// exponents, which attention's softmax must not see).
pub fn random_bf16(shape: &[usize], seed: u64, device: Device) -> kernel_runtime::Result<Tensor> {
    let n: usize = shape.iter().product();
    let bytes = random_bytes(2 * n, seed);
    let values: Vec<f32> =
        bytes.chunks_exact(2).map(|b| (f32::from(u16::from_le_bytes([b[0], b[1]])) / 32768.0) - 1.0).collect();
    Tensor::from_slice(&values, shape, Device::Cpu)?.to_dtype(DType::BF16)?.to_device(device)
}

/// Device-to-device copies that keep the GPU busy ahead of a timed group.
pub struct Backlog {
    src: Tensor,
    dst: Tensor,
}

impl Backlog {
    /// Two 256 MiB buffers: one copy keeps the GPU busy for about 0.13 ms.
    pub fn new() -> kernel_runtime::Result<Backlog> {
        let n = 128 << 20;
        Ok(Backlog { src: Tensor::zeros(&[n], DType::BF16, GPU)?, dst: Tensor::zeros(&[n], DType::BF16, GPU)? })
    }

    /// Enqueues at least `ms` milliseconds of GPU work.
    fn enqueue(&self, ms: f64) -> kernel_runtime::Result<()> {
        for _ in 0..((ms / 0.12).ceil() as usize).max(1) {
            ops::copy(&self.dst, &self.src)?;
        }
        Ok(())
    }
}

/// Host microseconds one launch of `case` may take to enqueue, at most (measured
/// once per group would cost a sync; this bound is generous for every op here).
const HOST_US_PER_LAUNCH: f64 = 100.0;

/// Milliseconds of `launches` back-to-back launches, timed with CUDA events behind
/// a backlog long enough to hide their enqueueing.
pub fn time_launches(timer: &EventTimer, backlog: &Backlog, case: &Case, launches: u64) -> kernel_runtime::Result<f64> {
    backlog.enqueue(launches as f64 * HOST_US_PER_LAUNCH / 1e3)?;
    timer.start()?;
    for _ in 0..launches {
        (case.run)()?;
    }
    Ok(f64::from(timer.stop_ms()?))
}

/// Median microseconds per launch over `samples` timed groups.
pub fn median_us(timer: &EventTimer, backlog: &Backlog, case: &Case, samples: usize) -> kernel_runtime::Result<f64> {
    // Groups of about 1 ms of GPU time, 10 to 2000 launches.
    let one = time_launches(timer, backlog, case, 10)? / 10.0;
    let per_group = ((1.0 / one.max(1e-4)) as u64).clamp(10, 2000);
    let mut us: Vec<f64> = (0..samples)
        .map(|_| time_launches(timer, backlog, case, per_group).map(|ms| ms * 1e3 / per_group as f64))
        .collect::<kernel_runtime::Result<_>>()?;
    us.sort_by(f64::total_cmp);
    Ok(us[us.len() / 2])
}

/// Runs every case once (module loads and NVRTC compiles stay out of the timings),
/// through criterion, then prints one `SUMMARY` line per case: median
/// microseconds, TB/s of `bytes` and, where the case counts them, TFLOP/s.
pub fn bench_cases(group_name: &str, cases: &[Case]) -> kernel_runtime::Result<()> {
    let dev = cuda::device(0)?;
    let timer = EventTimer::new(&dev)?;
    let backlog = Backlog::new()?;
    for case in cases {
        (case.run)()?;
    }
    dev.synchronize()?;

    let mut c = Criterion::default().configure_from_args();
    // Criterion's closures cannot return errors: keep the first one and stop timing.
    let failure: RefCell<Option<kernel_runtime::Error>> = RefCell::new(None);
    {
        let mut group = c.benchmark_group(group_name);
        for case in cases {
            group.throughput(Throughput::Bytes(case.bytes));
            group.bench_function(&case.name, |b| {
                b.iter_custom(|iters| {
                    if failure.borrow().is_some() {
                        return Duration::from_nanos(1);
                    }
                    match time_launches(&timer, &backlog, case, iters) {
                        Ok(ms) => Duration::from_secs_f64(ms / 1e3),
                        Err(e) => {
                            failure.borrow_mut().get_or_insert(e);
                            Duration::from_nanos(1)
                        }
                    }
                })
            });
        }
        group.finish();
    }
    c.final_summary();
    if let Some(e) = failure.into_inner() {
        return Err(e);
    }
    for case in cases {
        print_summary(case, "", median_us(&timer, &backlog, case, 30)?);
    }
    Ok(())
}

/// One `SUMMARY` line: `case`'s name and `tag`, the median, TB/s of its bytes and,
/// where it counts them, TFLOP/s.
pub fn print_summary(case: &Case, tag: &str, us: f64) {
    let tbs = case.bytes as f64 / (us * 1e-6) / 1e12;
    let flops =
        if case.flops > 0 { format!(", {:.1} TFLOP/s", case.flops as f64 / (us * 1e-6) / 1e12) } else { String::new() };
    println!("SUMMARY {}{tag}: median {us:.2} us, {tbs:.3} TB/s{flops} ({} bytes per launch)", case.name, case.bytes);
}

/// Launches of one case captured in one CUDA graph by [`graph_median_us`].
const GRAPH_LAUNCHES: u64 = 32;
/// Replays of that graph in one timed group.
const GRAPH_REPLAYS: u64 = 10;

/// Median microseconds per launch of `case` replayed from a CUDA graph of
/// [`GRAPH_LAUNCHES`] back-to-back launches: the kernel as a decode step's graph
/// runs it, without the host's gap between launches (about 2-3 us on the H200,
/// which the event-timed figure includes) and with the programmatic-launch overlap
/// of the kernels that use it. The case must be capturable (no host copies).
pub fn graph_median_us(
    timer: &EventTimer,
    backlog: &Backlog,
    case: &Case,
    samples: usize,
) -> kernel_runtime::Result<f64> {
    graph_median_us_of(timer, backlog, case, samples, GRAPH_LAUNCHES)
}

/// [`graph_median_us`] over a graph of `launches` launches (a case that rotates
/// through copies of its inputs captures each copy).
pub fn graph_median_us_of(
    timer: &EventTimer,
    backlog: &Backlog,
    case: &Case,
    samples: usize,
    launches: u64,
) -> kernel_runtime::Result<f64> {
    let dev = cuda::device(0)?;
    let launches = launches.max(1);
    let (mut graph, ()) = dev.capture(|| {
        for _ in 0..launches {
            (case.run)()?;
        }
        Ok::<(), kernel_runtime::Error>(())
    })?;
    graph.replay()?;
    dev.synchronize()?;
    let mut us = Vec::with_capacity(samples);
    for _ in 0..samples.max(1) {
        backlog.enqueue(GRAPH_REPLAYS as f64 * HOST_US_PER_LAUNCH / 1e3)?;
        timer.start()?;
        for _ in 0..GRAPH_REPLAYS {
            graph.replay()?;
        }
        us.push(f64::from(timer.stop_ms()?) * 1e3 / (GRAPH_REPLAYS * launches) as f64);
    }
    us.sort_by(f64::total_cmp);
    Ok(us[us.len() / 2])
}

/// [`bench_cases`], then one more `SUMMARY <case> [graph]` line per case from
/// [`graph_median_us`].
pub fn bench_cases_and_graphs(group_name: &str, cases: &[Case]) -> kernel_runtime::Result<()> {
    bench_cases(group_name, cases)?;
    let timer = EventTimer::new(&cuda::device(0)?)?;
    let backlog = Backlog::new()?;
    for case in cases {
        print_summary(case, " [graph]", graph_median_us(&timer, &backlog, case, 30)?);
    }
    Ok(())
}
