//! The CPU backend's collectives: ranks as processes (or threads) talking TCP.
//!
//! A star through rank 0: every other rank holds one connection to rank 0. An
//! all-reduce sends each rank's tensor to rank 0 as f32, rank 0 sums them in
//! rank order (0, 1, 2, ...) in f32 and sends the one result back, so every
//! rank gets the same bits and a run gives the same bits as the last.
//! All-gather and broadcast go through rank 0 the same way, in the tensor's own
//! dtype. Traffic is `2 (world - 1)` messages per collective, fine for the tiny
//! tensors of CPU tests; GPUs use NCCL.
//!
//! Nothing waits forever: every read and write has the group's timeout, a
//! closed connection is an error naming the rank at its other end, and each
//! message carries its collective's kind, sequence number and length, so that
//! ranks that called different collectives fail at once instead of reading
//! each other's data.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kernel_runtime::{ops, DType, Tensor};

use crate::error::{ModelError, Result};
use crate::tp::collective::Collective;

/// First bytes of every hello and every message ("MSTC").
const MAGIC: u32 = 0x4d53_5443;
/// Bumped whenever the messages change.
const VERSION: u32 = 1;
/// Largest payload accepted (a bound on what a bad peer can make us allocate).
pub const MAX_MESSAGE_BYTES: u64 = 1 << 32;

/// One rank's end of a TCP star (see the module docs).
#[derive(Debug)]
pub struct TcpCollective {
    rank: usize,
    world_size: usize,
    timeout: Duration,
    inner: Mutex<Links>,
}

#[derive(Debug)]
struct Links {
    /// Rank 0: the stream of rank `r` at `r - 1`. Other ranks: the stream to rank 0.
    streams: Vec<TcpStream>,
    /// Collectives run so far (checked in every message).
    seq: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Op {
    AllReduce = 1,
    AllGather = 2,
    Broadcast = 3,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::Broadcast => "broadcast",
        }
    }
}

fn configure(stream: &TcpStream, timeout: Duration) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))
}

impl TcpCollective {
    /// Rank 0 of `world_size`: accepts the other ranks on `listener` until each
    /// has joined, or fails after `timeout` naming the ranks that did not.
    pub fn accept(listener: &TcpListener, world_size: usize, timeout: Duration) -> Result<TcpCollective> {
        let err = |message: String| ModelError::Collective { rank: 0, op: "join", message };
        let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
        listener.set_nonblocking(true).map_err(|e| err(format!("listening on {addr}: {e}")))?;
        let deadline = Instant::now() + timeout;
        let mut streams: Vec<Option<TcpStream>> = (1..world_size).map(|_| None).collect();
        while streams.iter().any(Option::is_none) {
            match listener.accept() {
                Ok((stream, peer)) => {
                    stream.set_nonblocking(false).map_err(|e| err(format!("{peer}: {e}")))?;
                    configure(&stream, timeout).map_err(|e| err(format!("{peer}: {e}")))?;
                    let rank = read_hello(&stream, world_size).map_err(|m| err(format!("{peer}: {m}")))?;
                    match streams.get_mut(rank.wrapping_sub(1)) {
                        Some(slot @ None) => *slot = Some(stream),
                        Some(Some(_)) => return Err(err(format!("{peer}: rank {rank} joined twice"))),
                        None => return Err(err(format!("{peer}: rank {rank} is not in 1..{world_size}"))),
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<String> = streams
                            .iter()
                            .enumerate()
                            .filter(|(_, s)| s.is_none())
                            .map(|(i, _)| (i + 1).to_string())
                            .collect();
                        return Err(err(format!(
                            "rank(s) {} did not connect to {addr} within {:.0?}",
                            missing.join(", "),
                            timeout
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(err(format!("accepting on {addr}: {e}"))),
            }
        }
        let streams = streams.into_iter().flatten().collect();
        Ok(TcpCollective { rank: 0, world_size, timeout, inner: Mutex::new(Links { streams, seq: 0 }) })
    }

    /// Rank `rank` (> 0) of `world_size`: connects to rank 0 at `addr`, retrying
    /// until `timeout`.
    pub fn connect(addr: &str, rank: usize, world_size: usize, timeout: Duration) -> Result<TcpCollective> {
        let err = |message: String| ModelError::Collective { rank, op: "join", message };
        if rank == 0 || rank >= world_size {
            return Err(err(format!("rank {rank} cannot join rank 0 of a group of {world_size}")));
        }
        let stream = connect_with_retry(addr, timeout).map_err(err)?;
        configure(&stream, timeout).map_err(|e| err(format!("{addr}: {e}")))?;
        let mut hello = Vec::with_capacity(16);
        for v in [MAGIC, VERSION, rank as u32, world_size as u32] {
            hello.extend_from_slice(&v.to_le_bytes());
        }
        (&stream).write_all(&hello).map_err(|e| err(format!("{addr}: {e}")))?;
        Ok(TcpCollective { rank, world_size, timeout, inner: Mutex::new(Links { streams: vec![stream], seq: 0 }) })
    }

    /// `world_size` ranks in this process over loopback (one per thread; tests).
    pub fn local_group(world_size: usize, timeout: Duration) -> Result<Vec<TcpCollective>> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| ModelError::Collective {
            rank: 0,
            op: "join",
            message: format!("binding 127.0.0.1: {e}"),
        })?;
        let addr = listener.local_addr().map_err(|e| ModelError::Collective {
            rank: 0,
            op: "join",
            message: e.to_string(),
        })?;
        let joiners: Vec<_> = (1..world_size)
            .map(|rank| {
                let addr = addr.to_string();
                std::thread::spawn(move || TcpCollective::connect(&addr, rank, world_size, timeout))
            })
            .collect();
        let mut group = vec![TcpCollective::accept(&listener, world_size, timeout)?];
        for j in joiners {
            group.push(j.join().map_err(|_| ModelError::Collective {
                rank: 0,
                op: "join",
                message: "a joining thread panicked".into(),
            })??);
        }
        Ok(group)
    }

    fn links(&self) -> std::sync::MutexGuard<'_, Links> {
        // A panic while holding the lock leaves the streams mid-message; the
        // next collective then fails on the message checks.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn error(&self, op: Op, message: String) -> ModelError {
        ModelError::Collective { rank: self.rank, op: op.name(), message }
    }

    /// What went wrong talking to `peer`, in words.
    fn io_error(&self, op: Op, peer: usize, e: &std::io::Error) -> ModelError {
        let message = match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                format!("timed out after {:.0?} waiting for tp rank {peer}", self.timeout)
            }
            ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
                format!("tp rank {peer} closed its connection (the process exited?)")
            }
            _ => format!("talking to tp rank {peer}: {e}"),
        };
        self.error(op, message)
    }

    fn send(&self, op: Op, seq: u64, stream: &TcpStream, peer: usize, payload: &[u8]) -> Result<()> {
        let mut header = [0u8; 21];
        header[..4].copy_from_slice(&MAGIC.to_le_bytes());
        header[4] = op as u8;
        header[5..13].copy_from_slice(&seq.to_le_bytes());
        header[13..21].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        let mut w = stream;
        w.write_all(&header).and_then(|_| w.write_all(payload)).map_err(|e| self.io_error(op, peer, &e))
    }

    fn recv(&self, op: Op, seq: u64, stream: &TcpStream, peer: usize, expected_len: usize) -> Result<Vec<u8>> {
        let mut header = [0u8; 21];
        let mut r = stream;
        r.read_exact(&mut header).map_err(|e| self.io_error(op, peer, &e))?;
        let magic = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let (got_op, got_seq) = (header[4], u64::from_le_bytes(header[5..13].try_into().unwrap_or_default()));
        let len = u64::from_le_bytes(header[13..21].try_into().unwrap_or_default());
        if magic != MAGIC {
            return Err(self.error(op, format!("tp rank {peer} sent a message that is not a collective's")));
        }
        if got_op != op as u8 || got_seq != seq || len != expected_len as u64 || len > MAX_MESSAGE_BYTES {
            return Err(self.error(
                op,
                format!(
                    "tp rank {peer} is out of step: it sent collective #{got_seq} (kind {got_op}, {len} bytes), \
                     this rank expected #{seq} ({}, {expected_len} bytes)",
                    op.name()
                ),
            ));
        }
        let mut payload = vec![0u8; expected_len];
        r.read_exact(&mut payload).map_err(|e| self.io_error(op, peer, &e))?;
        Ok(payload)
    }

    /// Rank 0 collects a payload of `len` bytes from every other rank (in rank
    /// order); other ranks send theirs. Returns rank 0's list (its own first).
    fn gather(&self, op: Op, links: &Links, own: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        let len = own.len();
        if self.rank == 0 {
            let mut all = vec![own];
            for (i, stream) in links.streams.iter().enumerate() {
                all.push(self.recv(op, links.seq, stream, i + 1, len)?);
            }
            Ok(all)
        } else {
            self.send(op, links.seq, &links.streams[0], 0, &own)?;
            Ok(Vec::new())
        }
    }

    /// Rank 0 sends `result` to every rank; the others receive it (`len` bytes).
    fn scatter_result(&self, op: Op, links: &Links, result: Vec<u8>, len: usize) -> Result<Vec<u8>> {
        if self.rank == 0 {
            for (i, stream) in links.streams.iter().enumerate() {
                self.send(op, links.seq, stream, i + 1, &result)?;
            }
            Ok(result)
        } else {
            self.recv(op, links.seq, &links.streams[0], 0, len)
        }
    }
}

/// Connects to `addr`, retrying refused connections (the listener may not be
/// up yet) until `timeout`.
pub fn connect_with_retry(addr: &str, timeout: Duration) -> std::result::Result<TcpStream, String> {
    let deadline = Instant::now() + timeout;
    let targets: Vec<SocketAddr> = addr.to_socket_addrs().map_err(|e| format!("cannot resolve {addr}: {e}"))?.collect();
    let Some(&target) = targets.first() else {
        return Err(format!("{addr} resolves to no address"));
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&target, left.clamp(Duration::from_millis(10), Duration::from_secs(5))) {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("could not connect to {addr} within {timeout:.0?}: {e}"))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Reads a joining rank's hello: its rank, checked against the group.
fn read_hello(stream: &TcpStream, world_size: usize) -> std::result::Result<usize, String> {
    let mut hello = [0u8; 16];
    (&*stream).read_exact(&mut hello).map_err(|e| format!("reading the hello: {e}"))?;
    let word = |i: usize| u32::from_le_bytes([hello[4 * i], hello[4 * i + 1], hello[4 * i + 2], hello[4 * i + 3]]);
    if word(0) != MAGIC {
        return Err("not a minisgl collective connection".into());
    }
    if word(1) != VERSION {
        return Err(format!("collective protocol version {} (this rank speaks {VERSION})", word(1)));
    }
    if word(3) as usize != world_size {
        return Err(format!("rank {} was started for a group of {}, this one has {world_size}", word(2), word(3)));
    }
    Ok(word(2) as usize)
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32_values(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Writes `bytes` (row-major elements of `dtype`) into the contiguous `t`.
fn write_into(t: &Tensor, bytes: &[u8], dtype: DType) -> Result<()> {
    let n = t.numel();
    let src = Tensor::from_bytes(bytes, dtype, &[n], t.device())?.to_dtype(t.dtype())?;
    ops::copy(&t.reshape(&[n])?, &src)?;
    Ok(())
}

impl Collective for TcpCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce_sum(&self, t: &Tensor) -> Result<()> {
        const OP: Op = Op::AllReduce;
        if !t.is_contiguous() {
            return Err(self.error(OP, "the tensor is not contiguous".into()));
        }
        let mut links = self.links();
        links.seq += 1;
        let own = f32_bytes(&t.to_f32_vec()?);
        let len = own.len();
        let parts = self.gather(OP, &links, own)?;
        let sum = if self.rank == 0 {
            // In rank order, in f32: the same bits on every rank and every run.
            let mut acc: Vec<f32> = f32_values(&parts[0]).collect();
            for part in &parts[1..] {
                for (a, v) in acc.iter_mut().zip(f32_values(part)) {
                    *a += v;
                }
            }
            f32_bytes(&acc)
        } else {
            Vec::new()
        };
        let sum = self.scatter_result(OP, &links, sum, len)?;
        drop(links);
        write_into(t, &sum, DType::F32)
    }

    fn all_gather(&self, out: &Tensor, input: &Tensor) -> Result<()> {
        const OP: Op = Op::AllGather;
        if out.numel() != input.numel() * self.world_size || out.dtype() != input.dtype() || !out.is_contiguous() {
            return Err(self.error(
                OP,
                format!(
                    "`out` must be contiguous and hold {} x {} {} elements",
                    self.world_size,
                    input.numel(),
                    input.dtype()
                ),
            ));
        }
        let mut links = self.links();
        links.seq += 1;
        let own = input.to_host_bytes()?;
        let len = own.len();
        let parts = self.gather(OP, &links, own)?;
        let all = self.scatter_result(OP, &links, parts.concat(), len * self.world_size)?;
        drop(links);
        write_into(out, &all, out.dtype())
    }

    fn broadcast(&self, t: &Tensor, root: usize) -> Result<()> {
        const OP: Op = Op::Broadcast;
        if root >= self.world_size || !t.is_contiguous() {
            return Err(self.error(OP, format!("root {root} of {} ranks, or a tensor not contiguous", self.world_size)));
        }
        let mut links = self.links();
        links.seq += 1;
        let len = t.size_in_bytes();
        // The root's bytes reach rank 0 first (unless rank 0 is the root).
        let at_zero = if root == 0 {
            if self.rank == 0 {
                t.to_host_bytes()?
            } else {
                Vec::new()
            }
        } else if self.rank == root {
            self.send(OP, links.seq, &links.streams[0], 0, &t.to_host_bytes()?)?;
            Vec::new()
        } else if self.rank == 0 {
            self.recv(OP, links.seq, &links.streams[root - 1], root, len)?
        } else {
            Vec::new()
        };
        if self.rank == 0 {
            for (i, stream) in links.streams.iter().enumerate() {
                if i + 1 != root {
                    self.send(OP, links.seq, stream, i + 1, &at_zero)?;
                }
            }
            drop(links);
            return write_into(t, &at_zero, t.dtype());
        }
        if self.rank == root {
            return Ok(());
        }
        let bytes = self.recv(OP, links.seq, &links.streams[0], 0, len)?;
        drop(links);
        write_into(t, &bytes, t.dtype())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_runtime::Device;

    const TIMEOUT: Duration = Duration::from_secs(20);

    /// Runs `f(rank, collective)` on every rank of a local group, one thread each.
    fn on_ranks<R: Send + 'static>(
        size: usize,
        f: impl Fn(usize, &TcpCollective) -> R + Send + Sync + Copy + 'static,
    ) -> Vec<R> {
        let group = TcpCollective::local_group(size, TIMEOUT).unwrap();
        let handles: Vec<_> =
            group.into_iter().enumerate().map(|(rank, c)| std::thread::spawn(move || f(rank, &c))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn all_reduce_sums_in_rank_order_for_every_dtype() {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let results = on_ranks(3, move |rank, c| {
                let values: Vec<f32> = (0..6).map(|i| (rank * 10 + i) as f32 * 0.5).collect();
                let t = Tensor::from_slice(&values, &[2, 3], Device::Cpu).unwrap().to_dtype(dtype).unwrap();
                c.all_reduce_sum(&t).unwrap();
                t.to_f32_vec().unwrap()
            });
            let want: Vec<f32> = (0..6).map(|i| (0..3).map(|r| (r * 10 + i) as f32 * 0.5).sum()).collect();
            for got in &results {
                assert_eq!(got, &want, "{dtype}");
            }
        }
    }

    #[test]
    fn all_gather_and_broadcast() {
        let results = on_ranks(4, |rank, c| {
            let input = Tensor::from_slice(&[rank as f32, rank as f32 + 0.5], &[2], Device::Cpu).unwrap();
            let out = Tensor::empty(&[8], DType::F32, Device::Cpu).unwrap();
            c.all_gather(&out, &input).unwrap();
            let b = Tensor::from_slice(&[rank as i32 * 7; 3], &[3], Device::Cpu).unwrap();
            c.broadcast(&b, 2).unwrap();
            (out.to_vec::<f32>().unwrap(), b.to_vec::<i32>().unwrap())
        });
        for (gathered, broadcast) in results {
            assert_eq!(gathered, [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]);
            assert_eq!(broadcast, [14, 14, 14]);
        }
    }

    #[test]
    fn a_rank_that_calls_another_collective_is_caught() {
        let results = on_ranks(2, |rank, c| {
            let t = Tensor::from_slice(&[1.0f32; 4], &[4], Device::Cpu).unwrap();
            if rank == 0 {
                c.all_reduce_sum(&t).map_err(|e| e.to_string())
            } else {
                c.broadcast(&t, 1).map_err(|e| e.to_string())
            }
        });
        let err = results[0].as_ref().unwrap_err();
        assert!(err.contains("out of step"), "{err}");
    }

    #[test]
    fn a_closed_rank_is_an_error_naming_it() {
        let mut group = TcpCollective::local_group(2, TIMEOUT).unwrap();
        drop(group.pop());
        let t = Tensor::from_slice(&[1.0f32; 4], &[4], Device::Cpu).unwrap();
        let err = group[0].all_reduce_sum(&t).unwrap_err().to_string();
        assert!(err.contains("tp rank 1 closed its connection"), "{err}");
    }

    #[test]
    fn a_silent_rank_times_out() {
        let group = TcpCollective::local_group(2, Duration::from_millis(300)).unwrap();
        let t = Tensor::from_slice(&[1.0f32; 4], &[4], Device::Cpu).unwrap();
        let started = Instant::now();
        let err = group[0].all_reduce_sum(&t).unwrap_err().to_string();
        assert!(err.contains("timed out") && err.contains("tp rank 1"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_missing_rank_fails_the_join_in_time() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let err = TcpCollective::accept(&listener, 3, Duration::from_millis(200)).unwrap_err().to_string();
        assert!(err.contains("rank(s) 1, 2 did not connect"), "{err}");
        let err = TcpCollective::connect("127.0.0.1:9", 1, 2, Duration::from_millis(200)).unwrap_err().to_string();
        assert!(err.contains("127.0.0.1:9"), "{err}");
    }
}
