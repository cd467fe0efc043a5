//! The experts a router picked for one token at one layer, fetched: from the cache, from a
//! guess that read them ahead, or read now by the stream's readers, each computed as soon as it
//! is in, and what the cache keeps of them decided in the router's order.

use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use crate::artifact::{Artifact, ArtifactError};
use crate::expert_stream::ExpertStream;
use crate::experts::{ExpertCache, ExpertParts, Fetch, LoadedExpert, ReadExpert, TileReads};
use crate::guessed_experts::Settled;

/// The experts the router picked for one token at one layer: the cached ones taken from the
/// cache first (before any read could evict one), then the ones `guessed` read ahead on a guess
/// of this choice (see [`crate::guessed_experts`]), read whole or still arriving, the others
/// read from storage by the stream's `reads_in_flight` threads that take their tiles from one
/// queue, in the router's order, so the first expert is complete after its own reads, not after
/// every reader's first. While they are read, `meanwhile` runs (the shared expert's products),
/// then `each` for every expert as soon as it is in, so compute overlaps the reads still in
/// flight. The order of the calls does not matter to the result: each expert's output is kept
/// by its position and added in the router's order later. Experts new to the cache enter it in
/// the router's order once all of them are in, so what stays cached, and so what the next
/// token reads, depends neither on the number of readers, nor on which read finished first, nor
/// on what was guessed. Returns `meanwhile`'s value and the time spent waiting for reads.
pub fn with_fetched<R>(
    stream: &ExpertStream,
    layer: usize,
    experts: &[ExpertParts],
    chosen: &[usize],
    guessed: &mut Settled,
    meanwhile: impl FnOnce() -> R,
    mut each: impl FnMut(usize, &LoadedExpert, Fetch) -> Result<(), crate::step::ModelError>,
) -> Result<(R, Duration), crate::step::ModelError> {
    let cache = &stream.cache;
    let parts: Vec<&ExpertParts> = chosen
        .iter()
        .map(|&e| {
            experts.get(e).ok_or_else(|| ArtifactError::Tensor {
                name: format!("model.layers.{layer}.mlp experts"),
                reason: format!("the router chose expert {e} of {}", experts.len()),
            })
        })
        .collect::<Result<_, _>>()?;
    let sources = Sources::of(cache, layer, chosen, guessed);
    let sizes: Vec<(usize, u64)> = sources
        .fresh
        .iter()
        .map(|&i| (chosen[i], parts[i].held_bytes()))
        .collect();
    // Whether the cache keeps the expert at each position among the chosen.
    let mut kept_at = vec![false; chosen.len()];
    for (&i, keeps) in sources.fresh.iter().zip(cache.will_keep(layer, &sizes)) {
        kept_at[i] = keeps;
    }
    let misses = sources.misses();
    let keep: Vec<bool> = misses.iter().map(|&i| kept_at[i]).collect();
    let owned: Vec<ExpertParts> = misses.iter().map(|&i| parts[i].clone()).collect();
    let reads = TileReads::new(stream.artifact, owned);
    let threads = stream.reads_in_flight.clamp(1, reads.jobs().max(1));
    let (sender, receiver) = mpsc::channel::<ReadExpert>();
    std::thread::scope(|scope| {
        if !misses.is_empty() {
            for _ in 0..threads {
                let (reads, sender) = (&reads, sender.clone());
                scope.spawn(move || reads.run(&sender));
            }
        }
        // Only the readers hold senders now: if every one of them ends, waiting ends too.
        drop(sender);
        let value = meanwhile();
        let mut kept: Vec<KeptExpert> = Vec::new();
        let mut compute = || {
            for (i, expert) in sources.cached.iter().enumerate() {
                if let Some(expert) = expert {
                    each(i, expert, Fetch::cached())?;
                }
            }
            let mut guessed_in = |i: usize, expert: Arc<LoadedExpert>, fetch: Fetch| {
                each(i, &expert, fetch)?;
                if kept_at[i] {
                    kept.push((i, expert));
                }
                Ok::<_, crate::step::ModelError>(())
            };
            for (i, expert) in sources.ready.iter().enumerate() {
                if let Some(expert) = expert {
                    guessed_in(i, Arc::clone(expert), Fetch::read(parts[i], expert, true))?;
                }
            }
            let started = Instant::now();
            let arrived = sources.arrivals(chosen, guessed);
            let mut waited = started.elapsed();
            for (i, expert) in arrived {
                let expert = match expert {
                    Some(expert) => expert,
                    // The guess's read failed or never came: read it here, reporting a failure.
                    None => {
                        let started = Instant::now();
                        let read = read_whole(stream.artifact, parts[i])?;
                        waited += started.elapsed();
                        let fetch = Fetch::read(parts[i], &read, false);
                        guessed_in(i, read, fetch)?;
                        continue;
                    }
                };
                let fetch = Fetch::read(parts[i], &expert, true);
                guessed_in(i, expert, fetch)?;
            }
            let (kept_read, waited_read) =
                receive_reads(&receiver, &misses, &keep, layer, &mut each)?;
            Ok::<_, crate::step::ModelError>((kept_read, waited + waited_read))
        };
        let result = compute();
        // On an error the readers take no further tile (the scope waits for the ones reading).
        reads.stop();
        let (kept_read, waited) = result?;
        kept.extend(kept_read);
        kept.sort_by_key(|(i, _)| *i);
        let kept: Vec<_> = kept.into_iter().map(|(i, x)| (chosen[i], x)).collect();
        let read = sources
            .fresh
            .iter()
            .map(|&i| parts[i].allocated_bytes())
            .sum();
        cache.keep_in_order(layer, read, &kept);
        Ok((value, waited))
    })
}

/// Where each chosen expert (by its position among the chosen) comes from: the cache, a guess
/// that read it whole, a guess still reading it, or a read of its own.
struct Sources {
    cached: Vec<Option<Arc<LoadedExpert>>>,
    ready: Vec<Option<Arc<LoadedExpert>>>,
    arriving: Vec<bool>,
    /// Positions the cache did not hold: guessed or read.
    fresh: Vec<usize>,
}

impl Sources {
    fn of(cache: &ExpertCache, layer: usize, chosen: &[usize], guessed: &mut Settled) -> Sources {
        let cached: Vec<_> = chosen.iter().map(|&e| cache.get((layer, e))).collect();
        let ready: Vec<_> = chosen
            .iter()
            .zip(&cached)
            .map(|(e, hit)| hit.is_none().then(|| guessed.ready.remove(e)).flatten())
            .collect();
        let arriving = (0..chosen.len())
            .map(|i| {
                cached[i].is_none() && ready[i].is_none() && guessed.arriving.contains(&chosen[i])
            })
            .collect();
        let fresh = (0..chosen.len()).filter(|&i| cached[i].is_none()).collect();
        Sources {
            cached,
            ready,
            arriving,
            fresh,
        }
    }

    /// Positions to read here: neither cached nor guessed.
    fn misses(&self) -> Vec<usize> {
        self.fresh
            .iter()
            .copied()
            .filter(|&i| self.ready[i].is_none() && !self.arriving[i])
            .collect()
    }

    /// The arriving experts as the guess's reads end, by position; `None` for one to read
    /// again. Chosen experts of later chunks that arrive meanwhile wait in `guessed.ready`.
    fn arrivals(
        &self,
        chosen: &[usize],
        guessed: &mut Settled,
    ) -> Vec<(usize, Option<Arc<LoadedExpert>>)> {
        let mut outstanding: Vec<usize> = (0..chosen.len()).filter(|&i| self.arriving[i]).collect();
        let mut arrived = Vec::new();
        while !outstanding.is_empty() {
            let Some((e, expert)) = guessed.next_arrival() else {
                break;
            };
            match outstanding.iter().position(|&i| chosen[i] == e) {
                Some(at) => arrived.push((outstanding.swap_remove(at), expert)),
                None => {
                    if let Some(expert) = expert {
                        guessed.ready.insert(e, expert);
                    }
                }
            }
        }
        arrived.extend(outstanding.into_iter().map(|i| (i, None)));
        arrived
    }
}

/// One expert read whole here, on this thread.
fn read_whole(
    artifact: &Artifact,
    parts: &ExpertParts,
) -> Result<Arc<LoadedExpert>, ArtifactError> {
    let loaded = parts
        .parts()
        .iter()
        .map(|p| artifact.load_part(&p.part))
        .collect::<Result<Vec<_>, _>>()?;
    parts
        .with_parts(loaded)
        .map(Arc::new)
        .ok_or_else(|| ArtifactError::Tensor {
            name: "a routed expert".into(),
            reason: "was read with another number of projections".into(),
        })
}

/// A read expert the cache keeps: its position among the chosen (later its expert index), loaded.
type KeptExpert = (usize, Arc<LoadedExpert>);

/// Calls `each` for every read expert as it arrives, then drops it unless `keep` says the cache
/// keeps it; returns the kept ones in the router's order (position among the chosen, loaded)
/// and the time spent waiting.
fn receive_reads(
    receiver: &mpsc::Receiver<ReadExpert>,
    misses: &[usize],
    keep: &[bool],
    layer: usize,
    each: &mut impl FnMut(usize, &LoadedExpert, Fetch) -> Result<(), crate::step::ModelError>,
) -> Result<(Vec<KeptExpert>, Duration), crate::step::ModelError> {
    let mut loaded: Vec<Option<Arc<LoadedExpert>>> = vec![None; misses.len()];
    let mut waited = Duration::ZERO;
    for _ in misses {
        let started = Instant::now();
        let (slot, read) = receiver.recv().map_err(|_| ArtifactError::Tensor {
            name: format!("model.layers.{layer}.mlp experts"),
            reason: "a read thread ended before its reads were done".into(),
        })?;
        waited += started.elapsed();
        let (expert, cost) = read?;
        each(misses[slot], &expert, cost)?;
        if keep.get(slot).copied().unwrap_or(false) {
            loaded[slot] = Some(expert);
        }
    }
    let loaded = misses
        .iter()
        .zip(loaded)
        .filter_map(|(&position, expert)| Some((position, expert?)))
        .collect();
    Ok((loaded, waited))
}
