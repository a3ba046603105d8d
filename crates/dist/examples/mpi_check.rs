//! The MPI backend's checks, one process per rank (`cargo xtask test` runs them under
//! `mpirun -np 2`):
//!
//! - `mpi_check collectives`: every collective over MPI gives every rank the same bits as the
//!   same collective over [`Threads`] (computed in each process for all ranks): f32, f64, bf16,
//!   f16 and integer sums and means, uneven and empty shards, a tensor that is not contiguous,
//!   broadcasts from every root; a 16-byte kind is refused with `DistError::Argument`, and
//!   ranks whose calls disagree all fail with `DistError::Mismatch`. Prints `mpi_check: rank R
//!   of W: N results equal the threads backend's` and exits 0 on every rank.
//! - `mpi_check kill`: all-reduces in a loop; rank 1 kills itself with SIGKILL after 20 rounds.
//!   The job must end (the launcher kills the other ranks) with a non-zero exit: nothing hangs.
//! - `mpi_check leave`: rank 1 drops its communicator without `Mpi::finalize`, as a rank that
//!   fails does, while rank 0 waits for it in an all-reduce; the drop must end the job with a
//!   non-zero exit.
//! - `mpi_check stall`: rank 1 sleeps instead of reaching an all-reduce; rank 0 must fail with
//!   `DistError::Timeout` after [`STALL_TIMEOUT`] (printing `failed after S s`), and its dropped
//!   communicator must end the job, the sleeping rank with it, with a non-zero exit.
//!
//! ```text
//! cargo build --release -p kappa-dist --features mpi --example mpi_check
//! mpirun -np 2 target/release/examples/mpi_check collectives
//! ```

use std::process::Command;
use std::time::{Duration, Instant};

use kappa_dist::{shard_range, Communicator, DistError, Mpi, ReduceOp, Threads};
use tch::{Device, Kind, Tensor};

/// The group's timeout in `stall` mode.
const STALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Rank `rank`'s input of `n` elements of `kind`: distinct on every rank, not round in any kind.
fn input(rank: usize, n: i64, kind: Kind) -> Tensor {
    let x = Tensor::arange(n, (Kind::Double, Device::Cpu)) * 0.37 + rank as f64 * 1.7;
    match kind {
        Kind::Int | Kind::Int64 | Kind::Int16 | Kind::Uint8 => (x * 10.0).to_kind(kind),
        _ => x.sin().to_kind(kind),
    }
}

/// Every collective on rank `comm.rank()`'s inputs; the results, in order.
fn collectives(comm: &dyn Communicator) -> Result<Vec<Tensor>, DistError> {
    let (rank, world) = (comm.rank(), comm.world());
    let mut out = Vec::new();
    let float = [Kind::Float, Kind::Double, Kind::BFloat16, Kind::Half];
    // 13 elements make uneven shards over 2 or 3 ranks, 1 element empty ones.
    for (kind, n) in float.iter().flat_map(|k| [(*k, 13), (*k, 1)]) {
        let x = input(rank, n, kind);
        for reduce in [ReduceOp::Sum, ReduceOp::Mean] {
            let mut t = x.copy();
            comm.all_reduce(&mut t, reduce)?;
            out.push(t);
        }
        let len = shard_range(n as usize, world, rank).len() as i64;
        let mut shard = Tensor::zeros([len], (kind, Device::Cpu));
        comm.reduce_scatter(&x, &mut shard, ReduceOp::Mean)?;
        out.push(shard.copy());
        let mut whole = Tensor::zeros([n], (kind, Device::Cpu));
        comm.all_gather(&shard, &mut whole)?;
        out.push(whole);
        // In place: the shard is this rank's own part of the output.
        let mut whole = Tensor::zeros([n], (kind, Device::Cpu));
        let start = shard_range(n as usize, world, rank).start as i64;
        let mine = whole.narrow(0, start, len);
        mine.shallow_clone().copy_(&shard);
        comm.all_gather(&mine, &mut whole)?;
        out.push(whole);
        for root in 0..world {
            let mut b = x.copy();
            comm.broadcast(&mut b, root)?;
            out.push(b);
        }
    }
    for kind in [Kind::Int, Kind::Int64, Kind::Int16, Kind::Uint8] {
        let mut t = input(rank, 13, kind);
        comm.all_reduce_sum(&mut t)?;
        out.push(t);
    }
    // A transposed 3×5 matrix: its flattened order is not its memory's.
    let mut m = input(rank, 15, Kind::Float).reshape([3, 5]).tr();
    comm.all_reduce_sum(&mut m)?;
    out.push(m.contiguous());
    comm.barrier()?;
    Ok(out)
}

fn check_collectives(comm: &Mpi) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.world());
    let expected = Threads::run(world, |threads| collectives(&threads))
        .map_err(|e| e.to_string())?
        .swap_remove(rank)
        .map_err(|e| e.to_string())?;
    let got = collectives(comm).map_err(|e| format!("rank {rank}: {e}"))?;
    if got.len() != expected.len() {
        return Err(format!(
            "{} results, expected {}",
            got.len(),
            expected.len()
        ));
    }
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        if g.kind() != e.kind() || !g.equal(e) {
            return Err(format!(
                "rank {rank}, result {i}: MPI gave {g}, threads {e}"
            ));
        }
    }
    let wide = Tensor::zeros([2], (Kind::ComplexDouble, Device::Cpu));
    match comm.broadcast(&mut wide.copy(), 0) {
        Err(DistError::Argument { .. }) => {}
        other => {
            return Err(format!(
                "a 16-byte kind: expected Argument, found {other:?}"
            ))
        }
    }
    let reduce = [ReduceOp::Sum, ReduceOp::Mean][rank.min(1)];
    let mut t = Tensor::zeros([3], (Kind::Float, Device::Cpu));
    let disagree = comm.all_reduce(&mut t, reduce);
    let again = comm.barrier();
    match (&disagree, world > 1) {
        (Err(DistError::Mismatch { rank: 1, .. }), true) if again == disagree => {}
        (Ok(()), false) => {}
        _ => return Err(format!("disagreeing ranks: {disagree:?}, then {again:?}")),
    }
    println!(
        "mpi_check: rank {rank} of {world}: {} results equal the threads backend's; disagreeing \
         calls fail on every rank",
        got.len()
    );
    Ok(())
}

/// All-reduces until the launcher ends the job; rank 1 kills itself after 20 rounds. Returns
/// (an error) only when the job outlives the kill by a minute.
fn kill(comm: &Mpi) -> Result<(), String> {
    let start = Instant::now();
    for round in 0.. {
        let mut t = Tensor::ones([1000], (Kind::Float, Device::Cpu));
        comm.all_reduce_sum(&mut t).map_err(|e| e.to_string())?;
        if comm.rank() == 1 && round == 20 {
            eprintln!("mpi_check: rank 1 kills itself (SIGKILL) after {round} rounds");
            let pid = std::process::id().to_string();
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "rank {}: still running a minute later",
                comm.rank()
            ));
        }
    }
    Ok(())
}

/// Rank 1 stalls (sleeps) before an all-reduce; the others must fail with a timeout after
/// `STALL_TIMEOUT`, and their dropped communicators end the job, the stalled rank with it.
fn stall(comm: Mpi) -> Result<(), String> {
    let comm = comm.with_timeout(STALL_TIMEOUT);
    if comm.rank() == 1 {
        std::thread::sleep(Duration::from_secs(120));
        return Err("rank 1: still running two minutes later".into());
    }
    let start = Instant::now();
    let mut t = Tensor::ones([4], (Kind::Float, Device::Cpu));
    match comm.all_reduce_sum(&mut t) {
        Err(e @ DistError::Timeout { .. }) => {
            eprintln!(
                "mpi_check: rank {} failed after {:.1} s: {e}",
                comm.rank(),
                start.elapsed().as_secs_f64()
            );
            drop(comm);
            Err("still running after dropping the communicator".into())
        }
        other => Err(format!(
            "rank {}: the all-reduce returned {other:?}",
            comm.rank()
        )),
    }
}

/// Rank 1 drops its communicator without finalizing (as a rank that fails returns); the others
/// all-reduce and wait for it. The drop must end the job, non-zero.
fn leave(comm: Mpi) -> Result<(), String> {
    if comm.rank() == 1 {
        drop(comm);
        return Err("rank 1: still running after dropping its communicator".into());
    }
    let mut t = Tensor::ones([4], (Kind::Float, Device::Cpu));
    let done = comm.all_reduce_sum(&mut t);
    Err(format!(
        "rank {}: the all-reduce returned {done:?}",
        comm.rank()
    ))
}

fn main() {
    let mode = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "collectives".into());
    let comm = match Mpi::init() {
        Ok(comm) => comm,
        Err(e) => {
            eprintln!("mpi_check: {e}");
            std::process::exit(1);
        }
    };
    if mode == "leave" || mode == "stall" {
        let left = if mode == "leave" {
            leave(comm)
        } else {
            stall(comm)
        };
        let e = left.err().unwrap_or_default();
        eprintln!("mpi_check: {e}");
        std::process::exit(1);
    }
    let checked = match mode.as_str() {
        "collectives" => check_collectives(&comm),
        "kill" => kill(&comm),
        other => Err(format!(
            "unknown mode {other}: collectives, kill, leave or stall"
        )),
    };
    if let Err(e) = checked {
        eprintln!("mpi_check: {e}");
        comm.abort(1);
    }
    if let Err(e) = comm.finalize() {
        eprintln!("mpi_check: {e}");
        std::process::exit(1);
    }
}
