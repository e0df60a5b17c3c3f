//! The TCP rendezvous: every rank connects to rank 0 at `--dist-init-addr`,
//! says hello with the arguments that must agree, and gets back how to build
//! its collectives (rank 0's NCCL unique id, or the port of its CPU collective
//! listener). The connection then stays open as that rank's control channel.
//!
//! Rank 0 waits for every rank until the timeout and then fails naming the
//! ranks still missing and the address; a hello whose arguments differ from
//! rank 0's is answered with `Reject` and fails start-up naming the rank and
//! the argument. A worker that cannot reach rank 0 fails after the timeout
//! naming the address.

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::core::tp::error::TpError;
use crate::core::tp::protocol::{CommSetup, RankArgs, ToLeader, ToWorker};
use crate::core::tp::wire::{read_frame, write_frame, WireError};

/// Sends one message to a worker.
pub fn send_to_worker(stream: &TcpStream, rank: usize, msg: &ToWorker) -> Result<(), TpError> {
    let (kind, body) = msg.encode();
    write_frame(stream, kind, &body).map_err(TpError::channel(rank))
}

/// Reads one message from a worker.
pub fn recv_from_worker(stream: &TcpStream, rank: usize) -> Result<ToLeader, TpError> {
    let (kind, body) = read_frame(stream).map_err(TpError::channel(rank))?;
    ToLeader::decode(kind, &body).map_err(TpError::channel(rank))
}

/// Sends one message to rank 0 (from `rank`).
pub fn send_to_leader(stream: &TcpStream, rank: usize, msg: &ToLeader) -> Result<(), TpError> {
    let (kind, body) = msg.encode();
    write_frame(stream, kind, &body).map_err(|source| TpError::Channel { rank, source })
}

/// Reads one message from rank 0.
pub fn recv_from_leader(stream: &TcpStream) -> Result<ToWorker, WireError> {
    let (kind, body) = read_frame(stream)?;
    ToWorker::decode(kind, &body)
}

/// Rank 0's side: the control channel of ranks `1..world_size`, in rank order,
/// once each has said hello with arguments equal to `args`. `alive` is asked
/// while waiting, so that a local worker that died is reported at once (its
/// error) rather than after the timeout.
pub fn accept_ranks(
    listener: &TcpListener,
    world_size: usize,
    args: &RankArgs,
    timeout: Duration,
    alive: &mut dyn FnMut() -> Result<(), String>,
) -> Result<Vec<TcpStream>, TpError> {
    let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    listener.set_nonblocking(true).map_err(|e| TpError::Startup(format!("rendezvous at {addr}: {e}")))?;
    let deadline = Instant::now() + timeout;
    let mut joined: Vec<Option<TcpStream>> = (1..world_size).map(|_| None).collect();
    while joined.iter().any(Option::is_none) {
        alive().map_err(TpError::Startup)?;
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<String> = joined
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| s.is_none())
                        .map(|(i, _)| (i + 1).to_string())
                        .collect();
                    return Err(TpError::Startup(format!(
                        "tp rank(s) {} did not join the rendezvous at {addr} within {}s (--dist-timeout)",
                        missing.join(", "),
                        timeout.as_secs_f64()
                    )));
                }
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(e) => return Err(TpError::Startup(format!("rendezvous at {addr}: {e}"))),
        };
        let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
        let setup = |e: std::io::Error| TpError::Startup(format!("rendezvous at {addr}: {peer}: {e}"));
        stream.set_nonblocking(false).map_err(setup)?;
        stream.set_nodelay(true).map_err(setup)?;
        // A hello must come promptly; a stray connection does not stall the others long.
        stream.set_read_timeout(Some(timeout.min(Duration::from_secs(30)))).map_err(setup)?;
        let hello = read_frame(&stream)
            .and_then(|(kind, body)| ToLeader::decode(kind, &body))
            .map_err(|e| TpError::Startup(format!("rendezvous at {addr}: a hello from {peer}: {e}")))?;
        let ToLeader::Hello { rank, world_size: theirs, args: their_args } = hello else {
            return Err(TpError::Startup(format!("rendezvous at {addr}: {peer} sent no hello")));
        };
        let refusal = if theirs != world_size {
            Some(format!("--tp differs: rank {rank} was started for {theirs} ranks, rank 0 for {world_size}"))
        } else if rank == 0 || rank >= world_size {
            Some(format!("rank {rank} is not in 1..{world_size}"))
        } else if joined[rank - 1].is_some() {
            Some(format!("rank {rank} joined twice"))
        } else {
            args.mismatch(&their_args, rank)
        };
        if let Some(why) = refusal {
            // Tell the worker why before failing (best effort: it may be gone).
            let _ = send_to_worker(&stream, rank, &ToWorker::Reject(why.clone()));
            return Err(TpError::Startup(format!("rendezvous at {addr}: {peer} refused: {why}")));
        }
        stream.set_read_timeout(None).map_err(setup)?;
        joined[rank - 1] = Some(stream);
    }
    Ok(joined.into_iter().flatten().collect())
}

/// A worker's side: connects to rank 0 at `addr` (retrying until `timeout`),
/// says hello and waits for the welcome. Returns the control channel and how
/// to set up the collectives.
pub fn join(
    addr: &str,
    rank: usize,
    world_size: usize,
    args: &RankArgs,
    timeout: Duration,
) -> Result<(TcpStream, CommSetup), TpError> {
    let stream = models::tp::tcp::connect_with_retry(addr, timeout)
        .map_err(|e| TpError::Startup(format!("tp rank {rank}: the rendezvous (--dist-init-addr): {e}")))?;
    let setup = |e: std::io::Error| TpError::Startup(format!("tp rank {rank}: the rendezvous at {addr}: {e}"));
    stream.set_nodelay(true).map_err(setup)?;
    send_to_leader(&stream, rank, &ToLeader::Hello { rank, world_size, args: args.clone() })?;
    // Rank 0 welcomes once every rank has joined: wait as long as it waits.
    stream.set_read_timeout(Some(timeout + Duration::from_secs(5))).map_err(setup)?;
    let reply = recv_from_leader(&stream)
        .map_err(|e| TpError::Startup(format!("tp rank {rank}: waiting for the welcome from {addr}: {e}")))?;
    stream.set_read_timeout(None).map_err(setup)?;
    match reply {
        ToWorker::Welcome(comm) => Ok((stream, comm)),
        ToWorker::Reject(why) => Err(TpError::Startup(format!("tp rank {rank}: refused at the rendezvous: {why}"))),
        other => Err(TpError::Startup(format!("tp rank {rank}: expected a welcome from {addr}, got {other:?}"))),
    }
}
